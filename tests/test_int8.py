"""int8 matmul (torch._int_mm's contract: int8 A and B, exact int32 sums, int32 C) on MATH=wgmma_direct. Without
a GPU: the dtype record, inputs and reference, the space keeps int8 to its own configs on sm_90, the tensor
maps (layout nt only: wgmma reads 8-bit operands K-major, so the other layouts transpose through
registers), the instruction and the int32 split-K workspace, and every int8 config compiles for sm_90a. On
a Hopper GPU (`gpu` marker): every int8 config in every layout, batched, unaligned and split, exactly equal
to the float64 reference (and to cuBLAS's int8 GEMM), and the library's calls from torch and CuPy."""

from __future__ import annotations

import numpy as np
import pytest
from direct_support import MANY_TILES, check_compile, compile_cases, require_hopper, several_tiles_per_block

from autotile.codegen import build, dtypes, kernels
from autotile.codegen.limits import PROFILES
from autotile.codegen.problem import ProblemKey
from autotile.codegen.space import Problem
from autotile.codegen.tensor_map import TensorBox

SPEC = kernels.get("matmul")
SPACE = SPEC.space
NAMES = [n for n, c in SPACE.named_configs.items() if c["MATH"] == "wgmma_direct" and c["BK"] == 128]
LAYOUTS = ("nn", "nt", "tn", "tt")
NVRTC_MISSING = build.nvrtc_unavailable_reason()
needs_nvrtc = pytest.mark.skipif(NVRTC_MISSING is not None, reason=f"NVRTC cannot be loaded ({NVRTC_MISSING})")


# -- the dtype ----------------------------------------------------------------------------------------

def test_int8_record_outputs_int32_and_is_exact():
    record = dtypes.get("int8")
    assert record.size == 1 and record.output_name == "int32" and record.accumulator == "int32"
    assert dtypes.output_storage("int8") == "int32" and dtypes.output_ctype("int8") == "int"
    assert dtypes.output_storage("bfloat16") == "uint16" and dtypes.output_storage("float16") == "float16"
    assert dtypes.itemsize("int32") == 4 and dtypes.itemsize("int8") == 1
    assert kernels.tolerance("int8", 1 << 16) == 0.0  # exact: any difference fails


def test_rounding_to_int8_clips():
    values = np.array([0.4, 0.5, 1.5, -1.5, 126.6, 300.0, -300.0, -128.4], dtype=np.float32)
    assert dtypes.from_float32(values, "int8").tolist() == [0, 0, 2, -2, 127, 127, -128, -128]


def test_inputs_span_int8_and_the_reference_is_exact():
    rng = np.random.default_rng(0)
    a, b = SPEC.make_inputs((300, 200, 500), "int8", "nt", rng, np)
    assert a.dtype == np.int8 and b.dtype == np.int8 and b.shape == (500, 200)
    assert a.min() == -128 and a.max() == 127  # the whole range, extremes included
    ref = SPEC.reference((a, b))
    assert np.array_equal(ref, a.astype(np.int64) @ b.astype(np.int64))


def test_poison_of_an_int32_output_is_no_product():
    out = np.zeros(3, dtype=np.int32)
    kernels.poison(out)
    assert (out == -(2**31)).all()  # beyond 128 * 128 * K for every K a test checks


# -- the space ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_int8_configs_only_for_int8_on_sm90(name):
    config = SPACE.named(name)
    for profile in ("h100", "h200"):
        for layout in LAYOUTS:
            assert SPACE.is_feasible(config, Problem(PROFILES[profile], "int8", layout))
    assert not SPACE.is_feasible(config, Problem(PROFILES["a100"], "int8", "nt"))
    for other in ("bfloat16", "float16", "float32"):
        assert not SPACE.is_feasible(config, Problem(PROFILES["h100"], other, "nt"))


