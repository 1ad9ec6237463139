"""Compiling ahead (`autotile cache compile`, `autotile.tuning.precompile`): which kernels, that a tune's
first candidates then find them compiled, and the command's errors. NVRTC runs on the host: no GPU needed."""

from __future__ import annotations

import pytest

from autotile.cli import main as cli
from autotile.codegen import build, compile_cache, kernels
from autotile.codegen.limits import PROFILES
from autotile.codegen.problem import ProblemKey
from autotile.codegen.space import Problem
from autotile.errors import CompileError, InvalidValueError
from autotile.tuning import precompile
from autotile.tuning.search_bench import shipped_cache
from autotile.tuning.tuner import TuneOptions, Tuner

NVRTC_MISSING = build.nvrtc_unavailable_reason()
needs_nvrtc = pytest.mark.skipif(NVRTC_MISSING is not None, reason=f"NVRTC cannot be loaded ({NVRTC_MISSING})")
H100 = PROFILES["h100"]


@pytest.fixture
def own_compile_cache(tmp_path, monkeypatch):
    """An empty compile cache of the test's own (the session's shared one would hold these kernels)."""
    monkeypatch.setenv(compile_cache.ENV_VAR, str(tmp_path / "compiled"))
    build.clear_memo()
    yield tmp_path / "compiled"
    build.clear_memo()


def test_jobs_are_the_feasible_named_configs_and_the_databases_candidates_each_once():
    todo = precompile.jobs(H100, shipped_cache(), ["matmul"], ["float32"], ["nn"])
    space = kernels.get("matmul").space
    problem = Problem(H100, "float32", "nn")
    named = {f"named {n}" for n, c in space.named_configs.items() if space.is_feasible(c, problem)}
    origins = {job.origin for job in todo}
    # a named config whose kernel a database candidate also is appears once, under its name
    assert origins >= named and any(o.startswith("database ") for o in origins)
    assert len({job.source for job in todo}) == len(todo)
    assert {job.arch for job in todo} == {"sm_90", "sm_90a"}  # wgmma kernels need the arch-specific target
    # an A100 has no wgmma and no shipped database: its named configs of the other families only
    a100 = precompile.jobs(PROFILES["a100"], shipped_cache(), ["matmul"], ["float32"], ["nn"])
    assert a100 and all(job.origin.startswith("named ") and job.arch == "sm_80" for job in a100)


def test_with_a_shape_the_jobs_hold_the_named_configs_as_its_tune_fits_them():
    shape = (96, 5120, 3072)  # 40 tiles of 128x128 on 132 SMs: the tune splits their K
    plain = precompile.jobs(H100, shipped_cache(), ["matmul"], ["float32"], ["nn"])
    todo = precompile.jobs(H100, shipped_cache(), ["matmul"], ["float32"], ["nn"], shapes=[shape, (7, 9)])
    tuner = Tuner(ProblemKey("matmul", "float32", "nn", shape), TuneOptions(trials=40))
    starts = [tuner.candidate(c).source for _, c in tuner._named_starts(Problem(H100, "float32", "nn"))]
    assert any("SPLIT_K=8" in source for source in starts)  # fitted: a kernel of its own
    assert set(starts) <= {job.source for job in todo}
    assert not set(starts) <= {job.source for job in plain}
    assert any(job.origin.endswith(" fitted to 96x5120x3072") for job in todo)
    assert not any("7x9" in job.origin for job in todo)  # a matvec shape: not matmul's


@needs_nvrtc
def test_a_tunes_first_candidates_find_their_kernels_compiled(own_compile_cache):
    todo = precompile.jobs(H100, shipped_cache(), ["matvec"], ["float64"], ["col"])
    summary = precompile.compile_all(todo, threads=2)
    assert (summary.compiled, summary.cached, summary.failed) == (len(todo), 0, [])
    again = precompile.compile_all(todo, threads=2)
    assert (again.compiled, again.cached) == (0, len(todo))
    # the sources a tune renders for the named configs are the ones compiled: NVRTC is not run again
    tuner = Tuner(ProblemKey("matvec", "float64", "col", (3001, 1999)), TuneOptions(trials=5))
    problem = Problem(H100, "float64", "col")
    compiler = build.compiler_version()
    named = [c for c in tuner.space.named_configs.values() if tuner.space.is_feasible(c, problem)]
    assert named
    for config in named:
        source = tuner.candidate(config).source
        key = build.source_hash(source, build.nvrtc_options(build.target_arch(90, build.needs_arch_specific(source))))
        assert compile_cache.load(key, compiler) is not None, config.key()


