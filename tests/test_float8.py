"""The 8-bit floats (float8_e4m3fn, float8_e5m2) on MATH=wgmma_direct: torch._scaled_mm's contract (per-tensor
float32 scales, float32 sums, a bfloat16 C). Without a GPU: the byte <-> value conversions, the space keeps
them to wgmma_direct on sm_90, the kernels take the scales and compile for sm_90a, the reference scales, the
selection borrows int8's choices and names the GPUs that cannot. On a Hopper GPU (`gpu` marker): every
8-bit named config in every layout against a float64 reference and against torch._scaled_mm, specials
included, and `autotile.scaled_matmul`."""

from __future__ import annotations

import numpy as np
import pytest
from direct_support import check_compile, compile_cases, require_hopper

from autotile.codegen import dtypes, kernels
from autotile.codegen.limits import PROFILES
from autotile.codegen.problem import ProblemKey
from autotile.codegen.space import Problem
from autotile.errors import ArgumentError

SPEC = kernels.get("matmul")
SPACE = SPEC.space
FLOAT8 = dtypes.FLOAT8_DTYPES
NAMES = [n for n, c in SPACE.named_configs.items() if c["MATH"] == "wgmma_direct" and c["BK"] == 128]
LAYOUTS = ("nn", "nt", "tn", "tt")
SHAPES = [(131, 67, 257), (1, 97, 33), (256, 512, 1024), (300, 200, 700)]


# -- the types --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOAT8)
def test_every_finite_byte_round_trips_and_ties_go_to_even(dtype):
    values = dtypes.float8_values(dtype)
    codes = np.arange(256, dtype=np.uint8)
    finite = np.isfinite(values)
    assert np.array_equal(dtypes.from_float32(values[finite], dtype), codes[finite])
    assert np.nanmax(np.abs(values[finite])) == dtypes.get(dtype).max_finite
    one = int(dtypes.from_float32(np.array([1.0], np.float32), dtype)[0])
    step = float(values[one + 1] - 1.0)
    # halfway between 1 and the next value: the even code, 1 itself
    assert int(dtypes.from_float32(np.array([1.0 + step / 2], np.float32), dtype)[0]) == one
    assert int(dtypes.from_float32(np.array([-1.0], np.float32), dtype)[0]) == one | 0x80


def test_overflow_and_specials_follow_each_format():
    big = np.array([1e9, -1e9, np.inf, np.nan, 0.0, -0.0], np.float32)
    e4m3 = dtypes.from_float32(big, "float8_e4m3fn")
    assert list(e4m3) == [0x7F, 0xFF, 0x7F, 0x7F, 0x00, 0x80]  # no infinity: NaN
    e5m2 = dtypes.from_float32(big, "float8_e5m2")
    assert list(e5m2) == [0x7C, 0xFC, 0x7C, 0x7F, 0x00, 0x80]  # infinities as IEEE's
    assert np.isinf(dtypes.to_float32(e5m2[:3], "float8_e5m2")).all()
    assert np.isnan(dtypes.to_float32(e4m3[:4], "float8_e4m3fn")).all()


def test_inputs_carry_scales_and_the_reference_applies_them():
    a, b, scale_a, scale_b = SPEC.make_inputs((5, 7, 9), "float8_e4m3fn", "nt", np.random.default_rng(0), np)
    assert a.dtype == np.uint8 and b.shape == (9, 7) and scale_a.shape == (1,) and scale_a.dtype == np.float32
    assert 0.5 <= scale_a[0] < 2.0 and scale_b[0] != 1.0
    values = [dtypes.to_float32(x, "float8_e4m3fn").astype(np.float64) for x in (a, b)]
    expected = values[0] @ values[1] * float(scale_a[0]) * float(scale_b[0])
    assert np.allclose(SPEC.reference((a, b, scale_a, scale_b), "float8_e4m3fn"), expected, rtol=1e-12)
    assert SPEC.operand_count("float8_e5m2") == 4 and SPEC.operand_count("bfloat16") == 2
    # the output is bfloat16: one rounding of it, not of an 8-bit float
    assert kernels.tolerance("float8_e4m3fn", 4096) == kernels.tolerance("bfloat16", 4096)


