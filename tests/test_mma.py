"""MATH=mma (bfloat16, float16 and int8 on mma.sync, sm_80 and newer; templates/matmul_mma.cu.j2). Without a
GPU: the named configs compile for sm_80, sm_89 and sm_90 in every layout and batched, without spills and with
their ldmatrix reads (int8's M- or N-contiguous tiles gathered a byte at a time) and mma, the K splits sum in
float32 or int32, and the other kernels' text is what it was. On a GPU of sm_80 or newer (`gpu` marker; on an
H100 the same instructions run): every named config in every layout against a float64 reference (int8:
exactly) and the 16-bit types against cuBLAS's error on the same inputs, batched, unaligned operands (one
element at a time), K splits, and the Inf/NaN pattern of cuBLAS."""

from __future__ import annotations

import concurrent.futures
import hashlib

import numpy as np
import pytest
from direct_support import code, cublas_output, require_sm80

from autotile.codegen import build, dtypes, kernels
from autotile.codegen.limits import PROFILES
from autotile.codegen.problem import ProblemKey
from autotile.codegen.space import Problem

SPEC = kernels.get("matmul")
SPACE = SPEC.space
NAMES = [n for n, c in SPACE.named_configs.items() if c["MATH"] == "mma" and not n.startswith("mma8")]
INT8_NAMES = [n for n in SPACE.named_configs if n.startswith("mma8")]  # K steps of whole int8 mmas
LAYOUTS = ("nn", "nt", "tn", "tt")
HALF = dtypes.HALF_DTYPES
NVRTC_MISSING = build.nvrtc_unavailable_reason()
needs_nvrtc = pytest.mark.skipif(NVRTC_MISSING is not None, reason=f"NVRTC cannot be loaded ({NVRTC_MISSING})")


def test_named_configs_are_mma_for_the_16_bit_types_and_int8_only():
    assert len(NAMES) >= 4 and len(INT8_NAMES) >= 3
    for name in NAMES + INT8_NAMES:
        for dtype in (*HALF, "int8"):
            for profile in ("a100", "l4", "h100"):
                assert SPACE.is_feasible(SPACE.named(name), Problem(PROFILES[profile], dtype, "nn")), (name, profile)
        for dtype in ("float32", "float64"):
            assert not SPACE.is_feasible(SPACE.named(name), Problem(PROFILES["a100"], dtype, "nn"))


def test_int8_on_an_a100_runs_in_every_layout_and_size():
    """cuBLAS's int8 GEMM takes layout nt with leading dimensions that are multiples of 4 only; the mma
    kernels take the rest, so int8 is no longer refused on GPUs without wgmma."""
    from autotile.dispatch.cache import TuningCache
    from autotile.dispatch.select import select

    for layout, shape in (("nn", (64, 64, 64)), ("tt", (33, 70, 129)), ("nt", (64, 63, 65))):
        found = select(ProblemKey("matmul", "int8", layout, shape), PROFILES["a100"], TuningCache(None))
        assert found.implementation == "generated" and found.config["MATH"] == "mma", found.explain()


def test_int8_sums_in_int32_and_reads_m_or_n_contiguous_tiles_a_byte_at_a_time():
    config = SPACE.named("mma8-64-split4")
    launch = SPEC.launch(config, (64, 64, 8192), "int8", "nn")
    assert launch.workspace_dtype == "int32" and launch.workspace_elems == 4 * 64 * 64
    for layout in LAYOUTS:
        source = SPEC.render(config, "int8", layout)
        assert "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32" in source and "int* __restrict__ C" in source
        assert "int* __restrict__ partials" in source and "int sum_splits(const int* p" in source
        assert ("gather4(as" in source) == (layout[0] == "t") and ("gather4(bs" in source) == (layout[1] == "n")
    atomic = SPACE.with_overrides(config, {"SPLIT_REDUCE": "atomic"})  # exact int32 atomics: allowed
    assert SPACE.is_feasible(atomic, Problem(PROFILES["a100"], "int8", "nn"))
    assert not SPACE.is_feasible(atomic, Problem(PROFILES["a100"], "bfloat16", "nn"))


def test_split_k_sums_in_float32_and_c_takes_each_sum_rounded_once():
    config = SPACE.named("mma-64-split4")
    launch = SPEC.launch(config, (64, 64, 8192), "bfloat16", "nn")
    assert launch.workspace_dtype == "float32" and launch.workspace_elems == 4 * 64 * 64
    source = SPEC.render(config, "bfloat16", "nn")
    assert "float* __restrict__ partials" in source and "float* const slice" in source
    assert "make_ushort2(narrow(acc[i][j][2 * h]), narrow(acc[i][j][2 * h + 1]))" in source


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fragments_come_through_ldmatrix_transposed_where_the_tile_is_m_or_n_contiguous(layout):
    for dtype, types in (("bfloat16", "bf16.bf16"), ("float16", "f16.f16")):
        source = SPEC.render(SPACE.named("mma-128"), dtype, layout)
        assert f'#define AUTOTILE_MMA_AB "{types}"' in source
        assert "mma.sync.aligned.m16n8k16.row.col.f32." in source
        a_call = "ldmatrix_x4_trans(a[i]" if layout[0] == "t" else "ldmatrix_x4(a[i]"
        b_call = "ldmatrix_x2(b[j]" if layout[1] == "t" else "ldmatrix_x2_trans(b[j]"
        assert a_call in source and b_call in source


