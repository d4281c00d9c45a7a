"""The Triton Bernoulli score stage (santa_kernels.triton_bernoulli) against its reference.

Interpreter on a CPU (compiled on a GPU). Given the same uniforms the effective queries
give the reference's scores and feature counts; over many Philox seeds they are unbiased
for the query; composed with a value stage, the kernel's output agrees in distribution
(mean over seeds) with the reference composition.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

import santa_kernels as sk
from santa_kernels.kv import KVCache
from santa_kernels.scores import bernoulli_scores
from santa_kernels.triton_bernoulli import (
    BernoulliDecode,
    BernoulliWorkspace,
    bernoulli_queries,
)
from santa_kernels.validate import InputError

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRETED else "cuda"
pytestmark = pytest.mark.skipif(not INTERPRETED and not torch.cuda.is_available(),
                                reason="needs TRITON_INTERPRET=1 or a GPU")
GROUPINGS = ["per-head", "mean-group-query"]


def _inputs(batch=2, hq=4, hkv=2, n=96, d=16, seed=0, q_scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    q = (torch.randn(batch, hq, d, generator=gen) * q_scale).to(DEVICE)
    k = torch.randn(batch, n, hkv, d, generator=gen).to(DEVICE)
    v = torch.randn(batch, n, hkv, d, generator=gen).to(DEVICE)
    lengths = torch.tensor([n, n - 21][:batch], dtype=torch.int32, device=DEVICE)
    return q, KVCache.contiguous(k, v, lengths)


@pytest.mark.parametrize("grouping", GROUPINGS)
def test_same_uniforms_give_the_reference_scores_and_features(grouping):
    q, kv = _inputs()
    batch, hq, d = q.shape
    hkv, group, draws = kv.num_kv_heads, hq // kv.num_kv_heads, 3
    heads = hkv if grouping == "mean-group-query" else hq
    u = torch.rand(batch, heads, draws, d, generator=torch.Generator().manual_seed(5))
    w, features = bernoulli_queries(q, hkv, draws=draws, grouping=grouping, uniforms=u)
    n = kv.k.shape[1]
    valid = torch.arange(n, device=DEVICE)[None, :] < kv.lengths[:, None].long()
    scale = d**-0.5
    want, want_features = bernoulli_scores(q, kv.k, valid, scale, group, draws, grouping,
                                           torch.Generator(), uniforms=u.to(DEVICE))
    keys = kv.k.permute(0, 2, 1, 3).repeat_interleave(group, dim=1)
    got = scale * torch.einsum("bhd,bhnd->bhn", w, keys)
    got = got.masked_fill(~valid[:, None, :], float("-inf"))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(features.long() * kv.lengths[:, None].long(), want_features)
    assert int(features.min()) > 0 and int(features.max()) <= d


@pytest.mark.parametrize("grouping", GROUPINGS)
def test_effective_queries_are_unbiased_over_seeds(grouping):
    """E[w] = q for both groupings: the mean over R Philox streams within 5 standard errors."""
    q, kv = _inputs(batch=1, q_scale=2.0)
    ws = BernoulliWorkspace(q, kv.num_kv_heads, seed=11)
    draws, reps = 2, 300
    samples = torch.stack([bernoulli_queries(q, kv.num_kv_heads, draws=draws,
                                             grouping=grouping, workspace=ws)[0].clone()
                           for _ in range(reps)])
    mean, err = samples.mean(0), samples.std(0) / reps**0.5
    z = (mean - q).abs() / err.clamp_min(1e-6)
    assert float(z.max()) < 5.0, float(z.max())
    assert not torch.equal(samples[0], samples[1])  # fresh masks every call
    ws.reset_rng(0)
    again = bernoulli_queries(q, kv.num_kv_heads, draws=draws, grouping=grouping,
                              workspace=ws)[0]
    assert torch.equal(again, samples[0])  # reset_rng replays the run


def test_one_draw_per_head_is_ternary_times_the_head_max():
    q, kv = _inputs()
    w, _ = bernoulli_queries(q, kv.num_kv_heads, draws=1, grouping="per-head", seed=3)
    alpha = q.abs().amax(-1, keepdim=True)
    ratio = w / alpha
    assert set(ratio.round().unique().tolist()) <= {-1.0, 0.0, 1.0}
    torch.testing.assert_close(ratio, ratio.round(), rtol=0, atol=1e-6)
    assert bool(((ratio == 0) | (torch.sign(ratio) == torch.sign(q))).all())


@pytest.mark.parametrize("value_stage", ["dense", "prop"])
def test_composition_agrees_with_the_reference_in_distribution(value_stage):
    """The composed kernel's mean output over seeds against the reference composition's
    (both are the same random estimator): within 5 combined standard errors."""
    q, kv = _inputs(batch=1, n=128, q_scale=2.0)
    reps, S = 48, 16
    call = BernoulliDecode(q, kv, draws=2, grouping="per-head", value_stage=value_stage,
                           S=S, tile=32, seed=1, stash_dtype=torch.float32)
    got = torch.stack([call(q, kv).clone() for _ in range(reps)])
    ref = torch.stack([
        sk.attention(q, kv, score="bernoulli", value=value_stage, draws=2,
                     grouping="per-head", S=S, tile=32, seed=100 + i).out
        for i in range(reps)])
    err = (got.var(0) / reps + ref.var(0) / reps).sqrt().clamp_min(1e-4)
    z = (got.mean(0) - ref.mean(0)).abs() / err
    assert float(z.max()) < 5.0, float(z.max())
    dense = sk.attention(q, kv, value="dense").out
    # neither is exact: the Bernoulli scores move the softmax
    assert float((got.mean(0) - dense).abs().max()) > 1e-3


def test_bad_inputs_are_clear_errors():
    q, kv = _inputs()
    with pytest.raises(InputError, match="grouping"):
        bernoulli_queries(q, 2, grouping="per-group")
    with pytest.raises(InputError, match="draws"):
        bernoulli_queries(q, 2, draws=0)
    with pytest.raises(InputError, match="multiple"):
        bernoulli_queries(q, 3)
    with pytest.raises(InputError, match="uniforms"):
        bernoulli_queries(q, 2, draws=2, uniforms=torch.rand(2, 4, 3, 16))
    with pytest.raises(InputError, match="value_stage"):
        BernoulliDecode(q, kv, value_stage="softmax")
    with pytest.raises(InputError, match="workspace"):
        bernoulli_queries(q[:1], 2, workspace=BernoulliWorkspace(q, 2))


@pytest.mark.parametrize("value_stage", ["dense", "sys"])
def test_harness_adapter_reports_the_bytes_moved_and_the_feature_fraction(value_stage):
    from santa_bench.kernel_adapters import bernoulli_prepare

    q, kv = _inputs()
    prepared = bernoulli_prepare(q, kv, seed=2, draws=1, value_stage=value_stage, S=16,
                                 tile=32, stash="fp32")
    assert prepared.run().shape == q.shape
    reads = prepared.reads()
    assert reads.k_read_fraction == 1.0  # token-major K: the score pass reads every feature
    fraction, unit = prepared.metrics["bernoulli_k_feature_fraction"]
    assert unit == "ratio" and 0.0 < fraction < 1.0
    if value_stage == "dense":
        assert reads.v_read_fraction == 1.0
    else:
        assert 0.0 < reads.v_read_fraction < 1.0


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRETED, reason="CUDA graphs: compiled, on a GPU")
def test_gpu_graph_replays_draw_fresh_masks_and_reset_replays():
    q, kv = _inputs(q_scale=2.0)
    ws = BernoulliWorkspace(q, kv.num_kv_heads, seed=4)
    bernoulli_queries(q, kv.num_kv_heads, workspace=ws)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w, _ = bernoulli_queries(q, kv.num_kv_heads, workspace=ws)
    ws.reset_rng(0)
    draws = []
    for _ in range(3):
        graph.replay()
        draws.append(w.clone())
    assert not torch.equal(draws[0], draws[1]) and not torch.equal(draws[1], draws[2])
    ws.reset_rng(0)
    graph.replay()
    assert torch.equal(w, draws[0])
    assert int(ws.ticket.item()) == 0 and int(ws.rng.item()) == 1
