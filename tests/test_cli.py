"""The `autotile` command: render, space, devices, cache list, and one-line errors with exit status 2.
Through `autotile.cli.main.main` in-process, and through `python -m autotile` in a subprocess. No GPU."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autotile.cli import main as cli
from autotile.codegen import kernels
from autotile.codegen.limits import PROFILES
from autotile.codegen.space import Problem, load_space

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
    """Exit status 2, nothing on stdout, and stderr exactly one line naming the needles. (In-process, an
    unexpected exception propagates and fails the test; the subprocess tests below see what a user sees.)"""
    assert rc == 2, (rc, out, err)
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
    assert "using T = double;" in out and "const T* __restrict__ A" in out
    assert "float" not in out.replace("float64", "")


@pytest.mark.parametrize("layout", ["row", "col"])
def test_render_matvec_default_in_float64(capsys, layout):
    # The default config must suit the dtype: float64 may not load 4 elements (32 bytes) at once.
    rc, out, err = run(capsys, "render", "matvec", "--layout", layout, "--dtype", "float64", "--device", "p100")
    assert (rc, err) == (0, ""), err
    assert "using T = double;" in out and "const T* __restrict__ A" in out
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
    # one layout: each count walks the whole space (seconds); every layout is listed by the matvec test
    rc, out, err = run(capsys, "space", "matmul", "--device", "p100", "--layout", "nn")
    assert (rc, err) == (0, "")
    space = load_space("matmul")
    for name in space.params:
        assert f"\n  {name} " in out
    for c in space.constraints:
        assert f"] {c.name}: {c.expr.text}" in out
    # The kernel's own space, which the command counted: its count is kept per problem, not walked again.
    count = kernels.get("matmul").space.count(Problem(PROFILES["p100"], "float32", "nn"))
    assert "Tesla P100 (sm_60, offline profile), float32, layout nn:" in out
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
    assert (rc, err) == (0, "")
    assert out.startswith("device ") and len(out.splitlines()) > 1  # the shipped entries
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
                                                                         "[1, 2, 4, 8, 16, 32, 64, 128, 256]"]),
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
    "space unsupported layout": (["space", "matmul", "--layout", "col"],
                                 ["supports layout(s) ['nn', 'nt', 'tn', 'tt']", "'col'"]),
    "bad shape": (["tune", "matmul", "--shape", "12x12"], ["shape '12x12'", "MxNxK"]),
    "zero shape": (["tune", "matvec", "--shape", "0x16"], ["at least 1"]),
    "tune unknown kernel": (["tune", "conv2d", "--shape", "8x8"], ["unknown kernel 'conv2d'"]),
    "no trials": (["tune", "matmul", "--shape", "64x64x64", "--trials", "0"], ["--trials"]),
    "negative warm starts": (["tune", "matmul", "--shape", "64x64x64", "--warm-starts", "-1"],
                             ["--warm-starts must be at least 0", "-1"]),
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


@pytest.mark.parametrize("name", list(cli.BENCHMARKS))
def test_the_benchmarks_are_commands_that_fail_in_one_line_without_a_gpu(capsys, name):
    """`autotile bench` and the other benchmarks run their module's own command line (listed in --help);
    without a GPU (or torch) one line names what is missing, status 2, as every other bad input."""
    assert name in cli.build_parser().format_help()
    with pytest.raises(SystemExit) as exited:  # the module's own parser: argparse's usage error
        cli.main([name, "--bogus-option"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.splitlines()[-1] == f"autotile {name}: error: unrecognized arguments: " \
                                                            "--bogus-option"
    with pytest.raises(SystemExit) as exited:
        cli.main([name, "--help"])
    assert exited.value.code == 0 and capsys.readouterr().out.startswith(f"usage: autotile {name} ")
    if _gpu_visible():
        return
    argv = {"bench": ["--quick"], "bench-torch": ["--quick"], "overhead": ["--rounds", "1"],
            "bench-emulation": ["--sizes", "64"]}[name]
    rc, out, err = run(capsys, name, *argv)
    assert rc == 2 and out == "" and len(err.splitlines()) == 1, err
    assert err.startswith(f"autotile {name}: error: ") and ("GPU" in err or "torch" in err or "CuPy" in err), err


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
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("autotile: error: matmul config is infeasible")
    assert "static shared memory per block" in proc.stderr
    proc = _python_m("render", cwd=tmp_path)  # argparse's own usage error: status 2, one line
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1
    assert proc.stderr.startswith("autotile render: error: ") and "autotile render --help" in proc.stderr


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


# -- tune: every option checked before the GPU ---------------------------------------------------------

@pytest.fixture
def gpu_forbidden(monkeypatch):
    """Touching the GPU fails the test: live_device raises AssertionError (which main does not catch) and
    `import cupy` raises ImportError. A check made after the GPU one would show up as a failure here on a
    machine with a GPU and on one without alike."""

    def live_device(*args, **kwargs):
        raise AssertionError("the GPU was touched before the options were checked")

    monkeypatch.setattr("autotile.runtime.device.live_device", live_device)
    monkeypatch.setitem(sys.modules, "cupy", None)


TUNE = ["tune", "matmul", "--shape", "64x64x64"]

TUNE_ERRORS = {
    "storage unknown scheme": (["--storage", "garbage://x"], ["--storage 'garbage://x'", "unknown database 'garbage'",
                                                              "sqlite:///", "postgresql", "mysql"]),
    "storage unknown driver": (["--storage", "postgresql+bogus://u@h/db"], ["'postgresql+bogus://u@h/db'",
                                                                            "unknown driver 'postgresql+bogus'"]),
    "storage no scheme": (["--storage", "tune.db"], ["--storage 'tune.db'", "not a storage URL", "sqlite:///tune.db"]),
    "storage bad port": (["--storage", "postgresql://u@h:port/db"], ["'postgresql://u@h:port/db'", "not a valid"]),
    "redis is gone": (["--storage", "redis://localhost:6379"], ["unknown database 'redis'"]),
    "seed negative": (["--seed", "-3"], ["--seed -3", "0..4294967295"]),
    "seed too large": (["--seed", str(2**32)], ["--seed 4294967296", "0..4294967295"]),
    "timeout negative": (["--timeout", "-5"], ["--timeout", "positive, finite", "got -5"]),
    "timeout nan": (["--timeout", "nan"], ["--timeout", "positive, finite", "got nan"]),
    "timeout inf": (["--timeout", "inf"], ["--timeout", "got inf"]),
    "timeout zero": (["--timeout", "0"], ["--timeout", "got 0"]),
    "candidate timeout nan": (["--candidate-timeout", "nan"], ["--candidate-timeout", "positive, finite", "got nan"]),
    "candidate timeout zero": (["--candidate-timeout", "0"], ["--candidate-timeout", "got 0"]),
    "trials zero": (["--trials", "0"], ["--trials", "at least 1", "got 0"]),
    "trials negative": (["--trials", "-4"], ["--trials", "got -4"]),
    "fix without =": (["--fix", "BM"], ["--fix 'BM'", "PARAM=VALUE"]),
    "fix without values": (["--fix", "BM="], ["--fix 'BM='"]),
    "fix unknown param": (["--fix", "BX=16"], ["unknown parameter 'BX'"]),
    "precision unknown": (["--precision", "bogus"],
                          ["--precision 'bogus' is not one of highest, high, medium, emulated"]),
    "precision upper case": (["--precision", "HIGH"], ["--precision 'HIGH'"]),
    "precision with a fix it empties": (["--precision", "highest", "--fix", "MATH=tf32x3"],
                                        ["'highest' allows MATH simt, dmma, skinny only", "tf32x3"]),
}


@pytest.mark.parametrize("extra,needles", TUNE_ERRORS.values(), ids=TUNE_ERRORS.keys())
def test_tune_rejects_bad_options_before_the_gpu(capsys, gpu_forbidden, extra, needles):
    rc, out, err = run(capsys, *TUNE, *extra)
    assert_one_line_error(rc, out, err, *needles)


def test_tune_rejects_sqlite_files_it_could_not_create(capsys, gpu_forbidden, tmp_path):
    missing = tmp_path / "no" / "such" / "folder"
    rc, out, err = run(capsys, *TUNE, "--storage", f"sqlite:///{missing}/tune.db")
    assert_one_line_error(rc, out, err, f"folder '{missing}' does not exist")
    a_file = tmp_path / "plain.txt"
    a_file.write_text("x")
    rc, out, err = run(capsys, *TUNE, "--storage", f"sqlite:///{a_file}/tune.db")
    assert_one_line_error(rc, out, err, f"'{a_file}' is not a folder")
    rc, out, err = run(capsys, *TUNE, "--storage", f"sqlite:///{tmp_path}")
    assert_one_line_error(rc, out, err, "is a folder, not a database file")


def test_tune_rejects_an_sqlite_folder_it_cannot_write(capsys, gpu_forbidden, tmp_path, monkeypatch):
    # Root may write anywhere, so the permission is denied through os.access, the call the check makes.
    folder = tmp_path / "readonly"
    folder.mkdir()
    original = os.access

    def access(path, mode):
        return False if Path(path) == folder and mode & os.W_OK else original(path, mode)

    monkeypatch.setattr(os, "access", access)
    rc, out, err = run(capsys, *TUNE, "--storage", f"sqlite:///{folder}/tune.db")
    assert_one_line_error(rc, out, err, f"folder '{folder}' is not writable")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes to read-only folders")
def test_tune_rejects_a_read_only_sqlite_folder(capsys, gpu_forbidden, tmp_path):
    folder = tmp_path / "readonly"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        rc, out, err = run(capsys, *TUNE, "--storage", f"sqlite:///{folder}/tune.db")
    finally:
        folder.chmod(0o755)
    assert_one_line_error(rc, out, err, "is not writable")


GOOD_STORAGE = ["sqlite:///{tmp}/tune.db", "sqlite:///relative.db", "sqlite://", "sqlite:///:memory:",
                "postgresql://user:pw@db.example:5432/optuna", "postgresql+psycopg2://db.example/optuna",
                "mysql+pymysql://user@db.example/optuna", "mysql://db.example/optuna"]


@pytest.mark.parametrize("storage", GOOD_STORAGE)
def test_tune_accepts_good_options_and_only_then_asks_for_the_gpu(capsys, monkeypatch, tmp_path, storage):
    from autotile.errors import DeviceUnavailableError

    def live_device(*args, **kwargs):
        raise DeviceUnavailableError("no GPU here (test stub)")

    monkeypatch.setattr("autotile.runtime.device.live_device", live_device)
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(capsys, *TUNE, "--storage", storage.format(tmp=tmp_path), "--seed", str(2**32 - 1),
                       "--timeout", "0.5", "--candidate-timeout", "30", "--trials", "1", "--fix", "BM=64,128")
    assert (rc, out, err) == (2, "", "autotile: error: no GPU here (test stub)\n")
    assert list(tmp_path.iterdir()) == []  # no database was created: nothing connected


SUBPROCESS_ERRORS = {
    "precision": (["--precision", "bogus"], "--precision 'bogus' is not one of highest, high, medium, emulated"),
    "seed": (["--seed", "-3"], "--seed -3"),
    "storage": (["--storage", "garbage://x"], "'garbage://x'"),
    "timeout": (["--timeout", "nan"], "got nan"),
}


@pytest.mark.parametrize("extra,needle", SUBPROCESS_ERRORS.values(), ids=SUBPROCESS_ERRORS.keys())
def test_python_m_autotile_tune_bad_options_are_one_line(tmp_path, extra, needle):
    proc = _python_m(*TUNE, *extra, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr  # a traceback would be many lines
    assert lines[0].startswith("autotile: error: ") and needle in lines[0], lines[0]


# -- validate: the same checks for the library -----------------------------------------------------------

def test_validate_returns_good_values_and_names_the_option():
    from autotile.errors import InvalidValueError
    from autotile.tuning import validate

    assert validate.seed(0) == 0 and validate.seed(2**32 - 1) == 2**32 - 1
    assert validate.count(3, name="trials") == 3 and validate.count(0, name="n", minimum=0) == 0
    assert validate.seconds(None, name="timeout", allow_none=True) is None
    assert validate.seconds(2, name="timeout", allow_none=True) == 2.0
    assert validate.storage_url(None) is None
    assert validate.storage_url("sqlite://") == "sqlite://"
    assert validate.fix_items(["BM=64, 128", " TM = 4"]) == {"BM": ["64", "128"], "TM": ["4"]}
    for call, words in [(lambda: validate.seed(-1), "seed -1 is out of range"),
                        (lambda: validate.seed(True), "seed must be an integer"),
                        (lambda: validate.seed(1.5), "seed must be an integer"),
                        (lambda: validate.count(0, name="trials"), "trials must be at least 1, got 0"),
                        (lambda: validate.seconds(None, name="candidate_timeout", allow_none=False),
                         "candidate_timeout must be a positive"),
                        (lambda: validate.seconds(float("nan"), name="timeout", allow_none=True), "got nan"),
                        (lambda: validate.seconds("5", name="timeout", allow_none=True), "got '5'"),
                        (lambda: validate.storage_url("oracle+nope://h/d"), "storage 'oracle+nope://h/d'"),
                        (lambda: validate.storage_url(5), "storage must be a URL string")]:
        with pytest.raises(InvalidValueError, match=re.escape(words)):
            call()


def test_validate_writable_folder(tmp_path):
    from autotile.errors import InvalidValueError
    from autotile.tuning import validate

    assert validate.writable_folder(tmp_path / "a" / "b", name="--out") == tmp_path / "a" / "b"
    assert not (tmp_path / "a").exists()  # creates nothing
    (tmp_path / "f").write_text("")
    with pytest.raises(InvalidValueError, match="is a file, not a folder"):
        validate.writable_folder(tmp_path / "f", name="--out")
    with pytest.raises(InvalidValueError, match="is a file, not a folder"):
        validate.writable_folder(tmp_path / "f" / "sub", name="--out")


# -- help, version ------------------------------------------------------------------------------------

def _subparsers(parser):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield name, sub
                for inner_name, inner in _subparsers(sub):
                    yield f"{name} {inner_name}", inner


def test_every_argument_of_every_command_has_help():
    import argparse

    # A group of subcommands lists each subcommand with its own help instead.
    missing = [f"{name}: {action.dest}" for name, sub in _subparsers(cli.build_parser()) for action in sub._actions
               if not action.help and not isinstance(action, argparse._SubParsersAction)]
    assert missing == []


def test_layout_help_fits_each_command(capsys):
    for command, expected in [("render", "the --config's layout, else the first (nn, row)"),
                              ("tune", "Default: nn (matmul, bmm), row (matvec)"),
                              ("space", "every layout the kernel supports")]:
        with pytest.raises(SystemExit) as exit_:
            cli.main([command, "--help"])
        out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
        assert exit_.value.code == 0
        assert expected in out, (command, out)
        if command != "render":
            assert "--config" not in out, (command, out)  # only render has --config


def test_version(capsys):
    import autotile

    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"autotile {autotile.__version__}\n"


# -- cache commands: unknown kernels and devices ----------------------------------------------------------

def test_cache_unknown_kernel_is_an_error(capsys, isolated_cache):
    rc, out, err = run(capsys, "cache", "show", "nonsense")
    assert_one_line_error(rc, out, err, "unknown kernel 'nonsense'", "matmul, bmm, matvec")
    rc, out, err = run(capsys, "cache", "clear", "--kernel", "bogus")
    assert_one_line_error(rc, out, err, "unknown kernel 'bogus'", "matmul, bmm, matvec")


def test_cache_unknown_device_says_there_are_no_entries_for_it(capsys, isolated_cache):
    rc, out, err = run(capsys, "cache", "list", "--device", "h100", "--shipped")
    assert (rc, err) == (0, "")
    assert out.startswith(f"no cached entries for device 'h100' under {isolated_cache}; device keys with entries: ")
    assert "NVIDIA-H100-80GB-HBM3_sm_90" in out  # a shipped key, named so the user can copy it
    rc, out, err = run(capsys, "cache", "show", "matvec", "--device", "h100")
    assert (rc, err) == (0, "")
    assert out == f"no cached matvec entries for device 'h100' under {isolated_cache}; device keys with entries: none\n"
    rc, out, err = run(capsys, "cache", "clear", "--device", "h100")
    assert (rc, err) == (0, "")
    assert out.startswith("removed nothing: no cached entries for device 'h100'")
    assert not isolated_cache.exists()


def test_cache_clear_compiled_removes_the_compiled_kernels_only(capsys, tmp_path, monkeypatch):
    from autotile.codegen import compile_cache

    folder = tmp_path / "compiled"
    monkeypatch.setenv(compile_cache.ENV_VAR, str(folder))
    for i in range(3):
        compile_cache.store(f"{i:064x}", "nvrtc-13.0", {}, b"binary")
    rc, out, err = run(capsys, "cache", "clear", "--compiled")
    assert (rc, err, out) == (0, "", f"removed 3 compiled kernels from {folder}\n")
    assert compile_cache.entries(folder) == []
    rc, out, err = run(capsys, "cache", "clear", "--compiled", "--kernel", "matmul")
    assert_one_line_error(rc, out, err, "--compiled clears every compiled kernel")
    monkeypatch.setenv(compile_cache.ENV_VAR, "off")
    rc, out, err = run(capsys, "cache", "clear", "--compiled")
    assert (rc, err) == (0, "") and out.startswith("the compile cache is off")


# -- devices: why no GPU is listed --------------------------------------------------------------------

def test_devices_says_cupy_is_missing(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` raises ImportError
    rc, out, err = run(capsys, "devices")
    assert (rc, err) == (0, "")
    first = out.splitlines()[0]
    assert first.startswith("no CUDA GPU visible (CuPy is not installed: ") and first.endswith("); offline profiles:")


def test_devices_gives_the_cuda_error(capsys, monkeypatch):
    import types

    def no_device():
        raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected\nsecond line")

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=no_device)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    rc, out, err = run(capsys, "devices")
    assert (rc, err) == (0, "")
    assert out.splitlines()[0] == ("no CUDA GPU visible (cudaErrorNoDevice: no CUDA-capable device is detected); "
                                   "offline profiles:")
    assert "\nh100: NVIDIA H100 80GB HBM3\n" in out


# -- tune: the table is printed even when the result cannot be saved ---------------------------------------

def _result(**save_fields: Any) -> Any:
    """A TuneResult as the library returns it, with the save fields it adds (if given)."""
    import dataclasses

    from autotile.tuning.tuner import Finalist, TuneResult

    space = load_space("matmul")
    best = Finalist(space.named("seed-tiled32"), None, 0.5, (0.5, 0.51, 0.49))
    seed = Finalist(space.named("seed-tiled16"), "seed-tiled16", 1.0, (1.0, 1.0, 1.0))
    fields: dict[str, Any] = dict(
        kernel="matmul", shape=(1024, 1024, 1024), dtype="float32", layout="row", best=best, finalists=(best, seed),
        best_seed=seed, baseline_ms=0.4, metric=4295.0, metric_unit="GFLOP/s", trials=2, failures={}, pruned=0,
        duplicates=0, seconds=3.0, environment={"gpu": "Test GPU"}, study_name="s")
    if not save_fields:
        return TuneResult(**fields)

    @dataclasses.dataclass(frozen=True)
    class Saved(TuneResult):
        saved_path: str | None = None
        save_error: str | None = None
        save_note: str | None = None

    return Saved(**fields, **save_fields)


@pytest.fixture
def fake_tune(monkeypatch):
    """`autotile tune` with a stand-in GPU and library call that returns what the test sets."""
    returned = {}
    monkeypatch.setattr("autotile.runtime.device.live_device", lambda *a, **k: PROFILES["h100"])
    monkeypatch.setattr("autotile.tuning.api.tune", lambda *a, **k: returned["result"])
    return returned


def test_tune_prints_the_table_then_says_the_result_was_not_saved(capsys, fake_tune):
    fake_tune["result"] = _result(saved_path="/ro/cache/x.json", save_error="[Errno 30] Read-only file\nsystem")
    rc, out, err = run(capsys, *TUNE)
    assert rc == 1
    assert "matmul 1024x1024x1024 float32 layout row on Test GPU" in out
    assert "best: 0.5000 ms" in out and "seed-tiled16" in out
    assert err == "autotile: error: the result was not saved to /ro/cache/x.json: [Errno 30] Read-only file system\n"


def test_tune_not_saved_without_a_path(capsys, fake_tune):
    fake_tune["result"] = _result(save_error="cache root is a file")
    rc, out, err = run(capsys, *TUNE)
    assert rc == 1 and "best: 0.5000 ms" in out
    assert err == "autotile: error: the result was not saved to the cache: cache root is a file\n"


def test_tune_says_where_it_saved_or_why_it_kept_the_old_entry(capsys, fake_tune):
    fake_tune["result"] = _result(saved_path="/c/x.json")
    rc, out, err = run(capsys, *TUNE)
    assert (rc, err) == (0, "")
    assert out.endswith("\nsaved to /c/x.json\n")
    fake_tune["result"] = _result(saved_path="/c/x.json", save_note="kept the cached entry: 0.4000 ms is faster")
    rc, out, err = run(capsys, *TUNE)
    assert (rc, err) == (0, "")
    assert out.endswith("\nkept the cached entry: 0.4000 ms is faster\n")


def test_tune_with_a_library_without_the_save_fields(capsys, fake_tune):
    fake_tune["result"] = _result()
    rc, out, err = run(capsys, *TUNE, "--no-cache")
    assert (rc, err) == (0, "")
    assert out.endswith(", 0.80x cuBLAS, 2.00x the best seed (seed-tiled16)\n")  # the table is the last line


# -- the precision setting ------------------------------------------------------------------------------

def test_tune_passes_the_precision_and_takes_the_process_default(capsys, monkeypatch):
    from autotile.dispatch import precision

    asked = []
    monkeypatch.setattr("autotile.runtime.device.live_device", lambda *a, **k: PROFILES["h100"])
    monkeypatch.setattr("autotile.tuning.api.tune", lambda *a, **k: asked.append(k["precision"]) or _result())
    assert run(capsys, *TUNE, "--precision", "highest", "--no-cache")[0] == 0
    assert run(capsys, *TUNE, "--no-cache")[0] == 0
    monkeypatch.setenv(precision.ENV_VAR, "highest")
    precision._reset()
    assert run(capsys, *TUNE, "--no-cache")[0] == 0
    assert asked == ["highest", "high", "highest"]


def test_a_bad_precision_environment_variable_is_one_line(capsys, gpu_forbidden, monkeypatch):
    from autotile.dispatch import precision

    monkeypatch.setenv(precision.ENV_VAR, "half")
    precision._reset()
    rc, out, err = run(capsys, *TUNE)
    assert_one_line_error(rc, out, err, "AUTOTILE_FLOAT32_MATMUL_PRECISION='half'", "highest, high, medium, emulated")


def test_tune_table_names_a_precision_other_than_the_default():
    import dataclasses

    from autotile.cli.tune import format_result

    assert "precision" not in format_result(_result()).splitlines()[1]
    strict = dataclasses.replace(_result(), precision="highest")
    assert format_result(strict).splitlines()[1].endswith("on Test GPU, precision highest")


def test_cache_list_and_show_give_each_entry_its_precision(capsys, isolated_cache):
    import json

    from autotile.codegen import kernels
    from autotile.dispatch.cache import TuningCache
    from autotile.dispatch.record import Record

    space = load_space("matmul")
    cache = TuningCache(root=isolated_cache, shipped_root=None)
    for name, ms in (("tf32x3-128", 1.0), ("regtile-128", 2.0)):
        cache.put(Record(kernel="matmul", dtype="float32", layout="row", shape=(4096, 4096, 4096),
                         compat=kernels.compat_hash("matmul"), config=dict(space.named(name)), time_ms=ms,
                         spread=0.0, metric=1.0, metric_unit="GFLOP/s", baseline_ms=1.5,
                         device=PROFILES["h100"].fingerprint, environment={}))
    rc, out, err = run(capsys, "cache", "list")
    assert (rc, err) == (0, "")
    header, *rows, total = out.splitlines()
    assert header.split()[-2:] == ["runs", "precision"] and total == "2 entries"
    assert sorted(r.split()[-1] for r in rows) == ["high", "highest"]
    rc, out, err = run(capsys, "cache", "show", "matmul")
    assert (rc, err) == (0, "")
    paths = [line for line in out.splitlines() if line.startswith("# ")]
    assert sorted(p.rsplit("-", 2)[-2] for p in paths) == ["4096x4096x4096", "high"]
    shown = [json.loads(chunk) for chunk in re.split(r"^# .*$", out, flags=re.M) if chunk.strip()]
    assert sorted(d["precision"] for d in shown) == ["high", "highest"]
