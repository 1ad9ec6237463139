"""`python -m autotile.bench` without a GPU: every argument checked before CuPy is imported or the GPU
touched, each bad one a single line with exit status 2; no GPU is one line too; and the FP32 peak of the
measured ceilings counts the FP32 lanes the GPU really has. No GPU needed."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from autotile import bench
from autotile.device import PROFILES
from autotile.errors import DeviceUnavailableError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def gpu_forbidden(monkeypatch):
    """live_device fails the test if called (main does not catch AssertionError); `import cupy` fails."""

    def live_device(*args, **kwargs):
        raise AssertionError("the GPU was touched before the arguments were checked")

    monkeypatch.setattr("autotile.device.live_device", live_device)
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
    assert lines[0].startswith("autotile.bench: error: "), err
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
    "fix bad value": (["--tune", "5", "--kernels", "matmul", "--fix", "BM=63"], ["BM='63'", "[16, 32, 64, 128, 256]"]),
    "fix without tune": (["--fix", "BM=64"], ["--fix acts only with --tune"]),
    "tune-only without tune": (["--tune-only", "--retune"], ["--retune and --tune-only act only with --tune"]),
    "negative tune": (["--tune", "-1"], ["--tune must be at least 0, got -1"]),
    "negative fallback": (["--fallback", "-2"], ["--fallback must be at least 0, got -2"]),
    "tune timeout nan": (["--tune", "5", "--tune-timeout", "nan"], ["--tune-timeout", "got nan"]),
    "tune timeout negative": (["--tune", "5", "--tune-timeout", "-1"], ["--tune-timeout", "got -1"]),
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

    monkeypatch.setattr("autotile.device.live_device", live_device)
    monkeypatch.setitem(sys.modules, "cupy", None)  # asked for after live_device, never before
    rc, out, err = run(capsys, "--quick", "--out", str(tmp_path / "out"))
    assert_one_line_error(rc, out, err, "no usable CUDA GPU: cudaErrorNoDevice (test stub)")
    assert not (tmp_path / "out").exists()


def test_a_result_that_was_not_saved_stops_the_run(capsys, monkeypatch, tmp_path):
    """With --tune, a winner the cache could not take stops the run (exit 1) with one line: the next shapes'
    winners would be lost the same way, and the benchmark would not run them."""
    monkeypatch.setattr("autotile.device.live_device", lambda *a, **k: PROFILES["h100"])
    fake_cupy = types.SimpleNamespace(random=types.SimpleNamespace(default_rng=lambda seed: None))
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    monkeypatch.setattr(bench, "environment", lambda limits: {})
    monkeypatch.setattr(bench, "measure_ceilings", lambda limits: {})
    monkeypatch.setattr("autotile.timing.L2Flusher", lambda l2_bytes: None)
    monkeypatch.setattr(bench, "_retired_entry", lambda *a: None)
    monkeypatch.setattr(bench, "select",
                        lambda *a, **k: types.SimpleNamespace(source="built-in default", config=None))
    result = types.SimpleNamespace(best=types.SimpleNamespace(median_ms=1.5), vs_baseline=0.9,
                                   saved_path="/ro/x.json", save_error="[Errno 30] Read-only file system")
    calls = []
    monkeypatch.setattr("autotile.api.tune", lambda *a, **k: calls.append(a) or result)
    rc = bench.main(["--kernels", "matmul", "--quick", "--tune", "3", "--out", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert rc == 1
    assert len(calls) == 1  # stopped after the first shape
    assert out.startswith("tuned matmul row 4096x4096x4096: 1.5000 ms, 0.90x cuBLAS")
    assert err == ("autotile.bench: error: matmul row 4096x4096x4096 was tuned but not saved to /ro/x.json: "
                   "[Errno 30] Read-only file system\n")


# -- as a program ----------------------------------------------------------------------------------

def _python_m(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run([sys.executable, "-m", "autotile.bench", *argv], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)


def test_help_exits_0(tmp_path):
    proc = _python_m("--help", cwd=tmp_path)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout.startswith("usage: python -m autotile.bench")
    assert "--kernels KERNELS" in proc.stdout and "comma-separated" in proc.stdout


@pytest.mark.parametrize("argv,needle", [(["--only", "abc"], "--only 'abc'"), (["--fix", "BM"], "--fix"),
                                         (["--kernels", "bogus"], "--kernels 'bogus'")])
def test_python_m_bad_arguments_are_one_line(tmp_path, argv, needle):
    proc = _python_m(*argv, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr  # a traceback would be many lines
    assert lines[0].startswith("autotile.bench: error: ") and needle in lines[0]


def test_python_m_without_a_gpu_is_one_line(tmp_path):
    from conftest import gpu_skip_reason

    if gpu_skip_reason() is None:
        pytest.skip("a GPU is visible: the benchmark would run")
    proc = _python_m("--quick", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("autotile.bench: error: ") and ("GPU" in lines[0] or "CuPy" in lines[0])
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
    monkeypatch.setattr("autotile.timing.time_launch", lambda *a, **k: types.SimpleNamespace(median_ms=1.0))
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
