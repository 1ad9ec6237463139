"""autotile: a code-generating CUDA kernel autotuner.

Importing autotile touches no GPU and does not need CuPy: rendering kernels and inspecting search spaces
work anywhere. The tuned kernels (`matmul`, `matvec`) and `tune` import CuPy when first called.
`set_float32_matmul_precision` / `get_float32_matmul_precision` set and read the process-wide float32
matmul precision ("highest", "high", "medium"), in PyTorch's words (`autotile.dispatch.precision`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotile.codegen.kernels import KERNELS
from autotile.codegen.kernels import get as get_kernel
from autotile.codegen.limits import PROFILES, DeviceLimits, profile
from autotile.codegen.space import Config, Problem, Space, load_space
from autotile.dispatch import first_call as _first_call
from autotile.dispatch.first_call import tune_at_first_call
from autotile.dispatch.precision import get_float32_matmul_precision, set_float32_matmul_precision
from autotile.dispatch.shape_log import record_shapes
from autotile.errors import (
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
from autotile.library.api import matmul, matvec, scaled_matmul
from autotile.runtime.device import live_device

if TYPE_CHECKING:
    from autotile.codegen.problem import ProblemKey
    from autotile.dispatch.select import Selection
    from autotile.tuning.api import tune

from autotile.version import __version__ as __version__

__all__ = [
    "AutotileError", "ArgumentError", "CacheError", "CompileError", "Config", "DeviceLimits",
    "DeviceUnavailableError", "InfeasibleConfigError", "InvalidValueError", "KERNELS", "PROFILES", "Problem",
    "Space", "SpaceDefinitionError", "UnknownNameError", "get_float32_matmul_precision", "get_kernel", "live_device",
    "load_space", "profile", "matmul", "matvec", "record_shapes", "render", "scaled_matmul",
    "set_float32_matmul_precision", "tune", "tune_at_first_call",
]


def __getattr__(name: str) -> Any:
    # `tune` lives in the tuning layer, which imports optuna: loaded when first asked for, so that
    # `import autotile` and a library call never load the tuner.
    if name == "tune":
        from autotile.tuning.api import tune

        return tune
    raise AttributeError(f"module 'autotile' has no attribute {name!r}")


def _tune_at_first_call(key: ProblemKey, device: DeviceLimits, cache: Any, fallback: Selection,
                        setting: str) -> Selection:
    # The library asks `dispatch.first_call` for a tuner; this one imports the tuning code (no optuna) the
    # first time a call on an untuned shape needs it.
    from autotile.tuning.at_first_call import tune_here

    return tune_here(key, device, cache, fallback, setting)


_first_call.register_tuner(_tune_at_first_call)


def render(kernel: str, config: str | dict | None = None, dtype: str = "float32", layout: str = "row",
           device: str | DeviceLimits | None = None, **overrides) -> str:
    """The CUDA source of `kernel` for a named config or a mapping (checked against the device's limits)."""
    from autotile.runtime import device as device_mod

    spec = get_kernel(kernel)
    space = spec.space
    problem = Problem(device_mod.resolve(device if device is not None else "h100"), dtype, layout)
    base = space.default_config(layout, problem) if config is None else space.config(config)
    cfg = space.with_overrides(base, overrides) if overrides else base
    space.check(cfg, problem)
    return spec.render(cfg, dtype, layout)
