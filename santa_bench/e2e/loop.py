"""The batched decode loop: chunked dense prefill once, then greedy decode steps.

A :class:`DecodeSession` holds one model, one static KV cache and one prefilled batch
(``ctx`` prompt tokens per sequence): every method decodes from the same prefill (the
cache lengths are reset; decode rows past the prompt are simply overwritten).

Prefill (``prefill="dense"``) runs layer by layer over chunks of the prompt with torch
SDPA (causal inside the chunk, the GQA group as query rows, no K/V expansion); a paged
cache is filled from a contiguous scratch once per layer. ``prefill="random"`` fills
the cache with N(0, 1) K/V and draws the first tokens at random instead (speed-only).

A decode step embeds the current tokens, and for every layer computes q/k/v, writes
the new K/V at the device positions, attends through the backend and finishes the
layer; the greedy next tokens are written back into the static input buffer and into
a device token log. Nothing in a step synchronises with the host. On a GPU the step
is captured once in a CUDA graph (after eager warm-up steps) and replayed; CUDA events
around each replay give the per-step latency. A second graph holding only the
attention calls of every layer (on the queries of the last step) times attention's
share of the step.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from santa_bench.e2e.attention import DecodeAttention
from santa_bench.e2e.cache import StaticKVCache, round_up
from santa_bench.e2e.model import Decoder
from santa_kernels.validate import InputError

PREFILL_MODES = ("dense", "random")
REST_MODES = ("fused", "gemm", "torch")  # the step outside attention (fused.py, gemm.py)
WARMUP_STEPS = 2  # eager steps before capture (compilation, allocator, cuBLAS)
ATTENTION_REPS = 16  # timed replays of the attention-only pass
CPU_ATTENTION_REPS = 2  # CPU runs are for testing: keep them short
MASK_ALIGN = 16  # SDPA's fused kernels want the key length (mask stride) aligned


@dataclass
class DecodeResult:
    """One decode run: timed step latencies, attention-only latencies, greedy tokens."""

    step_ms: list[float]
    attention_ms: list[float]
    tokens: torch.Tensor  # [B, steps] int64 on the CPU
    timing: str  # "graph" | "events" | "cpu-wall"
    warmup_steps: int
    logits: torch.Tensor | None = None  # [steps, B, vocab] on the CPU (keep_logits)

    @property
    def step_ms_median(self) -> float:
        return statistics.median(self.step_ms)

    @property
    def step_ms_p90(self) -> float:
        return percentile(self.step_ms, 0.9)

    @property
    def attention_ms_median(self) -> float:
        return statistics.median(self.attention_ms)


def resolve_rest(rest: str | None, device: torch.device, name: str = "rest",
                 batch: int | None = None) -> str:
    """Returns the step outside attention a decode of ``batch`` sequences on ``device``
    runs, ``fused``, ``gemm`` or ``torch`` (``None`` / ``auto``: on a GPU gemm up to its
    rows, else fused; torch on a CPU); InputError for an unknown mode, ``fused`` /
    ``gemm`` where their kernels cannot run, or ``gemm`` for more rows than its GEMMs hold
    (``name`` starts messages)."""
    from santa_bench.e2e.gemm import MAX_ROWS

    if rest in (None, "auto"):
        if device.type != "cuda":
            return "torch"
        return "gemm" if batch is None or batch <= MAX_ROWS else "fused"
    if rest not in REST_MODES:
        raise InputError(f"{name}: expected auto, {' or '.join(REST_MODES)}, got {rest!r}")
    if rest in ("fused", "gemm"):
        from santa_bench.e2e.fused import fused_available

        ok, why = fused_available(device)
        if not ok:
            raise InputError(f"{name}={rest}: {why}")
    if rest == "gemm" and batch is not None and batch > MAX_ROWS:
        raise InputError(f"{name}=gemm: decode GEMMs hold at most {MAX_ROWS} rows, got batch "
                         f"{batch} (use --rest fused)")
    return rest


def percentile(values: list[float], q: float) -> float:
    """Returns the ``q`` quantile (linear interpolation) of ``values``."""
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def chunk_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float
) -> torch.Tensor:
    """Returns causal attention of prompt chunk ``q [B, T, Hq, d]`` (positions
    ``start..start+T-1``) over ``k``/``v`` ``[B, L, Hkv, d]`` (rows past the chunk masked)."""
    batch, span, hq, d = q.shape
    hkv, length = k.shape[2], k.shape[1]
    group = hq // hkv
    # row t*G + g of KV head h is query head h*G + g at position start + t
    rows = q.view(batch, span, hkv, group, d).permute(0, 2, 1, 3, 4).reshape(
        batch, hkv, span * group, d)
    row_pos = start + torch.arange(span, device=q.device).repeat_interleave(group)
    mask = torch.arange(length, device=q.device)[None, :] <= row_pos[:, None]
    out = F.scaled_dot_product_attention(rows, k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=mask, scale=scale)
    return out.view(batch, hkv, span, group, d).permute(0, 2, 1, 3, 4).reshape(
        batch, span, hq, d)


def random_prompt(batch: int, ctx: int, vocab: int, seed: int) -> torch.Tensor:
    """Returns ``[B, ctx]`` seeded random token ids (CPU)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, ctx), generator=gen)


