"""Batched greedy decoding of a real model through any method, on a CPU or a CUDA GPU.

The accuracy runs' decode engine. The model's weights are taken into the suite's own
decoder (:class:`santa_bench.e2e.model.Decoder`: bf16 on CUDA, fp32 on a CPU), so the
decode steps call the same attention backends as ``santa-bench e2e``:

- **prefill**: every prompt token but the last, dense and causal (torch SDPA), once per
  prompt; a batch's prefills fill one static cache that every method of the group
  (:meth:`Engine.generate_many`) decodes before the next batch is prefilled, so a run
  costs one prefill per prompt whatever its number of methods; :meth:`Engine.generate`
  also keeps each prompt's K/V (up to a memory budget) for a later call with the same
  prompts (a group keeps none: its cache already serves every method);
- **decode**: prompts of similar length are decoded together (``batch`` sequences, each
  at its own length: the kernels read per-sequence lengths), in a static KV cache sized
  to the longest prompt plus the longest answer; the last prompt token and each
  generated token are decode steps through the method in every layer (except
  ``dense_layers``), greedy, until every sequence has met a stop token or its budget;
- **backends**: dense is SDPA over the cache; a sampled method runs its Triton kernel
  on CUDA (``backend="triton"``: a fresh workspace seed per batch, a device step counter
  per call, so no sample repeats across layers, steps or batches; CUDA graphs replay
  the steps) and its PyTorch reference on a CPU or with ``reference=True``
  (``backend="reference"``). The reference draws each sequence's numbers from a seed of
  its own prompt, the call's layer and its step, so a prompt decodes to the same tokens
  whatever batch it is in.

KV read fractions: the reference's own counts on a CPU; on CUDA, the method's reference
(SANTA++: its kernel's selection) evaluated on the last decode step's queries of four
evenly spaced layers of each batch.
"""

from __future__ import annotations

import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from santa_bench.baselines import Unsupported
from santa_bench.devices import resolve_device
from santa_bench.e2e.attention import (
    DecodeAttention,
    LayerRouting,
    ReferenceDecode,
    SdpaDecode,
    method_backend,
)
from santa_bench.e2e.cache import StaticKVCache, round_up
from santa_bench.e2e.model import Decoder
from santa_bench.methods import Method
from santa_kernels.validate import InputError

BACKENDS = ("triton", "reference")
DEFAULT_BATCH = 16
STOP_CHECK_STEPS = 8  # host checks for "every sequence stopped" this often
WARMUP_STEPS = 2  # eager steps before a step is captured in a CUDA graph
READ_LAYERS = 4  # layers (evenly spaced) whose last call is read-counted on a GPU
CPU_PREFILL_BYTES = 2 << 30
GPU_PREFILL_SHARE = 0.3  # of the device's memory, for prefills kept between methods
GPU_PREFILL_HEADROOM = 0.08  # of the device's memory left free when a prefill is kept


def resolve_backend(method: Method, device: str, reference: bool = False) -> str:
    """Returns the backend a method's decode steps run on ``device``: ``sdpa`` (dense),
    ``triton`` (its kernel, on CUDA) or ``reference`` (PyTorch)."""
    if method.name == "dense":
        return "sdpa"
    if not reference and method.has_e2e_kernel and device == "cuda":
        return "triton"
    return "reference"


@dataclass(frozen=True)
class Prompt:
    """A prompt to continue: its token ids (all but the last are prefilled densely),
    the generation budget and extra stop tokens (the end-of-sequence token always stops)."""

    ids: tuple[int, ...]
    max_new_tokens: int
    stops: tuple[int, ...] = ()


@dataclass
class Generation:
    """What :meth:`Engine.generate` produced, in the order of the prompts."""

    tokens: list[list[int]]  # generated ids, cut after the first stop token
    first_logits: torch.Tensor | None  # [n, vocab] float32 of the first step (keep_logits)
    kv_read_fraction: list[float] = field(default_factory=list)
    decode_steps: int = 0
    decode_s: float = 0.0
    prefill_s: float = 0.0  # the group's (shared by every method that decoded it)
    prefill_tokens: int = 0  # prompt tokens the group prefilled (not taken from the store)
    prefills: int = 0  # prompts the group prefilled (not taken from the store)


