"""The kernel registry: for each kernel, its space, its problem shape, launch geometry, FLOP and byte
counts, inputs and float64 reference. Host-side only (NumPy); the GPU side lives in `build` and `bench`."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any, Callable

import numpy as np

from autotile.codegen import dtypes
from autotile.codegen.expr import ceil_div
from autotile.codegen.problem import KERNEL_DIMS, canonical_layout, parse_shape
from autotile.codegen.render import kernel_function_name, render
from autotile.codegen.space import DEVICE_DERIVED, DTYPE_SIZES, Config, Space, load_space
from autotile.codegen.tensor_map import TensorBox
from autotile.errors import UnknownNameError


@dataclasses.dataclass(frozen=True)
class Launch:
    """Grid and block dimensions, and the dynamic shared memory in bytes, of one kernel launch; with
    SPLIT_REDUCE=last_block, the sizes of the two buffers the launcher passes after the sizes."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_smem_bytes: int
    zero_output: bool  # split-K kernels with SPLIT_REDUCE=atomic add into the output, which must start at zero
    workspace_elems: int = 0  # last_block: partial results, in elements of the output's dtype (0: none)
    tickets: int = 0  # last_block: one unsigned int counter per output tile, zero between launches (0: none)
    tensor_maps: tuple[TensorBox, ...] = ()  # TMA copies of the inputs (wgmma LOADER=tma, wgmma_direct): one map each
    workspace_dtype: str | None = None  # last_block: the partial results' type where it is not the output's
    # wgmma LOADER=presplit: the split operands' K stride (`presplit_k`, K rounded up to 32: a row of the
    # workspace holds big then small, 2 presplit_k floats); its tensor maps (`tensor_maps`) read the workspace
    presplit_k: int = 0
    presplit_transposed: tuple[bool, bool] = (False, False)  # A stored column-major, B stored N x K (the "t"s)
    # a persistent wgmma kernel of a batch: its matrices, the launcher's last argument (the grid holds none)
    persistent_batch: int = 0


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    name: str
    dims: tuple[str, ...]  # the shape's letters, for example ("M", "N", "K")
    # (config, shape, geometry) -> the grid; the block and shared memory come from the geometry alone
    grid: Callable[[Config, tuple[int, ...]], tuple[int, int, int]]
    flops: Callable[[tuple[int, ...]], float]
    min_bytes: Callable[[tuple[int, ...], int], float]  # each input read once, the output written once
    # (shape, dtype, layout, generator, array module) -> inputs; NumPy or CuPy arrays alike
    make_inputs: Callable[[tuple[int, ...], str, str, Any, Any], tuple[Any, ...]]
    output_shape: Callable[[tuple[int, ...]], tuple[int, ...]]
    check_shapes: tuple[tuple[int, ...], ...]  # extra verification shapes: primes, 1, nothing a tile divides
    # (config, shape) -> (workspace elements, tickets) of a SPLIT_REDUCE=last_block launch
    split_buffers: Callable[[Config, tuple[int, ...]], tuple[int, int]]
    space_name: str = ""  # the search space (and template) it shares, if not its own: bmm is matmul's
    batched: bool = False  # the kernel takes a batch of problems along grid z (render's `batched`)

    def size_args(self, shape: tuple[int, ...]) -> tuple[Any, ...]:
        """The sizes as the kernel takes them, 32-bit ints: M, N, K (a batch's count is in the grid)."""
        return tuple(np.int32(d) for d in (shape[1:] if self.batched else shape))

    @staticmethod
    def operand_count(dtype: str) -> int:
        """Device arrays a launch reads: A and B (a matvec's A and x), then, for a scaled dtype (the 8-bit
        floats), A's and B's one-element float32 scales."""
        return 4 if dtypes.get(dtype).scaled else 2

    def kernel_args(self, inputs: tuple[Any, ...], out: Any, shape: tuple[int, ...],
                    buffers: tuple[Any, ...] = ()) -> tuple[Any, ...]:
        """The launch arguments: input arrays (A, B and, scaled, their scales), the output, the sizes as
        32-bit ints, (batched) the batch strides of A and B in elements (0: one matrix for the whole batch),
        then (last_block only) the workspace and the tickets."""
        strides = batch_strides(inputs) if self.batched else ()
        return (*inputs, out, *self.size_args(shape), *strides, *buffers)

    @staticmethod
    def reference(inputs: tuple[Any, ...], dtype: str | None = None) -> Any:
        """The float64 result of the same inputs (NumPy or CuPy arrays: the product runs where they are);
        `dtype` names what the arrays hold where their storage does not (the 8-bit floats' bytes): their
        scales multiply the product."""
        a, b, *scales = inputs
        product = to_float64(a, dtype) @ to_float64(b, dtype)
        for scale in scales:
            product = product * scale.astype("float64")  # one element: broadcast
        return product

    @property
    def space(self) -> Space:
        return _space(self.space_name or self.name)

    def geometry(self, config: Config, dtype: str = "float32", layout: str | None = None) -> dict[str, Any]:
        """The space's derived values for a config (threads, block_x, block_y, smem_bytes, tile strides,
        ...): the one source of the numbers that both the template and the launcher use."""
        return dict(_geometry(self.space_name or self.name, config, dtype, self.layout(layout)))

    def layout(self, layout: str | None) -> str:
        """The layout under its current name (None: the kernel's default, nn or row)."""
        return canonical_layout(self.name, layout) if layout is not None else self.space.layouts[0]

    @property
    def function_name(self) -> str:
        """The extern "C" name of the kernel its sources define (what a compile loads)."""
        return kernel_function_name(self.name)

    def render(self, config: Config, dtype: str = "float32", layout: str | None = None,
               variant: Mapping[str, Any] | None = None) -> str:
        """The source of `config`. `variant`: template variables beyond the space's parameters, for a kernel
        the library derives from a config (the int8 kernels' `RESIDUES`: each sum leaves as its residue
        modulo a `modulus` argument, for the emulated float64/float32 matmul); they join the config line."""
        layout = self.layout(layout)
        key = self.space.source_key(config)
        geometry = _geometry(self.space_name or self.name, config, dtype, layout)
        values: Mapping[str, Any] = config
        if variant:
            values = {**config, **variant}
            key += "".join(f",{name}={value}" for name, value in variant.items())
        return render(self.space.template, self.name, values, dtype, layout, key, geometry, batched=self.batched)

    def launch(self, config: Config, shape: tuple[int, ...], dtype: str = "float32", layout: str | None = None,
               sm_count: int | None = None) -> Launch:
        """Grid, block and dynamic shared memory of one launch of `config` on `shape`; a PERSISTENT config's
        grid holds at most a cluster per SM of the device's `sm_count` (all its tiles where None)."""
        g = _geometry(self.space_name or self.name, config, dtype, self.layout(layout))
        dynamic = int(g["smem_bytes"]) if config["smem"] == "dynamic" else 0
        grid, block = self.grid(config, shape), (int(g["block_x"]), int(g["block_y"]), 1)
        direct = config.get("MATH") == "wgmma_direct"
        persistent_batch = 0
        if config.get("PERSISTENT") and not direct:
            # wgmma: one line of blocks, each going through the tiles of every matrix in turn (the kernel's
            # `place`); the batch's size is an argument, as the grid no longer counts it
            tiles = grid[0] * grid[1] * grid[2]
            grid = (min(tiles, sm_count) if sm_count else tiles, 1, 1)
            persistent_batch = shape[0] if len(shape) == 4 else 0
        elif config.get("PERSISTENT") and sm_count:
            cluster = config.get("CLUSTER_M", 1)
            grid = (min(grid[0], max(sm_count // cluster, 1) * cluster), grid[1], grid[2])
        presplit = config.get("LOADER") == "presplit"
        if direct:
            maps: tuple[TensorBox, ...] = _direct_boxes(config, shape[-3:], self.layout(layout), DTYPE_SIZES[dtype])
        elif presplit:  # the copies read the workspace the split kernels write, batched or not
            maps = _presplit_boxes(config, shape)
        else:
            maps = _tensor_boxes(config, shape[-3:], self.layout(layout)) if config.get("LOADER") == "tma" else ()
        if len(shape) == 4 and direct:
            # a batch: 3-D maps, the batch their third coordinate. The tf32x3 wgmma template's batches load
            # through registers still (boxes of batch 0: the runner encodes none): a 3-D copy there alters
            # the kernels the shipped bmm databases timed, which wait for a survey on every GPU they cover.
            maps = tuple(dataclasses.replace(box, batch=shape[0]) for box in maps)
        split_k = presplit_k(shape[-1]) if presplit else 0
        named_layout = self.layout(layout)
        transposed = (named_layout[0] == "t", named_layout[1] == "t") if presplit else (False, False)
        if config["SPLIT_K"] > 1 and config.get("SPLIT_REDUCE", "atomic") == "last_block":
            workspace, tickets = self.split_buffers(config, shape)
            # partial sums are kept in the accumulator's type: float32 for the 16-bit types, int8's int32
            accumulator = dtypes.get(dtype).accumulator
            partial = accumulator if accumulator != dtype else None
            return Launch(grid, block, dynamic, False, workspace, tickets, maps, partial, split_k, transposed)
        return Launch(grid, block, dynamic, config["SPLIT_K"] > 1, tensor_maps=maps, presplit_k=split_k,
                      presplit_transposed=transposed, persistent_batch=persistent_batch)

    def parse_shape(self, text: str | tuple[int, ...]) -> tuple[int, ...]:
        """'4096x4096x4096' -> (4096, 4096, 4096); see `problem.parse_shape`."""
        return parse_shape(self.name, text)


@functools.lru_cache(maxsize=None)
def _space(name: str) -> Space:
    return load_space(name)


_DEVICE_DERIVED_NAMES = frozenset(name for name, _ in DEVICE_DERIVED)

# MATH=skinny keeps all of a block's rows of C in registers and reads B once per BM of them (BM of 64 at most):
# past SKINNY_MAX_ROWS rows of A it reads B several times and loses to every tiled kernel by far (measured on
# an H100, 2026-11-24: 0.29x cuBLAS at M = 30 with 4-row tiles), so it is neither timed
# (`dispatch.model.worth_timing`) nor drawn by the tuner there.
SKINNY_MAX_ROWS = 64


@functools.lru_cache(maxsize=4096)
def _geometry(kernel: str, config: Config, dtype: str, layout: str) -> dict[str, Any]:
    from autotile.codegen.limits import DEFAULT_OFFLINE_PROFILE, PROFILES
    from autotile.codegen.space import Problem

    space = _space(kernel)
    # The space's own derived values read no device limit, so any profile gives the same numbers; the
    # occupancy figures the device model adds are left out.
    derived = space.derive(config, Problem(PROFILES[DEFAULT_OFFLINE_PROFILE], dtype, layout))
    return {name: value for name, value in derived.items() if name not in _DEVICE_DERIVED_NAMES}


def _random(shape: tuple[int, ...], dtype: str, rng: Any) -> Any:
    """Uniform in [-1, 1): no zeros to hide unwritten outputs. `rng` is a NumPy or CuPy Generator. The
    16-bit and 8-bit floats are rounded from float32, and held as their storage (bfloat16: its bit
    patterns; the 8-bit floats: their bytes, [-4, 4) to use more of their exponents)."""
    values = rng.random(shape, dtype="float64") * 2.0 - 1.0
    if dtypes.get(dtype).is_ieee_wide:
        return values.astype(dtype)
    if dtypes.get(dtype).scaled:
        return dtypes.from_float32((values * 4.0).astype("float32"), dtype)
    if dtype == "int8":  # every value in [-128, 127] equally likely
        return dtypes.from_float32((values * 128.0 - 0.5).astype("float32"), dtype)
    return dtypes.from_float32(values.astype("float32"), dtype)


# -- matmul ------------------------------------------------------------------------------------------

def _matmul_grid(config: Config, shape: tuple[int, ...]) -> tuple[int, int, int]:
    M, N, _ = shape
    tiles_m, tiles_n = ceil_div(M, config["BM"]), ceil_div(N, config["BN"])
    if config.get("MATH") == "wgmma_direct":  # one line of clusters of vertically adjacent tiles, ordered by the
        cluster = config.get("CLUSTER_M", 1)  # kernel (the last cluster's rows may lie past M)
        return (cluster * ceil_div(tiles_m, cluster) * tiles_n, 1, config["SPLIT_K"])
    if config["SWIZZLE"] > 1:  # one line of blocks, ordered by the kernel (tile_origin in matmul_parts.j2)
        return (tiles_m * tiles_n, 1, config["SPLIT_K"])
    return (tiles_n, tiles_m, config["SPLIT_K"])


def _tensor_boxes(config: Config, shape: tuple[int, ...], layout: str) -> tuple[TensorBox, TensorBox]:
    """The TMA copies of a wgmma LOADER=tma kernel (matmul_wgmma.cu.j2): A, then B, as stored; each copy 32
    elements (128 bytes) along the contiguous dimension, by the tile's other extent (BK along K; BM or
    BN along M or N)."""
    M, N, K = shape
    BM, BN, BK = config["BM"], config["BN"], config["BK"]
    a = TensorBox(0, M, K, 32, BK) if layout in ("tn", "tt") else TensorBox(0, K, M, 32, BM)
    b = TensorBox(1, K, N, 32, BN) if layout in ("nt", "tt") else TensorBox(1, N, K, 32, BK)
    return a, b


# A LOADER=presplit workspace's parts start each row 128 bytes aligned, the width of one of their copies (32
# floats, 128-byte swizzle). With K rounded up to 4 floats only (the copies' least alignment), "high" ran 7
# random float32 shapes whose rounded K was an odd multiple of 4 at 1.5-1.75x SGEMM, and 7 whose rounded K was
# a multiple of 8 at 2.2-2.5x (H200, 2026-11-28); Nsight Compute on two of them: 6282x4602x10849 (K stride
# 10852) read 18.7 GB from DRAM, L2 hit rate 66%, tensor pipe 51% busy; 3799x7102x11046 (stride 11048) 4.7 GB,
# 83%, 97%. The same split held on `bench-emulation --dtype float32 --random 12 --seed 23`'s "high" column:
# 1.50-1.84x where the rounded K was an odd multiple of 4, 2.14-2.53x elsewhere.
PRESPLIT_K_ALIGN = 32


def presplit_k(k: int) -> int:
    """The K stride of a wgmma LOADER=presplit workspace's parts: `k` rounded up to `PRESPLIT_K_ALIGN` floats."""
    return -(-k // PRESPLIT_K_ALIGN) * PRESPLIT_K_ALIGN


def _presplit_boxes(config: Config, shape: tuple[int, ...]) -> tuple[TensorBox, ...]:
    """The TMA copies of a wgmma LOADER=presplit kernel: A's big and small parts, then B's, from the
    workspace the split kernels write (rows of M or N, each 2 presplit_k floats: big, then small; K-major in
    every layout); each copy 32 floats (128 bytes) of K by BM or BN rows. The boxes' `operand` indexes the
    workspace's four parts (`KernelRunner`); a batch's parts are one matrix per batch entry, or one shared."""
    *batch, M, N, K = shape
    stride = 2 * presplit_k(K)
    count = batch[0] if batch else 0
    rows = {0: M, 1: M, 2: N, 3: N}
    box_rows = {0: config["BM"], 1: config["BM"], 2: config["BN"], 3: config["BN"]}
    return tuple(TensorBox(part, K, rows[part], 32, box_rows[part], 4, count, stride) for part in range(4))


def _direct_boxes(config: Config, shape: tuple[int, ...], layout: str, element_bytes: int
                  ) -> tuple[TensorBox, ...]:
    """The TMA copies of a wgmma_direct kernel (matmul_wgmma_direct.cu.j2): A, then B, as stored; each copy
    128 bytes along the contiguous dimension (BK elements of K where it is K, else 64 of M or N) by BM or
    BN rows (K-contiguous) or BK rows of K (M- or N-contiguous). An 8-bit type's operand stored M- or
    N-contiguous has none: wgmma reads 8-bit operands K-major only, so the kernel's producer transposes it
    through registers (and in layout tn, both)."""
    M, N, K = shape
    BM, BN, BK = config["BM"], config["BN"], config["BK"]
    wide, size = 128 // element_bytes, element_bytes
    a_kmajor, b_kmajor = layout[0] == "n", layout[1] == "t"
    a = TensorBox(0, K, M, BK, BM, size) if a_kmajor else TensorBox(0, M, K, wide, BK, size)
    # CLUSTER_M = 2: each block of a pair copies half of B's K-contiguous tile (its rows) into both
    rows_b = BN // config.get("CLUSTER_M", 1)
    b = TensorBox(1, K, N, BK, rows_b, size) if b_kmajor else TensorBox(1, N, K, wide, BK, size)
    if element_bytes == 1:
        return tuple(box for box, kmajor in ((a, a_kmajor), (b, b_kmajor)) if kmajor)
    return a, b


def _matmul_split_buffers(config: Config, shape: tuple[int, ...]) -> tuple[int, int]:
    """SPLIT_K slices of M x N, indexed like C (the kernel stores and reads them in C's pattern; whole
    tiles would cost a short M up to BM / M times the traffic), and one ticket per output tile."""
    M, N, _ = shape
    return config["SPLIT_K"] * M * N, ceil_div(M, config["BM"]) * ceil_div(N, config["BN"])


def stored_transposed(x: Any, xp: Any) -> Any:
    """`x` (a matrix or a batch of matrices) with each matrix stored transposed: the same values, the last
    two dimensions column-major (what `W.T` of a row-major W gives)."""
    return xp.ascontiguousarray(x.swapaxes(-1, -2)).swapaxes(-1, -2)


def _matmul_inputs(shape, dtype, layout, rng, xp=np):
    *batch, M, N, K = shape
    a, b = _random((*batch, M, K), dtype, rng), _random((*batch, K, N), dtype, rng)
    layout = canonical_layout("bmm" if batch else "matmul", layout)
    operands = (stored_transposed(a, xp) if layout[0] == "t" else a,
                stored_transposed(b, xp) if layout[1] == "t" else b)
    if not dtypes.get(dtype).scaled:
        return operands
    # scales in [0.5, 2): not 1, so that a kernel that ignores them fails
    return (*operands, *(xp.asarray(rng.random(1, dtype="float64") * 1.5 + 0.5).astype("float32") for _ in "ab"))


def batch_strides(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """Elements between one matrix of each operand and the next, as 64-bit ints: 0 for a 2-D operand
    (one matrix for the whole batch)."""
    return tuple(np.int64(x.strides[0] // x.itemsize if x.ndim == 3 else 0) for x in inputs)


# -- bmm: matmul over a batch, along grid z -------------------------------------------------------------

def _bmm_grid(config: Config, shape: tuple[int, ...]) -> tuple[int, int, int]:
    x, y, z = _matmul_grid(config, shape[1:])
    return x, y, z * shape[0]


def _bmm_split_buffers(config: Config, shape: tuple[int, ...]) -> tuple[int, int]:
    workspace, tickets = _matmul_split_buffers(config, shape[1:])
    return shape[0] * workspace, shape[0] * tickets


# -- matvec ------------------------------------------------------------------------------------------

def _matvec_grid(config: Config, shape: tuple[int, ...]) -> tuple[int, int, int]:
    return (ceil_div(shape[0], config["ROWS"]), config["SPLIT_K"], 1)


def _matvec_split_buffers(config: Config, shape: tuple[int, ...]) -> tuple[int, int]:
    """SPLIT_K slices of M partial sums, and one ticket per block of ROWS rows (blockIdx.x)."""
    return config["SPLIT_K"] * shape[0], ceil_div(shape[0], config["ROWS"])


def _matvec_inputs(shape, dtype, layout, rng, xp=np):
    M, K = shape
    a = _random((M, K), dtype, rng)
    if layout == "col":
        a = xp.asfortranarray(a)
    return a, _random((K,), dtype, rng)


KERNELS: dict[str, KernelSpec] = {
    "matmul": KernelSpec(
        name="matmul", dims=KERNEL_DIMS["matmul"], grid=_matmul_grid,
        flops=lambda s: 2.0 * s[0] * s[1] * s[2],
        min_bytes=lambda s, size: float(s[0] * s[2] + s[2] * s[1] + s[0] * s[1]) * size,
        make_inputs=_matmul_inputs,
        output_shape=lambda s: (s[0], s[1]),
        check_shapes=((131, 67, 257), (1, 97, 33), (61, 1, 7)),
        split_buffers=_matmul_split_buffers),
    "bmm": KernelSpec(
        name="bmm", dims=KERNEL_DIMS["bmm"], grid=_bmm_grid,
        flops=lambda s: 2.0 * s[0] * s[1] * s[2] * s[3],
        min_bytes=lambda s, size: float(s[0] * (s[1] * s[3] + s[3] * s[2] + s[1] * s[2])) * size,
        make_inputs=_matmul_inputs,
        output_shape=lambda s: (s[0], s[1], s[2]),
        check_shapes=((3, 131, 67, 257), (2, 1, 97, 33), (5, 61, 1, 7)),
        split_buffers=_bmm_split_buffers, space_name="matmul", batched=True),
    "matvec": KernelSpec(
        name="matvec", dims=KERNEL_DIMS["matvec"], grid=_matvec_grid,
        flops=lambda s: 2.0 * s[0] * s[1],
        min_bytes=lambda s, size: float(s[0] * s[1] + s[1] + s[0]) * size,
        make_inputs=_matvec_inputs,
        output_shape=lambda s: (s[0],),
        check_shapes=((1031, 2053), (1, 17), (29, 1)),
        split_buffers=_matvec_split_buffers),
}


_WIDEN_SOURCE = r"""
extern "C" __global__ void autotile_widen(const float* __restrict__ x, double* __restrict__ y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = (double)x[i];
}
"""


def to_float64(x: Any, dtype: str | None = None) -> Any:
    """`x` as float64, denormals kept: NumPy's astype for host arrays; for a float32 CuPy array a kernel
    built with autotile's own options, because CuPy compiles its elementwise kernels (astype among them)
    with -ftz=true, which reads float32 denormals as zero, and a reference made that way is wrong exactly
    where the numerics are delicate. A uint16 array is bfloat16's storage (`dtypes`): its values are read
    as bfloat16 (exactly: every bfloat16 is a float32 with its low half zero); `dtype` an 8-bit float: the
    bytes are read as its values."""
    if dtype in dtypes.FLOAT8_DTYPES:
        return dtypes.to_float32(x, dtype).astype("float64")
    if str(x.dtype) == "uint16":
        return dtypes.to_float32(x, "bfloat16").astype("float64")
    if isinstance(x, np.ndarray) or str(x.dtype) != "float32":
        return x.astype("float64")
    import cupy

    from autotile.codegen import build

    src = cupy.ascontiguousarray(x)
    out = cupy.empty(src.shape, dtype=cupy.float64)
    if src.size:
        blocks = min((src.size + 255) // 256, 65535)
        build.compile_kernel(_WIDEN_SOURCE, "autotile_widen")((blocks,), (256,), (src, out, np.int64(src.size)))
    return out


def get(kernel: str) -> KernelSpec:
    try:
        return KERNELS[kernel]
    except KeyError:
        raise UnknownNameError(f"unknown kernel {kernel!r}; kernels: {', '.join(KERNELS)}") from None


def tolerance(dtype: str, k: int) -> float:
    """Largest accepted ||out - ref|| / ||ref|| for a reduction of length `k` (the last dimension of both
    kernels' shapes, MxNxK and MxK): rounding grows about like sqrt(K) ulps of the type the sums are kept
    in for random data, plus, where that is wider than the output (bfloat16, float16: float32 sums), one
    rounding of the output (half an ulp, here a whole one); the bound leaves a wide margin over that and
    stays far below what a wrong index gives (order 1)."""
    element = dtypes.get(dtype)
    if element.eps == 0.0:  # an integer type: exact
        return 0.0
    summed = max(64.0, 8.0 * float(np.sqrt(k))) * dtypes.get(element.accumulator).eps
    output = dtypes.get(element.output_name)  # the 8-bit floats' C is bfloat16
    return summed + (output.eps if element.accumulator != output.name else 0.0)


def poison(out: Any) -> None:
    """Fill `out` with NaN (bfloat16's storage with bfloat16's NaN; an int32 output with its most negative
    value, which no int8 product of a checked length reaches): an element a kernel does not write then
    fails every check."""
    kind = str(out.dtype)
    out.fill(0x7FC0 if kind == "uint16" else -(2**31) if kind == "int32" else float("nan"))


def compat_hash(kernel: str, space: Space | None = None) -> str:
    """The part of a cache key that says whether a stored config can still be read: the kernel and the
    names of its parameters (those without a default). Two finer checks are made per record by the
    selection chain (select.py): whether the config still renders the kernel that was timed
    (`source_hash`, kept in the record: a template change that leaves a config's source alone keeps its
    entry, one that changes it retires the entry), and whether it was tuned with the same compiler and
    compile options (preferred; a record from another compiler is the fallback, as the kernel is the
    same and only its speed may differ)."""
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
    """GFLOP/s for matmul and bmm (compute-bound), GB/s of the minimum traffic for matvec (memory-bound)."""
    spec = get(kernel)
    if kernel in ("matmul", "bmm"):
        return spec.flops(shape) / (time_ms * 1e-3) / 1e9, "GFLOP/s"
    return spec.min_bytes(shape, DTYPE_SIZES[dtype]) / (time_ms * 1e-3) / 1e9, "GB/s"


__all__ = ["KERNELS", "SKINNY_MAX_ROWS", "KernelSpec", "Launch", "compat_hash", "get", "metric", "poison",
           "source_hash", "to_float64", "tolerance", "DTYPE_SIZES"]
