"""Tests on a real GPU (`pytest -m gpu`): kernels against a float64 reference, a tune end to end, the
library, and the isolation of crashing and hanging candidates. Skipped without a GPU."""

from __future__ import annotations

import numpy as np
import pytest
from historical_space import sample_before_skinny

from autotile.codegen import kernels
from autotile.codegen.problem import ProblemKey
from autotile.codegen.space import Problem
from autotile.runtime.impl import Generated

pytestmark = pytest.mark.gpu

MATMUL_SHAPES = [(1, 1, 1), (1, 97, 33), (61, 1, 7), (131, 67, 257), (257, 263, 1), (509, 521, 523)]
MATVEC_SHAPES = [(1, 1), (1, 17), (29, 1), (1031, 2053), (4099, 509)]


def _limits():
    from autotile.runtime.device import live_device

    return live_device()


def _run(key: ProblemKey, config, inputs, poison: bool = True):
    """The library's own launcher (autotile.runtime.impl) on one problem; the output starts poisoned with NaN."""
    import cupy

    out = cupy.full(kernels.get(key.kernel).output_shape(key.shape), cupy.nan, dtype=key.dtype)
    Generated(config).prepare(key).run(inputs, out)
    return out


def _check_configs(kernel: str, dtype: str, layout: str, configs, shapes) -> list[str]:
    """Run every config on every shape; return one line per failure."""
    import cupy

    from autotile.codegen import build
    from autotile.runtime.timing import relative_error

    spec = kernels.get(kernel)
    # Compile in parallel first; preparing each config below then finds its kernel memoized.
    for fut in build.compile_many([(spec.render(c, dtype, layout), f"autotile_{kernel}") for c in configs], 8):
        fut.result()
    rng = cupy.random.default_rng(1)
    problems = []
    for shape in shapes:
        inputs = spec.make_inputs(shape, dtype, layout, rng, cupy)
        problems.append((ProblemKey(kernel, dtype, layout, shape), inputs, spec.reference(inputs),
                         kernels.tolerance(dtype, shape[-1])))
    failures = []
    for config in configs:
        for key, inputs, ref, tol in problems:
            err = relative_error(_run(key, config, inputs), ref)
            if not err <= tol:
                failures.append(f"{config.key()} {key.shape}: error {err:.3g} > {tol:.3g}")
    return failures


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_matmul_seeds_and_sample_match_reference(dtype):
    space = kernels.get("matmul").space
    problem = Problem(_limits(), dtype, "row")
    configs = [c for n, c in space.named_configs.items() if space.is_feasible(c, problem)]
    configs += space.sample(problem, 40 if dtype == "float32" else 20, seed=7)
    assert not _check_configs("matmul", dtype, "row", configs, MATMUL_SHAPES)


def test_matmul_tf32x3_sample_matches_reference():
    """The tensor-core path on its own: unaligned rows (scalar cp.async), aligned ones (16-byte copies),
    split-K, and a long K, where 3xTF32 must stay within the FP32 tolerance."""
    space = kernels.get("matmul").space.restricted({"MATH": "tf32x3"})
    problem = Problem(_limits(), "float32", "row")
    configs = [c for c in space.named_configs.values() if space.is_feasible(c, problem)]
    configs += space.sample(problem, 40, seed=5)
    assert any(c["SPLIT_K"] > 1 for c in configs) and any(c["VEC"] == 4 for c in configs)
    shapes = MATMUL_SHAPES + [(256, 264, 520), (67, 129, 4099), (128, 96, 4096)]
    assert not _check_configs("matmul", "float32", "row", configs, shapes)


def test_matmul_tf32x3_staged_store_matches_reference():
    """STORE=staged: the tf32x3 named configs without K splits, and a sample, on shapes whose N is odd (each
    warp's rows through its buffer in the stages) and even (the pairs), single and batched (odd M and N:
    every other matrix's C starts off 8 bytes)."""
    spec = kernels.get("matmul")
    space = spec.space.restricted({"MATH": "tf32x3", "STORE": "staged"})
    problem = Problem(_limits(), "float32", "row")
    configs = [space.with_overrides(c, {"STORE": "staged"}) for c in spec.space.named_configs.values()
               if c["MATH"] == "tf32x3" and c["SPLIT_K"] == 1]
    configs = [c for c in configs if space.is_feasible(c, problem)] + space.sample(problem, 12, seed=9)
    assert all(c["STORE"] == "staged" for c in configs) and any(c["WN"] == 16 for c in configs)
    shapes = MATMUL_SHAPES + [(64, 65, 100), (200, 127, 64)]
    assert not _check_configs("matmul", "float32", "row", configs, shapes)
    assert not _check_configs("bmm", "float32", "nn", configs[:6], [(3, 131, 67, 257), (4, 33, 130, 40)])