def test_the_other_kernels_text_is_unchanged():
    """The pipeline the mma kernels share (mma_pipeline.j2, async_copy.cuh.j2, matmul_parts.j2) learnt the
    16-bit types' float32 sums and 2-byte copies without changing a character of the float32, float64 and
    wgmma_direct kernels, so their tuned records' source hashes stay valid: the hashes below are those of
    the sources before MATH=mma existed (2026-11-27), K splits summed by the last block included; the
    batched wgmma_direct kernel's since its batches copy with 3-D tensor maps (2026-11-28)."""
    expected = {
        ("matmul", "tf32x3-32", "float32", "nn"): "752afdebb37b45cf",
        ("matmul", "tf32x3-64", "float32", "tt"): "2e924171a2454afa",
        ("matmul", "dmma-64", "float64", "nt"): "1bcf05c8b5d1a78d",
        ("matmul", "regtile-64x128-splitk", "float32", "nn"): "f2c4ef28cdc2aa97",
        ("matmul", "tf32x3-64-split8", "float32", "nn"): "011bffd209f28e76",
        ("matmul", "dmma-64-split8", "float64", "tt"): "1beef24adf8b8319",
        ("matmul", "direct-64-split8", "bfloat16", "nt"): "2cffc9ac5f560c94",
        ("bmm", "tf32x3-64-split8", "float32", "nn"): "dbf38da4c0168859",
        ("bmm", "dmma-64-split8", "float64", "tt"): "f6bd441abf7285d2",
        ("bmm", "direct-64-split8", "bfloat16", "nt"): "69fd3571910f6d05",
    }
    got = {(kernel, name, dtype, layout): hashlib.sha256(
        kernels.get(kernel).render(SPACE.named(name), dtype, layout).encode()).hexdigest()[:16]
        for kernel, name, dtype, layout in expected}
    assert got == expected


# Every config in bfloat16 and layout nn for sm_80; one config in every layout, batched, float16 and on sm_89
# and sm_90 (the instructions are the same; each compile costs CI's two cores about a second).
CASES = [(n, "bfloat16", "nn", False, "sm_80") for n in NAMES] + [
    ("mma-128", dtype, layout, batched, arch) for dtype in HALF for layout in LAYOUTS for batched in (False, True)
    for arch in ("sm_80", "sm_89", "sm_90")
    if (dtype == "bfloat16" or layout == "nt") and (not batched or layout == "tt") and (arch == "sm_80" or (
        layout == "nn" and not batched and dtype == "bfloat16"))
    and (dtype, layout, batched, arch) != ("bfloat16", "nn", False, "sm_80")] + [
    (n, "int8", layout, False, "sm_80") for n in INT8_NAMES for layout in LAYOUTS] + [
    ("mma8-64-split4", "int8", "tt", True, "sm_80"), ("mma8-128", "int8", "nt", False, "sm_89")]


@pytest.fixture(scope="module")
def compiled():
    if NVRTC_MISSING is not None:
        pytest.skip(NVRTC_MISSING)

    def one(case):
        name, dtype, layout, batched, arch = case
        spec = kernels.get("bmm" if batched else "matmul")
        return build.compile(spec.render(SPACE.named(name), dtype, layout), arch)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return dict(zip(CASES, pool.map(one, CASES), strict=True))


