"""The tuned-kernel library: `matmul(A, B)` and `matvec(A, x)` on CuPy arrays.

The config for a call comes from the tuning cache (exact shape, else the nearest tuned shape, its K
splits raised where the new shape would leave the GPU emptier, else the device's shipped default) or, failing all, from the space's built-in safe default. Everything a call
needs after the first (compiled kernel, launch geometry) is memoized per device, dtype, layout and shape,
so the host work per call is a dictionary lookup and one launch.

Inputs: CuPy arrays, or any object CuPy takes without copying (``__cuda_array_interface__``, DLPack
such as PyTorch CUDA tensors). Non-contiguous inputs are copied to a contiguous array first (one extra
pass over the data); `out` must be contiguous, as the kernel writes it directly.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np

from . import build, kernels
from .errors import ArgumentError, DeviceUnavailableError
from .space import Config

_SUPPORTED = ("float32", "float64")


@dataclasses.dataclass(frozen=True)
class Selection:
    """The config a call runs and where it came from: exact, nearest, device default or built-in."""

    config: Config
    source: str
    tuned_shape: tuple[int, ...] | None


@dataclasses.dataclass(frozen=True)
class _Prepared:
    kernel: Any
    launch: kernels.Launch
    selection: Selection
    sizes: tuple[Any, ...]  # the shape as the kernel's 32-bit int arguments


_lock = threading.Lock()
_prepared: dict[tuple[Any, ...], _Prepared] = {}
_device_info: dict[int, tuple[str, Any]] = {}


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


def _device(cupy: Any) -> tuple[str, Any]:
    dev_id = cupy.cuda.Device().id
    info = _device_info.get(dev_id)
    if info is None:
        from .device import live_device

        limits = live_device(dev_id)
        info = _device_info[dev_id] = (limits.fingerprint, limits)
    return info


def select_config(kernel: str, dtype: str, layout: str, shape: tuple[int, ...], device: str | None = None,
                  cache: Any = None, limits: Any = None) -> Selection:
    """The config the library runs for this problem on this device (a cache lookup, then the default)."""
    from .cache import TuningCache

    spec = kernels.get(kernel)
    if device is None:
        device, limits = _device(_cupy())
    cache = cache if cache is not None else TuningCache()

    def still_current(record: Any) -> bool:
        # The record's kernel must render to the source that was timed: after a template change that
        # touches this config, the entry is stale and the next candidate (or the default) is used.
        try:
            config = spec.space.config(record.config)
        except Exception:
            return False
        return record.environment.get("source_sha") == kernels.source_hash(spec.render(config, dtype, layout))

    compiler = kernels.compiler_major(build.compiler_version())

    def same_compiler(record: Any) -> bool:
        return kernels.compiler_major(str(record.environment.get("compiler", ""))) == compiler and still_current(record)

    compat = kernels.compat_hash(kernel)
    found = cache.lookup(device, kernel, dtype, layout, shape, compat, accept=same_compiler)
    if found is None:
        found = cache.lookup(device, kernel, dtype, layout, shape, compat, accept=still_current)
        if found is not None:
            found = (found[0], f"{found[1]}, tuned with {found[0].environment.get('compiler', 'another compiler')}")
    if found is not None:
        record, how = found
        try:
            config = spec.space.config(record.config)
        except Exception:
            config = None  # a record whose config no longer parses: fall through to the default
        if config is not None:
            tuned_shape = tuple(record.shape)
            if tuned_shape != tuple(shape):
                refilled = keep_grid_filled(kernel, config, tuned_shape, tuple(shape), dtype, layout)
                if refilled != config:
                    how += f", SPLIT_K raised {config['SPLIT_K']}->{refilled['SPLIT_K']}"
                    config = refilled
            return Selection(config, how, tuned_shape)
    from .space import Problem

    limits = _device(_cupy())[1] if limits is None else limits
    return Selection(spec.space.default_config(layout, Problem(limits, dtype, layout)), "built-in default", None)


MIN_K_PER_SPLIT = 128  # elements of K per split below which more splits only add atomics


def keep_grid_filled(kernel: str, config: Config, tuned_shape: tuple[int, ...], shape: tuple[int, ...],
                     dtype: str = "float32", layout: str = "row") -> Config:
    """A nearest-shape config, its K splits raised where the new shape would launch under half the blocks
    it was tuned with (fewer rows, say): the smallest SPLIT_K that restores the tuned block count, with
    at least MIN_K_PER_SPLIT of K each. Only ever raises SPLIT_K, so a shape that fills the GPU keeps the
    tuned config. (Measured cause: on an H200, column-major matvec 20000x3000 ran at 0.69x the speed of a
    config tuned for it when served 65536x4096's config, whose only difference was SPLIT_K 1 against 8.)"""
    import math

    spec = kernels.get(kernel)
    if "SPLIT_K" not in config:
        return config

    def blocks(c: Config, s: tuple[int, ...]) -> int:
        return math.prod(spec.launch(c, s, spec.space, dtype, layout).grid)

    target = blocks(config, tuned_shape)
    if 2 * blocks(config, shape) >= target:
        return config
    choices = sorted(v for v in spec.space.params["SPLIT_K"].choices if v > config["SPLIT_K"])
    best = config
    for split in choices:
        if shape[-1] < split * MIN_K_PER_SPLIT:
            break
        best = spec.space.with_overrides(config, {"SPLIT_K": split})
        if blocks(best, shape) >= target:
            break
    return best


def _prepare(kernel: str, dtype: str, layout: str, shape: tuple[int, ...]) -> _Prepared:
    # The per-call path: one cheap runtime query and a dictionary lookup.
    cupy = _cupy()
    key = (cupy.cuda.runtime.getDevice(), kernel, dtype, layout, shape)
    prepared = _prepared.get(key)
    if prepared is not None:
        return prepared
    fingerprint, limits = _device(cupy)
    spec = kernels.get(kernel)
    selection = select_config(kernel, dtype, layout, shape, fingerprint, limits=limits)
    config = selection.config
    from .space import Problem

    problem = Problem(limits, dtype, layout)
    if not spec.space.is_feasible(config, problem):
        config = spec.space.default_config(layout, problem)
        selection = Selection(config, "built-in default (cached config infeasible here)", None)
    compiled = build.compile_kernel(spec.render(config, dtype, layout), "autotile_" + kernel)
    launch = spec.launch(config, shape, spec.space, dtype, layout)
    build.allow_dynamic_smem(compiled, launch.dynamic_smem_bytes)
    prepared = _Prepared(compiled, launch, selection, tuple(_i32(d) for d in shape))
    with _lock:
        _prepared[key] = prepared
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


def _run(prepared: _Prepared, arrays: tuple[Any, ...], out: Any) -> Any:
    launch = prepared.launch
    if launch.zero_output:
        out.fill(0)
    prepared.kernel(launch.grid, launch.block, (*arrays, out, *prepared.sizes),
                    shared_mem=launch.dynamic_smem_bytes)
    return out


def matmul(A: Any, B: Any, out: Any = None) -> Any:
    """C = A @ B for 2-D float32 or float64 CuPy arrays A (M x K) and B (K x N); returns C (M x N)."""
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
    return _run(_prepare("matmul", dtype, "row", (M, N, K)), (A, B), out)


def matvec(A: Any, x: Any, out: Any = None) -> Any:
    """y = A @ x for a 2-D A (M x K, C- or Fortran-ordered) and a 1-D x (K); returns y (M)."""
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
    return _run(_prepare("matvec", dtype, layout, (M, K)), (A, x), out)


def _i32(n: int) -> Any:
    if n >= 2**31:
        raise ArgumentError(f"size {n} exceeds the 32-bit index range of the generated kernels (2**31 - 1)")
    return np.int32(n)


def selection_for(kernel: str, dtype: str, layout: str, shape: tuple[int, ...]) -> Selection:
    """Which config the library would run (compiling it, as a call would), for inspection and tests."""
    return _prepare(kernel, dtype, layout, tuple(shape)).selection


def forget() -> None:
    """Drop memoized kernels and selections (after tuning in the same process)."""
    with _lock:
        _prepared.clear()
