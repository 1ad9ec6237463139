"""`python -m autotile.cli.bench` without a GPU: every argument checked before CuPy is imported or the GPU
touched, each bad one a single line with exit status 2; no GPU is one line too; the FP32 peak of the
measured ceilings counts the FP32 lanes the GPU really has; and `--random`: its shapes, its statistics, its
run with the GPU stood in for, and the README's table of it. No GPU needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from autotile.cli import bench
from autotile.cli import report as report_cli
from autotile.codegen.limits import PROFILES
from autotile.errors import DeviceUnavailableError
from autotile.tuning import bench_results as report

REPO = Path(__file__).resolve().parents[1]
RANDOM_SAMPLE = REPO / "tests" / "data" / "bench_random_sample.json"  # hand-written, in the shape bench writes


@pytest.fixture
def gpu_forbidden(monkeypatch):
    """live_device fails the test if called (main does not catch AssertionError); `import cupy` fails."""

    def live_device(*args, **kwargs):
        raise AssertionError("the GPU was touched before the arguments were checked")

    monkeypatch.setattr("autotile.runtime.device.live_device", live_device)
    monkeypatch.setitem(sys.modules, "cupy", None)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = bench.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc: int, out: str, err: str, *needles: str) -> str:
    assert rc == 2, (rc, out, err)
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("autotile.cli.bench: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


BAD = {
    "unknown kernel": (["--kernels", "bogus"], ["--kernels 'bogus'", "'bogus'", "matmul, matvec"]),
    "one unknown of two": (["--kernels", "matmul,matvecs"], ["'matvecs'"]),
    "only not a shape": (["--only", "abc"], ["--only 'abc'", "4096x4096x4096"]),
    "only a bad size": (["--only", "4096x0"], ["'4096x0'"]),
    "only no such shape": (["--only", "5x5"], ["--only '5x5' matches none", "4096x4096x4096", "8192x8192"]),
    "only a matvec shape for matmul": (["--kernels", "matmul", "--only", "8192x8192"], ["matches none"]),
    "fix without =": (["--tune", "5", "--fix", "BM"], ["--fix 'BM'", "PARAM=VALUE"]),
    "fix unknown to a kernel": (["--tune", "5", "--fix", "BM=64"], ["matvec: unknown parameter 'BM'", "--kernels"]),
    "fix bad value": (["--tune", "5", "--kernels", "matmul", "--fix", "BM=63"],
                      ["BM='63'", "[1, 2, 4, 8, 16, 32, 64, 128, 256]"]),
    "fix without tune": (["--fix", "BM=64"], ["--fix acts only with --tune"]),
    "tune-only without tune": (["--tune-only", "--retune"], ["--retune and --tune-only act only with --tune"]),
    "negative tune": (["--tune", "-1"], ["--tune must be at least 0, got -1"]),
    "negative fallback": (["--fallback", "-2"], ["--fallback must be at least 0, got -2"]),
    "tune timeout nan": (["--tune", "5", "--tune-timeout", "nan"], ["--tune-timeout", "got nan"]),
    "tune timeout negative": (["--tune", "5", "--tune-timeout", "-1"], ["--tune-timeout", "got -1"]),
    "precision unknown": (["--precision", "bogus"],
                          ["--precision 'bogus' is not one of highest, high, medium, emulated"]),
    "precision one bad of two": (["--precision", "highest,fast"], ["--precision 'fast'"]),
    "precision empty": (["--precision", ""], ["--precision ''"]),
}


@pytest.mark.parametrize("argv,needles", BAD.values(), ids=BAD.keys())
def test_bad_arguments_are_one_line_before_the_gpu(capsys, gpu_forbidden, argv, needles):
    rc, out, err = run(capsys, *argv)
    assert_one_line_error(rc, out, err, *needles)


def test_out_must_be_a_folder(capsys, gpu_forbidden, tmp_path):
    a_file = tmp_path / "results"
    a_file.write_text("")
    rc, out, err = run(capsys, "--out", str(a_file))
    assert_one_line_error(rc, out, err, f"--out '{a_file}' is a file, not a folder")


def test_no_gpu_is_one_line_and_writes_nothing(capsys, monkeypatch, tmp_path):
    def live_device(*args, **kwargs):
        raise DeviceUnavailableError("no usable CUDA GPU: cudaErrorNoDevice (test stub)")

    monkeypatch.setattr("autotile.runtime.device.live_device", live_device)
    monkeypatch.setitem(sys.modules, "cupy", None)  # asked for after live_device, never before
    rc, out, err = run(capsys, "--quick", "--out", str(tmp_path / "out"))
    assert_one_line_error(rc, out, err, "no usable CUDA GPU: cudaErrorNoDevice (test stub)")
    assert not (tmp_path / "out").exists()


def test_a_result_that_was_not_saved_stops_the_run(capsys, monkeypatch, tmp_path):
    """With --tune, a winner the cache could not take stops the run (exit 1) with one line: the next shapes'
    winners would be lost the same way, and the benchmark would not run them."""
    monkeypatch.setattr("autotile.runtime.device.live_device", lambda *a, **k: PROFILES["h100"])
    fake_cupy = types.SimpleNamespace(random=types.SimpleNamespace(default_rng=lambda seed: None))
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    monkeypatch.setattr(bench, "environment", lambda limits: {})
    monkeypatch.setattr(bench, "measure_ceilings", lambda limits: {})
    monkeypatch.setattr("autotile.runtime.timing.L2Flusher", lambda l2_bytes: None)
    monkeypatch.setattr(bench, "_retired_entry", lambda *a: None)
    monkeypatch.setattr(bench, "select",
                        lambda *a, **k: types.SimpleNamespace(source="built-in default", tuned_here=False, config=None))
    result = types.SimpleNamespace(best=types.SimpleNamespace(median_ms=1.5), vs_baseline=0.9,
                                   saved_path="/ro/x.json", save_error="[Errno 30] Read-only file system")
    calls = []
    monkeypatch.setattr("autotile.tuning.api.tune", lambda *a, **k: calls.append(a) or result)
    rc = bench.main(["--kernels", "matmul", "--quick", "--tune", "3", "--out", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert rc == 1
    assert len(calls) == 1  # stopped after the first shape, under its first precision setting
    assert out.startswith("tuned matmul row 4096x4096x4096 high: 1.5000 ms, 0.90x cuBLAS")
    assert err == ("autotile.cli.bench: error: matmul row 4096x4096x4096 high was tuned but not saved to /ro/x.json: "
                   "[Errno 30] Read-only file system\n")


# -- as a program ----------------------------------------------------------------------------------

def _python_m(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run([sys.executable, "-m", "autotile.cli.bench", *argv], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)


def test_help_exits_0(tmp_path):
    proc = _python_m("--help", cwd=tmp_path)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.startswith("usage: python -m autotile.cli.bench")
    assert "--kernels KERNELS" in proc.stdout and "comma-separated" in proc.stdout


@pytest.mark.parametrize("argv,needle", [(["--only", "abc"], "--only 'abc'"), (["--fix", "BM"], "--fix"),
                                         (["--kernels", "bogus"], "--kernels 'bogus'")])
def test_python_m_bad_arguments_are_one_line(tmp_path, argv, needle):
    proc = _python_m(*argv, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr  # a traceback would be many lines
    assert lines[0].startswith("autotile.cli.bench: error: ") and needle in lines[0]


def test_python_m_without_a_gpu_is_one_line(tmp_path):
    from conftest import gpu_skip_reason

    if gpu_skip_reason() is None:
        pytest.skip("a GPU is visible: the benchmark would run")
    proc = _python_m("--quick", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("autotile.cli.bench: error: ") and ("GPU" in lines[0] or "CuPy" in lines[0])
    assert not (tmp_path / "out").exists()


# -- the FP32 peak ---------------------------------------------------------------------------------

def _peak(monkeypatch, limits, clock_khz: int) -> float:
    """measure_ceilings' FP32 peak for `limits`, with CuPy, the timing loop and the compiler stood in for."""
    props = {"clockRate": clock_khz}
    runtime = types.SimpleNamespace(getDeviceProperties=lambda i: props)
    fake = types.SimpleNamespace(
        float32="float32", ones=lambda n, dtype=None: object(), empty_like=lambda a: object(),
        zeros=lambda n, dtype=None: object(), copyto=lambda b, a: None,
        cuda=types.SimpleNamespace(runtime=runtime, Device=lambda: types.SimpleNamespace(id=0)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr("autotile.runtime.timing.time_launch", lambda *a, **k: types.SimpleNamespace(median_ms=1.0))
    monkeypatch.setattr(bench.build, "compile_kernel", lambda source, name: (lambda grid, block, args: None))
    return bench.measure_ceilings(limits)["fp32_peak_tflops"]


@pytest.mark.parametrize("cc,lanes", [((8, 0), 64), ((8, 6), 128), ((8, 9), 128), ((9, 0), 128), ((7, 0), 64),
                                      ((6, 0), 64), ((6, 1), 128), ((7, 5), 64),
                                      ((8, 7), 128), ((7, 2), 64), ((10, 3), 128)])  # the last three: not listed
def test_fp32_peak_counts_the_lanes_of_the_architecture(monkeypatch, cc, lanes):
    import dataclasses

    limits = dataclasses.replace(PROFILES["a100"], compute_capability=cc)
    peak = _peak(monkeypatch, limits, 1_410_000)
    assert peak == pytest.approx(108 * lanes * 2 * 1.41e9 / 1e12)


@pytest.mark.parametrize("profile,clock_khz,tflops", [("a100", 1_410_000, 19.5), ("h200", 1_980_000, 66.9)])
def test_fp32_peak_matches_the_data_sheets(monkeypatch, profile, clock_khz, tflops):
    # A100 (sm_80): 19.5 TFLOP/s FP32 at 1410 MHz in NVIDIA's data sheet, not the 39 that 128 lanes would give;
    # H200 (sm_90): 66.9, as recorded in tests/data/bench_results_h200.json.
    assert _peak(monkeypatch, PROFILES[profile], clock_khz) == pytest.approx(tflops, abs=0.05)


# -- --random: arguments, shapes, statistics, the run with the GPU stood in for ---------------------------

RANDOM_BAD = {
    "random not a number": (["--random", "abc"], ["--random must be a whole number of shapes per kernel", "'abc'"]),
    "random a fraction": (["--random", "2.5"], ["--random must be a whole number", "'2.5'"]),
    "random zero": (["--random", "0"], ["--random must be at least 1, got 0"]),
    "random negative": (["--random", "-3"], ["--random must be at least 1, got -3"]),
    "seed not a number": (["--random", "5", "--seed", "x"], ["--seed must be an integer in 0..4294967295, got 'x'"]),
    "seed negative": (["--random", "5", "--seed", "-1"], ["--seed -1 is out of range", "0..4294967295"]),
    "seed too large": (["--random", "5", "--seed", str(2**32)], [f"--seed {2**32} is out of range"]),
    "seed without random": (["--seed", "3"], ["--seed acts only with --random N"]),
    "random with quick and only": (["--random", "5", "--quick", "--only", "4096x4096x4096"],
                                   ["--random does not combine with --quick, --only"]),
    "random with tune": (["--random", "5", "--tune", "3"], ["--random does not combine with --tune"]),
    "random with a bad kernel": (["--random", "5", "--kernels", "gemm"], ["--kernels 'gemm'"]),
    "multiple zero": (["--random", "5", "--multiple", "0"], ["--multiple must be at least 1, got 0"]),
    "multiple not a number": (["--random", "5", "--multiple", "8.5"], ["--multiple must be a whole number", "'8.5'"]),
    "multiple without random": (["--multiple", "8"], ["--multiple acts only with --random N"]),
}


@pytest.mark.parametrize("argv,needles", RANDOM_BAD.values(), ids=RANDOM_BAD.keys())
def test_bad_random_arguments_are_one_line_before_the_gpu(capsys, gpu_forbidden, argv, needles):
    rc, out, err = run(capsys, *argv)
    assert_one_line_error(rc, out, err, *needles)


def test_python_m_bad_random_is_one_line(tmp_path):
    proc = _python_m("--random", "-1", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "autotile.cli.bench: error: --random must be at least 1, got -1\n"


def test_random_shapes_are_deterministic_and_within_the_ranges():
    for kernel, dims in (("matmul", 3), ("matvec", 2)):
        lo, hi, cap = bench.RANDOM_RANGES[kernel]
        shapes = bench.random_shapes(kernel, 400, seed=11)
        assert shapes == bench.random_shapes(kernel, 400, seed=11)  # same seed, same shapes
        assert shapes != bench.random_shapes(kernel, 400, seed=12)
        assert bench.random_shapes(kernel, 10, seed=11) == shapes[:10]  # N more shapes extend, never reshuffle
        assert len(shapes) == 400
        for shape in shapes:
            assert len(shape) == dims and all(type(d) is int and lo <= d <= hi for d in shape), shape
            assert np.prod(shape, dtype=np.int64) <= cap, shape
        sizes = np.array(shapes).ravel()
        # log-uniform: about as many sizes in the lower half of the octaves as in the upper half
        middle = np.sqrt(lo * (hi + 1))
        assert 0.4 < np.mean(sizes < middle) < 0.6
        assert sizes.min() < 2 * lo and sizes.max() > hi / 2
    assert bench.random_shapes("matmul", 0, seed=0) == []
    # each kernel draws from its own stream: matmul's shapes are not matvec's with a third size
    assert [s[:2] for s in bench.random_shapes("matmul", 5, 0)] != bench.random_shapes("matvec", 5, 0)


def test_random_shapes_rounded_up_to_a_multiple():
    """--multiple Q: the same draws, each size rounded up to a multiple of Q, within the ranges and the cap."""
    lo, hi, cap = bench.RANDOM_RANGES["matmul"]
    plain, rounded = bench.random_shapes("matmul", 200, seed=5), bench.random_shapes("matmul", 200, seed=5, multiple=8)
    assert all(d % 8 == 0 and lo <= d <= hi for shape in rounded for d in shape)
    assert all(np.prod(shape, dtype=np.int64) <= cap for shape in rounded)
    paired = [(p, r) for p, r in zip(plain, rounded, strict=True) if np.prod(r, dtype=np.int64) <= cap]
    # the same draws rounded up (until a rounded draw over the cap is drawn again and the streams part)
    assert sum(all(0 <= b - a < 8 for a, b in zip(p, r, strict=True)) for p, r in paired) >= 150


def test_random_shapes_redraw_over_the_cap(monkeypatch):
    monkeypatch.setitem(bench.RANDOM_RANGES, "matmul", (16, 12288, 2**30))
    shapes = bench.random_shapes("matmul", 300, seed=0)
    assert all(m * n * k <= 2**30 for m, n, k in shapes)
    assert any(m * n * k > 2**30 for m, n, k in [s for s in _uncapped(300)])  # the cap did reject some


def _uncapped(n):
    import math as _math

    rng = np.random.default_rng([0, 0])
    lo, hi = 16, 12288
    return [tuple(min(hi, max(lo, int(_math.exp(v)))) for v in rng.uniform(_math.log(lo), _math.log(hi + 1), 3))
            for _ in range(n)]


def test_ratio_summary_on_a_hand_made_list():
    ratios = [0.5, 2.0, 0.25, 4.0, 0.97, 1 / 0.97, 1.0, 0.96, 1 / 0.96, 1.0]  # the product is 1
    s = bench.ratio_summary(ratios)
    assert s["count"] == 10
    assert s["min"] == 0.25
    # sorted: 0.25, 0.5, 0.96, ...; the 10th percentile lies 0.9 of the way from the 1st to the 2nd
    assert s["p10"] == pytest.approx(0.25 + 0.9 * 0.25)
    assert s["median"] == pytest.approx(1.0)
    assert s["geomean"] == pytest.approx(1.0)
    assert s["frac_ge_1"] == pytest.approx(0.6)  # 1.0, 1.0, 1/0.97, 1/0.96, 2, 4
    assert s["frac_ge_097"] == pytest.approx(0.7)  # and 0.97
    assert bench.ratio_summary([2.0, 8.0])["geomean"] == pytest.approx(4.0)
    assert bench.ratio_summary([]) == {"count": 0, "min": None, "p10": None, "median": None, "geomean": None,
                                       "frac_ge_1": None, "frac_ge_097": None}


def test_random_problem_times_the_runner_the_library_prepared(monkeypatch):
    """What is timed against cuBLAS is `ops._prepare(...).runner`, on the problem's inputs and output."""
    launched = []
    runner = types.SimpleNamespace(run=lambda arrays, out: launched.append((arrays, out)))
    selection = types.SimpleNamespace(source="nearest", config=types.SimpleNamespace(key=lambda: "BM=64"),
                                      explain=lambda: "nearest, tuned on 64x64x64: BM=64")
    prepared_for = []

    def prepare(*args):
        prepared_for.append(args)
        return types.SimpleNamespace(runner=runner, selection=selection)

    class FakeProblem:
        def __init__(self, kernel, shape, layout, dtype, ceilings, flush, rng, timing=None):
            assert ceilings is None and timing == bench.RANDOM_TIMING
            self.inputs, self.out, self.tol = ("A", "x"), "y", 1e-5
            self.kernel, self.layout, self.shape = kernel, layout, shape

        def cublas(self):
            return lambda: None

        def measure(self, name, run, config=""):
            run()
            ms, err = (2.0, 1e-7) if name == "cuBLAS" else (1.6, 0.3)
            return bench.Row(self.kernel, self.layout, self.shape, name, ms, 0.0, 0.0, "", 0.0, 0.0,
                             err if err <= self.tol else float("nan"), config, err)

    monkeypatch.setattr(bench, "_Problem", FakeProblem)
    monkeypatch.setattr(bench.ops, "_prepare", prepare)
    row = bench._random_problem("matvec", (300, 5000), "col", "float32", None, None)
    assert prepared_for == [("matvec", "float32", "col", (300, 5000), None)]  # None: the process's precision
    assert launched == [(("A", "x"), "y")]
    assert row.ratio == pytest.approx(1.25) and (row.cublas_ms, row.autotile_ms) == (2.0, 1.6)
    assert row.wrong and row.autotile_error == 0.3 and row.cublas_error == 1e-7  # kept, flagged
    assert (row.source, row.config) == ("nearest", "BM=64")
    assert row.selection == "nearest, tuned on 64x64x64: BM=64"


def test_random_run_writes_every_shape_and_flags_wrong_results(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr("autotile.runtime.device.live_device", lambda *a, **k: PROFILES["h100"])
    pool = types.SimpleNamespace(free_all_blocks=lambda: None)
    fake_cupy = types.SimpleNamespace(random=types.SimpleNamespace(default_rng=lambda seed: None),
                                      get_default_memory_pool=lambda: pool)
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    env = {"gpu": "GPU X", "date": "2026-12-01", "cupy": "14", "cuda_runtime": 13020, "driver": 13000,
           "compiler": "nvrtc-13.0"}
    monkeypatch.setattr(bench, "environment", lambda limits: dict(env))
    monkeypatch.setattr(bench, "measure_ceilings", lambda limits: pytest.fail("no ceilings in --random"))
    monkeypatch.setattr("autotile.runtime.timing.L2Flusher", lambda l2_bytes: None)
    calls = []

    def problem(kernel, shape, layout, dtype, flush, rng, precision=""):
        assert precision == ""  # matvec: the setting changes nothing, so each problem runs once
        calls.append((kernel, shape, layout, dtype))
        ratio = 0.5 + (len(calls) % 4) * 0.25
        return bench.RandomRow(kernel, layout, shape, 1.0, 1.0 / ratio, ratio, 1e-7, 1e-7, 1e-5, len(calls) == 2,
                               "nearest", f"nearest, tuned on 8x8: K{len(calls)}", f"K{len(calls)}")

    monkeypatch.setattr(bench, "_random_problem", problem)
    out = tmp_path / "out"
    rc = bench.main(["--random", "3", "--seed", "5", "--kernels", "matvec", "--dtype", "float64", "--out", str(out)])
    stdout, err = capsys.readouterr()
    assert (rc, err) == (0, "")
    shapes = bench.random_shapes("matvec", 3, 5)
    assert calls == [("matvec", s, layout, "float64") for s in shapes for layout in ("row", "col")]
    data = json.loads((out / "random.json").read_text())
    assert data["mode"] == "random" and data["environment"]["seed"] == 5 and data["environment"]["n"] == 3
    assert data["environment"]["gpu"] == "GPU X" and data["environment"]["dtype"] == "float64"
    assert len(data["rows"]) == 6 and [tuple(r["shape"]) for r in data["rows"][::2]] == shapes
    assert data["summary"]["matvec col"]["wrong"] == 1 and data["summary"]["matvec row"]["count"] == 3
    assert len(data["summary"]["matvec row"]["worst"]) == 3
    md = (out / "random.md").read_text()
    assert md.startswith("## Random shapes: GPU X, 2026-12-01")
    assert "seed 5" in md and "**1 WRONG**" in md and "**Wrong results (1)**" in md and "(WRONG)" in md
    assert "| kernel layout | N | min | p10 | median | geomean | >= 1.0x | >= 0.97x | wrong |" in stdout
    assert stdout.count("WRONG RESULT") == 1
    # the README's table reads what was written
    table = report.random_markdown([data])
    assert "| matvec float64 | col | GPU X | 3 (1 WRONG) |" in table


def test_random_report_table_from_a_hand_written_json():
    data = json.loads(RANDOM_SAMPLE.read_text())
    text = report.random_markdown([data])
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:3]): [c.strip() for c in line.strip("|").split("|")]
            for line in text.splitlines() if line.startswith("| matvec") or line.startswith("| matmul")}
    gpu = "NVIDIA H100 80GB HBM3"
    # matmul ratios 0.5, 1.25, 1.0
    assert rows[("matmul float32", "row", gpu)][3:] == ["3", "0.50", "0.60", "1.00", f"**{0.625 ** (1 / 3):.2f}**",
                                                         "67%"]
    # matvec row 0.8, 1.0, 1.0204...: p10 = 0.8 + 0.2 * 0.2
    assert rows[("matvec float32", "row", gpu)][3:7] == ["3", "0.80", "0.84", "1.00"]
    # matvec col 2.0, 0.5 (a wrong result: counted, and said), 1.0
    assert rows[("matvec float32", "col", gpu)][3:] == ["3 (1 WRONG)", "0.50", "0.60", "1.00", "**1.00**", "67%"]
    assert "seed 7, 3 shapes per kernel" in text
    # two runs (two GPUs, say): one table, a row per kernel, layout and GPU
    other = json.loads(RANDOM_SAMPLE.read_text())
    other["environment"]["gpu"] = "NVIDIA H200"
    both = report.random_markdown([data, other])
    assert both.count("| matvec float32 | col |") == 2 and both.count("| kernel | layout | GPU |") == 1


def test_report_command_reads_random_json(capsys, tmp_path):
    assert report_cli.main([str(RANDOM_SAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "| kernel | layout | GPU | N | min | p10 | median | geomean | >= 1.0x |" in out
    broken = json.loads(RANDOM_SAMPLE.read_text())
    del broken["rows"][2]["ratio"]
    path = tmp_path / "random.json"
    path.write_text(json.dumps(broken))
    assert report_cli.main([str(path)]) == 2
    _, err = capsys.readouterr()
    assert err.startswith("autotile.cli.report: error: ") and "row 2 lacks 'ratio'" in err
    assert len(err.splitlines()) == 1


# -- the precision setting: both settings of float32 matmul, each against the cuBLAS of the same run ------

def test_precision_settings_per_problem():
    assert bench.parse_precisions(None) is None
    assert bench.parse_precisions("highest, high,highest") == ["highest", "high"]
    assert bench.settings_for("matmul", "float32", None) == ["high", "highest"]
    assert bench.settings_for("matmul", "float32", ["highest"]) == ["highest"]
    assert bench.settings_for("matmul", "float64", None) == [""]  # the setting changes nothing: once
    assert bench.settings_for("matvec", "float32", ["highest", "high"]) == [""]


class _FakeProblem:
    """bench._Problem without a GPU: cuBLAS takes 2 ms, a seed 8 ms; an implementation prepared for the
    selection's config takes what `times` says for its config key."""

    times = {"MATH=tf32x3": 1.6, "MATH=simt": 2.5, "cuBLAS": 2.0}

    def __init__(self, kernel, shape, layout, dtype, ceilings, flush, rng, timing=None):
        self.kernel, self.layout, self.shape = kernel, layout, shape
        self.spec = types.SimpleNamespace(space=types.SimpleNamespace(
            named=lambda name: types.SimpleNamespace(key=lambda: name), is_feasible=lambda c, p: True))

    def cublas(self):
        return "cuBLAS"

    def launcher(self, config):
        return "seed"

    def _run(self, implementation):
        return implementation

    def measure(self, name, run, config=""):
        ms = {"cuBLAS": 2.0, "seed": 8.0}.get(run) or self.times[run]
        return bench.Row(self.kernel, self.layout, self.shape, name, ms, 0.0, 1000.0 / ms, "GFLOP/s", 0.0, 0.1,
                         1e-7, config, 1e-7)


def _fake_select(asked):
    def select(key, limits, precision=None):
        asked.append(precision)
        math = "simt" if precision == "highest" else "tf32x3"
        config = types.SimpleNamespace(key=lambda: f"MATH={math}")
        return types.SimpleNamespace(source="exact", tuned_here=True, config=config,
                                     implementation_object=lambda: f"MATH={math}")

    return select


def test_bench_problem_times_autotile_under_each_setting_against_one_cublas(monkeypatch):
    asked = []
    monkeypatch.setattr(bench, "_Problem", _FakeProblem)
    monkeypatch.setattr(bench, "select", _fake_select(asked))
    rows = bench._bench_problem("matmul", (4096, 4096, 4096), "row", "float32", ("seed-naive",), PROFILES["h100"],
                                {}, None, None, bench.settings_for("matmul", "float32", None))
    assert asked == ["high", "highest"]
    assert [(r.name, r.precision) for r in rows] == [("cuBLAS", ""), ("seed-naive", ""), ("autotile (exact)", "high"),
                                                     ("autotile (exact)", "highest")]
    assert [r.vs_cublas for r in rows] == pytest.approx([1.0, 0.25, 1.25, 0.8])  # all against the one cuBLAS
    assert rows[2].config == "MATH=tf32x3" and rows[3].config == "MATH=simt"
    md = bench.to_markdown(rows, {"gpu": "GPU X", "date": "d", "cupy": "14", "cuda_runtime": 1, "driver": 2,
                                  "compiler": "nvrtc"},
                           {"copy_gbps": 1.0, "read_gbps": 1.0, "fp32_peak_tflops": 1.0, "clock_mhz": 1.0})
    table = [line for line in md.splitlines() if line.startswith("| matmul |")]
    assert [line.split("|")[5].strip() for line in table] == ["-", "-", "high", "highest"]
    assert "| implementation | precision | ms |" in md
    # Where the setting changes nothing the library's pick is timed once, under the process's setting.
    asked.clear()
    once = bench._bench_problem("matvec", (4096, 4096), "row", "float32", (), PROFILES["h100"], {}, None, None,
                                bench.settings_for("matvec", "float32", None))
    assert asked == [None] and [r.precision for r in once] == ["", ""]


def test_a_fixed_run_times_each_problem_and_writes_its_files(capsys, monkeypatch, tmp_path):
    """The fixed shape list through `main` (the GPU's parts stubbed): each problem's rows printed as they
    come, then results.md, results.json and summary.md written, and results.md printed last."""
    monkeypatch.setattr("autotile.runtime.device.live_device", lambda *a, **k: PROFILES["h100"])
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(
        random=types.SimpleNamespace(default_rng=lambda seed: None)))
    env = {"gpu": "GPU X", "date": "d", "cupy": "14", "cuda_runtime": 1, "driver": 2, "compiler": "nvrtc"}
    monkeypatch.setattr(bench, "environment", lambda limits: dict(env))
    ceilings = {"copy_gbps": 1.0, "read_gbps": 1.0, "fp32_peak_tflops": 1.0, "clock_mhz": 1.0}
    monkeypatch.setattr(bench, "measure_ceilings", lambda limits: ceilings)
    monkeypatch.setattr("autotile.runtime.timing.L2Flusher", lambda l2_bytes: None)
    timed = []

    def bench_problem(kernel, shape, layout, dtype, seeds, limits, ceilings, flush, rng, settings):
        timed.append((kernel, shape, layout, tuple(settings)))
        return [bench.Row(kernel, layout, shape, name, ms, 0.01, 1.0, "GFLOP/s", 2.0 / ms, 0.5, 1e-6)
                for name, ms in (("cuBLAS", 2.0), ("autotile (exact)", 1.0))]

    monkeypatch.setattr(bench, "_bench_problem", bench_problem)
    out = tmp_path / "out"
    assert bench.main(["--kernels", "matmul", "--quick", "--precision", "high", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert [t[0] for t in timed] == ["matmul"] * len(bench.QUICK_MATMUL)
    assert all(t[3] == ("high",) for t in timed)
    assert sum(line.startswith("matmul row ") for line in printed.splitlines()) == 2 * len(bench.QUICK_MATMUL)
    results = json.loads((out / "results.json").read_text())
    assert len(results["rows"]) == 2 * len(bench.QUICK_MATMUL) and results["ceilings"] == ceilings
    assert (out / "summary.md").exists()
    assert printed.rstrip().endswith((out / "results.md").read_text().rstrip())


def test_summary_table_has_a_line_per_setting():
    data = json.loads((REPO / "tests" / "data" / "bench_results_h200.json").read_text())
    rows = data["rows"]
    i = next(i for i, r in enumerate(rows) if r["kernel"] == "matmul" and r["name"].startswith("autotile")
             and r["shape"] == [4096, 4096, 4096])
    rows[i]["precision"] = "high"
    strict = dict(rows[i], precision="highest", config="cuBLAS", vs_cublas=1.0, metric=rows[i - 3]["metric"])
    rows.insert(i + 1, strict)
    text = report.summary_markdown(data)
    lines = [line for line in text.splitlines() if line.startswith("| 4096x4096x4096 |")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    assert [(c[4], c[5], c[6]) for c in cells] == [("**1.21**", "tf32x3", "high"), ("**1.00**", "cuBLAS", "highest")]
    assert cells[0][1] == cells[1][1]  # one cuBLAS measurement for both
    assert "| autotile math | precision | error cuBLAS / autotile |" in text
    other = next(line for line in text.splitlines() if line.startswith("| 1000x3000x500 |"))
    assert other.split("|")[7].strip() == "-"  # a run from before the setting: no precision recorded


def test_random_run_times_float32_matmul_under_each_setting(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr("autotile.runtime.device.live_device", lambda *a, **k: PROFILES["h100"])
    pool = types.SimpleNamespace(free_all_blocks=lambda: None)
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(
        random=types.SimpleNamespace(default_rng=lambda seed: None), get_default_memory_pool=lambda: pool))
    env = {"gpu": "GPU X", "date": "2026-12-01", "cupy": "14", "cuda_runtime": 13020, "driver": 13000,
           "compiler": "nvrtc-13.0"}
    monkeypatch.setattr(bench, "environment", lambda limits: dict(env))
    monkeypatch.setattr("autotile.runtime.timing.L2Flusher", lambda l2_bytes: None)
    calls = []

    def problem(kernel, shape, layout, dtype, flush, rng, precision=""):
        calls.append((shape, precision))
        ratio = 1.2 if precision == "high" else 0.9
        return bench.RandomRow(kernel, layout, shape, 1.0, 1.0 / ratio, ratio, 1e-7, 1e-7, 1e-5, False, "model",
                               f"model: x [precision {precision}]", "x", precision)

    monkeypatch.setattr(bench, "_random_problem", problem)
    out = tmp_path / "out"
    assert bench.main(["--random", "2", "--kernels", "matmul", "--out", str(out)]) == 0
    capsys.readouterr()
    shapes = bench.random_shapes("matmul", 2, 0)
    assert calls == [(s, p) for s in shapes for p in ("high", "highest")]
    data = json.loads((out / "random.json").read_text())
    assert set(data["summary"]) == {"matmul row high", "matmul row highest"}
    assert data["summary"]["matmul row high"]["geomean"] == pytest.approx(1.2)
    assert [r["precision"] for r in data["rows"]] == ["high", "highest"] * 2
    table = report.random_markdown([data])
    assert "| matmul float32 high | row | GPU X | 2 |" in table
    assert "| matmul float32 highest | row | GPU X | 2 |" in table
    assert "| matmul high | row |" in (out / "random.md").read_text()
    calls.clear()
    assert bench.main(["--random", "1", "--kernels", "matmul", "--precision", "highest", "--out", str(out)]) == 0
    assert calls == [(shapes[0], "highest")]