def test_only_the_tensor_core_kernels_take_int8_and_wgmma_direct_stores_int32_directly():
    problem = Problem(PROFILES["h100"], "int8", "nt")
    for name, config in SPACE.named_configs.items():
        if name not in NAMES and config["MATH"] != "mma":  # mma: int8 on mma.sync (tests/test_mma.py)
            assert not SPACE.is_feasible(config, problem), name
    staged = SPACE.with_overrides(SPACE.named("direct8-128x256"), {"STORE": "staged"})
    assert any("stores int32 directly" in line for line in SPACE.violations(staged, problem))
    assert SPACE.restricted({"MATH": "wgmma_direct"}).feasible(problem)  # the tuner has a space to search


def test_int8_runs_cublas_without_a_record():
    from autotile.dispatch.cache import TuningCache
    from autotile.dispatch.select import select

    for kernel, shape in (("matmul", (33, 4096, 4096)), ("bmm", (8, 64, 64, 64))):
        found = select(ProblemKey(kernel, "int8", "nt", shape), PROFILES["h100"], TuningCache(None))
        assert found.implementation == "cublas" and found.config is None, found.explain()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_tensor_maps_only_for_k_contiguous_operands(layout):
    """The TMA copies an int8 operand stored K-contiguous (A in nn and nt, B in nt and tt); the producer
    transposes the others through registers (tn: both, and no tensor-map parameters at all)."""
    config = SPACE.named("direct8-128x256")
    M, N, K = 300, 500, 700
    launch = SPEC.launch(config, (M, N, K), "int8", layout)
    source = SPEC.render(config, "int8", layout)
    assert "m64n256k32.s32.s8.s8" in source and "int* __restrict__ partials" not in source
    a, b = TensorBox(0, K, M, 128, 128, 1), TensorBox(1, K, N, 128, 256, 1)
    expected = {"nt": (a, b), "nn": (a,), "tt": (b,), "tn": ()}[layout]
    assert launch.tensor_maps == expected
    assert ("TensorMap map_a" in source) == (a in expected) and ("TensorMap map_b" in source) == (b in expected)
    if layout == "tn":
        assert "constexpr int use_tma = 0;" in source
    if layout in ("nn", "tt"):  # one operand by the TMA, the other transposed: every producer thread arrives
        assert "mbarrier.expect_tx" in source and "mbar_init(bars + 8 * s, 128);" in source
    derived = SPACE.derive(config, Problem(PROFILES["h100"], "int8", layout))
    assert derived["producer_regs"] == (40 if layout == "nt" else 64)  # the transposes need registers


def test_split_k_sums_in_int32():
    config = SPACE.named("direct8-64-split8")
    launch = SPEC.launch(config, (64, 64, 8192), "int8", "nn")
    assert launch.workspace_dtype == "int32" and launch.workspace_elems == 8 * 64 * 64
    assert "int* __restrict__ partials" in SPEC.render(config, "int8", "nn")


# Every int8 config in nt; two that cover the knobs (clusters and persistence; K splits) in the other layouts
# (the transposing producer) and batched.
COVERING = ("direct8-128x256-c2p", "direct8-64-split8")
CASES = [(n, "int8", "nt", False) for n in NAMES] + [
    (n, "int8", layout, batched) for n in COVERING for layout in LAYOUTS for batched in (False, True)
    if (layout, batched) != ("nt", False) and (not batched or layout in ("nt", "tt"))]


@pytest.fixture(scope="module")
def compiled():
    if NVRTC_MISSING is not None:
        pytest.skip(NVRTC_MISSING)
    return compile_cases(CASES)


@needs_nvrtc
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[2]}{'-batched' if c[3] else ''}")
def test_compiles_for_sm90a_without_spills(compiled, case):
    check_compile(case, compiled[case])


# -- on a Hopper GPU ----------------------------------------------------------------------------------

SHAPES = [(131, 67, 257), (1, 97, 33), (61, 1, 7), (257, 509, 1031), (1024, 768, 512), (17, 4096, 4099)]


