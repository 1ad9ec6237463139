"""autotile: a code-generating CUDA kernel autotuner.

Importing autotile touches no GPU and does not need CuPy: rendering kernels and inspecting search spaces
work anywhere. The tuned kernels (`matmul`, `matvec`) and `tune` import CuPy when first called.
`set_float32_matmul_precision` / `get_float32_matmul_precision` set and read the process-wide float32
matmul precision ("highest", "high", "medium"), in PyTorch's words (`autotile.precision`).
"""

from __future__ import annotations

from .api import tune
from .device import PROFILES, DeviceLimits, live_device, profile
from .errors import (
    ArgumentError,
    AutotileError,
    CacheError,
    CompileError,
    DeviceUnavailableError,
    InfeasibleConfigError,
    InvalidValueError,
    SpaceDefinitionError,
    UnknownNameError,
)
from .first_call import tune_at_first_call
from .kernels import KERNELS
from .kernels import get as get_kernel
from .ops import matmul, matvec
from .precision import get_float32_matmul_precision, set_float32_matmul_precision
from .space import Config, Problem, Space, load_space

__version__ = "0.1.0"

__all__ = [
    "AutotileError", "ArgumentError", "CacheError", "CompileError", "Config", "DeviceLimits",
    "DeviceUnavailableError", "InfeasibleConfigError", "InvalidValueError", "KERNELS", "PROFILES", "Problem",
    "Space", "SpaceDefinitionError", "UnknownNameError", "get_float32_matmul_precision", "get_kernel", "live_device",
    "load_space", "profile", "matmul", "matvec", "render", "set_float32_matmul_precision", "tune",
    "tune_at_first_call",
]


def render(kernel: str, config: str | dict | None = None, dtype: str = "float32", layout: str = "row",
           device: str | DeviceLimits | None = None, **overrides) -> str:
    """The CUDA source of `kernel` for a named config or a mapping (checked against the device's limits)."""
    from . import device as device_mod

    spec = get_kernel(kernel)
    space = spec.space
    problem = Problem(device_mod.resolve(device if device is not None else "h100"), dtype, layout)
    base = space.default_config(layout, problem) if config is None else space.config(config)
    cfg = space.with_overrides(base, overrides) if overrides else base
    space.check(cfg, problem)
    return spec.render(cfg, dtype, layout)
