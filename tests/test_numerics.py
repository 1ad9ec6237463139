"""FP32 semantics (issue 11). Without a GPU: what the compiled code of each precision class may contain.
With one (`pytest -m gpu`): the edge-of-range probes against cuBLAS SGEMM, and a property-based fuzz over
shapes, magnitudes across the float32 exponent range, special values, layouts and dtypes, for matmul and
matvec: the result is within the precision class's tolerance of a float64 reference, and its NaN/Inf
pattern is cuBLAS's on the same inputs."""

from __future__ import annotations

import re

import numpy as np
import pytest

from autotile.codegen import build, kernels
from autotile.errors import CompileError

try:
    build.require_nvrtc()
    _NVRTC = None
except CompileError as exc:
    _NVRTC = str(exc)
needs_nvrtc = pytest.mark.skipif(_NVRTC is not None, reason=f"needs NVRTC: {_NVRTC}")

MATMUL = kernels.get("matmul")
MATVEC = kernels.get("matvec")
TENSOR_CORE_PTX = re.compile(r"\b(w?mma|HMMA)\b|\bmma\.")


def _ptx(spec, config, dtype="float32", layout="row", arch="compute_90") -> str:
    return build.compile(spec.render(config, dtype, layout), arch).binary.decode()


# --- without a GPU -----------------------------------------------------------------------------------------


@needs_nvrtc
@pytest.mark.parametrize("name", [n for n in MATMUL.space.named_configs if MATMUL.space.named(n)["MATH"] == "simt"])
def test_highest_class_matmul_configs_compile_to_no_tensor_core_instruction(name):
    """"highest" runs only SIMT configs (or cuBLAS SGEMM): their compiled code has no mma of any kind."""
    assert not TENSOR_CORE_PTX.search(_ptx(MATMUL, MATMUL.space.named(name)))


@needs_nvrtc
@pytest.mark.parametrize("name", sorted(MATVEC.space.named_configs))
def test_matvec_configs_compile_to_no_tensor_core_instruction(name):
    config = MATVEC.space.named(name)
    for layout in [MATVEC.space.named_layouts[name]] if name in MATVEC.space.named_layouts else ["row", "col"]:
        assert not TENSOR_CORE_PTX.search(_ptx(MATVEC, config, layout=layout))


@needs_nvrtc
def test_tf32x3_ptx_has_the_tensor_cores_and_the_exact_path():
    """The check above can fail: tf32x3 code has mma.sync, rounds with cvt.rn.tf32 on sm_90 (and on the
    bits before it, where cvt.rn.tf32 does not exist), and keeps FP32 FMAs for its exact path."""
    config = MATMUL.space.named("tf32x3-128")
    sm90 = _ptx(MATMUL, config)
    assert TENSOR_CORE_PTX.search(sm90) and "cvt.rn.tf32.f32" in sm90 and "fma.rn.f32" in sm90
    sm80 = _ptx(MATMUL, config, arch="compute_80")
    assert "mma.sync" in sm80 and "cvt.rn.tf32" not in sm80 and "cvt.rna" not in sm80


@needs_nvrtc
def test_no_kernel_flushes_denormals():
    """-ftz=false: float32 arithmetic in the PTX carries no .ftz (which would read denormals as zero)."""
    matvec = sorted(n for n in MATVEC.space.named_configs if MATVEC.space.named_layouts.get(n, "row") == "row")[0]
    for spec, name in ((MATMUL, "tf32x3-128"), (MATMUL, "regtile-128"), (MATVEC, matvec)):
        assert ".ftz" not in _ptx(spec, spec.space.named(name))


# --- on a GPU ---------------------------------------------------------------------------------------------

gpu = pytest.mark.gpu
FLT_MAX = float(np.finfo(np.float32).max)


def _gpu_inputs(a, b):
    import cupy

    return cupy.asarray(np.asarray(a, np.float32)), cupy.asarray(np.asarray(b, np.float32))