def _run(name: str, key: ProblemKey, offset: int = 0):
    """(autotile's output, the float64 reference, whether tensor maps were used) for `name` on `key`."""
    import cupy

    from autotile.runtime.impl import Generated

    spec = kernels.get(key.kernel)
    a, b = spec.make_inputs(key.shape, "int8", key.layout, cupy.random.default_rng(7), cupy)
    if offset:  # operands that start one element past an aligned address: no tensor maps
        a = cupy.concatenate([cupy.zeros(offset, a.dtype), a.reshape(-1)])[offset:].reshape(a.shape) \
            if a.flags.c_contiguous else a
    runner = Generated(SPACE.named(name)).prepare(key)
    out = cupy.empty(spec.output_shape(key.shape), dtype=cupy.int32)
    kernels.poison(out)
    runner.run((a, b), out)
    cupy.cuda.Device().synchronize()
    return out, spec.reference((a, b)), runner.uses_tensor_maps((int(a.data.ptr), int(b.data.ptr))), (a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", NAMES)
def test_named_configs_are_exact(name, layout):
    require_hopper()
    import cupy

    for shape in SHAPES:
        out, ref, tma, _ = _run(name, ProblemKey("matmul", "int8", layout, shape))
        assert cupy.array_equal(out.astype(cupy.float64), ref), (name, layout, shape)
        # the TMA copies K-contiguous operands whose rows are 16-byte aligned (K % 16 == 0)
        assert tma == (layout != "tn" and shape[-1] % 16 == 0)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ("nt", "nn"))
@pytest.mark.parametrize("name", [n for n in NAMES if SPACE.named(n)["PERSISTENT"]])
def test_persistent_blocks_through_many_tiles(name, layout):
    """Blocks that take several tiles each (test_wgmma_direct.MANY_TILES): with PINGPONG, in turns."""
    require_hopper()
    import cupy

    for shape in MANY_TILES:
        assert several_tiles_per_block(SPACE.named(name), shape), (name, shape)
        out, ref, _, _ = _run(name, ProblemKey("matmul", "int8", layout, shape))
        assert cupy.array_equal(out.astype(cupy.float64), ref), (name, layout, shape)


@pytest.mark.gpu
def test_int8_unaligned_batched_and_cublas_agree():
    require_hopper()
    import cupy

    from autotile.runtime.cublas import unsupported_reason
    from autotile.runtime.impl import Cublas

    for name in ("direct8-128x256", "direct8-64-split8"):
        out, ref, tma, _ = _run(name, ProblemKey("matmul", "int8", "nt", (130, 70, 272)), offset=1)
        assert not tma and cupy.array_equal(out.astype(cupy.float64), ref)
        for layout in ("nt", "nn", "tt"):
            for shape in ((3, 131, 67, 257), (2, 132, 68, 256)):
                key = ProblemKey("bmm", "int8", layout, shape)
                out, ref, _, inputs = _run(name, key)
                assert cupy.array_equal(out.astype(cupy.float64), ref), (name, key)
                if unsupported_reason(key) is None:  # leading dimensions that cuBLAS's int8 GEMM takes
                    theirs = cupy.empty_like(out)
                    Cublas().prepare(key).run(inputs, theirs)
                    assert cupy.array_equal(theirs, out), (name, key)


@pytest.mark.gpu
def test_library_int8_matmul_from_torch_and_cupy():
    require_hopper()
    import cupy

    import autotile
    from autotile.errors import ArgumentError

    torch = pytest.importorskip("torch")
    a = torch.randint(-128, 128, (300, 4096), dtype=torch.int8, device="cuda")
    w = torch.randint(-128, 128, (1000, 4096), dtype=torch.int8, device="cuda")
    c = autotile.matmul(a, w.T)
    assert c.dtype == torch.int32 and c.shape == (300, 1000)
    assert torch.equal(c, torch._int_mm(a, w.T))  # torch._int_mm's contract, to the bit
    out = torch.empty(300, 1000, dtype=torch.int32, device="cuda")
    autotile.matmul(a, w.T, out=out)
    assert torch.equal(out, c)
    with pytest.raises(ArgumentError, match="int8 and the 8-bit floats are for matmul"):
        autotile.matvec(a, w[0])
    x, y = cupy.asarray(a[:, :67].contiguous()), cupy.asarray(w[:5, :67].T)
    z = autotile.matmul(x, y)
    assert z.dtype == cupy.int32 and cupy.array_equal(z, x.astype(cupy.int64) @ y.astype(cupy.int64))


