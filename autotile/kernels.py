"""The kernel registry: for each kernel, its space, its problem shape, launch geometry, FLOP and byte
counts, inputs and float64 reference. Host-side only (NumPy); the GPU side lives in `build` and `bench`."""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, Callable

import numpy as np

from .errors import InvalidValueError, UnknownNameError
from .expr import ceil_div
from .render import render
from .space import DTYPE_SIZES, Config, Space, load_space


@dataclasses.dataclass(frozen=True)
class Launch:
    """Grid and block dimensions, and the dynamic shared memory in bytes, of one kernel launch."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_smem_bytes: int
    zero_output: bool  # split-K kernels add into the output, which must start at zero


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    name: str
    dims: tuple[str, ...]  # the shape's letters, for example ("M", "N", "K")
    launch: Callable[[Config, tuple[int, ...], Space, str, str], Launch]
    flops: Callable[[tuple[int, ...]], float]
    min_bytes: Callable[[tuple[int, ...], int], float]  # each input read once, the output written once
    # (shape, dtype, layout, generator, array module) -> inputs; NumPy or CuPy arrays alike
    make_inputs: Callable[[tuple[int, ...], str, str, Any, Any], tuple[Any, ...]]
    reference: Callable[[tuple[np.ndarray, ...], str], np.ndarray]  # float64 result from host inputs
    output_shape: Callable[[tuple[int, ...]], tuple[int, ...]]
    check_shapes: tuple[tuple[int, ...], ...]  # extra verification shapes: primes, 1, nothing a tile divides

    def kernel_args(self, inputs: tuple[Any, ...], out: Any, shape: tuple[int, ...]) -> tuple[Any, ...]:
        """The launch arguments: input and output arrays, then the sizes as 32-bit ints."""
        return (*inputs, out, *(np.int32(d) for d in shape))

    @property
    def space(self) -> Space:
        return _space(self.name)

    def render(self, config: Config, dtype: str = "float32", layout: str = "row") -> str:
        return render(self.space.template, self.name, config, dtype, layout, self.space.source_key(config))

    def parse_shape(self, text: str) -> tuple[int, ...]:
        """'4096x4096x4096' -> (4096, 4096, 4096); every size a positive integer."""
        parts = re.split(r"[x×X,]", text.strip())
        if len(parts) != len(self.dims) or not all(p.strip().isdigit() for p in parts):
            raise InvalidValueError(
                f"{self.name} shape {text!r} must be {'x'.join(self.dims)} with positive integers, "
                f"for example {'x'.join(['1024'] * len(self.dims))}")
        shape = tuple(int(p) for p in parts)
        if min(shape) < 1:
            raise InvalidValueError(f"{self.name} shape {text!r}: every size must be at least 1")
        return shape


@functools.lru_cache(maxsize=None)
def _space(name: str) -> Space:
    return load_space(name)


def _random(shape: tuple[int, ...], dtype: str, rng: Any) -> Any:
    """Uniform in [-1, 1): no zeros to hide unwritten outputs. `rng` is a NumPy or CuPy Generator."""
    return (rng.random(shape, dtype="float64") * 2.0 - 1.0).astype(dtype)


# -- matmul ------------------------------------------------------------------------------------------

def _matmul_launch(config: Config, shape: tuple[int, ...], space: Space, dtype: str, layout: str) -> Launch:
    M, N, K = shape
    c = config
    if c["MATH"] == "tf32x3":  # warps in a line; the kernel reads threadIdx.x only
        block = (32 * (c["BM"] // c["WM"]) * (c["BN"] // c["WN"]), 1, 1)
    else:
        block = (c["BN"] // c["TN"], c["BM"] // c["TM"], 1)
    tiles_m, tiles_n = ceil_div(M, c["BM"]), ceil_div(N, c["BN"])
    if c["SWIZZLE"] > 1:
        grid = (tiles_m * tiles_n, 1, c["SPLIT_K"])
    else:
        grid = (tiles_n, tiles_m, c["SPLIT_K"])
    dyn = _smem_bytes(config, space, dtype, layout) if c["smem"] == "dynamic" else 0
    return Launch(grid, block, dyn, c["SPLIT_K"] > 1)


def _matmul_inputs(shape, dtype, layout, rng, xp=np):
    M, N, K = shape
    return _random((M, K), dtype, rng), _random((K, N), dtype, rng)


def _matmul_reference(inputs, layout):
    a, b = inputs
    return a.astype(np.float64) @ b.astype(np.float64)


# -- matvec ------------------------------------------------------------------------------------------

def _matvec_launch(config: Config, shape: tuple[int, ...], space: Space, dtype: str, layout: str) -> Launch:
    M, K = shape
    c = config
    if layout == "row":
        block = (c["THREADS_K"], c["ROWS"], 1)
    else:
        block = (c["ROWS"] // c["VEC"], c["THREADS_K"], 1)
    grid = (ceil_div(M, c["ROWS"]), c["SPLIT_K"], 1)
    dyn = _smem_bytes(config, space, dtype, layout) if c["smem"] == "dynamic" else 0
    return Launch(grid, block, dyn, c["SPLIT_K"] > 1)


def _matvec_inputs(shape, dtype, layout, rng, xp=np):
    M, K = shape
    a = _random((M, K), dtype, rng)
    if layout == "col":
        a = xp.asfortranarray(a)
    return a, _random((K,), dtype, rng)


def _matvec_reference(inputs, layout):
    a, x = inputs
    return a.astype(np.float64) @ x.astype(np.float64)


def _smem_bytes(config: Config, space: Space, dtype: str, layout: str) -> int:
    from .device import PROFILES, DEFAULT_OFFLINE_PROFILE
    from .space import Problem

    # smem_bytes reads no device limit, so any profile gives the same number.
    return int(space.derive(config, Problem(PROFILES[DEFAULT_OFFLINE_PROFILE], dtype, layout))["smem_bytes"])


KERNELS: dict[str, KernelSpec] = {
    "matmul": KernelSpec(
        name="matmul", dims=("M", "N", "K"), launch=_matmul_launch,
        flops=lambda s: 2.0 * s[0] * s[1] * s[2],
        min_bytes=lambda s, size: float(s[0] * s[2] + s[2] * s[1] + s[0] * s[1]) * size,
        make_inputs=_matmul_inputs, reference=_matmul_reference,
        output_shape=lambda s: (s[0], s[1]),
        check_shapes=((131, 67, 257), (1, 97, 33), (61, 1, 7))),
    "matvec": KernelSpec(
        name="matvec", dims=("M", "K"), launch=_matvec_launch,
        flops=lambda s: 2.0 * s[0] * s[1],
        min_bytes=lambda s, size: float(s[0] * s[1] + s[1] + s[0]) * size,
        make_inputs=_matvec_inputs, reference=_matvec_reference,
        output_shape=lambda s: (s[0],),
        check_shapes=((1031, 2053), (1, 17), (29, 1))),
}


def get(kernel: str) -> KernelSpec:
    try:
        return KERNELS[kernel]
    except KeyError:
        raise UnknownNameError(f"unknown kernel {kernel!r}; kernels: {', '.join(KERNELS)}") from None


def tolerance(dtype: str, k: int) -> float:
    """Largest accepted ||out - ref|| / ||ref|| for a reduction of length `k` (the last dimension of both
    kernels' shapes, MxNxK and MxK): rounding grows about like sqrt(K) ulps for random data;
    the bound leaves a wide margin over that and stays far below what a wrong index gives (order 1)."""
    eps = float(np.finfo(dtype).eps)
    return max(64.0, 8.0 * float(np.sqrt(k))) * eps


__all__ = ["KERNELS", "KernelSpec", "Launch", "get", "tolerance", "DTYPE_SIZES"]


def compat_hash(kernel: str, space: Space | None = None) -> str:
    """The part of a cache key that says whether a stored config can still be read: the kernel and the
    names of its parameters (those without a default). Two finer checks are made per record by the library: whether the config
    still renders the kernel that was timed (`source_hash`, kept in the record: a template change that
    leaves a config's source alone keeps its entry, one that changes it retires the entry), and whether
    it was tuned with the same compiler (preferred; a record from another compiler is the fallback, as
    the kernel is the same and only its speed may differ)."""
    import hashlib

    space = space or get(kernel).space
    # Parameters with a default were added later; records made before them still read, so they stay out.
    required = [name for name, p in space.params.items() if not p.has_default]
    text = kernel + "\0" + ",".join(required)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def compiler_major(compiler: str) -> str:
    """'nvrtc-13.0' -> 'nvrtc-13'."""
    return compiler.split(".")[0]


def source_hash(source: str) -> str:
    """A short hash of a rendered kernel, kept with a tuned record to tell when the template changed."""
    import hashlib

    return hashlib.sha256(source.encode()).hexdigest()[:16]


def metric(kernel: str, shape: tuple[int, ...], dtype: str, time_ms: float) -> tuple[float, str]:
    """GFLOP/s for matmul (compute-bound), GB/s of the minimum traffic for matvec (memory-bound)."""
    spec = get(kernel)
    if kernel == "matmul":
        return spec.flops(shape) / (time_ms * 1e-3) / 1e9, "GFLOP/s"
    return spec.min_bytes(shape, DTYPE_SIZES[dtype]) / (time_ms * 1e-3) / 1e9, "GB/s"
