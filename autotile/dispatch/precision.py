"""The float32 matmul precision setting, in PyTorch's words (`torch.set_float32_matmul_precision`).

A *setting* says which arithmetic a float32 matmul may use; a *class* is what a kernel or a cached record
needs to be allowed:

- ``"highest"``: IEEE FP32 arithmetic only: the SIMT configs (``MATH: simt``, FP32 FMAs on the CUDA cores)
  and cuBLAS SGEMM/SGEMV as CuPy calls it by default (FP32 compute type, no TF32; a process that tells
  CuPy to allow TF32 changes what cuBLAS runs, which autotile does not check). No tensor-core instruction
  of autotile's runs.
- ``"high"`` (the default): also the tensor-core configs of ``MATH: tf32x3``, which split each FP32 operand
  into two TF32 parts and sum three products in FP32: FP32-level accuracy, not IEEE FP32 bit for bit.
- ``"medium"``: accepted for PyTorch compatibility, and allows exactly what ``"high"`` allows: autotile has
  no kernel below FP32-level accuracy (such as single-pass TF32 or bfloat16), so there is nothing more to
  allow.
- ``"emulated"``: what ``"high"`` allows, and, for float32 *and float64* matmul large enough to gain, the
  emulation on the int8 tensor cores (Ozaki scheme II, `autotile.library.emulation`), whose guard keeps
  every element within a native GEMM's error bound (elements it cannot vouch for are recomputed
  natively). The one setting that concerns float64; off by default.

A kernel needs ``"highest"`` or ``"high"`` (`CLASSES`); ``"medium"`` is a setting only. float64 and matvec
kernels are all IEEE: every setting allows them, and the setting changes nothing for them (it is still
checked). The process-wide setting starts as ``$AUTOTILE_FLOAT32_MATMUL_PRECISION`` where that is set
(read once, on first use), else ``"high"``; `set_float32_matmul_precision` changes it; a call's own
``precision=`` argument wins over both.

Pure Python; importing this module imports nothing heavy (no CuPy, no torch).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autotile.errors import InvalidValueError

if TYPE_CHECKING:
    from autotile.codegen.space import Space

ENV_VAR = "AUTOTILE_FLOAT32_MATMUL_PRECISION"
DEFAULT = "high"
SETTINGS = ("highest", "high", "medium", "emulated")  # strictest first
CLASSES = ("highest", "high")  # what a kernel can need; no kernel needs "medium"
# How far down a setting reaches, or how far down a class sits: a setting allows the classes at or below
# its own rank.
_RANK = {"highest": 0, "high": 1, "medium": 2, "emulated": 2}
# The setting under which float32 and float64 matmul may be emulated on the int8 tensor cores (the library
# decides where it pays); as to the kernels it allows, it is "medium".
EMULATED = "emulated"
# The one place that says what each value of the matmul space's MATH parameter needs. A MATH value missing
# here is refused (`needed` raises): a new math mode must say its class before any record of it is served.
MATH_PARAM = "MATH"
# wgmma_direct and mma compute the 16-bit (wgmma_direct also the 8-bit) types only, which no setting
# concerns (`needed` answers "highest" for them); as MATH values they are not IEEE FP32, so a float32 space
# under "highest" leaves them out.
MATH_CLASS: dict[str, str] = {"simt": "highest", "tf32x3": "high", "dmma": "highest", "wgmma": "high",
                              "skinny": "highest", "wgmma_direct": "high", "mma": "high"}

_lock = threading.Lock()
_setting: str | None = None  # None: not yet read from the environment


def _check(value: Any, name: str, choices: tuple[str, ...] = SETTINGS) -> str:
    if not isinstance(value, str) or value not in choices:
        raise InvalidValueError(f"{name} {value!r} is not one of {', '.join(choices)}")
    return value


def check(value: Any, *, name: str = "precision") -> str:
    """`value` if it is a setting ("highest", "high" or "medium"); else `InvalidValueError`, one line naming
    `name`, the value and the settings."""
    return _check(value, name)


def set_float32_matmul_precision(precision: str) -> None:
    """Set the process-wide float32 matmul precision: "highest" (IEEE FP32 only: SIMT kernels, cuBLAS
    SGEMM), "high" (also the FP32-level tf32x3 tensor-core kernels; the default), "medium" (as "high":
    autotile has no kernel below FP32-level accuracy) or "emulated" (as "high", and float32 and float64
    matmul emulated on the int8 tensor cores where that pays). Later calls without their own `precision=`
    use it."""
    global _setting
    value = check(precision)
    with _lock:
        _setting = value


def get_float32_matmul_precision() -> str:
    """The process-wide float32 matmul precision: as last set, else ``$AUTOTILE_FLOAT32_MATMUL_PRECISION``
    (read once), else "high". A bad value of the variable raises `InvalidValueError` naming it."""
    global _setting
    found = _setting  # the per-call path: one read of a module global, no lock
    if found is not None:
        return found
    with _lock:
        if _setting is None:
            raw = os.environ.get(ENV_VAR, "")
            # A value typed in a shell: case and surrounding blanks do not matter there.
            value = raw.strip().lower() or DEFAULT
            if value not in SETTINGS:
                raise InvalidValueError(f"{ENV_VAR}={raw!r} is not one of {', '.join(SETTINGS)}")
            _setting = value
        return _setting


def _reset() -> None:
    """Forget the process-wide setting, so that the next read takes the environment again (for tests)."""
    global _setting
    with _lock:
        _setting = None


def resolve(precision: str | None, *, name: str = "precision") -> str:
    """The setting a call runs under: `precision` itself, checked, or the process-wide one where None."""
    if precision is None:
        return get_float32_matmul_precision()
    if precision in _RANK:  # the common case first: a dict lookup
        return precision
    return check(precision, name=name)


def allows(setting: str, needed_class: str) -> bool:
    """Whether `setting` lets a kernel that needs `needed_class` run."""
    return _RANK[_check(needed_class, "needed precision class", CLASSES)] <= _RANK[check(setting)]


def loosest(setting: str) -> str:
    """The least strict class `setting` allows ("medium" -> "high"): two settings with the same answer
    allow the same kernels (a tuning study is bound to this, not to the setting's name)."""
    rank = _RANK[check(setting)]
    return max((c for c in CLASSES if _RANK[c] <= rank), key=_RANK.__getitem__)


def needed(kernel: str, dtype: str, config: Mapping[str, Any] | None, implementation: str = "generated") -> str:
    """The class a config (or cuBLAS) needs for `kernel` on `dtype`: cuBLAS and every dtype but float32
    compute in their own type's arithmetic ("highest": float64, and the 16-bit types' float32 sums); a
    generated float32 config needs what its MATH value needs (`MATH_CLASS`), and a config without
    MATH (matvec, or a matmul record made before MATH existed, which ran SIMT) needs "highest"."""
    if implementation == "cublas" or dtype != "float32" or config is None:
        return "highest"
    math = config.get(MATH_PARAM)
    if math is None:
        return "highest"
    try:
        return MATH_CLASS[str(math)]
    except KeyError:
        raise InvalidValueError(f"{kernel} {MATH_PARAM}={math!r} has no precision class; known: "
                                f"{', '.join(MATH_CLASS)}") from None


def math_choices(space: Space, dtype: str, setting: str) -> list[Any] | None:
    """The MATH values `setting` allows in `space` for `dtype`, or None where the setting narrows nothing
    (no MATH parameter, a dtype other than float32, or every value allowed)."""
    param = space.params.get(MATH_PARAM)
    if param is None or dtype != "float32":
        return None
    allowed = [v for v in param.choices if allows(setting, needed(space.kernel, dtype, {MATH_PARAM: v}))]
    return None if len(allowed) == len(param.choices) else allowed


def restricted(space: Space, dtype: str, setting: str) -> Space:
    """`space` narrowed to what `setting` allows (through `Space.restricted`, the tuner's `fix`): under
    "highest", MATH=simt only. Raises `InvalidValueError` where nothing the space has is allowed (a
    `fix` of MATH=tf32x3 under "highest")."""
    allowed = math_choices(space, dtype, setting)
    if allowed is None:
        return space
    if not allowed:
        have = ", ".join(map(str, space.params[MATH_PARAM].choices))
        can = ", ".join(m for m, c in MATH_CLASS.items() if allows(setting, c))
        raise InvalidValueError(f"precision {setting!r} allows {MATH_PARAM} {can} only, and the space's "
                                f"{MATH_PARAM} choices are {have}")
    return space.restricted({MATH_PARAM: allowed})


def applies(kernel: str, dtype: str) -> bool:
    """Whether the setting can change what runs for `kernel` on `dtype` (float32 matmul: it has MATH)."""
    found = _applies.get((kernel, dtype))
    if found is None:
        from autotile.codegen import kernels

        found = _applies[(kernel, dtype)] = math_choices(kernels.get(kernel).space, dtype, "highest") is not None
    return found


_applies: dict[tuple[str, str], bool] = {}


__all__ = ["CLASSES", "DEFAULT", "EMULATED", "ENV_VAR", "MATH_CLASS", "SETTINGS", "allows", "applies", "check",
           "get_float32_matmul_precision", "loosest", "math_choices", "needed", "resolve", "restricted",
           "set_float32_matmul_precision"]