def test_where_cublas_cannot_run_int8_a_generated_kernel_does():
    """cuBLAS's int8 GEMM needs layout nt and leading dimensions that are multiples of 4: elsewhere the
    built-in default is a generated int8 config (wgmma_direct on sm_90, mma on sm_80 and newer), and a
    one-line ArgumentError before sm_80 (no kernel of either kind)."""
    from autotile.dispatch.cache import TuningCache
    from autotile.dispatch.select import select
    from autotile.errors import ArgumentError
    from autotile.runtime.cublas import unsupported_reason

    odd = ProblemKey("matmul", "int8", "nt", (131, 67, 257))
    assert "lda = 257, ldb = 257, ldc = 67" in unsupported_reason(odd)
    assert unsupported_reason(ProblemKey("matmul", "int8", "nt", (131, 68, 256))) is None
    assert "layout nt" in unsupported_reason(ProblemKey("matmul", "int8", "nn", (128, 128, 128)))
    assert unsupported_reason(ProblemKey("matmul", "bfloat16", "nn", (131, 67, 257))) is None
    found = select(odd, PROFILES["h100"], TuningCache(None))
    assert found.implementation == "generated" and found.config["MATH"] == "wgmma_direct", found.explain()
    found = select(odd, PROFILES["a100"], TuningCache(None))
    assert found.implementation == "generated" and found.config["MATH"] == "mma", found.explain()
    with pytest.raises(ArgumentError, match="no generated kernel runs int8 there, and cuBLAS's int8 GEMM needs"):
        select(odd, PROFILES["v100"], TuningCache(None))


def test_int8_main_layout_is_nt_in_the_survey_and_the_selection():
    """wgmma reads 8-bit operands K-major only: int8's fast layout is nt (the TMA alone), nn and tt transpose
    one operand in the producer, tn both: nt and nn are surveyed on the whole grid, tt and tn borrow nn's
    choices first."""
    from autotile.dispatch.select import borrowed_keys
    from autotile.tuning import survey

    assert dtypes.main_layout("int8") == "nt" and dtypes.main_layout("bfloat16") == "nn"
    for layout in ("nt", "nn"):  # the kernels differ by layout: both surveyed on the whole grid
        assert survey.coverage("matmul", layout, "int8") is None
        assert survey.grid("matmul", layout=layout, dtype="int8") == survey.grid("matmul", layout="nn")
    assert survey.coverage("matmul", "nt", "bfloat16") == [survey.DECODE_MAX_ROWS, None, None]
    assert [(k.kernel, k.layout) for k in borrowed_keys(ProblemKey("matmul", "int8", "nn", (64, 64, 64)))] == \
        [("matmul", "nt")]
    assert borrowed_keys(ProblemKey("matmul", "int8", "nt", (64, 64, 64))) == []
    # tt transposes one operand, as nn does: nn's choices first
    assert [(k.kernel, k.layout) for k in borrowed_keys(ProblemKey("bmm", "int8", "tt", (2, 64, 64, 64)))] == \
        [("bmm", "nn"), ("bmm", "nt"), ("matmul", "tt"), ("matmul", "nn"), ("matmul", "nt")]


def test_int8_other_layouts_run_generated_kernels():
    """cuBLAS's int8 GEMM runs layout nt only: every other int8 problem runs a generated kernel on sm_90
    (the producer transposes: 1.5-3.5x cuBLAS's nn measured where it ran), chosen from nn's database."""
    from autotile.dispatch.cache import TuningCache
    from autotile.dispatch.select import select

    cache = TuningCache(None)  # the shipped databases only
    for layout in ("nn", "tt", "tn"):
        for shape in ((1024, 8192, 8192), (33, 4096, 4096), (1023, 8191, 8191)):
            found = select(ProblemKey("matmul", "int8", layout, shape), PROFILES["h100"], cache)
            assert found.implementation == "generated", found.explain()