def _reference(a32, b32):
    """float64 product of float32 inputs, widened on the host (CuPy's astype flushes denormals)."""
    import cupy

    return cupy.asarray(a32.astype(np.float64)) @ cupy.asarray(b32.astype(np.float64))


def _pattern(x) -> np.ndarray:
    import cupy

    x = cupy.asnumpy(x)
    return np.stack([np.isnan(x), np.isposinf(x), np.isneginf(x)])


def _tf32x3_config():
    from autotile.codegen.space import Problem
    from autotile.runtime.device import live_device

    config = MATMUL.space.named("tf32x3-64")
    assert MATMUL.space.is_feasible(config, Problem(live_device(), "float32", "row"))
    return config


def _run_config(config, a, b):
    import cupy

    from autotile.codegen.problem import ProblemKey
    from autotile.runtime.impl import Generated

    out = cupy.full((a.shape[0], b.shape[1]), cupy.nan, dtype=cupy.float32)
    key = ProblemKey("matmul", "float32", "row", (a.shape[0], b.shape[1], a.shape[1]))
    Generated(config).prepare(key).run((a, b), out)
    return out


def _probes(rng):
    M, N, K = 1024, 1024, 2048

    def normal(*shape):
        return rng.standard_normal(shape)

    yield "random normal", normal(M, K), normal(K, N)
    yield "rows and columns scaled by 2^+-30", normal(M, K) * 2.0 ** rng.integers(-30, 31, (M, 1)), \
        normal(K, N) * 2.0 ** rng.integers(-30, 31, (1, N))
    yield "A near FLT_MIN (1+U)2^-120, B x 2^110", (1 + rng.random((M, K))) * 2.0**-120, normal(K, N) * 2.0**110
    yield "products near 2^120", normal(M, K) * 2.0**60, normal(K, N) * 2.0**60
    yield "products near 2^-120", normal(M, K) * 2.0**-60, normal(K, N) * 2.0**-60
    yield "A denormal (U 2^-128), B x 2^120", rng.random((M, K)) * 2.0**-128, normal(K, N) * 2.0**120
    yield "B denormal, A x 2^120", normal(M, K) * 2.0**120, rng.random((K, N)) * 2.0**-128
    yield "exponents U(-100, 60) x U(-60, 20)", normal(M, K) * 2.0 ** rng.uniform(-100, 60, (M, K)), \
        normal(K, N) * 2.0 ** rng.uniform(-60, 20, (K, N))


@gpu
def test_probes_keep_sgemm_accuracy():
    """The issue's probes (1024 x 1024 x 2048) and more: tf32x3's error is at most 2x cuBLAS SGEMM's."""
    import cupy

    from autotile.runtime.timing import relative_error

    config = _tf32x3_config()
    failures = []
    for label, a, b in _probes(np.random.default_rng(11)):
        a32, b32 = a.astype(np.float32), b.astype(np.float32)
        A, B = _gpu_inputs(a32, b32)
        ref = _reference(a32, b32)
        sgemm = cupy.full((A.shape[0], B.shape[1]), cupy.nan, dtype=cupy.float32)
        cupy.matmul(A, B, out=sgemm)
        ours, theirs = relative_error(_run_config(config, A, B), ref), relative_error(sgemm, ref)
        if not ours <= 2 * theirs:
            failures.append(f"{label}: tf32x3 {ours:.3g} against SGEMM {theirs:.3g}")
    assert not failures, "\n".join(failures)


@gpu
def test_issue_special_values_probe():
    """One NaN, one +Inf and one 3e38 in A (512 x 512, positive B): SGEMM's NaN/Inf pattern exactly."""
    import cupy

    rng = np.random.default_rng(12)
    a, b = rng.standard_normal((512, 512)), np.abs(rng.standard_normal((512, 512)))
    spots = rng.choice(a.size, 3, replace=False)
    a.flat[spots] = (np.nan, np.inf, 3e38)
    A, B = _gpu_inputs(a, b)
    sgemm = cupy.matmul(A, B)
    assert (_pattern(_run_config(_tf32x3_config(), A, B)) == _pattern(sgemm)).all()