# -- the space and the source -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOAT8)
def test_8_bit_configs_take_the_8_bit_floats_on_sm90_only(dtype):
    for name in NAMES:
        config = SPACE.named(name)
        for layout in LAYOUTS:
            assert SPACE.is_feasible(config, Problem(PROFILES["h100"], dtype, layout)), (name, layout)
        assert not SPACE.is_feasible(config, Problem(PROFILES["a100"], dtype, "nt"))
    for name, config in SPACE.named_configs.items():
        if name not in NAMES:
            assert not SPACE.is_feasible(config, Problem(PROFILES["h100"], dtype, "nt")), name
    matvec = kernels.get("matvec").space
    row = Problem(PROFILES["h100"], dtype, "row")
    assert not any(matvec.is_feasible(c, row) for c in matvec.named_configs.values())


def test_kernels_take_the_scales_and_store_bfloat16():
    source = SPEC.render(SPACE.named("direct8-64-split8"), "float8_e5m2", "nt")
    assert "const float* __restrict__ scale_a, const float* __restrict__ scale_b, TC* __restrict__ C" in source
    assert "m64n64k32.f32.e5m2.e5m2" in source and "cvt.rn.bf16x2.f32" in source
    assert "acc[mi][j][v] *= scale;" in source and "float* __restrict__ partials" in source
    assert source.index("sum += sp ==") < source.index("*= scale")  # the splits are summed, then scaled once


CASES = [(name, dtype, layout, False) for dtype in FLOAT8 for name, layout in
         (("direct8-128x256-c2p", "nt"), ("direct8-64-split8", "nn"), ("direct8-256x128", "tn"))]


