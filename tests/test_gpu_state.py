"""GPU clocks, power and temperature through a fake ``pynvml`` (no GPU needed): the values,
their units, fields NVML cannot give, the package or driver missing, the run record."""

from __future__ import annotations

import sys
import types

import pytest

from santa_bench import environment, gpu_state
from santa_bench.results import ResultStore


def _fake_pynvml(*, init_fails: bool = False, no_power: bool = False) -> types.ModuleType:
    nvml = types.ModuleType("pynvml")
    nvml.NVML_CLOCK_SM, nvml.NVML_CLOCK_MEM, nvml.NVML_TEMPERATURE_GPU = 1, 2, 0
    calls: list[str] = []

    def init() -> None:
        calls.append("init")
        if init_fails:
            raise RuntimeError("NVML Shared Library Not Found")

    def power(handle):
        if no_power:
            raise RuntimeError("Not Supported")
        return 612_345  # mW

    nvml.nvmlInit = init
    nvml.nvmlDeviceGetHandleByIndex = lambda index: ("gpu", index)
    nvml.nvmlDeviceGetHandleByUUID = lambda uuid: ("gpu", uuid)
    nvml.nvmlDeviceGetClockInfo = lambda h, kind: {1: 1755, 2: 3201}[kind]
    nvml.nvmlDeviceGetMaxClockInfo = lambda h, kind: {1: 1980, 2: 3201}[kind]
    nvml.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700_000
    nvml.nvmlDeviceGetPowerUsage = power
    nvml.nvmlDeviceGetTemperature = lambda h, sensor: 61
    nvml.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0x20
    nvml.calls = calls
    return nvml


@pytest.fixture
def use_nvml(monkeypatch):
    """Installs a fake pynvml (or None: the package missing) for one test."""

    def install(module: types.ModuleType | None) -> None:
        monkeypatch.setitem(sys.modules, "pynvml", module)
        gpu_state._nvml.cache_clear()

    yield install
    gpu_state._nvml.cache_clear()


def test_gpu_state_reads_clocks_power_and_temperature(use_nvml):
    fake = _fake_pynvml()
    use_nvml(fake)
    state = gpu_state.gpu_state(0)
    assert state == {
        "sm_clock_mhz": 1755, "sm_clock_max_mhz": 1980, "mem_clock_mhz": 3201,
        "mem_clock_max_mhz": 3201, "power_limit_w": 700.0, "power_w": 612.3,
        "temperature_c": 61, "clocks_event_reasons": 0x20,
    }
    gpu_state.gpu_state(0)
    assert fake.calls == ["init"]  # initialised once per process


def test_older_bindings_report_throttle_reasons(use_nvml):
    fake = _fake_pynvml()
    del fake.nvmlDeviceGetCurrentClocksEventReasons
    fake.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: 0x4
    use_nvml(fake)
    assert gpu_state.gpu_state(0)["clocks_event_reasons"] == 0x4


def test_a_field_nvml_cannot_give_is_none(use_nvml):
    use_nvml(_fake_pynvml(no_power=True))
    state = gpu_state.gpu_state(0)
    assert state["power_w"] is None and state["power_limit_w"] == 700.0


@pytest.mark.parametrize("module", [None, _fake_pynvml(init_fails=True)])
def test_without_nvml_every_field_is_none(use_nvml, module):
    use_nvml(module)
    assert gpu_state.gpu_state(0) == dict.fromkeys(gpu_state.FIELDS)
    assert gpu_state.gpu_state_columns() == dict.fromkeys(gpu_state.CASE_FIELDS)


def test_a_gpu_run_records_the_state_at_its_start(use_nvml, monkeypatch):
    use_nvml(_fake_pynvml())
    monkeypatch.setattr(environment, "_device_info", lambda: {"device": "cuda", "gpu_name": "X"})
    env = environment.collect_environment("santa-bench kernel")
    assert env["gpu_sm_clock_mhz_start"] == 1755 and env["gpu_power_limit_w_start"] == 700.0
    assert "gpu_sm_clock_mhz_start" not in environment.FINGERPRINT_FIELDS
    monkeypatch.setattr(environment, "_device_info", lambda: {"device": "cpu"})
    assert not any(k.startswith("gpu_sm") for k in environment.collect_environment("x"))


def test_annotate_run_adds_the_end_state(tmp_path, use_nvml):
    use_nvml(_fake_pynvml())
    store = ResultStore(tmp_path)
    env = {"device": "cuda", "gpu_name": "X", "torch": "2.11"}
    run = store.start_run(env, run_id="r1")
    store.annotate_run("r1", gpu_state.gpu_state_record("end", 0))
    (record,) = store.runs()
    assert record["gpu_temperature_c_end"] == 61
    assert record["env_fingerprint"] == run.env_fingerprint
    with pytest.raises(ValueError, match="fingerprint"):
        store.annotate_run("r1", {"gpu_name": "Y"})
    with pytest.raises(ValueError, match=r"no run\.json"):
        store.annotate_run("r2", {})
