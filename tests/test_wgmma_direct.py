"""MATH=wgmma_direct (bfloat16 and float16 on Hopper, templates/matmul_wgmma_direct.cu.j2) and the 16-bit
dtypes around it. Without a GPU: the dtype records' rounding, the space keeps the kernel to the 16-bit types
on sm_90 (and every CUDA-core kernel away from them), the tensor-map boxes, the transposes each layout asks
wgmma for, and every named config compiles for sm_90a (spills of 32 bytes at most) or serialised wgmmas. On a Hopper GPU
(`gpu` marker): every named config in every layout, batched, unaligned and split, against a float64
reference and against cuBLAS's error on the same inputs, specials included."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from direct_support import (
    MANY_TILES,
    check_compile,
    compile_cases,
    cublas_output,
    require_hopper,
    several_tiles_per_block,
)

from autotile.codegen import build, dtypes, kernels
from autotile.codegen.limits import PROFILES
from autotile.codegen.problem import ProblemKey
from autotile.codegen.space import Problem
from autotile.codegen.tensor_map import TensorBox

SPEC = kernels.get("matmul")
SPACE = SPEC.space
# the 16-bit types' configs (K steps of 64 elements); int8's (128) are tests/test_int8.py's
NAMES = [n for n, c in SPACE.named_configs.items() if c["MATH"] == "wgmma_direct" and c["BK"] == 64]
LAYOUTS = ("nn", "nt", "tn", "tt")
HALF = dtypes.HALF_DTYPES
NVRTC_MISSING = build.nvrtc_unavailable_reason()
needs_nvrtc = pytest.mark.skipif(NVRTC_MISSING is not None, reason=f"NVRTC cannot be loaded ({NVRTC_MISSING})")


# -- the dtypes ---------------------------------------------------------------------------------------

def test_bfloat16_rounds_to_nearest_even_and_keeps_specials():
    one_ulp = 2.0**-7  # bfloat16's spacing at 1
    values = np.array([1.0, 1.0 + one_ulp / 2, 1.0 + 1.5 * one_ulp, 1.0 + one_ulp / 2 + 2.0**-20, -2.5,
                       np.inf, -np.inf, np.nan, 3.4e38, 1e-40, 0.0, -0.0], dtype=np.float32)
    bits = dtypes.from_float32(values, "bfloat16")
    assert bits.dtype == np.uint16
    back = dtypes.to_float32(bits, "bfloat16")
    assert back[0] == 1.0
    assert back[1] == 1.0  # a tie goes to the even neighbour
    assert back[2] == 1.0 + 2 * one_ulp  # a tie from an odd one goes up
    assert back[3] == 1.0 + one_ulp  # past the tie: up
    assert back[4] == -2.5
    assert np.isposinf(back[5]) and np.isneginf(back[6]) and np.isnan(back[7])
    assert np.isposinf(back[8])  # above bfloat16's largest finite (3.3895e38): rounds to Inf
    assert back[9] == np.float32(2.0**-133)  # denormals kept, on bfloat16's grid (spacing 2^-133 there)
    assert back[10] == 0.0 and np.signbit(back[11])


def test_bfloat16_widening_is_exact():
    bits = np.arange(0, 1 << 16, dtype=np.uint16)
    wide = dtypes.to_float32(bits, "bfloat16")
    finite = np.isfinite(wide)
    again = dtypes.from_float32(wide[finite], "bfloat16")
    assert np.array_equal(again, bits[finite])


def test_tolerance_counts_the_output_rounding_of_the_16_bit_types():
    for dtype in HALF:
        tol = kernels.tolerance(dtype, 4096)
        assert dtypes.get(dtype).eps < tol < 0.02  # one output rounding, plus float32 sums, far below order 1
    assert kernels.tolerance("float32", 4096) == pytest.approx(max(64.0, 8.0 * 64) * 2.0**-23)


def test_inputs_are_16_bit_storage_and_the_reference_reads_them():
    rng = np.random.default_rng(0)
    a, b = SPEC.make_inputs((5, 7, 9), "bfloat16", "nt", rng, np)
    assert a.dtype == np.uint16 and b.dtype == np.uint16 and b.shape == (9, 7)
    ref = SPEC.reference((a, b))
    exact = dtypes.to_float32(a, "bfloat16").astype(np.float64) @ dtypes.to_float32(b, "bfloat16").astype(np.float64)
    assert np.array_equal(ref, exact)
    h, _ = SPEC.make_inputs((5, 7, 9), "float16", "nn", rng, np)
    assert h.dtype == np.float16 and np.all(h != 0)


def test_poison_is_a_nan_of_the_storage():
    out = np.zeros(4, dtype=np.uint16)
    kernels.poison(out)
    assert np.isnan(dtypes.to_float32(out, "bfloat16")).all()
    half = np.zeros(4, dtype=np.float16)
    kernels.poison(half)
    assert np.isnan(half).all()


# -- the space ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_wgmma_direct_only_for_16_bit_types_on_sm90(name):
    config = SPACE.named(name)
    for dtype in HALF:
        for profile in ("h100", "h200"):
            assert SPACE.is_feasible(config, Problem(PROFILES[profile], dtype, "nt"))
        assert not SPACE.is_feasible(config, Problem(PROFILES["a100"], dtype, "nn"))
    for other in ("float32", "int8"):  # int8 steps through K 128 elements at a time
        assert not SPACE.is_feasible(config, Problem(PROFILES["h100"], other, "nn"))


def test_cuda_core_kernels_and_tf32_splits_never_take_16_bit_types():
    # mma: the 16-bit types on mma.sync (test_mma.py); skinny: widened and summed in float32 (test_skinny.py)
    for dtype in HALF:
        problem = Problem(PROFILES["h100"], dtype, "nn")
        for name, config in SPACE.named_configs.items():
            if config["MATH"] not in ("wgmma_direct", "mma", "skinny"):
                assert not SPACE.is_feasible(config, problem), name


def test_16_bit_types_run_cublas_without_a_record():
    # shapes where the shipped databases have no candidate faster than cuBLAS nearby (the H100's has mma.sync
    # tiles faster on tiny ones, such as 45x45x45; the A100 has none)
    from autotile.dispatch.cache import TuningCache
    from autotile.dispatch.select import select

    for profile in ("h100", "a100"):
        for kernel, layout, shape in (("matmul", "nt", (33, 4096, 4096)), ("bmm", "nn", (64, 512, 512, 512))):
            found = select(ProblemKey(kernel, "bfloat16", layout, shape), PROFILES[profile], TuningCache(None))
            assert found.implementation == "cublas" and found.config is None, found.explain()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_boxes_are_128_bytes_wide_along_the_stored_rows(layout):
    config = SPACE.named("direct-128x256")
    launch = SPEC.launch(config, (300, 500, 700), "bfloat16", layout)
    a, b = launch.tensor_maps
    M, N, K = 300, 500, 700
    a_kmajor, b_kmajor = layout[0] == "n", layout[1] == "t"
    assert a == (TensorBox(0, K, M, 64, 128, 2) if a_kmajor else TensorBox(0, M, K, 64, 64, 2))
    assert b == (TensorBox(1, K, N, 64, 256, 2) if b_kmajor else TensorBox(1, N, K, 64, 64, 2))
    source = SPEC.render(config, "bfloat16", layout)
    # wgmma reads an operand stored M- or N-contiguous transposed (its imm-trans flag)
    assert f"p, 1, 1, {0 if a_kmajor else 1}, {0 if b_kmajor else 1};" in source
    assert "m64n256k16.f32.bf16.bf16" in source


def test_split_k_sums_in_float32():
    config = SPACE.named("direct-64-split8")
    launch = SPEC.launch(config, (64, 64, 8192), "float16", "nn")
    assert launch.workspace_dtype == "float32" and launch.workspace_elems == 8 * 64 * 64
    assert "float* __restrict__ partials" in SPEC.render(config, "float16", "nn")


@pytest.mark.parametrize("realign", [False, True])
def test_setmaxnreg_fits_the_blocks_registers(realign):
    """With two consumer warpgroups (384 threads) the producer gives registers back and the consumers take
    them: the new counts must fit what the block was launched with, or the increase waits forever. Every
    feasible config (one test per REALIGN value, which moves the producer's count: a test per config cost CI
    more in its own overhead than in the check)."""
    problem = Problem(PROFILES["h100"], "bfloat16", "nn")
    configs = SPACE.restricted({"MATH": "wgmma_direct", "REALIGN": realign}).feasible(problem)
    assert configs
    for config in configs:
        derived = SPACE.derive(config, problem)
        threads = derived["threads"]
        if threads == 256:
            continue
        cap = 65536 // threads // 8 * 8
        producer, consumer = derived["producer_regs"], derived["consumer_regs"]
        assert 128 * producer + (threads - 128) * consumer <= cap * threads, config.key()
        accumulators = derived["wg_rows"] // 64 * config["BN"] // 2
        assert accumulators + 24 <= consumer, config.key()


# Every config in bfloat16 and layout nt; three configs that cover the knobs (two consumer warpgroups with
# clusters, persistence and the staged store; one warpgroup with K splits) in the other layouts, batched,
# and in float16 (the same kernel but for its types' names in two instructions): each compile costs CI's
# two cores about half a second.
COVERING = ("direct-128x256-c2ps", "direct-64-split8", "direct-128-p")
CASES = [(n, "bfloat16", "nt", False) for n in NAMES] + [
    (n, dtype, layout, batched) for n in COVERING for dtype in HALF for layout in LAYOUTS for batched in (False, True)
    if (dtype, layout, batched) != ("bfloat16", "nt", False) and (not batched or layout in ("nn", "tt"))
    and (dtype == "bfloat16" or (layout == "nt" and not batched))]


@pytest.fixture(scope="module")
def compiled():
    if NVRTC_MISSING is not None:
        pytest.skip(NVRTC_MISSING)
    return compile_cases(CASES)


@needs_nvrtc
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}{'-batched' if c[3] else ''}")
def test_compiles_for_sm90a_without_spills(compiled, case):
    check_compile(case, compiled[case])


# -- on a Hopper GPU ----------------------------------------------------------------------------------

SHAPES = [(131, 67, 257), (1, 97, 33), (61, 1, 7), (257, 509, 1031), (1024, 768, 512)]


def _cublas_error(key: ProblemKey, a, b, ref) -> float:
    from autotile.runtime.timing import relative_error

    return relative_error(cublas_output(key, a, b), ref)


def _run(name: str, key: ProblemKey, offset: int = 0, specials: bool = False):
    """(autotile's error, cuBLAS's error, autotile's output, the tensor maps used) for `name` on `key`."""
    import cupy

    from autotile.runtime.impl import Generated
    from autotile.runtime.timing import relative_error

    spec = kernels.get(key.kernel)
    rng = cupy.random.default_rng(7)
    a, b = spec.make_inputs(key.shape, key.dtype, key.layout, rng, cupy)
    if specials:  # an Inf, a -Inf and a NaN in A, a huge value in B
        nan = dtypes.from_float32(cupy.array([np.inf, -np.inf, np.nan, 60000.0], dtype=cupy.float32), key.dtype)
        flat_a, flat_b = a.reshape(-1), b.reshape(-1)
        flat_a[3], flat_a[a.size // 2], flat_a[-1] = nan[0], nan[1], nan[2]
        flat_b[b.size // 3] = nan[3]
    if offset:  # operands that start one element past an aligned address: the register path
        a = cupy.concatenate([cupy.zeros(offset, a.dtype), a.reshape(-1)])[offset:].reshape(a.shape) \
            if a.flags.c_contiguous else a
    runner = Generated(SPACE.named(name)).prepare(key)
    out = cupy.empty(spec.output_shape(key.shape), dtype=dtypes.get(key.dtype).storage)
    kernels.poison(out)
    runner.run((a, b), out)
    cupy.cuda.Device().synchronize()
    ref = spec.reference((a, b))
    return relative_error(out, ref), _cublas_error(key, a, b, ref), out, \
        runner.uses_tensor_maps((int(a.data.ptr), int(b.data.ptr)))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", NAMES)
def test_named_configs_match_cublas_accuracy(name, layout, dtype):
    require_hopper()
    for shape in SHAPES:
        key = ProblemKey("matmul", dtype, layout, shape)
        err, cublas_err, _, _ = _run(name, key)
        assert err <= kernels.tolerance(dtype, shape[-1]), (name, key, err)
        assert err <= 1.5 * cublas_err + 1e-6, (name, key, err, cublas_err)


PERSISTENT = [n for n in NAMES if SPACE.named(n)["PERSISTENT"]]


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ("nn", "tn"))
@pytest.mark.parametrize("name", PERSISTENT)
def test_persistent_blocks_through_many_tiles(name, layout):
    require_hopper()
    for shape in MANY_TILES:
        assert several_tiles_per_block(SPACE.named(name), shape), (name, shape)
        key = ProblemKey("matmul", "bfloat16", layout, shape)
        err, cublas_err, _, _ = _run(name, key)
        assert err <= 1.5 * cublas_err + 1e-6, (name, key, err, cublas_err)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF)
def test_unaligned_batched_and_special_operands(dtype):
    require_hopper()
    import cupy

    for name in ("direct-128x256", "direct-64-split8"):
        # one element off alignment: no tensor map, the producer copies through registers
        err, cublas_err, _, tma = _run(name, ProblemKey("matmul", dtype, "nn", (130, 70, 264)), offset=1)
        assert not tma and err <= 1.5 * cublas_err + 1e-6
        err, cublas_err, _, tma = _run(name, ProblemKey("matmul", dtype, "nt", (256, 512, 1024)))
        assert tma and err <= 1.5 * cublas_err + 1e-6
        for layout in ("nn", "tt"):
            err, cublas_err, _, _ = _run(name, ProblemKey("bmm", dtype, layout, (3, 131, 67, 257)))
            assert err <= 1.5 * cublas_err + 1e-6
        # specials: the NaN and Inf pattern of the output is cuBLAS's
        key = ProblemKey("matmul", dtype, "nn", (97, 130, 200))
        _, _, out, _ = _run(name, key, specials=True)
        spec = kernels.get("matmul")
        rng = cupy.random.default_rng(7)
        a, b = spec.make_inputs(key.shape, dtype, "nn", rng, cupy)
        nan = dtypes.from_float32(cupy.array([np.inf, -np.inf, np.nan, 60000.0], dtype=cupy.float32), dtype)
        fa, fb = a.reshape(-1), b.reshape(-1)
        fa[3], fa[a.size // 2], fa[-1] = nan[0], nan[1], nan[2]
        fb[b.size // 3] = nan[3]
        from autotile.runtime.cublas import CublasCall

        expected = cupy.empty_like(out)
        CublasCall(key, cupy.cuda.Device().id)((int(a.data.ptr), int(b.data.ptr)), int(expected.data.ptr),
                                                cupy.cuda.get_current_stream().ptr)
        ours, theirs = kernels.to_float64(out), kernels.to_float64(expected)
        assert cupy.array_equal(cupy.isnan(ours), cupy.isnan(theirs))
        assert cupy.array_equal(cupy.isinf(ours), cupy.isinf(theirs))
        assert cupy.array_equal(cupy.sign(ours[cupy.isinf(ours)]), cupy.sign(theirs[cupy.isinf(theirs)]))


@pytest.mark.gpu
def test_bound_launch_rewrites_tensor_maps_only_when_the_inputs_move():
    """The library's repeated call of a tensor-map kernel writes the maps into its parameter block only when
    the inputs' addresses change: alternating between two pairs of inputs (and one aligned, one not), each
    result is its own inputs' product."""
    require_hopper()
    import cupy

    from autotile.runtime.impl import Generated
    from autotile.runtime.timing import relative_error

    key = ProblemKey("matmul", "bfloat16", "nt", (200, 136, 264))
    spec = kernels.get("matmul")
    runner = Generated(SPACE.named("direct-128x256")).prepare(key)
    run = runner.bound_launch(out_nbytes=200 * 136 * 2, dtype="bfloat16")
    rng = cupy.random.default_rng(3)
    pairs = [spec.make_inputs(key.shape, "bfloat16", "nt", rng, cupy) for _ in range(2)]
    a, b = spec.make_inputs(key.shape, "bfloat16", "nt", rng, cupy)
    shifted = cupy.concatenate([cupy.zeros(1, a.dtype), a.reshape(-1)])[1:].reshape(a.shape)  # misaligned
    pairs.append((shifted, b))
    stream = cupy.cuda.get_current_stream().ptr
    for a, b in pairs * 2 + pairs[::-1]:
        out = cupy.empty(spec.output_shape(key.shape), dtype=dtypes.get("bfloat16").storage)
        kernels.poison(out)
        run(int(a.data.ptr), int(b.data.ptr), int(out.data.ptr), stream)
        assert relative_error(out, spec.reference((a, b))) <= kernels.tolerance("bfloat16", 264)
    assert runner.uses_tensor_maps((int(pairs[0][0].data.ptr), int(pairs[0][1].data.ptr)))
    assert not runner.uses_tensor_maps((int(shifted.data.ptr), int(b.data.ptr)))


def test_float16_borrows_bfloat16s_database(tmp_path):
    """float16 runs bfloat16's kernels at the same tensor-core rate: without a database of its own (on its
    GPU or a sibling) it takes bfloat16's choices (a generated kernel where bfloat16's database chose one)."""
    import shutil

    from autotile.codegen import resources
    from autotile.dispatch.cache import TuningCache
    from autotile.dispatch.select import borrowed_keys, select

    key = ProblemKey("matmul", "float16", "nt", (8192, 8192, 1024))
    assert [(k.dtype, k.layout) for k in borrowed_keys(key)] == [("float16", "nn"), ("bfloat16", "nt"),
                                                                 ("bfloat16", "nn")]
    device = PROFILES["h100"]
    shipped = resources.shipped_cache_dir()
    assert shipped is not None
    only_bf16 = tmp_path / device.fingerprint / "database"
    only_bf16.mkdir(parents=True)
    shutil.copy(shipped / device.fingerprint / "database" / "matmul-bfloat16-nn.json", only_bf16)
    cache = TuningCache(root=tmp_path / "user", shipped_root=tmp_path)
    found = select(key, device, cache)
    bf16 = select(dataclasses.replace(key, dtype="bfloat16"), device, cache)
    assert found.implementation == "generated", found.explain()
    assert (found.implementation, found.config) == (bf16.implementation, bf16.config)
    assert "bfloat16" in found.source, found.explain()