def test_matmul_tf32x3_is_as_accurate_as_sgemm():
    """3xTF32 must not trade accuracy for speed: on long K, where the tensor cores' truncating
    accumulation would show (an error growing like K), its error stays within 4x of cuBLAS SGEMM's."""
    import cupy

    from autotile.runtime.timing import relative_error

    spec = kernels.get("matmul")
    space = spec.space.restricted({"MATH": "tf32x3"})
    problem = Problem(_limits(), "float32", "row")
    configs = [c for c in space.named_configs.values() if space.is_feasible(c, problem)]
    configs += space.sample(problem, 6, seed=17)
    rng = cupy.random.default_rng(3)
    report = []
    for shape in [(96, 80, 16384), (97, 83, 8191)]:
        a, b = spec.make_inputs(shape, "float32", "row", rng, cupy)
        ref = spec.reference((a, b))
        sgemm = relative_error(cupy.matmul(a, b), ref)
        for config in configs:
            err = relative_error(_run(ProblemKey("matmul", "float32", "row", shape), config, (a, b)), ref)
            if not err <= 4 * sgemm:
                report.append(f"{config.key()} {shape}: error {err:.3g}, cuBLAS SGEMM {sgemm:.3g}")
    assert not report


def test_matmul_dmma_sample_matches_reference():
    """The FP64 tensor-core path on its own: every mma depth, scalar (8-byte) and 16-byte copies, split-K
    both ways, odd shapes and a long K, within the float64 tolerance."""
    space = kernels.get("matmul").space.restricted({"MATH": "dmma"})
    problem = Problem(_limits(), "float64", "row")
    configs = [c for c in space.named_configs.values() if space.is_feasible(c, problem)]
    configs += sample_before_skinny({"MATH": "dmma"}, problem, 30, seed=5)  # the sample as it was chosen
    assert {c["MMA_K"] for c in configs} == {4, 8, 16} and {c["VEC"] for c in configs} == {1, 2}
    assert any(c["SPLIT_K"] > 1 and c["SPLIT_REDUCE"] == "atomic" for c in configs)
    shapes = MATMUL_SHAPES + [(256, 264, 520), (67, 129, 4099), (128, 96, 4096)]
    assert not _check_configs("matmul", "float64", "row", configs, shapes)


def test_matmul_dmma_keeps_dgemm_accuracy_and_special_values():
    """DMMA is IEEE double arithmetic: on long K the error against the float64 reference (which is DGEMM
    itself) stays within the tuner's float64 tolerance, and with NaN and +-Inf placed in A and B every
    output is NaN, +Inf or -Inf exactly where DGEMM's is (an order-independent pattern: values near
    DBL_MAX are left out, since whether a partial sum overflows depends on the order of the sum)."""
    import cupy

    from autotile.runtime.timing import relative_error

    spec = kernels.get("matmul")
    space = spec.space.restricted({"MATH": "dmma"})
    problem = Problem(_limits(), "float64", "row")
    configs = [c for c in space.named_configs.values() if space.is_feasible(c, problem)]
    rng = cupy.random.default_rng(23)
    report = []
    for shape in [(257, 131, 4099), (96, 80, 16384)]:
        a, b = spec.make_inputs(shape, "float64", "row", rng, cupy)
        ref, tol = spec.reference((a, b)), kernels.tolerance("float64", shape[-1])
        for config in configs:
            err = relative_error(_run(ProblemKey("matmul", "float64", "row", shape), config, (a, b)), ref)
            if not err <= tol:
                report.append(f"{config.key()} {shape}: error {err:.3g} > {tol:.3g}")
    shape = (131, 67, 257)
    a, b = spec.make_inputs(shape, "float64", "row", rng, cupy)
    places = np.random.default_rng(29)
    for arr in (a, b):
        flat = arr.reshape(-1)
        where = cupy.asarray(places.choice(flat.size, size=30, replace=False))
        flat[where[:10]] = cupy.nan
        flat[where[10:20]] = cupy.inf
        flat[where[20:]] = -cupy.inf
    want = cupy.matmul(a, b)
    for config in configs:
        got = _run(ProblemKey("matmul", "float64", "row", shape), config, (a, b))
        for name, test in (("NaN", cupy.isnan), ("+Inf", cupy.isposinf), ("-Inf", cupy.isneginf)):
            differ = int((test(got) != test(want)).sum())
            if differ:
                report.append(f"{config.key()}: {name} differs from DGEMM in {differ} elements")
    assert not report, "\n".join(report)