@needs_nvrtc
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(v) for v in c))
def test_compiles_without_spills(compiled, case):
    name, dtype, layout, _, _ = case
    (usage,) = compiled[case].usages
    derived = SPACE.derive(SPACE.named(name), Problem(PROFILES["a100"], dtype, layout))
    assert usage.registers <= min(255, 65536 // derived["threads"] // 8 * 8)
    assert usage.spill_stores == 0 and usage.static_smem == 0, (case, usage)


def test_sources_differ_only_where_the_code_does():
    # float16's kernel is bfloat16's but for the mma's type names and the conversions
    bf16 = code(SPEC.render(SPACE.named("mma-64"), "bfloat16", "nn"))
    f16 = code(SPEC.render(SPACE.named("mma-64"), "float16", "nn"))
    assert bf16 != f16 and bf16.count("mma_tile(") == f16.count("mma_tile(")


# -- on a GPU of sm_80 or newer ------------------------------------------------------------------------

SHAPES = [(131, 67, 257), (1, 97, 33), (61, 1, 7), (257, 509, 1031), (1024, 768, 512)]


def _inputs(key: ProblemKey, offset: int = 0, specials: bool = False):
    """A and B for `key` (random, no zeros); `offset`: A starts that many elements past an aligned address
    (its rows are then copied one element at a time); `specials`: an Inf, a -Inf and a NaN in A, a value
    near the type's largest in B."""
    import cupy

    spec = kernels.get(key.kernel)
    a, b = spec.make_inputs(key.shape, key.dtype, key.layout, cupy.random.default_rng(7), cupy)
    if specials:
        big = 60000.0 if key.dtype == "float16" else 3e38
        values = dtypes.from_float32(cupy.array([np.inf, -np.inf, np.nan, big], dtype=cupy.float32), key.dtype)
        flat_a, flat_b = a.reshape(-1), b.reshape(-1)
        flat_a[3], flat_a[a.size // 2], flat_a[-1] = values[0], values[1], values[2]
        flat_b[b.size // 3] = values[3]
    if offset:
        assert a.flags.c_contiguous
        a = cupy.concatenate([cupy.zeros(offset, a.dtype), a.reshape(-1)])[offset:].reshape(a.shape)
    return a, b


def _run(name: str, key: ProblemKey, a, b):
    import cupy

    from autotile.runtime.impl import Generated

    spec = kernels.get(key.kernel)
    runner = Generated(SPACE.named(name)).prepare(key)
    out = cupy.empty(spec.output_shape(key.shape), dtype=dtypes.output_storage(key.dtype))
    kernels.poison(out)
    runner.run((a, b), out)
    cupy.cuda.Device().synchronize()
    return out


def _errors(name: str, key: ProblemKey, offset: int = 0) -> tuple[float, float]:
    from autotile.runtime.timing import relative_error

    a, b = _inputs(key, offset)
    ref = kernels.get(key.kernel).reference((a, b))
    return relative_error(_run(name, key, a, b), ref), relative_error(cublas_output(key, a, b), ref)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", NAMES)
def test_named_configs_match_cublas_accuracy(name, layout, dtype):
    require_sm80()
    for shape in SHAPES:
        key = ProblemKey("matmul", dtype, layout, shape)
        err, cublas_err = _errors(name, key)
        assert err <= kernels.tolerance(dtype, shape[-1]), (name, key, err)
        assert err <= 1.5 * cublas_err + 1e-6, (name, key, err, cublas_err)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF)
def test_batched_unaligned_split_and_special_operands(dtype):
    require_sm80()
    import cupy

    for name in ("mma-128", "mma-64-split4", "mma-32"):
        for layout in ("nn", "tt"):
            err, cublas_err = _errors(name, ProblemKey("bmm", dtype, layout, (3, 131, 67, 257)))
            assert err <= 1.5 * cublas_err + 1e-6, (name, layout, err, cublas_err)
        # A one element off alignment, and K odd: rows copied one 16-bit element at a time
        for shape in ((130, 70, 264), (77, 45, 2049)):
            err, cublas_err = _errors(name, ProblemKey("matmul", dtype, "nn", shape), offset=1)
            assert err <= 1.5 * cublas_err + 1e-6, (name, shape, err, cublas_err)
        key = ProblemKey("matmul", dtype, "nn", (97, 130, 200))
        a, b = _inputs(key, specials=True)
        ours, theirs = kernels.to_float64(_run(name, key, a, b)), kernels.to_float64(cublas_output(key, a, b))
        assert cupy.array_equal(cupy.isnan(ours), cupy.isnan(theirs)), name
        assert cupy.array_equal(cupy.isinf(ours), cupy.isinf(theirs)), name
        assert cupy.array_equal(cupy.sign(ours[cupy.isinf(ours)]), cupy.sign(theirs[cupy.isinf(theirs)])), name
        assert bool(cupy.isnan(ours).any()) and bool(cupy.isinf(ours).any())


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
def test_int8_products_are_exact(layout):
    require_sm80()
    import cupy

    from autotile.runtime.timing import relative_error

    for name in INT8_NAMES:
        for kernel, shape in (("matmul", (131, 67, 257)), ("matmul", (1, 97, 33)), ("matmul", (257, 509, 1031)),
                              ("bmm", (3, 61, 45, 129))):
            key = ProblemKey(kernel, "int8", layout, shape)
            a, b = _inputs(key)
            out = _run(name, key, a, b)
            ref = kernels.get(kernel).reference((a, b))
            assert relative_error(out, ref) == 0.0, (name, key)
            assert bool(cupy.all(out.astype(cupy.float64) == ref)), (name, key)
    # K splits added with int32 atomics (exact, whatever the order), and rows one element off alignment
    config = SPACE.with_overrides(SPACE.named("mma8-64-split4"), {"SPLIT_REDUCE": "atomic"})
    key = ProblemKey("matmul", "int8", layout, (77, 45, 2049))
    a, b = _inputs(key, offset=1 if layout[0] == "n" else 0)
    from autotile.runtime.impl import Generated

    out = cupy.empty((77, 45), dtype=cupy.int32)
    kernels.poison(out)
    Generated(config).prepare(key).run((a, b), out)
    cupy.cuda.Device().synchronize()
    assert bool(cupy.all(out.astype(cupy.float64) == SPEC.reference((a, b))))
