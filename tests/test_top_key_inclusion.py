"""scripts/top_key_inclusion.py: how often SANTA++ draws read a head's heaviest key."""

import pytest
import torch

import santa_kernels as sk
from conftest import load_script
from santa_bench.methods import REGISTRY


def _script():
    return load_script("top_key_inclusion")


def _needle_problem(n: int = 512, d: int = 16, at: int = 200):
    """One sequence, 2 query heads on 1 KV head; every key small except one aligned with
    the query (the needle) at ``at``."""
    gen = torch.Generator().manual_seed(3)
    keys = 0.1 * torch.randn(1, n, 1, d, generator=gen)
    q = torch.zeros(1, 2, d)
    q[0, :, 0] = 4.0
    keys[0, at, 0, 0] = 4.0  # q.k = 16, / sqrt(16) = 4: about e^4 of the others' mass
    kv = sk.KVCache.contiguous(keys, keys.clone())
    return q, kv


def _params(**overrides):
    return REGISTRY.get("santapp").resolve_params(overrides)


def test_the_heaviest_key_leaves_out_the_first_and_last_positions():
    q, kv = _needle_problem()
    position, share = _script().heaviest_keys(q, kv, 4, 64)
    assert position.tolist() == [200, 200] and bool((share > 0.05).all())
    position, _ = _script().heaviest_keys(q, kv, 201, 64)  # past the needle: another key
    assert bool((position >= 201).all())
    with pytest.raises(ValueError, match="no position left"):
        _script().heaviest_keys(q, kv, 300, 300)


def test_inclusion_is_one_when_every_team_is_read_and_falls_with_few_teams():
    script = _script()
    q, kv = _needle_problem()
    position, _ = script.heaviest_keys(q, kv, 4, 64)
    teams = -(-(512 - 4 - 64) // 16)
    everything = script.inclusion(q, kv, _params(M=teams), position, seeds=4)
    assert everything.tolist() == [1.0, 1.0]
    # contiguous teams: the needle is rarely its team's leader, so one team in 28 finds it
    # about as often as any other team is drawn; the exact window always reads it
    few = script.inclusion(q, kv, _params(M=1), position, seeds=32)
    assert float(few.mean()) < 0.5
    window = script.inclusion(q, kv, _params(M=1, window=400), position, seeds=2)
    assert window.tolist() == [1.0, 1.0]


def test_bad_arguments_are_one_line_and_exit_2(capsys, tmp_path):
    main = _script().main
    assert main([str(tmp_path / "none.safetensors"), "--methods", "santa-prop"]) == 2
    assert "SANTA++ (santapp) configurations only" in capsys.readouterr().err
    assert main([str(tmp_path / "none.safetensors"), "--methods", "santapp:M=0"]) == 2
    assert "--methods" in capsys.readouterr().err
    assert main([str(tmp_path / "none.safetensors"), "--methods", "santapp"]) == 2
    assert "none.safetensors" in capsys.readouterr().err
