"""float64 and float32 matmul emulated on the int8 tensor cores (Ozaki scheme II), behind the precision
setting "emulated": the kernels around the int8 GEMMs (`autotile.codegen.emulation`) and the int8 GEMMs
the library already serves (its tuned int8 matmul, layout nt), launched in order on the caller's stream.

A call (A and B in any of the four layouts; a batch runs its matrices one after another) runs, all on one
stream, with no synchronisation:

1. the statistics of A's rows and B's columns (exponent, and the guard's terms from their largest magnitude,
   their sum of magnitudes and whether they hold a NaN or Inf; each matrix's largest line peak), and the
   choice between the type's scheme and its scheme of one modulus fewer (`FEWER_MODULI`);
2. A's and B's residue matrices, one per modulus, and their magnitudes, int8 and K-major (K padded to `K_ALIGN`),
   and the magnitudes of every fourth element of K (`SAMPLED_MAGNITUDES`);
3. one int8 GEMM (exact int32 sums) per modulus (the one left out skipped where fewer were chosen), and one of
   the sampled magnitudes;
4. the rebuild: C from the residues of its products, and the guard's flags on output tiles; then, only where
   the guard failed an element, the magnitudes' full product;
5. the native fix-up: flagged tiles (a NaN or Inf in their rows or columns, or an error bound above a
   native GEMM's, counted again on the full product) recomputed in the type's own arithmetic.

The schemes' kernels not chosen, and the products skipped, are launched all the same and return at once:
what runs is decided on the GPU, by words the call's kernels write and read.

Its workspace, allocated per call through the inputs' framework on the call's stream, holds (count + 1)
int8 copies of A and of B and (count + 1) int32 products of M x N (N rounded up to `N_ALIGN`): for float64 with
16 moduli, 17 M N 4 bytes of products (4.6 GB at 8192 x 8192).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from autotile.codegen import emulation as scheme_mod
from autotile.codegen.emulation import FIX_TILE, MAX_K, Scheme

if TYPE_CHECKING:
    from autotile.runtime.operands import Framework, Operand

# Where emulation pays, measured on an H100 (2026-11-25) over random shapes: float64 against DGEMM, float32
# against what "high" runs otherwise (autotile's tf32x3 kernels). The int8 products cost (moduli + 1) M N K
# and their int32 results (moduli + 1) M N words written and read again: a short K or a small M N cannot
# pay that back. On 24 random shapes drawn afterwards (seed 23), every shape this rule took ran faster
# than the native path; some it leaves would have too (float64 10658x2839x14303 at 1.15x). float32's sides
# start at 2048: 13835x1061x10179 ran 0.94x the tf32x3 kernels. float64's M N K starts at 2^38 since its
# large products run a generated int8 kernel (`SUSTAINED_MIN_WORK`): on an H200 (2026-11-28, `python
# tools/emulation_band.py`: 10 random shapes with K 8192-16384, M and N 2048-16384, M N K 2^37.5-2^39) every
# one ran faster emulated, the seven of at least 2^38 1.22-1.41x DGEMM, the three below 1.09-1.37x.
MIN_K = {"float64": 2048, "float32": 4096}
MIN_VOLUME = {"float64": 2**38, "float32": 2**37}  # M N K
# float64's K from 2048 (2026-11-28, night, H200, once the products' rows were aligned: `N_ALIGN`; `python
# tools/emulation_band.py --volume 38 40`, against DGEMM): seed 62's nine of K 1938-3585 1.02-1.36x and one of
# K 1590 0.90x, seed 63's twelve of K 4196-8092 1.03-1.60x, then held out, seed 65's fourteen of K 2585-7882
# 1.22-1.56x (geomean 1.35). Before the alignment half of those under K = 4096 lost, down to 0.61x.
MIN_SIDE = {"float64": 2048, "float32": 2048}  # M and N
# CUDA's grid limit on the fix-up's tiles along y (65535 rows of FIX_TILE-row tiles)
MAX_M = 65535 * FIX_TILE
# The products run back to back, 10 (float32) to 17 (float64) of one shape: a sustained load, under which
# kernels keep less of their speed than in the shape databases' timings (one product at a time, L2 flushed).
# Where the int8 selection keeps cuBLAS on the model's word, the model's best generated candidate (the
# runner-up) runs products of at least SUSTAINED_MIN_WORK multiply-adds if it was predicted at least
# SUSTAINED_FLOOR x cuBLAS. Measured on an H200 (2026-11-28, `bench-emulation --int8-config library
# direct8-128x256-c2p library direct8-128x256-c2p`, the runner-up there, predicted 0.93-0.99x cuBLAS; emulated
# time with it against cuBLAS's products): float64 4096³ 5% slower (2.53 against 2.40 ms), 6144³ 3% faster,
# 8192³ 6-8% (15.9-16.5 against 17.2-17.4 ms), 10240³ 6%, 12288³ 9%, 16384³ 13-14% (118-120 against 136-138
# ms); float32 6144³ even, 12288³ 8%, 16384³ 18% (68.3 against 81.1-82.7 ms). On random shapes whose sides
# cuBLAS's int8 GEMM refuses the generated kernels run anyway.
SUSTAINED_MIN_WORK = 2**38  # M N K of one product: 6502³
SUSTAINED_FLOOR = 0.9
# The int8 GEMMs' K (bytes; the residues' rows padded with zeros): a multiple of 16 for the TMA, and of 32
# because both the generated int8 kernel and cuBLAS's run K of an odd multiple of 16 slower (H200, 2026-11-28,
# `direct8-128x256-c2p` nt: 8192x8192xK 1302-1323 TOP/s at K = 16 mod 32 against 1306-1566 otherwise, 6144x6144xK
# 1186-1201 against 1204-1412; cuBLAS 1134-1175 against 1402-1544). Emulated calls in one run, K rounded up to
# 16 then 32: float64 8192x8192x8200 16.7 -> 15.3 ms, 6000x7000x5000 8.68 -> 7.20 (0.90x -> 1.07x DGEMM),
# float32 8192x8192x8200 9.31 -> 8.47 (2.49x -> 2.74x SGEMM); the same errors.
K_ALIGN = 32
# The int8 products' N (B's residue lines, rounded up; the extra lines and the columns they make are never
# read): rows of the products that start 16-byte aligned (int8 residues and int32 sums alike). On an H200
# (2026-11-28, `tools/emulation_band.py`, float64, seeds 61-64) the same generated int8 kernel ran the products
# of 22 random shapes whose N was not a multiple of 4 at 480-1090 TOP/s, and of 12 whose N was at 1040-1360.
N_ALIGN = 16
# Whether the residue products leave the int8 kernel as int8 residues (its RESIDUES epilogue) rather than as
# int32 sums. Off: on an H100 (2026-11-25) it cut the rebuild by 30% (8192³ float64: 1.94 -> 1.34 ms) but
# slowed the 16 products by 5-9% (12.5 -> 13.2-13.7 ms; the epilogue does not overlap the next tile's main
# loop), 3-4% slower in all. On an H200 (2026-11-28, `bench-emulation --residue-epilogue off on --int8-config
# ...`) the same trade held with the ping-pong int8 kernels too (whose epilogue overlaps the other consumer's
# products): 8192³ float64 17.04 ms off, 17.12 on, under direct8-128x256-c2p.
RESIDUE_EPILOGUE = False
# Whether the products (residues' and magnitudes') go as one batched launch (cuBLAS's strided batched GEMM where
# cuBLAS is the int8 selection, the generated kernel batched where a wgmma_direct kernel is) rather than one
# launch each. Off: on an H200 (2026-11-28, `bench-emulation
# --batched-products off on`) cuBLAS's batched int8 GEMM ran the 17 products of an 8192^3 float64 emulation in
# 16.35 ms against 12.56 ms as 17 calls (16384^3: 134.7 against 125.5 ms); the generated kernel batched (its 3-D
# tensor maps) ran within the run's noise of one launch a product (2026-11-28, `--batched-products on off`:
# float64 8192^3 16.24-16.31 against 15.89-16.12 ms, float32 9.41 against 9.60).
BATCHED_PRODUCTS = False
# Whether a call may run one modulus fewer where its inputs' line peaks allow (`autotile.codegen.emulation.fewer`,
# decided on the device by `emu_choose`, no synchronisation): both schemes' kernels are launched, the one not
# chosen returning at once, and the product of the modulus left out is skipped where a generated kernel runs
# it (cuBLAS's runs anyway, unread).
FEWER_MODULI = True
# Whether the guard first reads the magnitudes' product over every fourth element of K (a quarter of an int8
# product: a lower bound of the lower bound of (|A||B|)_ij, which on inputs without structure along K is about a
# quarter of it) and the full product runs only where that fails an element (the rebuild clears a device word
# the full product's kernel reads; the fix-up counts again with the full product before it recomputes). Where
# cuBLAS runs the products (it cannot be told to skip one) or they leave as residues or in one batched launch,
# the full product as before.
SAMPLED_MAGNITUDES = True


# Where float32's emulation outruns even the tf32x3 kernels that split once (LOADER=presplit): K at least
# PRESPLIT_MIN_K and M N K at least PRESPLIT_MIN_VOLUME. Measured on an H200 (2026-11-28; ms emulated against
# "high", normal inputs, one modulus fewer): `bench-emulation --dtype float32 --sizes 8192 --sampled-magnitudes
# on off`: 8192³ 8.16 against 9.26 (1.13x) with the sampled magnitudes, 8.88 against 9.53 without; on inputs whose
# lines peak (every modulus, the full magnitudes' product after the sampled one) 10.0 against 9.8 (0.98x).
# `--sizes 12288 16384 --random 12 --seed 23` (before the sampled magnitudes): 12288³ 27.4 against 30.7
# (1.12x), 16384³ 63.2 against 75.5 (1.19x); 10719x13896x5950 15.27 against 15.30, 13835x1061x10179 4.92 against
# 4.77: left to "high" (K under 8192). Checked again once the presplit workspace's rows were 128-byte aligned
# (`kernels.PRESPLIT_K_ALIGN`, 2026-11-28, `tools/emulation_band.py --dtype float32 --count 8 --seed 68 --min-k
# 8192 --volume 39 40.5`): emulated 1.04-1.18x "high" on all eight (2.43-2.70x SGEMM against 2.21-2.43x).
PRESPLIT_MIN_K = 8192
PRESPLIT_MIN_VOLUME = 2**39


def native_outruns_emulation(native: Mapping[str, Any] | None, shape: tuple[int, int, int]) -> bool:
    """Whether "high"'s choice `native` runs a float32 product of `shape` (M, N, K) faster than its emulation
    wherever the size rule would emulate: the tf32x3 wgmma kernels that split each operand once
    (LOADER=presplit), except on the largest products (`PRESPLIT_MIN_K`, `PRESPLIT_MIN_VOLUME`). Measured on
    an H200 (2026-11-28) before one modulus fewer could be chosen: of the four shapes the size rule took, the
    three these kernels serve ran 1.16-1.27x faster natively (8192³ 9.25 against 10.73 ms, 16384³ 74.1
    against 88.7, 10719x13896x5950 15.2 against 19.2); the fourth (6282x4602x10849) ran faster emulated only
    while the presplit kernels read it slowly (`kernels.PRESPLIT_K_ALIGN`)."""
    if native is None or native.get("MATH") != "wgmma" or native.get("LOADER") != "presplit":
        return False
    m, n, k = shape
    return not (k >= PRESPLIT_MIN_K and m * n * k >= PRESPLIT_MIN_VOLUME)


def aligned_n(n: int) -> int:
    """The int8 products' N for a problem's `n`: rounded up to `N_ALIGN` (their rows start aligned)."""
    return -(-n // N_ALIGN) * N_ALIGN


def aligned_k(k: int) -> int:
    """The int8 GEMMs' K for a problem's `k`: rounded up to `K_ALIGN` (the residues' rows padded with zeros)."""
    return -(-k // K_ALIGN) * K_ALIGN


def pays(dtype: str, shape: tuple[int, ...], native: Mapping[str, Any] | None = None) -> bool:
    """Whether the emulation is the choice for a 2-D `dtype` matmul of `shape` (M, N, K) under the
    "emulated" setting: K, M N K, M and N large enough (`MIN_K`, `MIN_VOLUME`, `MIN_SIDE`), K within the
    int32 sums' exact range (`MAX_K`), M within the fix-up's grid; for float32, not where `native` (the
    config "high" runs for the problem, None for cuBLAS) is a tf32x3 kernel that splits its operands once
    (`native_outruns_emulation`)."""
    if dtype not in MIN_SIDE or len(shape) != 3:
        return False
    m, n, k = shape
    if dtype == "float32" and native_outruns_emulation(native, (m, n, k)):
        return False
    return (k >= MIN_K[dtype] and m * n * k >= MIN_VOLUME[dtype] and min(m, n) >= MIN_SIDE[dtype]
            and k <= MAX_K and m <= MAX_M)


@dataclasses.dataclass
class _Kernels:
    """The scheme's compiled kernels on one device, by name."""

    scheme: Scheme
    functions: dict[str, Any]


_lock = threading.Lock()
_compiled: dict[tuple[Any, ...], _Kernels] = {}


def _kernels(s: Scheme, layout: str, device: int, full: Scheme | None = None) -> _Kernels:
    """The kernels of `s` (`full`: the scheme `s` has one modulus fewer than, whose statistics it reads)."""
    key = (s.dtype, s.moduli, s.beta, layout, device, None if full is None else (full.moduli, full.beta))
    found = _compiled.get(key)
    if found is not None:
        return found
    from autotile.codegen.build import COMPILE_OPTIONS, compile_kernel

    source = scheme_mod.render(s, layout, full=full)
    options = COMPILE_OPTIONS + scheme_mod.EXTRA_OPTIONS
    made = _Kernels(s, {name: compile_kernel(source, name, options) for name in scheme_mod.KERNEL_NAMES})
    with _lock:
        return _compiled.setdefault(key, made)


@dataclasses.dataclass(frozen=True)
class _Side:
    """One operand of an emulated call as its kernels take it: A's rows or B's columns (its "lines")."""

    name: str  # "a" or "b": the kernels' suffix
    ptr: int  # the operand's device address
    ld: int  # its leading dimension, in elements
    lines: int  # M (A) or N (B)
    plane_lines: int  # lines per residue plane: N rounded up for B (`N_ALIGN`), M for A
    stats: list[int]  # the statistics' four per-line arrays (exponent, bound term, floor scale, magnitude exponent)
    contiguous: bool  # whether its lines run along memory
    planes: int  # its residue and magnitude planes (int8, K-major)
    sampled: int  # its sampled magnitudes (0: none)


def _i32(v: int) -> np.int32:
    return np.int32(v)


def _i64(v: int) -> np.int64:
    return np.int64(v)


def _ptr(v: int) -> np.uint64:
    return np.uint64(v)


# (device, stream) -> (owner, address) of two int32 words: where a call's `emu_choose` writes its choice, and
# whether its rebuild's guard passed every element on the sampled magnitudes. Kept, so that the products they
# may skip are launched with the same argument every call (launches on one stream are ordered: a call's words
# are read by its own kernels before the next call's overwrite them).
_stream_words: dict[tuple[int, int], tuple[Any, int]] = {}


def _words(framework: Framework, device: int, stream_ptr: int) -> int:
    found = _stream_words.get((device, stream_ptr))
    if found is None:
        owner, pointer = framework.allocate(2, "int32", stream_ptr)
        with _lock:
            found = _stream_words.setdefault((device, stream_ptr), (owner, int(pointer)))
    return found[1]


def run(framework: Framework, a: Operand, b: Operand, c: Operand, layout: str, shape: tuple[int, int, int],
        stream_ptr: int, int8_gemm: Any, events: list[Any] | None = None,
        report: dict[str, int] | None = None, bits: int | None = None,
        residue_epilogue: bool | None = None, batched_products: bool | None = None,
        fewer_moduli: bool | None = None, sampled_magnitudes: bool | None = None) -> None:
    """C = A B by emulation, on the stream `stream_ptr` of the operands' device (current). `layout` and
    `shape` (M, N, K) as the call's plan has them; `int8_gemm(shape)` gives what runs an int8 nt matmul of
    `shape` as `(pointers, out_ptr, out_nbytes, stream_ptr) -> None`. `events`, where given, gets a
    recorded CUDA event after each phase (statistics, residues, int8 products, rebuild, fix-up), and
    `report`, where given, the guard's counts once the call is done (it waits): runs of 32 elements of a
    row holding a failed one, output tiles recomputed whole, tiles in all, and whether one modulus fewer
    was chosen. Both are the benchmark's, as is `bits` (the bits each scaled operand keeps; None:
    `autotile.codegen.emulation`'s default for the type, and the choice of one modulus fewer where
    `fewer_moduli`, None: `FEWER_MODULI`), `residue_epilogue` (None: `RESIDUE_EPILOGUE`),
    `batched_products` (None: `BATCHED_PRODUCTS`) and `sampled_magnitudes` (None: `SAMPLED_MAGNITUDES`)."""
    import cupy

    from autotile.runtime.impl import cupy_stream, sm_count

    m, n, k = shape
    s = scheme_mod.scheme(a.dtype, k, bits)
    adaptive = bits is None and (FEWER_MODULI if fewer_moduli is None else fewer_moduli)
    f = scheme_mod.fewer(s) if adaptive else None  # the scheme of one modulus fewer, where the inputs allow
    kernels = _kernels(s, layout, a.device).functions
    schemes = [kernels] if f is None else [kernels, _kernels(f, layout, a.device, full=s).functions]
    knobs = scheme_mod.DEFAULT_KNOBS
    sms = sm_count()
    planes = s.count + 1  # the residues' products and the magnitudes'
    kp = aligned_k(k)
    n_p = aligned_n(n)  # the products' N: their rows aligned (`N_ALIGN`)
    tiles_m, tiles_n = -(-m // FIX_TILE), -(-n // FIX_TILE)
    keep: list[Any] = []  # the workspace's owners, alive until every launch is enqueued
    stream = cupy_stream(stream_ptr)

    def allocate(elems: int, dtype: str) -> int:
        owner, pointer = framework.allocate(elems, dtype, stream_ptr)
        keep.append(owner)
        return int(pointer)

    def phase_done() -> None:
        if events is not None:
            event = cupy.cuda.Event()
            event.record(stream)
            events.append(event)

    # per line of A (rows) and of B (columns): exponent, the guard's bound term and floor scale, the
    # magnitudes' exponent (the statistics kernels say what each is)
    lines_a = [allocate(m, "int32"), allocate(m, "float64"), allocate(m, "float64"), allocate(m, "int32")]
    lines_b = [allocate(n, "int32"), allocate(n, "float64"), allocate(n, "float64"), allocate(n, "int32")]
    res_a, res_b = allocate(planes * m * kp, "int8"), allocate(planes * n_p * kp, "int8")
    products = int8_gemm((m, n_p, kp))
    product_bytes = m * n_p * 4  # one int32 product
    magnitude_planes = (res_a + s.count * m * kp, res_b + s.count * n_p * kp)  # the planes after the residues'
    # With RESIDUE_EPILOGUE, and where the selection runs a generated kernel that has one, each product
    # leaves as int8 residues; else as int32 sums (reduced by the rebuild).
    epilogue = RESIDUE_EPILOGUE if residue_epilogue is None else residue_epilogue
    residue_launches = [products.residues(modulus) if epilogue else None for modulus in s.moduli]
    fused = all(launch is not None for launch in residue_launches)
    one_launch = None if fused or not (BATCHED_PRODUCTS if batched_products is None else batched_products) \
        else products.batched(planes)
    if one_launch is not None:  # the magnitudes' product is the last of the batch
        sums = allocate(planes * m * n_p, "int32")
        magnitudes = sums + s.count * product_bytes
    else:
        sums = allocate(s.count * m * n_p, "int8" if fused else "int32")
        magnitudes = allocate(m * n_p, "int32")
    # the magnitudes' product over every fourth element of K first, the full one only where the guard fails
    # an element on it: where a generated kernel runs the products one by one (it can be told to skip)
    sample = (SAMPLED_MAGNITUDES if sampled_magnitudes is None else sampled_magnitudes) and not fused \
        and one_launch is None
    words = _words(framework, a.device, stream_ptr) if f is not None or sample else 0
    full_magnitudes = products.unless(words + 4) if sample else None
    sample = full_magnitudes is not None
    kq = aligned_k(kp // 4)  # the sampled magnitudes' K
    sampled_a = allocate(m * kq, "int8") if sample else 0
    sampled_b = allocate(n_p * kq, "int8") if sample else 0
    # runs of 32 holding a failed element, per tile; then A's and B's largest line peaks
    tile_counts = allocate(tiles_m * tiles_n + 2, "int32")
    peaks = tile_counts + 4 * tiles_m * tiles_n
    cupy.cuda.runtime.memsetAsync(tile_counts, 0, 4 * (tiles_m * tiles_n + 2), stream_ptr)
    choice = 0 if f is None else words  # 0: nullptr, no choice
    passed = words + 4 if sample else 0  # nonzero (all four bytes 1) until the rebuild's guard fails an element
    if sample:
        cupy.cuda.runtime.memsetAsync(passed, 1, 4, stream_ptr)
    if events is not None:
        phase_done()  # the start
    # A's rows run along K when A is row-major ("n"); B's columns when B is stored N x K ("t").
    ld_a = k if layout[0] == "n" else m
    ld_b = k if layout[1] == "t" else n
    operands = (_Side("a", a.ptr, ld_a, m, m, lines_a, layout[0] == "n", res_a, sampled_a),
                _Side("b", b.ptr, ld_b, n, n_p, lines_b, layout[1] == "t", res_b, sampled_b))
    for index, side in enumerate(operands):
        warps = knobs["STATS_WARPS"] if side.contiguous else knobs["STATS_COLUMN_WARPS"]
        blocks = -(-side.lines // warps) if side.contiguous else -(-side.lines // 32)
        peak = 0 if f is None else peaks + 4 * index
        kernels[f"emu_stats_{side.name}"](
            (blocks, 1, 1), (warps * 32, 1, 1),
            (_ptr(side.ptr), _i64(side.ld), _i32(side.lines), _i32(k), *map(_ptr, side.stats), _ptr(peak)),
            stream=stream)
    if f is not None:
        kernels["emu_choose"]((1, 1, 1), (1, 1, 1), (_ptr(peaks), _i32(k), _ptr(choice)), stream=stream)
    phase_done()
    for functions in schemes:  # the scheme not chosen returns at once
        for side in operands:
            functions[f"emu_split_{side.name}"](
                scheme_mod.split_grid(side.lines, kp, side.contiguous, knobs, sms), (scheme_mod.SPLIT_THREADS, 1, 1),
                (_ptr(side.ptr), _i64(side.ld), _i32(side.lines), _i32(k), _i32(kp), _i32(side.plane_lines),
                 _ptr(side.stats[0]), _ptr(side.stats[3]), _ptr(side.planes), _ptr(choice)), stream=stream)
    for side, magnitude_plane in zip(operands, magnitude_planes, strict=True) if sample else ():
        kernels["emu_sample"]((min(-(-side.plane_lines * kq // 4 // 256), 65535), 1, 1), (256, 1, 1),
                              (_ptr(magnitude_plane), _i64(side.plane_lines), _i32(kp), _ptr(side.sampled),
                               _i32(kq)), stream=stream)
    phase_done()
    if one_launch is not None:
        one_launch((res_a, res_b), sums, stream_ptr)
    else:
        # the product of the modulus the scheme of fewer moduli leaves out: skipped where that scheme is chosen
        # and a generated kernel runs it (cuBLAS's runs anyway; its result is then not read)
        optional = products.unless(choice) if f is not None and not fused else None
        for plane, launch in enumerate(residue_launches):
            pointers = (res_a + plane * m * kp, res_b + plane * n_p * kp)
            if launch is not None and fused:
                launch(pointers, sums + plane * m * n_p, stream_ptr)
            elif optional is not None and plane == s.count - 1:
                optional(pointers, sums + plane * product_bytes, product_bytes, stream_ptr)
            else:
                products(pointers, sums + plane * product_bytes, product_bytes, stream_ptr)
        if sample:
            int8_gemm((m, n_p, kq))((sampled_a, sampled_b), magnitudes, product_bytes, stream_ptr)
        else:
            products(magnitude_planes, magnitudes, product_bytes, stream_ptr)
    phase_done()
    for functions in schemes:
        functions["emu_rebuild_residues" if fused else "emu_rebuild"](
            scheme_mod.rebuild_grid(m, n, knobs, sms), (knobs["REBUILD_THREADS"], 1, 1),
            (_ptr(sums), _i64(m * n_p), _ptr(magnitudes), _i32(m), _i32(n), _i32(n_p), _i32(k), *map(_ptr, lines_a[:3]),
             *map(_ptr, lines_b[:3]), _ptr(c.ptr), _ptr(tile_counts), _ptr(choice), _ptr(passed)), stream=stream)
    phase_done()
    if full_magnitudes is not None:  # skipped where the guard passed every element on the sampled magnitudes
        full_magnitudes(magnitude_planes, magnitudes, product_bytes, stream_ptr)
    # A's element (i, k) at A[i a_row + k a_col]; B's (k, j) at B[k b_row + j b_col]
    a_row, a_col = (k, 1) if layout[0] == "n" else (1, m)
    b_row, b_col = (n, 1) if layout[1] == "n" else (1, k)
    for functions in schemes:
        functions["emu_fixup"]((tiles_n, tiles_m, 1), (256, 1, 1),
                               (_ptr(a.ptr), _i64(a_row), _i64(a_col), _ptr(b.ptr), _i64(b_row), _i64(b_col),
                                _ptr(c.ptr), _i32(m), _i32(n), _i32(n_p), _i32(k), _ptr(tile_counts), _ptr(magnitudes),
                                *map(_ptr, lines_a[:3]), *map(_ptr, lines_b[:3]), _ptr(choice),
                                _i32(1 if sample else 0)), stream=stream)
    phase_done()
    if report is not None:  # the benchmark's diagnostics: waits for the GPU
        stream.synchronize()
        host = np.empty(tiles_m * tiles_n, np.int32)
        cupy.cuda.runtime.memcpy(host.ctypes.data, tile_counts, host.nbytes, cupy.cuda.runtime.memcpyDeviceToHost)
        chosen = np.zeros(2, np.int32)
        if words:
            cupy.cuda.runtime.memcpy(chosen.ctypes.data, words, 8, cupy.cuda.runtime.memcpyDeviceToHost)
        few = knobs["FEW_PER_TILE"]
        if layout == "nt":
            few //= 8
        report.update(failed_runs=int(host.sum()), whole_tiles=int((host > few).sum()), tiles=int(host.size),
                      residue_epilogue=int(fused), batched_products=int(one_launch is not None),
                      fewer_moduli=int(chosen[0]) if f is not None else 0,
                      full_magnitudes=int(not chosen[1]) if sample else 1)
    keep.clear()  # back to the framework's pool on this stream: later work on it is ordered after ours


def run_batch(framework: Framework, a: Operand, b: Operand, c: Operand, layout: str, shape: tuple[int, ...],
              batch_strides: tuple[int, ...], stream_ptr: int, int8_gemm: Any) -> None:
    """`run` for a call's plan: `shape` (M, N, K), or (batch, M, N, K) with each operand's batch stride in
    elements in `batch_strides` (0: one matrix for the whole batch) and C's matrices packed one after the
    other; the batch's matrices one after another, each a whole emulated product."""
    if len(shape) == 3:
        run(framework, a, b, c, layout, (shape[0], shape[1], shape[2]), stream_ptr, int8_gemm)
        return
    batch, m, n, k = shape
    size = np.dtype(a.dtype).itemsize
    for index in range(batch):
        run(framework, a._replace(ptr=a.ptr + index * batch_strides[0] * size),
            b._replace(ptr=b.ptr + index * batch_strides[1] * size), c._replace(ptr=c.ptr + index * m * n * size),
            layout, (m, n, k), stream_ptr, int8_gemm)


def forget() -> None:
    """Drop the compiled kernels (tests)."""
    with _lock:
        _compiled.clear()
