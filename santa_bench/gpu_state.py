"""GPU clocks, power and temperature through NVML (``nvidia-ml-py``, imported as ``pynvml``).

Optional: without the package, without a driver, or where a query fails, every field is
None; reading the state never raises. The same kernel runs up to a few percent faster
or slower on another machine of the same model, and clocks, power limit and temperature
are what differ, so each GPU run records them (``run.json``: at its start and end; each
kernel case: after its timing).
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

# field -> (NVML query, scale): the query takes (pynvml, handle)
_QUERIES: dict[str, tuple[str, float]] = {
    "sm_clock_mhz": ("sm_clock", 1.0),
    "sm_clock_max_mhz": ("sm_clock_max", 1.0),
    "mem_clock_mhz": ("mem_clock", 1.0),
    "mem_clock_max_mhz": ("mem_clock_max", 1.0),
    "power_limit_w": ("power_limit", 1e-3),  # NVML reports milliwatts
    "power_w": ("power", 1e-3),
    "temperature_c": ("temperature", 1.0),
    "clocks_event_reasons": ("event_reasons", 1.0),
}
FIELDS: tuple[str, ...] = tuple(_QUERIES)
"""What :func:`gpu_state` returns: current and maximum SM and memory clocks (MHz), the
enforced power limit and the power drawn (W), the GPU temperature (C) and NVML's
clocks-event (throttle) reason bitmask (0: none; e.g. 0x20 software power cap, 0x40 HW
slowdown)."""
CASE_FIELDS: tuple[str, ...] = (
    "sm_clock_mhz", "mem_clock_mhz", "power_w", "temperature_c", "clocks_event_reasons"
)
"""The fields a kernel case's latency row records (the limits are in ``run.json``)."""


@functools.cache
def _nvml() -> ModuleType | None:
    """Returns pynvml, initialised once per process, or None where it is absent or fails."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no package, no driver, no permission
        return None
    return pynvml


def _handle(nvml: ModuleType, device: Any) -> Any:
    """NVML's handle of a CUDA device: by the UUID torch reports (NVML counts every GPU of
    the machine, CUDA_VISIBLE_DEVICES does not), else by index."""
    index = _cuda_index(device)
    try:
        import torch

        if torch.cuda.is_available():
            uuid = str(torch.cuda.get_device_properties(index).uuid)
            return nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else
                                                  f"GPU-{uuid}")
    except Exception:
        pass
    return nvml.nvmlDeviceGetHandleByIndex(index)


def _cuda_index(device: Any) -> int:
    """The CUDA index of ``device`` (an int, ``"cuda:1"``, a torch.device; None: current)."""
    if isinstance(device, int):
        return device
    try:
        import torch

        if device is None:
            return torch.cuda.current_device() if torch.cuda.is_available() else 0
        index = torch.device(device).index
        if index is None:
            return torch.cuda.current_device() if torch.cuda.is_available() else 0
        return int(index)
    except Exception:
        return 0


def _query(nvml: ModuleType, handle: Any, what: str) -> float | int:
    if what == "sm_clock":
        return nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)
    if what == "sm_clock_max":
        return nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM)
    if what == "mem_clock":
        return nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM)
    if what == "mem_clock_max":
        return nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_MEM)
    if what == "power_limit":
        return nvml.nvmlDeviceGetEnforcedPowerLimit(handle)
    if what == "power":
        return nvml.nvmlDeviceGetPowerUsage(handle)
    if what == "temperature":
        return nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
    if hasattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons"):  # what == "event_reasons"
        return nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
    return nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)  # older bindings


def gpu_state(device: Any = None) -> dict[str, float | int | None]:
    """Returns :data:`FIELDS` of a CUDA device (None: the current one); None for each
    field NVML cannot give."""
    state: dict[str, float | int | None] = dict.fromkeys(FIELDS)
    nvml = _nvml()
    if nvml is None:
        return state
    try:
        handle = _handle(nvml, device)
    except Exception:
        return state
    for field, (what, scale) in _QUERIES.items():
        try:
            value = _query(nvml, handle, what)
        except Exception:  # not supported on this GPU (e.g. power under MIG)
            continue
        state[field] = int(value) if scale == 1.0 else round(float(value) * scale, 1)
    return state


def gpu_state_columns(device: Any = None) -> dict[str, float | int | None]:
    """Returns :data:`CASE_FIELDS` of :func:`gpu_state` (a kernel case's row columns)."""
    state = gpu_state(device)
    return {field: state[field] for field in CASE_FIELDS}


def gpu_state_record(when: str, device: Any = None) -> dict[str, float | int | None]:
    """Returns :func:`gpu_state` as flat ``run.json`` fields ``gpu_<field>_<when>``."""
    return {f"gpu_{field}_{when}": value for field, value in gpu_state(device).items()}