@dataclass(frozen=True)
class Decoding:
    """One method configuration that decodes a group's prompts (:meth:`Engine.generate_many`):
    ``backend`` is ``sdpa``, ``triton`` or ``reference`` (:func:`resolve_backend`)."""

    method: Method
    params: dict[str, Any]
    seed: int = 0
    dense_layers: tuple[int, ...] = ()
    backend: str = "reference"


def prompt_seed(ids: Sequence[int]) -> int:
    """A stable 31-bit seed of a prompt's tokens (the same in any batch)."""
    return zlib.crc32(PrefillStore.key(ids)) & 0x7FFFFFFF


class PrefillStore:
    """Dense prefills ``(K, V)`` per prompt, least recently used dropped past ``max_bytes``."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._store: OrderedDict[bytes, tuple[list[torch.Tensor], list[torch.Tensor], int]] = (
            OrderedDict())
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(ids: Sequence[int]) -> bytes:
        return torch.tensor(list(ids), dtype=torch.int64).numpy().tobytes()

    def get(self, ids: Sequence[int]):
        key = self.key(ids)
        found = self._store.get(key)
        if found is None:
            self.misses += 1
            return None
        self.hits += 1
        self._store.move_to_end(key)
        return found[0], found[1]

    def put(self, ids: Sequence[int], ks: list[torch.Tensor], vs: list[torch.Tensor]) -> None:
        size = sum(t.numel() * t.element_size() for t in (*ks, *vs))
        if size > self.max_bytes:
            return
        self._store[self.key(ids)] = (ks, vs, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            self.bytes -= self._store.popitem(last=False)[1][2]

    def clear(self) -> None:
        self._store.clear()
        self.bytes = 0


class Engine:
    """One model on one device; decodes lists of prompts through any method, in batches."""

    def __init__(self, hf_model: Any, *, device: str = "cpu", batch: int = DEFAULT_BATCH,
                 prefill_bytes: int | None = None, name: str | None = None) -> None:
        if batch <= 0:
            raise InputError(f"--batch: must be > 0, got {batch}")
        self.device = resolve_device(device)
        dtype = torch.bfloat16 if self.device == "cuda" else torch.float32
        self.decoder = Decoder.from_hf(hf_model, device=self.device, dtype=dtype, name=name)
        self.batch = batch
        self.eos = _eos_ids(hf_model)
        c = self.decoder.config
        self.decoder.ensure_positions(c.max_positions)
        self.scale = c.head_dim**-0.5
        total = (torch.cuda.get_device_properties(0).total_memory
                 if self.device == "cuda" else None)
        if prefill_bytes is None:
            prefill_bytes = CPU_PREFILL_BYTES if total is None else int(GPU_PREFILL_SHARE * total)
        self.prefills = PrefillStore(prefill_bytes)
        # bytes a kept prefill must leave free on the device (the next prefill's)
        self.headroom = 0 if total is None else int(GPU_PREFILL_HEADROOM * total)
        self.prefill_tokens = 0  # prompt tokens prefilled (store misses), all groups

    # ------------------------------------------------------------------ prefill
    @torch.no_grad()
    def prefill(self, ids: Sequence[int], keep: bool = True,
                ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Returns every layer's post-RoPE ``K``/``V`` ``[n, Hkv, d]`` of a dense causal
        prefill of ``ids`` (``keep``: kept for a later call that decodes the same prompt)."""
        found = self.prefills.get(ids)
        if found is not None:
            return found
        model, c = self.decoder, self.decoder.config
        n = len(ids)
        if n + 1 > c.max_positions:
            raise InputError(f"prompt of {n + 1} tokens exceeds the model's "
                             f"{c.max_positions} positions")
        x = model.embed(torch.tensor(list(ids), dtype=torch.int64, device=self.device))
        positions = torch.arange(n, device=self.device)
        group = c.num_heads // c.num_kv_heads
        ks, vs = [], []
        for layer in range(c.num_layers):
            q, k, v = model.attention_inputs(layer, x, positions)
            ks.append(k.contiguous())
            vs.append(v.contiguous())
            attn = F.scaled_dot_product_attention(
                q.transpose(0, 1)[None],
                k.transpose(0, 1).repeat_interleave(group, dim=0)[None],
                v.transpose(0, 1).repeat_interleave(group, dim=0)[None],
                is_causal=True, scale=self.scale)
            x = model.layer_output(layer, x, attn[0].transpose(0, 1))
        if keep and self._room_to_keep():
            self.prefills.put(ids, ks, vs)
        self.prefill_tokens += n
        return ks, vs

    def free_device_bytes(self) -> int | None:
        """Bytes the device can still give (free, plus what torch holds unused); None on
        a CPU, where the store's own budget is the only bound."""
        if self.device != "cuda":
            return None
        free, _ = torch.cuda.mem_get_info()
        return free + torch.cuda.memory_reserved() - torch.cuda.memory_allocated()

    def _room_to_keep(self) -> bool:
        """Whether a prefill just made may stay in the store: beside a batch's static cache
        the store's budget alone can fill the device (a batch of 50 prompts of 32k on an
        80 GB GPU did), so one is kept only while the headroom stays free."""
        free = self.free_device_bytes()
        return free is None or free >= self.headroom

    # ------------------------------------------------------------------ decode
    def generate(
        self, method: Method, params: dict[str, Any], prompts: Sequence[Prompt], *,
        seed: int = 0, dense_layers: Sequence[int] = (), reference: bool = False,
        keep_logits: bool = False, on_batch: Callable[[int], None] | None = None,
        backend: str | None = None,
    ) -> Generation:
        """Greedy continuations of ``prompts`` with ``method`` in every decode step.

        ``backend``: ``triton`` or ``reference`` (default :func:`resolve_backend`; the
        kernels run on a CPU only through Triton's interpreter, for tests)."""
        backend = backend or resolve_backend(method, self.device, reference)
        run = Decoding(method, params, seed=seed, dense_layers=tuple(dense_layers),
                       backend=backend)
        found = self.generate_many([run], prompts, keep_logits=keep_logits,
                                   on_batch=on_batch, keep_prefills=True)[0]
        if isinstance(found, BaseException):
            raise found
        return found

    def generate_many(
        self, runs: Sequence[Decoding], prompts: Sequence[Prompt], *,
        keep_logits: bool = False, on_batch: Callable[[int], None] | None = None,
        keep_prefills: bool = False,
    ) -> list[Generation | Exception]:
        """Greedy continuations of ``prompts`` through each of ``runs``: each batch is
        prefilled once, then decoded by every run before the next batch is prefilled.
        ``keep_prefills``: also keep each prompt's K/V in the prefill store, for a later
        call with the same prompts (one group needs none: it holds GPU memory).

        Returns each run's :class:`Generation` (its ``prefill_s`` and ``prefill_tokens``
        are the group's, shared), or the exception that stopped that run (the others go
        on); an error of the prefill itself is raised."""
        for run in runs:
            if run.backend not in (*BACKENDS, "sdpa"):
                raise InputError(f"backend: expected one of {BACKENDS}, got {run.backend!r}")
        if not prompts:
            return [Generation([], None) for _ in runs]
        for p in prompts:
            if len(p.ids) < 1 or p.max_new_tokens < 1:
                raise InputError("a prompt needs >= 1 token and a budget of >= 1 new token")
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i].ids))
        outs: list[Generation | Exception] = [
            Generation([[] for _ in prompts], None) for _ in runs]
        logits: list[list[torch.Tensor | None]] = [[None] * len(prompts) for _ in runs]
        shared = {"prefill_s": 0.0, "prefill_tokens": 0, "prefills": 0}
        for number, start in enumerate(range(0, len(order), self.batch)):
            chosen = order[start : start + self.batch]
            batch = [prompts[i] for i in chosen]
            tokens_before, misses_before = self.prefill_tokens, self.prefills.misses
            cache, lengths, seconds = self._prefill_batch(batch, keep_prefills)
            shared["prefill_s"] += seconds
            shared["prefill_tokens"] += self.prefill_tokens - tokens_before
            shared["prefills"] += self.prefills.misses - misses_before
            for slot, run in enumerate(runs):
                out = outs[slot]
                if not isinstance(out, Generation):
                    continue  # this run failed on an earlier batch
                try:
                    tokens, first, reads, steps, decode_s = self._decode_batch(
                        run.method, run.params, batch, cache, lengths, seed=run.seed,
                        number=number, dense_layers=run.dense_layers, backend=run.backend,
                        keep_logits=keep_logits)
                except Exception as exc:  # that run's error: the others go on
                    if self.device == "cuda" and isinstance(exc, torch.OutOfMemoryError):
                        torch.cuda.empty_cache()
                    outs[slot] = exc
                    continue
                for row, index in enumerate(chosen):
                    out.tokens[index] = tokens[row]
                    if first is not None:
                        logits[slot][index] = first[row]
                out.kv_read_fraction += reads
                out.decode_steps += steps
                out.decode_s += decode_s
                if on_batch is not None:
                    on_batch(len(chosen))
            del cache
        for slot, out in enumerate(outs):
            if isinstance(out, Generation):
                out.prefill_s = shared["prefill_s"]
                out.prefill_tokens = int(shared["prefill_tokens"])
                out.prefills = int(shared["prefills"])
                if keep_logits:
                    out.first_logits = torch.stack(logits[slot])  # type: ignore[arg-type]
        return outs

    def _backend(self, method: Method, params: dict[str, Any], seed: int, number: int,
                 row_seeds: list[int], dense_layers: Sequence[int],
                 backend: str) -> DecodeAttention:
        """The batch's backend: a kernel's workspace seed differs per batch (``number``);
        the reference's seeds are per sequence (``row_seeds``), whatever its batch."""
        c = self.decoder.config
        if method.name == "dense":
            return SdpaDecode(self.scale)
        if backend == "triton":
            if params.get("min_ctx"):
                raise Unsupported(f"{method.name}: the Triton kernels do not implement "
                                  "min_ctx (use --reference)")
            main = method_backend(method, params, device="cuda", scale=self.scale,
                                  seed=seed + 7919 * number)
        else:
            main = ReferenceDecode(method, params, self.scale, seed, row_seeds=row_seeds)
        exempt = [layer for layer in dense_layers if 0 <= layer < c.num_layers]
        if not exempt:
            return main
        return LayerRouting(main, SdpaDecode(self.scale), exempt)

    @torch.no_grad()
    def _prefill_batch(self, batch: list[Prompt], keep: bool = True,
                       ) -> tuple[StaticKVCache, list[int], float]:
        """A batch's static cache holding every prompt's dense prefill (all tokens but the
        last), its prompt lengths and the seconds this took. Decode steps write past the
        prompts only, so every method of a group decodes from this one cache."""
        model, c = self.decoder, self.decoder.config
        t0 = time.perf_counter()
        lengths = [len(p.ids) - 1 for p in batch]
        steps = max(p.max_new_tokens for p in batch)
        if max(lengths) + steps > c.max_positions:
            raise InputError(f"prompt + {steps} new tokens exceeds the model's "
                             f"{c.max_positions} positions")
        cache = StaticKVCache(num_layers=c.num_layers, batch=len(batch),
                              capacity=round_up(max(lengths) + steps, 16),
                              num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
                              dtype=model.dtype, device=self.device)
        for row, prompt in enumerate(batch):
            n = lengths[row]
            if n == 0:
                continue
            ks, vs = self.prefill(prompt.ids[:-1], keep)
            for layer in range(c.num_layers):
                cache.k[layer][row, :n].copy_(ks[layer])
                cache.v[layer][row, :n].copy_(vs[layer])
        cache.set_lengths(lengths)
        if self.device == "cuda":
            torch.cuda.synchronize()
        return cache, lengths, time.perf_counter() - t0

    @torch.no_grad()
    def _decode_batch(self, method, params, batch: list[Prompt], cache: StaticKVCache,
                      lengths: list[int], *, seed: int, number: int,
                      dense_layers: Sequence[int], backend: str, keep_logits: bool):
        """Decodes a prefilled batch (:meth:`_prefill_batch`) through ``method``; first
        clears what an earlier method's steps wrote past the prompts."""
        model, c = self.decoder, self.decoder.config
        t1 = time.perf_counter()
        steps = max(p.max_new_tokens for p in batch)
        for row, n in enumerate(lengths):  # the cache as the prefill left it
            for layer in range(c.num_layers):
                cache.k[layer][row, n:].zero_()
                cache.v[layer][row, n:].zero_()
        cache.set_lengths(lengths)
        row_seeds = [prompt_seed(p.ids) for p in batch]
        attend = self._backend(method, params, seed, number, row_seeds, dense_layers,
                               backend)
        query = torch.zeros(len(batch), c.num_heads, c.head_dim, dtype=model.dtype,
                            device=self.device)
        try:
            attend.setup(cache, query)
            attend.after_prefill(cache)
        except ValueError as exc:
            raise Unsupported(f"{method.name}: {exc}") from exc
        cache.set_lengths(lengths)
        attend.set_pdl_chain(False)
        attend.reset()
        stops = torch.tensor(sorted({*self.eos, *(s for p in batch for s in p.stops)}),
                             dtype=torch.int64, device=self.device)
        ids = torch.tensor([p.ids[-1] for p in batch], dtype=torch.int64, device=self.device)
        tokens = torch.zeros(len(batch), steps, dtype=torch.int64, device=self.device)
        step_index = torch.zeros(1, dtype=torch.int64, device=self.device)
        first = torch.zeros(len(batch), c.vocab, dtype=torch.float32, device=self.device)
        last_q: list[torch.Tensor | None] = [None] * c.num_layers

        def step() -> torch.Tensor:
            positions = cache.lengths.long()
            cache.lengths.add_(1)
            x = model.embed(ids)
            for layer in range(c.num_layers):
                q, k, v = model.attention_inputs(layer, x, positions)
                cache.write(layer, k, v, positions)
                last_q[layer] = q
                x = model.layer_output(layer, x, attend(layer, q))
            logits = model.logits(x)
            nxt = logits.argmax(-1)
            ids.copy_(nxt)
            tokens.index_copy_(1, step_index, nxt[:, None])
            step_index.add_(1)
            return logits

        def all_stopped(done: int) -> bool:
            hit = torch.isin(tokens[:, :done], stops).any(dim=1)
            return bool(hit.all())

        cuda = self.device == "cuda"
        graph, capture = None, cuda and attend.graph_safe
        side = torch.cuda.Stream() if cuda else None
        done = 0
        while done < steps:
            if capture and done >= WARMUP_STEPS and steps - done > 1:
                capture = False
                graph = _capture(step)  # None: the step syncs with the host; eager
                continue
            if graph is not None:
                graph.replay()
            elif side is not None and done < WARMUP_STEPS:  # warm-up before a capture
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    logits = step()
                torch.cuda.current_stream().wait_stream(side)
            else:
                logits = step()
            if done == 0 and keep_logits:
                first.copy_(logits.float())
            done += 1
            if done % STOP_CHECK_STEPS == 0 and done < steps and all_stopped(done):
                break
        if self.device == "cuda":
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        reads = self._reads(method, params, attend, cache, last_q, seed)
        rows = tokens[:, :done].cpu().tolist()
        stop_set = set(stops.cpu().tolist())
        cut = []
        for row, prompt in zip(rows, batch, strict=True):
            row = row[: prompt.max_new_tokens]
            for i, token in enumerate(row):
                if token in stop_set:
                    row = row[: i + 1]
                    break
            cut.append(row)
        return cut, first.cpu() if keep_logits else None, reads, done, t2 - t1

    def _reads(self, method, params, attend, cache, last_q, seed) -> list[float]:
        """Read fractions of the batch's decode calls (see the module docstring)."""
        if method.name == "dense":
            return [1.0]
        main = attend.main if isinstance(attend, LayerRouting) else attend
        if isinstance(main, ReferenceDecode):
            return list(main.reads)
        fractions = []
        count = len(last_q)
        chosen = sorted({round(i * (count - 1) / max(1, READ_LAYERS - 1))
                         for i in range(min(READ_LAYERS, count))})
        for layer in chosen:
            q = last_q[layer]
            if q is None:
                continue
            kv = cache.layers[layer]
            if hasattr(main, "read_fraction"):  # a kernel that counts its own reads
                fraction = main.read_fraction(layer, q)
            else:
                result = method.run_reference(q, kv, params, seed=seed + layer,
                                              scale=self.scale)
                fraction = float(result.reads.kv_read_fraction)
            if fraction is not None:
                fractions.append(fraction)
        return fractions


def _capture(step: Callable[[], Any]):
    """Returns a CUDA graph of one decode step, or None when the step cannot be captured.

    Capturing runs nothing, so the caller replays it for the step it stands for."""
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            step()
    except Exception:  # a backend that syncs with the host: decode eagerly
        torch.cuda.synchronize()
        return None
    return graph


def _eos_ids(hf_model: Any) -> list[int]:
    """The model's end-of-sequence ids (its generation config's, else its config's)."""
    found: list[int] = []
    for source in (getattr(hf_model, "generation_config", None), hf_model.config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if value is None:
            continue
        for token in value if isinstance(value, list | tuple) else [value]:
            if int(token) not in found:
                found.append(int(token))
    return found