class DecodeSession:
    """One model, one static cache, one prefilled batch; decodes it through any backend."""

    def __init__(
        self,
        model: Decoder,
        *,
        batch: int,
        ctx: int,
        steps: int,
        layout: str = "contiguous",
        page_size: int = 16,
        seed: int = 0,
    ) -> None:
        config = model.config
        if batch <= 0:
            raise InputError(f"batch: must be > 0, got {batch}")
        if ctx <= 0:
            raise InputError(f"ctx: must be > 0, got {ctx}")
        if steps < 2:
            raise InputError(f"steps: need at least 2 decode steps, got {steps}")
        if ctx + steps > config.max_positions:
            raise InputError(f"ctx {ctx} + {steps} decode steps exceeds {config.name}'s "
                             f"{config.max_positions} positions")
        self.model, self.batch, self.ctx, self.steps, self.seed = model, batch, ctx, steps, seed
        self.cache = StaticKVCache(
            num_layers=config.num_layers, batch=batch, capacity=ctx + steps,
            num_kv_heads=config.num_kv_heads, head_dim=config.head_dim, dtype=model.dtype,
            device=model.device, layout=layout, page_size=page_size, seed=seed,
        )
        model.ensure_positions(self.cache.capacity)
        self.scale = config.head_dim**-0.5
        self.first_tokens: torch.Tensor | None = None
        self.prefill_logits: torch.Tensor | None = None
        self.prefill_mode: str | None = None

    # ------------------------------------------------------------------ prefill
    @torch.no_grad()
    def prefill(self, mode: str = "dense", prompt: torch.Tensor | None = None,
                chunk: int = 1024) -> None:
        """Fills the cache with the prompt (``dense``) or random K/V (``random``)."""
        if mode not in PREFILL_MODES:
            raise InputError(f"prefill: expected one of {PREFILL_MODES}, got {mode!r}")
        if mode == "random":
            self._prefill_random()
        else:
            if prompt is None:
                prompt = random_prompt(self.batch, self.ctx, self.model.config.vocab, self.seed)
            if tuple(prompt.shape) != (self.batch, self.ctx):
                raise InputError(f"prompt: expected [{self.batch}, {self.ctx}] token ids, "
                                 f"got {tuple(prompt.shape)}")
            if chunk <= 0:
                raise InputError(f"prefill chunk: must be > 0, got {chunk}")
            self._prefill_dense(prompt.to(self.model.device), chunk)
        self.prefill_mode = mode
        self.cache.set_lengths(self.ctx)

    def _prefill_random(self) -> None:
        gen = torch.Generator(device=self.model.device).manual_seed(self.seed)
        for k, v in zip(self.cache.k, self.cache.v, strict=True):
            k.normal_(generator=gen)
            v.normal_(generator=gen)
        self.first_tokens = torch.randint(0, self.model.config.vocab, (self.batch,),
                                          generator=gen, device=self.model.device)
        self.prefill_logits = None

    def _prefill_dense(self, prompt: torch.Tensor, chunk: int) -> None:
        model, cache, c = self.model, self.cache, self.model.config
        batch, n = prompt.shape
        x = model.embed(prompt)  # [B, N, hidden], updated layer by layer
        positions = torch.arange(n, device=model.device)
        padded = round_up(n, MASK_ALIGN)
        scratch = None
        if cache.layout == "paged":
            scratch = tuple(torch.zeros(batch, padded, c.num_kv_heads, c.head_dim,
                                        dtype=model.dtype, device=model.device)
                            for _ in range(2))
        for layer in range(c.num_layers):
            view = cache.contiguous_view(layer)
            keys, values = view if view is not None else scratch  # type: ignore[misc]
            for start in range(0, n, chunk):
                end = min(n, start + chunk)
                span = end - start
                xc = x[:, start:end].reshape(batch * span, c.hidden)
                q, k, v = model.attention_inputs(layer, xc, positions[start:end].repeat(batch))
                keys[:, start:end] = k.view(batch, span, c.num_kv_heads, c.head_dim)
                values[:, start:end] = v.view(batch, span, c.num_kv_heads, c.head_dim)
                length = min(round_up(end, MASK_ALIGN), keys.shape[1])
                attn = chunk_attention(q.view(batch, span, c.num_heads, c.head_dim),
                                       keys[:, :length], values[:, :length], start, self.scale)
                out = model.layer_output(layer, xc, attn.reshape(batch * span, c.num_heads,
                                                                  c.head_dim))
                x[:, start:end] = out.view(batch, span, c.hidden)
            if scratch is not None:
                cache.write_span(layer, 0, scratch[0][:, :n], scratch[1][:, :n])
        self.prefill_logits = model.logits(x[:, -1])
        self.first_tokens = self.prefill_logits.argmax(-1)

    # ------------------------------------------------------------------ decode
    def prepare(self, attend: DecodeAttention) -> None:
        """Sets ``attend`` up on this cache and lets it index the prompt (lengths reset)."""
        if self.first_tokens is None:
            raise InputError("prepare: prefill first")
        c = self.model.config
        self.cache.set_lengths(self.ctx)
        query = torch.zeros(self.batch, c.num_heads, c.head_dim, dtype=self.model.dtype,
                            device=self.model.device)
        attend.setup(self.cache, query)
        attend.after_prefill(self.cache)

    @torch.no_grad()
    def decode(
        self, attend: DecodeAttention, *, graph: bool = True, keep_logits: bool = False,
        rest: str | None = None,
    ) -> DecodeResult:
        """Decodes ``steps`` greedy tokens per sequence through ``attend``; returns timings.

        ``tokens[:, i]`` is the token chosen by decode step ``i`` (the first decode step
        consumes the prefill's greedy token, ``first_tokens``); ``keep_logits`` also logs
        every step's logits (tests). ``rest``: the step outside attention as three fused
        Triton kernels a layer around cuBLAS GEMMs (``fused``, :mod:`santa_bench.e2e.fused`),
        on Triton decode GEMMs (``gemm``, :mod:`santa_bench.e2e.gemm`) or as the eager ops
        of ``model.py`` (``torch``); see :func:`resolve_rest`.

        ``attend`` must be prepared on this session (:meth:`prepare`).
        """
        if self.first_tokens is None:
            raise InputError("decode: prefill first")
        model, cache, c = self.model, self.cache, self.model.config
        cuda = model.device.type == "cuda"
        rest = resolve_rest(rest, model.device, batch=self.batch)
        use_graph = graph and cuda and attend.graph_safe
        attend.set_pdl_chain(rest == "gemm" and _gemm_pdl(model.device))
        cache.set_lengths(self.ctx)
        attend.reset()
        ids = self.first_tokens.clone()
        tokens = torch.zeros(self.batch, self.steps, dtype=torch.int64, device=model.device)
        step_index = torch.zeros(1, dtype=torch.int64, device=model.device)
        logits_log = (torch.zeros(self.steps, self.batch, c.vocab, dtype=model.dtype,
                                  device=model.device) if keep_logits else None)
        last_q: list[torch.Tensor | None] = [None] * c.num_layers
        host_lengths = [self.ctx] * self.batch

        def layers_torch(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            for layer in range(c.num_layers):
                q, k, v = model.attention_inputs(layer, x, positions)
                cache.write(layer, k, v, positions)
                last_q[layer] = q
                x = model.layer_output(layer, x, attend(layer, q))
            return model.logits(x)

        def attend_and_keep(layer: int, q: torch.Tensor) -> torch.Tensor:
            last_q[layer] = q
            return attend(layer, q)

        def layers_fast(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            return model.decode_layers(rest, x, positions, cache.k, cache.v, attend_and_keep,
                                       cache.page_table, cache.page_size)

        layers = layers_torch if rest == "torch" else layers_fast

        def step() -> None:
            positions = cache.lengths.long()  # where the new tokens go
            cache.lengths.add_(1)
            logits = layers(model.embed(ids), positions)
            nxt = logits.argmax(-1)
            if logits_log is not None:
                logits_log.index_copy_(0, step_index, logits[None])
            ids.copy_(nxt)
            tokens.index_copy_(1, step_index, nxt[:, None])
            step_index.add_(1)

        def attention_pass() -> None:
            for layer in range(c.num_layers):
                attend(layer, last_q[layer])  # type: ignore[arg-type]

        def advance() -> None:
            for i in range(self.batch):
                host_lengths[i] += 1
            attend.before_step(host_lengths)

        warmup = min(WARMUP_STEPS, self.steps - 1)
        timed = self.steps - warmup
        if cuda:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    advance()
                    step()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
        else:
            for _ in range(warmup):
                advance()
                step()
        if use_graph:
            advance()
            step_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(step_graph):
                step()
            host_lengths[:] = [n - 1 for n in host_lengths]  # capture ran nothing
            step_ms = _time_cuda(timed, lambda: advance(), step_graph.replay)
            attention_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(attention_graph):
                attention_pass()
            attend.before_step(host_lengths)
            attention_ms = _time_cuda(ATTENTION_REPS, lambda: None, attention_graph.replay)
            timing = "graph"
        elif cuda:
            step_ms = _time_cuda(timed, advance, step)
            attention_ms = _time_cuda(ATTENTION_REPS, lambda: None, attention_pass)
            timing = "events"
        else:
            step_ms = _time_wall(timed, advance, step)
            attention_ms = _time_wall(CPU_ATTENTION_REPS, lambda: None, attention_pass)
            timing = "cpu-wall"
        return DecodeResult(step_ms, attention_ms, tokens.cpu(), timing, warmup,
                            None if logits_log is None else logits_log.cpu())


def _gemm_pdl(device: torch.device) -> bool:
    """True where the gemm rest's kernels launch as programmatic dependents."""
    from santa_bench.e2e.gemm import use_pdl

    return use_pdl(device)


def _time_cuda(reps: int, before, run) -> list[float]:
    """Milliseconds of ``run`` between CUDA events, ``before`` (host work) outside them."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends, strict=True):
        before()
        start.record()
        run()
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]


def _time_wall(reps: int, before, run) -> list[float]:
    samples = []
    for _ in range(reps):
        before()
        t0 = time.perf_counter()
        run()
        samples.append((time.perf_counter() - t0) * 1e3)
    return samples