@pytest.mark.parametrize("layout", ["row", "col"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_matvec_seeds_and_sample_match_reference(dtype, layout):
    space = kernels.get("matvec").space
    problem = Problem(_limits(), dtype, layout)
    configs = [c for n, c in space.named_configs.items() if space.is_feasible(c, problem)]
    configs += space.sample(problem, 30, seed=11)
    assert not _check_configs("matvec", dtype, layout, configs, MATVEC_SHAPES)


def test_seed_configs_are_named_and_feasible():
    limits = _limits()
    mm, mv = kernels.get("matmul").space, kernels.get("matvec").space
    for name in ("seed-naive", "seed-tiled16", "seed-tiled32"):
        assert mm.is_feasible(mm.named(name), Problem(limits))
    assert mv.is_feasible(mv.named("seed-matvec-colmajor"), Problem(limits, "float32", "col"))


def test_small_tune_lands_in_cache_and_library_uses_it(isolated_cache):
    import cupy

    import autotile
    from autotile.library import calls as ops

    result = autotile.tune("matmul", "300x257x131", trials=10, seed=3)
    assert result.trials >= 10 - 0 and result.best.median_ms > 0
    assert result.best_seed is not None and result.baseline_ms
    files = list(isolated_cache.rglob("matmul-float32-nn-300x257x131-*.json"))
    assert len(files) == 1
    ops.forget()
    sel = ops.selection_for("matmul", "float32", "row", (300, 257, 131))
    assert sel.source == "exact"
    if result.baseline_ms < result.best.median_ms:  # cuBLAS won the tuning: the library runs it
        assert sel.implementation == "cublas" and sel.config is None
    else:
        assert sel.implementation == "generated" and sel.config == result.best.config
    # A shape nobody tuned: the shipped shape database's model where this GPU has one, else the nearest.
    near = ops.selection_for("matmul", "float32", "row", (320, 250, 128))
    assert near.source.startswith("model") or (near.source == "nearest" and near.config == result.best.config)
    a = cupy.random.default_rng(0).random((300, 131), dtype=cupy.float32) - 0.5
    b = cupy.random.default_rng(1).random((131, 257), dtype=cupy.float32) - 0.5
    c = autotile.matmul(a, b)
    ref = a.astype(cupy.float64) @ b.astype(cupy.float64)
    assert float(cupy.linalg.norm(c - ref) / cupy.linalg.norm(ref)) < 1e-5


def test_first_call_tuning_of_a_batch_compiles_its_candidates_at_once_and_saves_its_winner(isolated_cache,
                                                                                          monkeypatch):
    import cupy

    import autotile
    from autotile.codegen import build
    from autotile.dispatch.cache import TuningCache
    from autotile.library import calls as ops
    from autotile.runtime.device import live_device
    from autotile.tuning import at_first_call

    batch, M, N, K = shape = (6, 131, 67, 257)  # no side a multiple of any tile
    device = live_device()
    listed = at_first_call.candidates(ProblemKey("bmm", "float32", "nn", shape), device, TuningCache())
    generated = sum(sel.config is not None for sel in listed)
    submitted: list[int] = []
    real = build.compile_many

    def spy(jobs, workers=4, clock=None):
        jobs = list(jobs)
        submitted.append(len(jobs))
        return real(jobs, workers, clock)

    monkeypatch.setattr(build, "compile_many", spy)
    rng = cupy.random.default_rng(5)
    a = rng.random((batch, M, K), dtype=cupy.float32) - 0.5
    b = rng.random((batch, K, N), dtype=cupy.float32) - 0.5
    out = cupy.full((batch, M, N), cupy.nan, dtype=cupy.float32)
    ops.forget()
    autotile.tune_at_first_call(True)
    try:
        autotile.matmul(a, b, out=out)
        chosen = ops.selection_for("bmm", "float32", "nn", shape)
    finally:
        autotile.tune_at_first_call(None)
        ops.forget()
    ref = a.astype(cupy.float64) @ b.astype(cupy.float64)
    assert float(cupy.linalg.norm(out - ref) / cupy.linalg.norm(ref)) <= kernels.tolerance("float32", K)
    assert chosen.step == "first call", chosen.explain()
    if generated >= 2:  # the candidates compiled together, before the first was timed
        assert submitted[:1] == [generated]
    if generated:  # the fastest generated candidate is kept, with cuBLAS's time, whichever won
        records = [r for _, r in TuningCache().entries(device.fingerprint)
                   if (r.kernel, r.dtype, r.layout, tuple(r.shape)) == ("bmm", "float32", "nn", shape)]
        assert len(records) == 1 and records[0].baseline_ms


def test_library_matvec_layouts_and_errors():
    import cupy

    import autotile

    rng = cupy.random.default_rng(5)
    a = rng.random((1031, 517)) - 0.5
    x = rng.random(517) - 0.5
    ref = a @ x
    for arr in (a, cupy.asfortranarray(a)):
        y = autotile.matvec(arr, x)
        assert float(cupy.linalg.norm(y - ref) / cupy.linalg.norm(ref)) < 1e-12
    strided = a[:, ::2]  # every other column: neither C- nor Fortran-contiguous, copied first
    assert not strided.flags.c_contiguous and not strided.flags.f_contiguous
    ref_strided = strided @ x[::2]
    y = autotile.matvec(strided, x[::2])
    assert float(cupy.linalg.norm(y - ref_strided) / cupy.linalg.norm(ref_strided)) < 1e-12
    a32 = a.astype(cupy.float32)
    y = autotile.matvec(a32[::2], x.astype(cupy.float32))  # non-contiguous rows: copied
    ref32 = a32[::2].astype(cupy.float64) @ x
    assert float(cupy.linalg.norm(y - ref32) / cupy.linalg.norm(ref32)) < 1e-5
    with pytest.raises(autotile.ArgumentError, match="host"):
        autotile.matvec(np.ones((3, 3)), x[:3])
    with pytest.raises(autotile.ArgumentError, match="do not match"):
        autotile.matvec(a, x[:5])
    with pytest.raises(autotile.ArgumentError, match="dtype"):
        autotile.matvec(a.astype(cupy.int32), x)
    out = cupy.empty(1031)
    assert autotile.matvec(a, x, out=out) is out


def test_matmul_through_dlpack_and_out():
    import cupy

    import autotile

    rng = cupy.random.default_rng(9)
    a = rng.random((67, 45), dtype=cupy.float32)
    b = rng.random((45, 31), dtype=cupy.float32)

    class Foreign:  # exposes only the CUDA array interface, like a tensor from another framework
        def __init__(self, arr):
            self.__cuda_array_interface__ = arr.__cuda_array_interface__

    out = cupy.empty((67, 31), dtype=cupy.float32)
    c = autotile.matmul(Foreign(a), cupy.from_dlpack(b), out=out)
    assert c is out
    ref = a.astype(cupy.float64) @ b.astype(cupy.float64)
    assert float(cupy.linalg.norm(c - ref) / cupy.linalg.norm(ref)) < 1e-5
    with pytest.raises(autotile.ArgumentError, match="do not match"):
        autotile.matmul(a, a)


CRASH_SOURCE = """
extern "C" __global__ void autotile_matmul(const float* A, const float* B, float* C, int M, int N, int K) {
    // writes far outside any allocation: an illegal address that poisons the CUDA context
    float* p = (float*)0x10;
    p[threadIdx.x * 1024 * 1024] = 1.0f;
}
"""
HANG_SOURCE = """
extern "C" __global__ void autotile_matmul(const float* A, const float* B, float* C, int M, int N, int K) {
    // spins on the clock for about a year: the compiler cannot prove the loop ends, the GPU never returns
    const long long start = clock64();
    while (clock64() - start < (1LL << 62)) { }
    C[0] = 0.0f;
}
"""


def test_crashing_and_hanging_candidates_are_recorded_and_the_study_completes(isolated_cache):
    from autotile.tuning import api

    spec = kernels.get("matmul")

    def render(config):
        if config == spec.space.named("seed-tiled16"):
            return CRASH_SOURCE
        if config == spec.space.named("seed-tiled32"):
            return HANG_SOURCE
        return spec.render(config, "float32", "row")

    result = api.tune("matmul", (256, 256, 256), trials=8, seed=1, candidate_timeout=15, render_source=render,
                      cache=None)
    assert result.failures.get("crash") == 1
    assert result.failures.get("timeout") == 1
    assert result.trials == 8
    assert result.best.median_ms > 0


def test_readme_style_script_without_a_main_guard_tunes_and_calls(tmp_path):
    """The README's Python example, as a script with no `if __name__ == "__main__":` guard (smaller: a
    short tune of a small shape): it runs once, tunes, and the library uses the result."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "example.py"
    script.write_text(
        "import cupy, autotile\n"
        "print('script ran')\n"
        "result = autotile.tune('matmul', '256x192x128', trials=4)\n"
        "A = cupy.random.random((256, 128), dtype=cupy.float32)\n"
        "B = cupy.random.random((128, 192), dtype=cupy.float32)\n"
        "C = autotile.matmul(A, B)\n"
        "ref = A.astype(cupy.float64) @ B.astype(cupy.float64)\n"
        "print('error', float(cupy.linalg.norm(C - ref) / cupy.linalg.norm(ref)), result.saved_path)\n")
    repo = Path(__file__).resolve().parent.parent
    env = {**__import__("os").environ, "AUTOTILE_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": f"{repo}{__import__('os').pathsep}{__import__('os').environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines.count("script ran") == 1
    err_line = next(line for line in lines if line.startswith("error "))
    assert float(err_line.split()[1]) < 1e-5 and str(tmp_path / "cache") in err_line


# -- split-K summed by the last block (SPLIT_REDUCE=last_block) ----------------------------------------

LAST_BLOCK_NAMED = {("matmul", "row"): ("tf32x3-64-split8", "tf32x3-32x64-split8", "regtile-64-split8",
                                        "dmma-64-split8"),
                    ("matvec", "row"): ("warp-per-row-split8", "warp-per-row-vec2-split8"),
                    ("matvec", "col"): ("col-vec4-split8", "col-vec2-split8")}
# Awkward shapes: 1, primes, nothing a tile divides, K far longer than M and N (more splits than K tiles too).
LAST_BLOCK_SHAPES = {"matmul": [(1, 1, 1), (1, 97, 4099), (61, 1, 7), (131, 67, 257), (7, 131, 8191),
                                (128, 96, 4096), (67, 129, 4099), (257, 263, 3)],
                     "matvec": [(1, 1), (1, 17), (29, 1), (1031, 2053), (3, 65537), (127, 16411), (4099, 509)]}


def _last_block_configs(kernel: str, layout: str, dtype: str, sampled: int):
    space = kernels.get(kernel).space
    problem = Problem(_limits(), dtype, layout)
    configs = [space.named(n) for n in LAST_BLOCK_NAMED[(kernel, layout)] if space.is_feasible(space.named(n), problem)]
    narrowed = space.restricted({"SPLIT_REDUCE": "last_block"})
    return configs + narrowed.sample(problem, sampled, seed=41)


@pytest.mark.parametrize("kernel,layout", [("matmul", "row"), ("matvec", "row"), ("matvec", "col")])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_last_block_split_k_is_correct_deterministic_and_resets_its_tickets(kernel, layout, dtype):
    """Each last_block config on awkward shapes, through the library's launcher: the output poisoned with
    NaN before each run, within tolerance of float64, and run twice on one runner with bitwise identical
    results (the tickets were reset by the first run; the sum's order does not depend on which split
    arrived last). Two shapes through the same compiled kernel, interleaved, each with its own buffers."""
    import cupy

    from autotile.codegen import build
    from autotile.runtime.timing import relative_error

    spec = kernels.get(kernel)
    configs = _last_block_configs(kernel, layout, dtype, 8 if dtype == "float32" else 6)
    assert configs and all(c["SPLIT_REDUCE"] == "last_block" and c["SPLIT_K"] > 1 for c in configs)
    for fut in build.compile_many([(spec.render(c, dtype, layout), f"autotile_{kernel}") for c in configs], 8):
        fut.result()
    rng = cupy.random.default_rng(13)
    problems = []
    for shape in LAST_BLOCK_SHAPES[kernel]:
        inputs = spec.make_inputs(shape, dtype, layout, rng, cupy)
        problems.append((ProblemKey(kernel, dtype, layout, shape), inputs, spec.reference(inputs),
                         kernels.tolerance(dtype, shape[-1])))
    failures = []
    for config in configs:
        runners = [(Generated(config).prepare(key), key, inputs, ref, tol) for key, inputs, ref, tol in problems]
        results: dict[tuple[int, ...], list] = {}
        for _ in range(2):  # all shapes, then all shapes again: the same kernel, interleaved
            for runner, key, inputs, ref, tol in runners:
                out = cupy.full(spec.output_shape(key.shape), cupy.nan, dtype=dtype)
                runner.run(inputs, out)
                err = relative_error(out, ref)
                if not err <= tol:
                    failures.append(f"{config.key()} {key.shape} run {len(results.get(key.shape, [])) + 1}: "
                                    f"error {err:.3g} > {tol:.3g}")
                results.setdefault(key.shape, []).append(out)
        for shape, (first, second) in results.items():
            if not bool(cupy.array_equal(first, second, equal_nan=True)):
                failures.append(f"{config.key()} {shape}: two runs differ (not deterministic, or tickets not reset)")
    assert not failures, "\n".join(failures[:20])


def test_last_block_runner_on_two_streams_at_once():
    """One runner, two streams running it at the same time: each stream has its own workspace and tickets,
    so both results are right and equal to a run on the default stream."""
    import cupy

    from autotile.runtime.timing import relative_error

    spec = kernels.get("matmul")
    key = ProblemKey("matmul", "float32", "row", (67, 129, 8191))
    a, b = spec.make_inputs(key.shape, "float32", "row", cupy.random.default_rng(17), cupy)
    ref = spec.reference((a, b))
    for name in ("regtile-64-split8", "tf32x3-64-split8"):
        runner = Generated(spec.space.named(name)).prepare(key)
        streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]
        outs = [cupy.full((67, 129), cupy.nan, dtype="float32") for _ in range(2)]
        cupy.cuda.Device().synchronize()
        for _ in range(20):  # many launches in flight on both streams
            for stream, out in zip(streams, outs, strict=True):
                runner.run((a, b), out, stream)
        for stream in streams:
            stream.synchronize()
        alone = cupy.full((67, 129), cupy.nan, dtype="float32")
        runner.run((a, b), alone)
        assert relative_error(alone, ref) <= kernels.tolerance("float32", key.shape[-1]), name
        for out in outs:
            assert bool(cupy.array_equal(out, alone)), name


def test_library_calls_load_no_tuner():
    # The library's call path, run for real (a first call selects, compiles and launches; a second is the
    # repeated call), loads neither optuna nor the tuning layer.
    import subprocess
    import sys

    code = ("import sys, cupy, autotile\n"
            "a = cupy.random.random((257, 131), dtype=cupy.float32)\n"
            "b = cupy.random.random((131, 67), dtype=cupy.float32)\n"
            "for _ in range(2):\n"
            "    c = autotile.matmul(a, b)\n"
            "    y = autotile.matvec(a, b[:, 0])\n"
            "cupy.cuda.runtime.deviceSynchronize()\n"
            "err = float(cupy.linalg.norm(c - a @ b) / cupy.linalg.norm(a @ b))\n"
            "assert err < 1e-5, err\n"
            "print(','.join(sorted(m for m in sys.modules\n"
            "                      if m.split('.')[0] == 'optuna' or m.startswith('autotile.tuning'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", out.stdout


def test_batched_timing_measures_the_launch_alone():
    """Repetitions enqueued behind one hold time what one hold each timed: a kernel of known length (the
    harness's own hold, which spins on the GPU's clock) and a cuBLAS call, batched and one by one."""
    import cupy

    from autotile.runtime.timing import L2Flusher, hold_gpu, time_launch

    flush = L2Flusher(cupy.cuda.Device().attributes["L2CacheSize"])
    spin = time_launch(lambda: hold_gpu(40.0), flush)
    assert spin.reps >= 10
    assert 0.040 <= spin.median_ms < 0.048, spin  # 40 us of spinning, and a launch's few us
    a = cupy.random.rand(1024, 1024, dtype=cupy.float32)
    for launch in (lambda: hold_gpu(40.0), lambda: a @ a):
        alone = time_launch(launch, flush, max_batch=1)
        batched = time_launch(launch, flush)
        assert abs(batched.median_ms / alone.median_ms - 1) < 0.1, (batched, alone)


def test_timing_stops_early_only_for_a_clearly_slower_launch():
    import cupy

    from autotile.runtime.timing import PROBE_REPS, time_launch

    a = cupy.ones(1 << 20, dtype=cupy.float32)

    def launch():
        a.sum()

    full = time_launch(launch, None)
    assert full.reps >= 10
    assert time_launch(launch, None, give_up_ms=full.min_ms / 100).reps == PROBE_REPS  # far above the threshold
    assert time_launch(launch, None, give_up_ms=full.median_ms * 100).reps >= 10  # far below it: timed in full


def test_recording_lists_the_problems_met_without_a_record_once_for_autotile_batch(isolated_cache, tmp_path):
    import cupy

    import autotile
    from autotile.dispatch import shape_log
    from autotile.library import calls as ops
    from autotile.tuning import batch

    path = tmp_path / "seen.yaml"
    untuned = (6, 132, 68, 260)  # rows 16-byte aligned (no padded plan), no side a tile's multiple
    shipped = (128, 256, 256, 256)  # a tuned record ships for it (the exact step)
    rng = cupy.random.default_rng(2)
    ops.forget()
    autotile.record_shapes(path)
    try:
        for n, (batch_size, M, N, K) in enumerate((untuned, shipped, untuned)):
            if n == 2:
                ops.forget()  # a later process, as far as memory goes: the file keeps the list unique
            a = rng.random((batch_size, M, K), dtype=cupy.float32) - 0.5
            b = rng.random((batch_size, K, N), dtype=cupy.float32) - 0.5
            out = cupy.full((batch_size, M, N), cupy.nan, dtype=cupy.float32)
            autotile.matmul(a, b, out=out)
            ref = a.astype(cupy.float64) @ b.astype(cupy.float64)
            assert float(cupy.linalg.norm(out - ref) / cupy.linalg.norm(ref)) <= kernels.tolerance("float32", K)
        assert ops.selection_for("bmm", "float32", "nn", shipped).source == "exact"
    finally:
        autotile.record_shapes(None)
        shape_log._noted.clear()
        ops.forget()
    assert [item.key for item in batch.read_problems(path)] == [ProblemKey("bmm", "float32", "nn", untuned)]


def test_autotile_batch_shortlist_tunes_a_recorded_problem_and_resumes(isolated_cache, tmp_path, capsys):
    from autotile.cli import main as cli
    from autotile.dispatch import shape_log
    from autotile.library import calls as ops

    key = ProblemKey("bmm", "float32", "nn", (6, 132, 68, 260))
    path = tmp_path / "seen.yaml"
    path.write_text(shape_log.line(key))
    ops.forget()
    assert ops.selection_for("bmm", "float32", "nn", key.shape).step != "exact"
    assert cli.main(["batch", str(path), "--shortlist"]) == 0
    assert "1 of 1 problems tuned" in capsys.readouterr().out
    ops.forget()
    assert ops.selection_for("bmm", "float32", "nn", key.shape).step == "exact"  # its record, found first
    assert cli.main(["batch", str(path), "--shortlist"]) == 0
    assert f"[1/1] {key}: tuned before" in capsys.readouterr().out
    ops.forget()