def test_tt_borrows_nns_tile_mirrored():
    """tt is nn with the operands' roles swapped: nn's tile, mirrored, keeps the TMA's operand on the long
    side."""
    from autotile.dispatch.cache import TuningCache
    from autotile.dispatch.select import select

    shape = (8192, 8192, 8192)
    nn = select(ProblemKey("matmul", "int8", "nn", shape), PROFILES["h100"], TuningCache(None))
    tt = select(ProblemKey("matmul", "int8", "tt", shape), PROFILES["h100"], TuningCache(None))
    assert "of matmul nn" in tt.source and nn.config is not None and tt.config is not None
    assert (tt.config["BM"], tt.config["BN"]) == (nn.config["BN"], nn.config["BM"])


def test_where_cublas_refuses_an_nt_shape_the_model_still_chooses():
    """An nt shape cuBLAS refuses (K = 4095: leading dimensions not multiples of 4) takes the candidate the
    database predicts best, whatever its margin over cuBLAS, rather than the built-in default."""
    from autotile.dispatch.cache import TuningCache
    from autotile.dispatch.select import select

    found = select(ProblemKey("matmul", "int8", "nt", (33, 4096, 4095)), PROFILES["h100"], TuningCache(None))
    assert found.implementation == "generated" and found.source.startswith("model"), found.explain()


def test_a_gpu_without_its_own_database_reads_a_same_architecture_ones(shipped_subset):
    """The H200 has no bfloat16 matvec database of its own: it reads the H100's (the same sm_90 kernels),
    and says so; its own float32 and bfloat16 databases stay first. A float16 problem takes its own GPU's bfloat16
    database before a sibling's float16 one (the GPU predicts more than the 16-bit type), but a sibling's
    float16 batches before one matrix's choice on its own GPU."""
    from autotile.dispatch.cache import TuningCache
    from autotile.dispatch.select import select

    cache = TuningCache(None)
    found = select(ProblemKey("matvec", "bfloat16", "row", (8192, 8192)), PROFILES["h200"], cache)
    assert "on NVIDIA H100" in found.source, found.explain()
    for dtype in ("float32", "bfloat16"):
        own = select(ProblemKey("matmul", dtype, "nn", (4096, 4096, 4096)), PROFILES["h200"], cache)
        assert own.source.startswith("model") and " on " not in own.source, own.explain()
    # an H100 with no float16 databases and no batched ones (the shipped H100 has them since 2026-12-06)
    cache = shipped_subset(("h100", "matmul", "bfloat16", "nn"), ("h200", "matmul", "float16", "nn"),
                           ("h200", "bmm", "float16", "nn"))
    half = select(ProblemKey("matmul", "float16", "nn", (8192, 8192, 1024)), PROFILES["h100"], cache)
    assert half.source.startswith("model") and "of matmul bfloat16" in half.source, half.source
    assert " on " not in half.source, half.source
    batch = select(ProblemKey("bmm", "float16", "nn", (24, 512, 512, 512)), PROFILES["h100"], cache)
    assert batch.source.startswith("model") and "on NVIDIA H200" in batch.source, batch.source
    assert "matmul" not in batch.source, batch.source
    assert "on NVIDIA H100" not in select(ProblemKey("matmul", "int8", "nt", (8192, 8192, 1024)), PROFILES["a100"],
                                          cache).source  # another architecture: no


def test_wgmma_direct_candidates_learn_from_rows_of_the_querys_alignment():
    """A wgmma_direct config copies with tensor maps where rows are 16-byte aligned and through registers
    elsewhere (several times slower for int8): the model predicts it from shapes of the query's kind only.
    Learning from the nearest of either kind, it picked direct8-128 for 24x696x920 nt, which ran 0.13x
    torch._int_mm on an H100 (2026-11-28)."""
    from autotile.dispatch.cache import TuningCache
    from autotile.dispatch.model import copy_width
    from autotile.dispatch.select import select

    assert copy_width(SPACE.named("direct8-128"), 1) == 16
    assert copy_width(SPACE.named("direct-128x256"), 2) == 8
    for shape in ((24, 696, 920), (24, 88, 888)):  # K % 16 == 8: no tensor map for A or B
        found = select(ProblemKey("matmul", "int8", "nt", shape), PROFILES["h100"], TuningCache(None))
        assert found.config is None or found.config["MATH"] != "wgmma_direct", found.explain()
