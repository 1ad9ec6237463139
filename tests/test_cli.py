"""The `autotile` command: render, space, devices, cache list, and one-line errors with exit status 2.
Through `autotile.cli.main` in-process, and through `python -m autotile` in a subprocess. No GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotile import cli
from autotile.device import PROFILES
from autotile.space import Problem, load_space

REPO = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden"


def _gpu_visible() -> bool:
    from conftest import gpu_skip_reason

    return gpu_skip_reason() is None


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc: int, out: str, err: str, *needles: str) -> str:
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in err and "Traceback" not in out
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("autotile: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert out == ""
    return lines[0]


# -- render ----------------------------------------------------------------------------------------

def test_render_prints_the_seed_kernel(capsys):
    rc, out, err = run(capsys, "render", "matmul", "--config", "seed-tiled16", "--device", "h100")
    assert (rc, err) == (0, "")
    assert 'extern "C" __global__ void __launch_bounds__(256)\nautotile_matmul(' in out
    assert out == (GOLDEN / "matmul-seed-tiled16-float32-row.cu").read_text()


def test_render_without_config_prints_the_default(capsys):
    rc, out, err = run(capsys, "render", "matmul", "--device", "p100")
    assert (rc, err) == (0, "")
    space = load_space("matmul")
    assert f"// config: {space.source_key(space.default_config('row'))}\n" in out


def test_render_set_overrides(capsys):
    rc, out, err = run(capsys, "render", "matmul", "--config", "seed-tiled16", "--set", "BM=32", "--set", " TM = 2",
                       "--set", "A_TRANSPOSED=true", "--set", "UNROLL=4")
    assert (rc, err) == (0, "")
    assert "constexpr int BM = 32, BN = 16, TM = 2, TN = 1;" in out
    assert "// config: smem=static,BM=32,BN=16,TM=2,TN=1,BK=16,VEC=1,A_TRANSPOSED=True," in out
    assert "#pragma unroll 4\n" in out
    assert "As[s * A_TILE + (c + v) * A_STRIDE + r]" in out  # A staged transposed


def test_render_float64_gives_double(capsys):
    rc, out, err = run(capsys, "render", "matmul", "--config", "seed-tiled32", "--dtype", "float64")
    assert (rc, err) == (0, "")
    assert "const double* __restrict__ A" in out and "float" not in out.replace("float64", "")


@pytest.mark.parametrize("layout", ["row", "col"])
def test_render_matvec_default_in_float64(capsys, layout):
    # The default config must suit the dtype: float64 may not load 4 elements (32 bytes) at once.
    rc, out, err = run(capsys, "render", "matvec", "--layout", layout, "--dtype", "float64", "--device", "p100")
    assert (rc, err) == (0, ""), err
    assert "const double* __restrict__ A" in out
    assert "VEC = 4" not in out


def test_render_takes_the_layout_of_a_named_config(capsys):
    rc, out, err = run(capsys, "render", "matvec", "--config", "seed-matvec-colmajor")
    assert (rc, err) == (0, "")
    assert out == (GOLDEN / "matvec-seed-matvec-colmajor-float32-col.cu").read_text()
    rc, out, err = run(capsys, "render", "matvec", "--layout", "row", "--set", "VEC=2")
    assert (rc, err) == (0, "")
    assert "A row-major" in out and "VEC = 2" in out


# -- space, devices, cache ---------------------------------------------------------------------------

def test_space_on_p100(capsys):
    rc, out, err = run(capsys, "space", "matmul", "--device", "p100")
    assert (rc, err) == (0, "")
    space = load_space("matmul")
    for name in space.params:
        assert f"\n  {name} " in out
    for c in space.constraints:
        assert f"] {c.name}: {c.expr.text}" in out
    count = space.count(Problem(PROFILES["p100"], "float32", "row"))
    assert "Tesla P100 (sm_60, offline profile), float32, layout row:" in out
    assert f"{count.total:,} points, {count.feasible:,} feasible" in out
    for name, n in count.excluded_by.items():
        if n:
            assert f"{n:,} excluded by {name}\n" in out
    assert "excluded by static shared memory per block" in out


def test_space_matvec_lists_both_layouts(capsys):
    rc, out, err = run(capsys, "space", "matvec", "--device", "a100", "--dtype", "float64")
    assert (rc, err) == (0, "")
    assert "float64, layout row:" in out and "float64, layout col:" in out
    rc, out, err = run(capsys, "space", "matvec", "--device", "a100", "--layout", "col")
    assert "layout col:" in out and "layout row:" not in out


def test_devices_prints_offline_profiles(capsys):
    if _gpu_visible():
        pytest.skip("a GPU is visible: `devices` lists it instead of the offline profiles")
    rc, out, err = run(capsys, "devices")
    assert (rc, err) == (0, "")
    assert out.startswith("no CUDA GPU visible")
    for key, d in PROFILES.items():
        assert f"\n{key}: {d.name}\n" in out
        assert "cache key" in out and d.fingerprint in out
    assert "shared memory: opt-in per block" in out and "227 KB" in out and "48 KB" in out


def test_cache_list_on_an_empty_cache(capsys, tmp_path, monkeypatch):
    root = tmp_path / "empty"
    root.mkdir()
    monkeypatch.setenv("AUTOTILE_CACHE_DIR", str(root))
    rc, out, err = run(capsys, "cache", "list")
    assert (rc, err) == (0, "")
    assert out == f"no cached entries under {root}\n"
    rc, out, err = run(capsys, "cache", "list", "--shipped")
    assert rc == 0 and "Traceback" not in err
    assert list(root.iterdir()) == []  # listing writes nothing


# -- errors: exit 2, one line ----------------------------------------------------------------------

INFEASIBLE = ["--set", "smem=static", "--set", "BM=256", "--set", "BN=256", "--set", "BK=64", "--set", "TM=8",
              "--set", "TN=8"]

ERRORS = {
    "unknown kernel": (["render", "conv2d"], ["unknown kernel 'conv2d'", "matmul"]),
    "unknown config": (["render", "matmul", "--config", "seed-tiled64"], ["unknown config 'seed-tiled64'",
                                                                          "seed-tiled16"]),
    "unknown param": (["render", "matmul", "--set", "BX=16"], ["unknown parameter 'BX'", "BM"]),
    "value not among choices": (["render", "matmul", "--set", "BM=48"], ["BM='48'", "not among the choices",
                                                                         "[16, 32, 64, 128, 256]"]),
    "bool not among choices": (["render", "matmul", "--set", "A_TRANSPOSED=maybe"], ["A_TRANSPOSED"]),
    "set without =": (["render", "matmul", "--set", "BM"], ["PARAM=VALUE"]),
    "infeasible config": (["render", "matmul", *INFEASIBLE], ["infeasible", "static shared memory",
                                                              "smem_bytes=133120", "static_smem_per_block=49152"]),
    "infeasible on p100": (["render", "matmul", "--device", "p100", "--set", "smem=dynamic", "--set", "BM=128",
                            "--set", "BN=128", "--set", "TM=8", "--set", "TN=8", "--set", "BK=32", "--set", "VEC=4",
                            "--set", "STAGES=2"], ["Tesla P100", "dynamic shared memory per block (opt-in)"]),
    "too many threads": (["render", "matmul", "--config", "seed-naive", "--set", "BM=64", "--set", "BN=64",
                          "--set", "TN=2"], ["threads per block", "threads=2048"]),
    "unknown device": (["render", "matmul", "--device", "z80"], ["unknown device profile 'z80'", "h100"]),
    "unsupported layout": (["render", "matmul", "--layout", "col"], ["layout"]),
    "space unknown kernel": (["space", "gemv"], ["unknown kernel 'gemv'"]),
    "space unsupported layout": (["space", "matmul", "--layout", "col"], ["supports layout(s) ['row']", "'col'"]),
    "bad shape": (["tune", "matmul", "--shape", "12x12"], ["shape '12x12'", "MxNxK"]),
    "zero shape": (["tune", "matvec", "--shape", "0x16"], ["at least 1"]),
    "tune unknown kernel": (["tune", "conv2d", "--shape", "8x8"], ["unknown kernel 'conv2d'"]),
    "no trials": (["tune", "matmul", "--shape", "64x64x64", "--trials", "0"], ["--trials"]),
}


@pytest.mark.parametrize("argv,needles", ERRORS.values(), ids=ERRORS.keys())
def test_errors_are_one_line_with_status_2(capsys, argv, needles):
    rc, out, err = run(capsys, *argv)
    assert_one_line_error(rc, out, err, *needles)


def test_tune_without_a_gpu_is_one_line(capsys, tmp_path, monkeypatch):
    if _gpu_visible():
        pytest.skip("a GPU is visible: tune would run")
    monkeypatch.setenv("AUTOTILE_CACHE_DIR", str(tmp_path / "cache"))
    rc, out, err = run(capsys, "tune", "matmul", "--shape", "64x64x64", "--trials", "1")
    line = assert_one_line_error(rc, out, err)
    assert "GPU" in line or "CuPy" in line
    assert not (tmp_path / "cache").exists()  # nothing was tuned nor cached


# -- as a program ----------------------------------------------------------------------------------

def _python_m(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run([sys.executable, "-m", "autotile", *argv], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)


def test_python_m_autotile(tmp_path):
    proc = _python_m("render", "matmul", "--config", "seed-tiled16", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (GOLDEN / "matmul-seed-tiled16-float32-row.cu").read_text()
    proc = _python_m("render", "matmul", *INFEASIBLE, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("autotile: error: matmul config is infeasible")
    assert "static shared memory per block" in proc.stderr
    proc = _python_m("render", cwd=tmp_path)  # argparse's own usage error keeps status 2
    assert proc.returncode == 2 and "usage: autotile render" in proc.stderr


def test_importing_autotile_needs_no_gpu_and_loads_neither_cupy_nor_optuna(tmp_path):
    """Importing the package and rendering a kernel touch no GPU and import neither CuPy nor optuna."""
    code = (
        "import sys, autotile\n"
        "src = autotile.render('matmul', 'seed-tiled16')\n"
        "assert '__syncthreads' in src\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('cupy', 'cupy_backends', 'optuna'))\n"
        "print(heavy)\n"
    )
    import autotile

    package_root = str(Path(autotile.__file__).resolve().parents[1])
    env = dict(os.environ, AUTOTILE_CACHE_DIR=str(tmp_path / "cache"), HOME=str(tmp_path),
               PYTHONPATH=package_root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                          check=True)
    assert done.stdout.strip() == "[]"
    assert not (tmp_path / "cache").exists()  # no directory is created on import