# The fuzz: hypothesis draws the problem, NumPy (seeded by hypothesis) the values.
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

SPECIALS = (np.nan, np.inf, -np.inf)

@st.composite
def problems(draw):
    kernel = draw(st.sampled_from(["matmul", "matvec"]))
    dtype = draw(st.sampled_from(["float32", "float64"]))
    m, k = draw(st.integers(1, 300)), draw(st.integers(1, 300))
    n = draw(st.integers(1, 300)) if kernel == "matmul" else 1
    # Operand magnitudes 2^ea and 2^eb anywhere in float32's exponent range, products kept inside it
    # (below 2^-100 SGEMM itself loses its accuracy to denormal rounding; above 2^100 sums overflow).
    ea = draw(st.integers(-140, 120))
    eb = draw(st.integers(max(-140, -100 - ea), min(120, 100 - ea)))
    specials = draw(st.sampled_from(["none", "nan-inf", "near-max"]))
    layout = draw(st.sampled_from(["row", "col"])) if kernel == "matvec" else "row"
    precision = draw(st.sampled_from(["highest", "high"]))
    seed = draw(st.integers(0, 2**32 - 1))
    return kernel, dtype, (m, n, k), ea, eb, specials, layout, precision, seed

def _operands(kernel, shape, ea, eb, specials, seed):
    rng = np.random.default_rng(seed)
    m, n, k = shape
    a = rng.standard_normal((m, k)) * 2.0 ** (ea + rng.uniform(-4, 4, (m, k)))
    b = rng.standard_normal((k, n)) * 2.0 ** (eb + rng.uniform(-4, 4, (k, n)))
    if specials == "nan-inf":
        for x in (a, b):
            hit = rng.random(x.shape) < 0.01
            x[hit] = rng.choice(SPECIALS, hit.sum())
    elif specials == "near-max":
        # at most one value near FLT_MAX per row of A, B of order 1: whether a dot product overflows
        # does not depend on the order of its sum
        b = rng.standard_normal((k, n))
        rows = np.flatnonzero(rng.random(m) < 0.3)
        a[rows, rng.integers(0, k, rows.size)] = rng.choice([3e38, -3e38, FLT_MAX, -1e38], rows.size)
    return a, (b[:, 0] if kernel == "matvec" else b)

@gpu
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(problems())
def test_fuzz_matches_float64_and_sgemm_pattern(problem):
    import cupy

    import autotile
    from autotile.runtime.timing import relative_error

    kernel, dtype, shape, ea, eb, specials, layout, precision, seed = problem
    a, b = _operands(kernel, shape, ea, eb, specials, seed)
    if dtype == "float32":
        a, b = a.astype(np.float32), b.astype(np.float32)
    A = cupy.asarray(a) if layout == "row" else cupy.asfortranarray(cupy.asarray(a))
    B = cupy.asarray(b)
    if kernel == "matmul":
        ours = autotile.matmul(A, B, precision=precision)
    else:
        ours = autotile.matvec(A, B, precision=precision)
    theirs = cupy.matmul(A, B)  # cuBLAS SGEMM/SGEMV (DGEMM/DGEMV) on the same inputs
    assert (_pattern(ours) == _pattern(theirs)).all(), f"NaN/Inf pattern differs from cuBLAS: {problem}"
    finite = np.isfinite(cupy.asnumpy(theirs))
    if specials == "none" or finite.all():
        ref = _reference(np.asarray(a, np.float64), np.asarray(b, np.float64))
        tol = kernels.tolerance(dtype, shape[2])
        err = relative_error(ours, ref)
        assert err <= tol, f"error {err:.3g} > {tol:.3g} ({precision}): {problem}"
