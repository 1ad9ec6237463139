"""The tuned-kernel library: `matmul(A, B)` and `matvec(A, x)` on CuPy arrays.

What a call runs (a generated config, or cuBLAS) is chosen by the selection chain (`autotile.select`:
exact tuned shape, the shape database's model, nearest tuned shape, the device's default, the built-in
default) and prepared through the one implementation interface
(`autotile.impl`). Everything a call needs after the first (the selection, the compiled kernel, its launch
geometry) is memoized per device and problem, so the host work per call is a dictionary lookup and one
launch.

Float32 matmul runs under a precision setting, in PyTorch's words (`autotile.precision`): a call's
``precision=`` ("highest", "high" or "medium"), else the process-wide setting
(`autotile.set_float32_matmul_precision`, ``$AUTOTILE_FLOAT32_MATMUL_PRECISION``, else "high"). Under
"highest" only IEEE FP32 arithmetic runs (SIMT kernels, cuBLAS SGEMM); "high" and "medium" also allow the
FP32-level tf32x3 tensor-core kernels. For float64 and matvec every kernel is IEEE: the setting is checked
and changes nothing.

Inputs: CuPy arrays, or any object CuPy takes without copying (``__cuda_array_interface__``, DLPack
such as PyTorch CUDA tensors). Non-contiguous inputs are copied to a contiguous array first (one extra
pass over the data); `out` must be contiguous, as the kernel writes it directly.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from . import precision as precision_mod
from .errors import ArgumentError, DeviceUnavailableError
from .impl import Runner
from .problem import MAX_DIM, ProblemKey

if TYPE_CHECKING:  # the selection chain reads the cache (filelock, platformdirs): imported on first call
    from .select import Selection

_SUPPORTED = ("float32", "float64")


@dataclasses.dataclass(frozen=True)
class _Prepared:
    runner: Runner
    selection: Selection


_lock = threading.Lock()
_prepared: dict[tuple[Any, ...], _Prepared] = {}
_device_limits: dict[int, Any] = {}


_cupy_module: Any = None


def _cupy() -> Any:
    global _cupy_module
    if _cupy_module is None:
        try:
            import cupy
        except ImportError as exc:
            raise DeviceUnavailableError(
                f"autotile.matmul/matvec need CuPy ({exc}); install autotile[cuda12] or autotile[cuda13]") from None
        _cupy_module = cupy
    return _cupy_module


def _as_device_array(cupy: Any, value: Any, name: str) -> Any:
    if isinstance(value, cupy.ndarray):
        return value
    if hasattr(value, "__cuda_array_interface__"):
        return cupy.asarray(value)  # shares the memory
    if hasattr(value, "__dlpack__") and hasattr(value, "__dlpack_device__"):
        device_type = value.__dlpack_device__()[0]
        if device_type in (2, 13):  # kDLCUDA, kDLCUDAManaged
            return cupy.from_dlpack(value)
    kind = type(value).__module__.split(".")[0] + "." + type(value).__name__
    raise ArgumentError(f"{name} is a {kind} on the host; pass a CuPy array (cupy.asarray({name}) copies it "
                        "to the GPU) or a CUDA tensor")


_DTYPE_NAMES = {np.dtype(name): name for name in _SUPPORTED}


def _check_dtype(name: str, arr: Any) -> str:
    dtype = _DTYPE_NAMES.get(arr.dtype)
    if dtype is None:
        raise ArgumentError(f"{name} has dtype {arr.dtype}; autotile supports {', '.join(_SUPPORTED)}")
    return dtype


def _device(cupy: Any) -> Any:
    dev_id = cupy.cuda.Device().id
    limits = _device_limits.get(dev_id)
    if limits is None:
        from .device import live_device

        limits = _device_limits[dev_id] = live_device(dev_id)
    return limits


def _prepare(kernel: str, dtype: str, layout: str, shape: tuple[int, ...], setting: str | None = None) -> _Prepared:
    """What runs `kernel` on this problem under the precision `setting` (resolved by the caller; None: the
    process-wide one), prepared once."""
    # The per-call path: one cheap runtime query and a dictionary lookup on plain values (a ProblemKey,
    # which validates, is made only on the first call of a problem).
    if setting is None:
        setting = precision_mod.get_float32_matmul_precision()
    cupy = _cupy()
    memo_key = (cupy.cuda.runtime.getDevice(), kernel, dtype, layout, shape, setting)
    prepared = _prepared.get(memo_key)
    if prepared is not None:
        return prepared
    if max(shape) > MAX_DIM:
        raise ArgumentError(f"size {max(shape)} exceeds the 32-bit index range of the generated kernels "
                            f"({MAX_DIM})")
    from . import first_call
    from .select import select

    key = ProblemKey(kernel, dtype, layout, shape)
    device = _device(cupy)
    selection = select(key, device, precision=setting)
    if first_call.enabled() and not (selection.source == "exact"):
        from .cache import TuningCache

        selection = first_call.tune_here(key, device, TuningCache(), selection, setting)
    prepared = _Prepared(selection.implementation_object().prepare(key), selection)
    with _lock:
        _prepared[memo_key] = prepared
    return prepared


def _check_out(cupy: Any, out: Any, shape: tuple[int, ...], dtype: str) -> Any:
    if out is None:
        return cupy.empty(shape, dtype=dtype)
    out = _as_device_array(cupy, out, "out")
    if tuple(out.shape) != shape or str(out.dtype) != dtype:
        raise ArgumentError(f"out has shape {tuple(out.shape)} and dtype {out.dtype}; expected {shape} {dtype}")
    if not out.flags.c_contiguous:
        raise ArgumentError("out must be C-contiguous: the kernel writes it in place")
    return out


def matmul(A: Any, B: Any, out: Any = None, precision: str | None = None) -> Any:
    """C = A @ B for 2-D float32 or float64 CuPy arrays A (M x K) and B (K x N); returns C (M x N).

    `precision`: "highest" (IEEE FP32 only), "high" (also the FP32-level tf32x3 tensor-core kernels) or
    "medium" (as "high"); None takes the process-wide setting. float64 is IEEE under every setting."""
    setting = precision_mod.resolve(precision)  # checked first: a bad value is an error whatever the arrays
    cupy = _cupy()
    A, B = _as_device_array(cupy, A, "A"), _as_device_array(cupy, B, "B")
    if A.ndim != 2 or B.ndim != 2:
        raise ArgumentError(f"matmul takes 2-D arrays; got A with {A.ndim} and B with {B.ndim} dimensions")
    (M, K), (K2, N) = A.shape, B.shape
    if K != K2:
        raise ArgumentError(f"matmul shapes do not match: A is {M}x{K}, B is {K2}x{N} ({K} != {K2})")
    dtype = _check_dtype("A", A)
    if _check_dtype("B", B) != dtype:
        raise ArgumentError(f"A is {dtype} and B is {B.dtype}; both must have the same dtype")
    if min(M, N, K) == 0:
        return cupy.zeros((M, N), dtype=dtype) if out is None else out.fill(0) or out
    if not A.flags.c_contiguous:
        A = cupy.ascontiguousarray(A)
    if not B.flags.c_contiguous:
        B = cupy.ascontiguousarray(B)
    out = _check_out(cupy, out, (M, N), dtype)
    _prepare("matmul", dtype, "row", (M, N, K), setting).runner.run((A, B), out)
    return out


def matvec(A: Any, x: Any, out: Any = None, precision: str | None = None) -> Any:
    """y = A @ x for a 2-D A (M x K, C- or Fortran-ordered) and a 1-D x (K); returns y (M).

    `precision` is checked as `matmul`'s is, and changes nothing: every matvec kernel is IEEE."""
    setting = precision_mod.resolve(precision)
    cupy = _cupy()
    A, x = _as_device_array(cupy, A, "A"), _as_device_array(cupy, x, "x")
    if A.ndim != 2 or x.ndim != 1:
        raise ArgumentError(f"matvec takes a 2-D A and a 1-D x; got {A.ndim}-D and {x.ndim}-D")
    M, K = A.shape
    if x.shape[0] != K:
        raise ArgumentError(f"matvec shapes do not match: A is {M}x{K}, x has {x.shape[0]} elements")
    dtype = _check_dtype("A", A)
    if _check_dtype("x", x) != dtype:
        raise ArgumentError(f"A is {dtype} and x is {x.dtype}; both must have the same dtype")
    if min(M, K) == 0:
        return cupy.zeros((M,), dtype=dtype) if out is None else out.fill(0) or out
    if A.flags.c_contiguous:
        layout = "row"
    elif A.flags.f_contiguous:
        layout = "col"
    else:
        A, layout = cupy.ascontiguousarray(A), "row"
    if not x.flags.c_contiguous:
        x = cupy.ascontiguousarray(x)
    out = _check_out(cupy, out, (M,), dtype)
    _prepare("matvec", dtype, layout, (M, K), setting).runner.run((A, x), out)
    return out


def selection_for(kernel: str, dtype: str, layout: str, shape: tuple[int, ...],
                  precision: str | None = None) -> Selection:
    """Which config the library runs for a problem on the current GPU under the precision setting (None:
    the process-wide one), preparing it as a call would."""
    return _prepare(kernel, dtype, layout, tuple(shape), precision_mod.resolve(precision)).selection


def forget() -> None:
    """Drop memoized kernels and selections (after tuning in the same process)."""
    with _lock:
        _prepared.clear()
