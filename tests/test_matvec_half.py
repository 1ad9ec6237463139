"""matvec in bfloat16 and float16 (templates/matvec.cu.j2 with float32 sums). Without a GPU: the space
admits the 16-bit types only with K splits summed in float32, float32's and float64's kernels read as they
did, the 16-bit kernels compile, and the selection serves them. On a GPU (`gpu` marker): named and sampled
configs against a float64 reference and against cuBLAS's error on the same inputs, specials included, and the
library's calls on torch tensors and CuPy arrays."""

from __future__ import annotations

import numpy as np
import pytest

from autotile.codegen import build, dtypes, kernels
from autotile.codegen.limits import PROFILES
from autotile.codegen.problem import ProblemKey
from autotile.codegen.space import Problem

SPEC = kernels.get("matvec")
SPACE = SPEC.space
HALF = dtypes.HALF_DTYPES
LAYOUTS = ("row", "col")
SHAPES = [(1, 1), (1, 17), (29, 1), (1031, 2053), (4099, 509), (3, 65537)]


def _named(dtype: str, layout: str) -> list[str]:
    problem = Problem(PROFILES["h100"], dtype, layout)
    return [n for n, c in SPACE.named_configs.items()
            if SPACE.named_layouts.get(n, layout) == layout and SPACE.is_feasible(c, problem)]


# -- the space and the source ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", HALF)
def test_16_bit_split_k_is_summed_in_float32_by_the_last_block(dtype):
    problem = Problem(PROFILES["h100"], dtype, "row")
    base = SPACE.named("warp-per-row-vec8")
    assert SPACE.is_feasible(base, problem)
    atomic = SPACE.with_overrides(base, {"SPLIT_REDUCE": "atomic"})
    assert not SPACE.is_feasible(atomic, problem)  # each split's sum would be rounded to 16 bits
    assert SPACE.is_feasible(atomic, Problem(PROFILES["h100"], "float32", "row")) is False  # VEC 8: 32 bytes
    launch = SPEC.launch(base, (1000, 3000), dtype, "row")
    assert launch.workspace_dtype == "float32" and not launch.zero_output


def test_float32_and_float64_skip_the_8_wide_defaults_and_int8_has_no_matvec():
    for dtype, layout, first in (("float32", "row", "warp-per-row"), ("float64", "row", "warp-per-row-vec2"),
                                 ("float32", "col", "col-vec4"), ("float64", "col", "col-vec2"),
                                 ("bfloat16", "row", "warp-per-row-vec8"), ("float16", "col", "col-vec8-split8")):
        config = SPACE.default_config(layout, Problem(PROFILES["h100"], dtype, layout))
        assert config == SPACE.named(first), (dtype, layout)
    assert not any(SPACE.is_feasible(c, Problem(PROFILES["h100"], "int8", "row")) for c in SPACE.named_configs.values())


def test_16_bit_kernels_widen_and_round_once():
    source = SPEC.render(SPACE.named("warp-per-row-vec8"), "bfloat16", "row")
    assert "float acc = 0;" in source and "widen(a[u][v]) * widen(xv[u][v])" in source
    assert "y[row] = narrow(sum_splits<4>(partials + row, M, blockIdx.y, acc));" in source
    assert "float* __restrict__ partials" in source and "const uint4 v" in source
    f32 = SPEC.render(SPACE.named("warp-per-row-split8"), "float32", "row")
    assert "widen" not in f32 and "narrow" not in f32 and "T acc = 0;" in f32 and "T* __restrict__ partials" in f32


@pytest.mark.skipif(build.nvrtc_unavailable_reason() is not None,
                    reason=f"NVRTC cannot be loaded ({build.nvrtc_unavailable_reason()})")
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_named_and_sampled_16_bit_configs_compile_without_spills(dtype, layout):
    problem = Problem(PROFILES["h100"], dtype, layout)
    configs = [SPACE.named(n) for n in _named(dtype, layout)] + SPACE.sample(problem, 3, seed=11)
    assert len(configs) >= 4
    for config in configs:
        (usage,) = build.compile(SPEC.render(config, dtype, layout), "sm_90").usages
        assert usage.spill_stores <= 8, (config.key(), usage)


def test_16_bit_matvec_gets_a_generated_kernel_and_float16_borrows_bfloat16s():
    from autotile.dispatch.cache import TuningCache
    from autotile.dispatch.select import borrowed_keys, select

    key = ProblemKey("matvec", "float16", "col", (1000, 3000))
    assert [(k.dtype, k.layout) for k in borrowed_keys(key)] == [("bfloat16", "col")]
    unsurveyed = select(key, PROFILES["a100"], TuningCache(None))  # no database: the layout's default
    assert unsurveyed.config == SPACE.named("col-vec8-split8"), unsurveyed.explain()
    for profile in ("h100", "a100"):  # the H100's bfloat16 database, or the default
        found = select(key, PROFILES[profile], TuningCache(None))
        bf16 = select(ProblemKey("matvec", "bfloat16", "col", (1000, 3000)), PROFILES[profile], TuningCache(None))
        assert (found.implementation, found.config) == (bf16.implementation, bf16.config)