def test_one_kernel_that_fails_is_reported_and_the_others_compile(own_compile_cache, monkeypatch):
    todo = precompile.jobs(H100, shipped_cache(), ["matvec"], ["float32"], ["row"])[:4]
    bad = todo[1].source

    full = todo[2].source

    def fake_compile(source, arch, options=build.COMPILE_OPTIONS):
        if source == bad:
            raise CompileError("error: the template broke\nmore log", source, options, "log")
        if source == full:
            raise OSError("No space left on device")
        return None

    monkeypatch.setattr(build, "compile", fake_compile)
    summary = precompile.compile_all(todo, threads=2)
    assert summary.compiled == 2 and sorted((job.source, msg) for job, msg in summary.failed) == sorted([
        (bad, "error: the template broke"), (full, "OSError: No space left on device")])


def test_without_nvrtc_compiling_ahead_fails_once_not_once_a_kernel(monkeypatch, own_compile_cache):
    todo = precompile.jobs(H100, shipped_cache(), ["matvec"], ["float32"], ["row"])[:3]
    monkeypatch.setattr(build, "_nvrtc", lambda: (None, "OSError: libnvrtc.so not found"))
    with pytest.raises(CompileError, match="NVRTC is not available .OSError: libnvrtc.so not found."):
        precompile.compile_all(todo)


def test_compiling_ahead_into_a_cache_that_is_off_is_refused(monkeypatch):
    monkeypatch.setenv(compile_cache.ENV_VAR, compile_cache.OFF)
    with pytest.raises(InvalidValueError, match="compile cache is off"):
        precompile.compile_all([])


@needs_nvrtc
def test_cli_compiles_for_a_profile_and_says_what_it_did(capsys, own_compile_cache):
    argv = ["cache", "compile", "--device", "h100", "--kernel", "matvec", "--dtype", "float64", "--layout", "col"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    n = len(precompile.jobs(H100, shipped_cache(), ["matvec"], ["float64"], ["col"]))
    assert out[0] == f"{n} kernels for {H100.name} (sm_90) into {own_compile_cache}"
    assert out[-2].startswith(f"compiled {n}, already compiled 0, failed 0 in ")
    assert out[-1] == "the compiled lookup of torch calls is off ($AUTOTILE_COMPILED_LOOKUP)"  # tests/conftest.py
    assert cli.main(argv) == 0
    assert capsys.readouterr().out.splitlines()[-2].startswith(f"compiled 0, already compiled {n}, failed 0")


@pytest.mark.parametrize("argv,needle", [
    (["--device", "h101"], "unknown device profile 'h101'"),
    (["--device", "h100", "--kernel", "matmal"], "matmal"),
    (["--device", "h100", "--dtype", "float33"], "float33"),
    (["--device", "h100", "--kernel", "matvec", "--layout", "nn"], "layout 'nn'"),
    (["--device", "h100", "--threads", "0"], "--threads"),
    (["--device", "h100", "--kernel", "matvec", "--shape", "96x5120x3072"], "--shape '96x5120x3072'"),
    (["--device", "h100", "--kernel", "matmul", "--shape", "96x0x3072"], "96x0x3072"),
])
def test_cli_refuses_bad_values_in_one_line(capsys, argv, needle):
    assert cli.main(["cache", "compile", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and needle in err


def test_cli_without_a_gpu_asks_for_a_device(capsys, monkeypatch):
    from autotile.errors import DeviceUnavailableError
    from autotile.runtime import device

    def no_gpu(device_id=None):
        raise DeviceUnavailableError("no usable CUDA GPU: none here")

    monkeypatch.setattr(device, "live_device", no_gpu)
    assert cli.main(["cache", "compile", "--kernel", "matvec"]) == 2
    err = capsys.readouterr().err
    assert "no usable CUDA GPU" in err and "--device (" in err and "h100" in err
