"""The GPU's SM clock and temperature, read before and after each measured point.

NVML through ctypes (``libnvidia-ml.so.1`` ships with the driver; no Python package needed),
so one read costs microseconds and can sit between points.  Where NVML is missing (a CPU box)
every read is None and rows say so.
"""

from __future__ import annotations

import ctypes
from typing import Any

_NVML_CLOCK_SM = 1
_NVML_TEMPERATURE_GPU = 0


class GpuState:
    def __init__(self, uuid: str | None = None, index: int = 0) -> None:
        self._lib: Any = None
        self._dev = ctypes.c_void_p()
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                return
            ok = 1
            if uuid:
                ok = lib.nvmlDeviceGetHandleByUUID(uuid.encode(), ctypes.byref(self._dev))
            if ok != 0:
                ok = lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self._dev))
            if ok == 0:
                self._lib = lib
        except (OSError, AttributeError):
            self._lib = None

    @property
    def available(self) -> bool:
        return self._lib is not None

    def read(self) -> dict[str, Any]:
        """``{"sm_mhz": int, "temp_c": int}``; None values where NVML cannot say."""
        out: dict[str, Any] = {"sm_mhz": None, "temp_c": None}
        if self._lib is None:
            return out
        v = ctypes.c_uint()
        if self._lib.nvmlDeviceGetClockInfo(self._dev, _NVML_CLOCK_SM, ctypes.byref(v)) == 0:
            out["sm_mhz"] = v.value
        if self._lib.nvmlDeviceGetTemperature(self._dev, _NVML_TEMPERATURE_GPU, ctypes.byref(v)) == 0:
            out["temp_c"] = v.value
        return out


def compute_capability(index: int = 0) -> int | None:
    """The GPU's compute capability as Triton writes it (9.0 -> 90), from NVML: no CUDA context
    is made.  None where NVML is missing or cannot say."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        if lib.nvmlInit_v2() != 0:
            return None
        dev = ctypes.c_void_p()
        major, minor = ctypes.c_int(), ctypes.c_int()
        if (lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(dev)) != 0
                or lib.nvmlDeviceGetCudaComputeCapability(dev, ctypes.byref(major),
                                                          ctypes.byref(minor)) != 0):
            return None
        return major.value * 10 + minor.value
    except (OSError, AttributeError):
        return None