# -- on a GPU -------------------------------------------------------------------------------------------

def _cublas(key: ProblemKey, a, x):
    import cupy

    from autotile.runtime.cublas import CublasCall

    out = cupy.empty(key.shape[0], dtype=dtypes.get(key.dtype).storage)
    kernels.poison(out)
    CublasCall(key, cupy.cuda.Device().id)((int(a.data.ptr), int(x.data.ptr)), int(out.data.ptr),
                                            cupy.cuda.get_current_stream().ptr)
    cupy.cuda.Device().synchronize()
    return out


def _generated(key: ProblemKey, config, a, x):
    import cupy

    from autotile.runtime.impl import Generated

    out = cupy.empty(key.shape[0], dtype=dtypes.get(key.dtype).storage)
    kernels.poison(out)
    Generated(config).prepare(key).run((a, x), out)
    cupy.cuda.Device().synchronize()
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_configs_match_the_reference_and_cublas_accuracy(dtype, layout):
    cupy = pytest.importorskip("cupy")
    from autotile.runtime.timing import relative_error

    problem = Problem(PROFILES["h100"], dtype, layout)
    configs = [SPACE.named(n) for n in _named(dtype, layout)] + SPACE.sample(problem, 12, seed=2)
    rng = cupy.random.default_rng(5)
    failures = []
    for shape in SHAPES:
        key = ProblemKey("matvec", dtype, layout, shape)
        a, x = SPEC.make_inputs(shape, dtype, layout, rng, cupy)
        ref = SPEC.reference((a, x))
        theirs = relative_error(_cublas(key, a, x), ref)
        for config in configs:
            err = relative_error(_generated(key, config, a, x), ref)
            if not (err <= kernels.tolerance(dtype, shape[-1]) and err <= 1.5 * theirs + 1e-6):
                failures.append(f"{config.key()} {shape}: error {err:.3g}, cuBLAS {theirs:.3g}")
    assert not failures, failures


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_specials_give_cublas_nan_and_inf_pattern(dtype, layout):
    cupy = pytest.importorskip("cupy")

    key = ProblemKey("matvec", dtype, layout, (517, 1283))
    a, x = SPEC.make_inputs(key.shape, dtype, layout, cupy.random.default_rng(3), cupy)
    specials = dtypes.from_float32(cupy.array([np.inf, -np.inf, np.nan, 60000.0], dtype=cupy.float32), dtype)
    a[5, 7], a[100, 9], a[300, 1000], x[11] = specials  # Inf, -Inf, NaN in A; a huge x element (rows overflow)
    expected = kernels.to_float64(_cublas(key, a, x))
    for name in _named(dtype, layout):
        ours = kernels.to_float64(_generated(key, SPACE.named(name), a, x))
        assert cupy.array_equal(cupy.isnan(ours), cupy.isnan(expected)), name
        assert cupy.array_equal(cupy.isinf(ours), cupy.isinf(expected)), name
        inf = cupy.isinf(ours)
        assert cupy.array_equal(cupy.sign(ours[inf]), cupy.sign(expected[inf])), name


@pytest.mark.gpu
def test_library_matvec_on_16_bit_torch_tensors_and_cupy_arrays():
    cupy = pytest.importorskip("cupy")
    torch = pytest.importorskip("torch")
    import autotile

    for torch_dtype in (torch.bfloat16, torch.float16):
        a = torch.randn(1031, 2053, device="cuda", dtype=torch_dtype)
        x = torch.randn(2053, device="cuda", dtype=torch_dtype)
        ref = a.double() @ x.double()
        for matrix in (a, a.t().contiguous().t()):  # row-major and column-major
            y = autotile.matvec(matrix, x)
            assert y.dtype == torch_dtype and y.shape == (1031,)
            err = float((y.double() - ref).norm() / ref.norm())
            assert err <= 1.5 * float((torch.mv(matrix, x).double() - ref).norm() / ref.norm()) + 1e-6
    h = cupy.random.default_rng(0).standard_normal((333, 777), dtype=cupy.float32).astype(cupy.float16)
    v = cupy.ones(777, dtype=cupy.float16)
    y = autotile.matvec(h, v)
    assert y.dtype == cupy.float16
    ref = h.astype(cupy.float64).sum(axis=1)
    assert float(cupy.linalg.norm(y.astype(cupy.float64) - ref) / cupy.linalg.norm(ref)) < 2e-3
