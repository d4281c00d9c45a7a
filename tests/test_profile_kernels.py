"""scripts/profile_kernels.py on a CPU: its options' errors (one line, exit 2) and kernel
names (the profile itself needs a GPU)."""

import pytest

from conftest import load_script


@pytest.mark.parametrize(("argv", "message"), [
    (["--methods", "nope"], "unknown method 'nope'"),
    (["--methods", "quest", "--attn", "32/x/128"], "expected HEADS/KV_HEADS/HEAD_DIM"),
    (["--methods", "quest", "--shapes", "8by32k"], "expected BATCHxCTX"),
    (["--methods", "quest", "--calls", "0"], "--calls must be at least 1"),
])
def test_bad_options_are_one_line_errors(capsys, argv, message):
    script = load_script("profile_kernels")
    assert script.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_without_a_gpu_it_says_so(capsys, monkeypatch):
    script = load_script("profile_kernels")
    monkeypatch.setattr(script.torch.cuda, "is_available", lambda: False)
    assert script.main(["--methods", "quest:pages=64,oracle-topk"]) == 2
    assert capsys.readouterr().err == "error: needs a CUDA GPU\n"


def test_kernel_names_lose_their_arguments():
    script = load_script("profile_kernels")
    assert script._short("void at::native::fill_kernel<float>(float*)") == \
        "void at::native::fill_kernel"
    assert script._short("_indexed_stage1") == "_indexed_stage1"
    assert script._attn("28/4/128") == (28, 4, 128)