@pytest.fixture(scope="module")
def compiled():
    from autotile.codegen import build

    if build.nvrtc_unavailable_reason() is not None:
        pytest.skip(f"NVRTC cannot be loaded ({build.nvrtc_unavailable_reason()})")
    return compile_cases(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
def test_compiles_for_sm90a_without_spills(compiled, case):
    check_compile(case, compiled[case])


# -- what runs ----------------------------------------------------------------------------------------------

def test_selection_borrows_int8s_choices_weighed_against_torch_scaled_mm():
    """An 8-bit float problem borrows int8's database; where torch._scaled_mm takes the problem (layout nt, K
    and N multiples of 16) the choices are weighed against int8's cuBLAS column, which stands for it, and the
    vendor's call ("cublas": torch._scaled_mm) runs where none is predicted safely faster; elsewhere a
    generated kernel always runs."""
    from autotile.dispatch.cache import TuningCache
    from autotile.dispatch.select import borrowed_keys, scaled_mm_takes, select

    key = ProblemKey("matmul", "float8_e4m3fn", "nt", (4096, 4096, 4096))
    assert [(k.dtype, k.layout) for k in borrowed_keys(key)] == [("int8", "nt")]
    assert scaled_mm_takes(key)
    assert not scaled_mm_takes(ProblemKey("matmul", "float8_e4m3fn", "nn", (4096, 4096, 4096)))
    assert not scaled_mm_takes(ProblemKey("matmul", "float8_e4m3fn", "nt", (4096, 4104, 4096)))  # N % 16
    assert not scaled_mm_takes(ProblemKey("matmul", "float8_e4m3fn", "nt", (4096, 4096, 4104)))  # K % 16
    assert scaled_mm_takes(ProblemKey("matmul", "float8_e4m3fn", "nt", (33, 4096, 4096)))  # any M
    assert not scaled_mm_takes(ProblemKey("matmul", "float8_e5m2", "nt", (4096, 4096, 4096)))  # refused by torch
    for shape in ((4096, 4096, 4096), (33, 4096, 4096), (1, 5000, 300)):
        for layout, dtype in (("nt", "float8_e4m3fn"), ("nt", "float8_e5m2"), ("nn", "float8_e4m3fn"),
                              ("tt", "float8_e4m3fn")):
            problem = ProblemKey("matmul", dtype, layout, shape)
            found = select(problem, PROFILES["h100"], TuningCache(None))
            if scaled_mm_takes(problem):
                assert found.implementation in ("cublas", "generated"), found.explain()
            else:
                assert found.implementation == "generated" and found.config is not None, found.explain()
    # at 4096^3 nt int8's database has nothing safely faster than cuBLAS: torch._scaled_mm runs
    assert select(key, PROFILES["h100"], TuningCache(None)).implementation == "cublas"
    with pytest.raises(ArgumentError, match="float8_e4m3fn matmul 64x64x64 .* NVIDIA A100.*no generated kernel"):
        select(ProblemKey("matmul", "float8_e4m3fn", "nt", (64, 64, 64)), PROFILES["a100"], TuningCache(None))


# -- on a GPU -----------------------------------------------------------------------------------------------

def _torch_scaled(a, b, scale_a, scale_b, dtype):
    """torch._scaled_mm on the same bytes (`a` row-major and `b` column-major, as it requires)."""
    import torch

    ta = torch.as_tensor(a, device="cuda").view(getattr(torch, dtype))
    tb = torch.as_tensor(b, device="cuda").view(getattr(torch, dtype))
    sa, sb = torch.as_tensor(scale_a, device="cuda"), torch.as_tensor(scale_b, device="cuda")
    return torch._scaled_mm(ta, tb, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", FLOAT8)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_named_configs_match_the_reference(dtype, layout):
    require_hopper()
    import cupy

    from autotile.runtime.impl import Generated
    from autotile.runtime.timing import relative_error

    rng = cupy.random.default_rng(3)
    failures = []
    for shape in SHAPES:
        key = ProblemKey("matmul", dtype, layout, shape)
        inputs = SPEC.make_inputs(shape, dtype, layout, rng, cupy)
        ref = SPEC.reference(inputs, dtype)
        for name in NAMES:
            out = cupy.empty(shape[:2], dtype=cupy.uint16)
            kernels.poison(out)
            Generated(SPACE.named(name)).prepare(key).run(inputs, out)
            err = relative_error(out, ref)
            if not err <= kernels.tolerance(dtype, shape[-1]):
                failures.append(f"{name} {shape}: {err:.3g}")
    assert not failures, failures


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", FLOAT8)
def test_accuracy_and_specials_as_torch_scaled_mm(dtype):
    """NaN and Inf where the float64 reference has them; the error at most 1.5x torch._scaled_mm's on the
    same bytes (float8_e4m3fn: torch 2.11 refuses two float8_e5m2 operands)."""
    require_hopper()
    cupy = pytest.importorskip("cupy")
    torch = pytest.importorskip("torch")
    from autotile.runtime.impl import Generated
    from autotile.runtime.timing import relative_error

    key = ProblemKey("matmul", dtype, "nt", (272, 528, 1040))  # torch._scaled_mm: sides multiples of 16
    a, b, scale_a, scale_b = SPEC.make_inputs(key.shape, dtype, "nt", cupy.random.default_rng(4), cupy)
    specials = dtypes.from_float32(cupy.array([np.inf, -np.inf, np.nan, 400.0], dtype=cupy.float32), dtype)
    a[3, 5], a[100, 9], a[200, 1000] = specials[0], specials[1], specials[2]
    b[11, 7] = specials[3]  # a large value in B (K x N, stored column-major)
    ref = SPEC.reference((a, b, scale_a, scale_b), dtype)
    finite = cupy.isfinite(ref)
    their_err = None
    if dtype == "float8_e4m3fn" and hasattr(torch, dtype):
        theirs64 = cupy.asarray(_torch_scaled(a, b, scale_a, scale_b, dtype).float()).astype(cupy.float64)
        assert cupy.array_equal(cupy.isnan(theirs64), cupy.isnan(ref))
        their_err = relative_error(cupy.where(finite, theirs64, 0), cupy.where(finite, ref, 0))
    for name in NAMES:
        out = cupy.empty(key.shape[:2], dtype=cupy.uint16)
        kernels.poison(out)
        Generated(SPACE.named(name)).prepare(key).run((a, b, scale_a, scale_b), out)
        ours = kernels.to_float64(out)
        assert cupy.array_equal(cupy.isnan(ours), cupy.isnan(ref)), name
        assert cupy.array_equal(cupy.isinf(ours), cupy.isinf(ref)), name
        inf = cupy.isinf(ours)
        assert cupy.array_equal(cupy.sign(ours[inf]), cupy.sign(ref[inf])), name
        err = relative_error(cupy.where(finite, ours, 0), cupy.where(finite, ref, 0))
        assert err <= kernels.tolerance(dtype, key.shape[-1]), (name, err)
        if their_err is not None:
            assert err <= 1.5 * their_err + 1e-6, (name, err, their_err)


@pytest.mark.gpu
def test_library_scaled_matmul_on_torch_tensors():
    require_hopper()
    torch = pytest.importorskip("torch")
    import autotile

    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8_e4m3fn")
    a = (torch.randn(300, 1000, device="cuda") * 2).to(torch.float8_e4m3fn)
    w = (torch.randn(520, 1000, device="cuda") * 2).to(torch.float8_e4m3fn)
    sa, sb = torch.tensor([0.75], device="cuda"), torch.tensor([1.25], device="cuda")
    ref = (a.double() @ w.double().T) * 0.75 * 1.25
    for B in (w.T, w.T.contiguous()):  # column-major (torch._scaled_mm's layout), then row-major
        c = autotile.scaled_matmul(a, B, sa, sb)
        assert c.dtype == torch.bfloat16 and c.shape == (300, 520)
        err = float((c.double() - ref).norm() / ref.norm())
        assert err <= kernels.tolerance("float8_e4m3fn", 1000), err
        again = autotile.scaled_matmul(a, B, sa, sb)  # the repeated call's path
        assert torch.equal(again, c)
    # a problem torch._scaled_mm takes, where the selection finds nothing faster: its own call runs (the same
    # bits), with out= and on a stream of the caller's too
    from autotile.library import calls

    a16 = (torch.randn(256, 4096, device="cuda") * 2).to(torch.float8_e4m3fn)
    w16 = (torch.randn(4096, 4096, device="cuda") * 2).to(torch.float8_e4m3fn)
    assert calls.selection_for("matmul", "float8_e4m3fn", "nt", (256, 4096, 4096)).implementation == "cublas"
    theirs = torch._scaled_mm(a16, w16.T, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    out = torch.full((256, 4096), float("nan"), device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    for _ in range(2):  # the first call prepares; the repeated one takes the short path
        assert torch.equal(autotile.scaled_matmul(a16, w16.T, sa, sb), theirs)
        out.fill_(float("nan"))
        assert autotile.scaled_matmul(a16, w16.T, sa, sb, out=out) is out and torch.equal(out, theirs)
        with torch.cuda.stream(stream):
            on_stream = autotile.scaled_matmul(a16, w16.T, sa, sb, stream=stream)
        stream.synchronize()
        assert torch.equal(on_stream, theirs)
    with pytest.raises(ArgumentError, match="come with scales"):
        autotile.matmul(a, w.T)
    with pytest.raises(ArgumentError, match="scale_b must be a one-element float32 tensor"):
        autotile.scaled_matmul(a, w.T, sa, torch.ones(2, device="cuda"))


def test_first_call_tuning_times_int8s_candidates_and_no_cublas():
    """Where cuBLAS cannot run the problem, tuning at first call times the borrowed database's generated
    candidates (feasible for the 8-bit float) and no cuBLAS; the record it saves then has no baseline."""
    from autotile.dispatch.cache import TuningCache
    from autotile.tuning import at_first_call

    key = ProblemKey("matmul", "float8_e4m3fn", "nt", (1000, 1000, 1000))
    picks = at_first_call.candidates(key, PROFILES["h100"], TuningCache(None))
    assert picks and all(p.implementation == "generated" for p in picks)
    problem = Problem(PROFILES["h100"], "float8_e4m3fn", "nt")
    assert all(SPACE.is_feasible(p.config, problem) for p in picks)
    assert len(picks) <= at_first_call.MAX_CANDIDATES
    float32 = at_first_call.candidates(ProblemKey("matmul", "float32", "nn", (1000, 1000, 1000)),
                                       PROFILES["h100"], TuningCache(None))
    assert float32[0].implementation == "cublas"


@pytest.mark.gpu
def test_first_call_tuning_of_an_8_bit_float_problem_saves_its_winner(isolated_cache):
    require_hopper()
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8_e4m3fn")
    import autotile
    from autotile.dispatch.cache import TuningCache
    from autotile.library import calls
    from autotile.runtime.device import live_device

    a = torch.randn(272, 992, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(608, 992, device="cuda").to(torch.float8_e4m3fn)
    sa, sb = torch.tensor([0.5], device="cuda"), torch.tensor([2.0], device="cuda")
    calls.forget()
    autotile.tune_at_first_call(True)
    try:
        c = autotile.scaled_matmul(a, w.T, sa, sb)
    finally:
        autotile.tune_at_first_call(None)
        calls.forget()
    ref = a.double() @ w.double().T
    assert float((c.double() - ref).norm() / ref.norm()) <= kernels.tolerance("float8_e4m3fn", 992)
    device = live_device()
    records = [r for _, r in TuningCache().entries(device.fingerprint)
               if (r.dtype, r.layout, tuple(r.shape)) == ("float8_e4m3fn", "nt", (272, 608, 992))]
    assert records and records[0].implementation == "generated" and records[0].baseline_ms is None
