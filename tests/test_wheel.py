"""The wheel: it carries the templates, search spaces and shipped cache as package data, installs into a
fresh virtual environment, and works there (python -m autotile and the console script) from a directory
outside the source tree, reading its data from site-packages. No GPU; needs pip and hatchling."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden"


def _env() -> dict[str, str]:
    """The environment without anything that would put the source tree on the path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INDEX"] = "1"  # nothing is downloaded: --no-deps and a local wheel
    return env


def _run(cmd: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=timeout)
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("hatchling", reason="building the wheel needs hatchling (--no-build-isolation)")
    out = tmp_path_factory.mktemp("dist")
    before = {p.name for p in REPO.iterdir()}
    proc = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", ".", "-w", out], REPO)
    assert proc.returncode == 0, f"pip wheel failed:\n{proc.stdout}\n{proc.stderr}"
    created = {p.name for p in REPO.iterdir()} - before
    assert not created & {"build", "dist", "autotile.egg-info"}, f"the build left {created} in the source tree"
    wheels = list(out.glob("autotile-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("venv") / "env"
    proc = _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", root], root.parent)
    assert proc.returncode == 0, proc.stderr
    python = root / "bin" / "python"
    # The system pip (visible through --system-site-packages) installs into the environment it runs in.
    proc = _run([python, "-m", "pip", "install", "--no-deps", "--no-index", wheel], root.parent)
    assert proc.returncode == 0, f"pip install failed:\n{proc.stdout}\n{proc.stderr}"
    return root


@pytest.fixture
def outside(tmp_path) -> Path:
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    assert REPO not in cwd.parents
    return cwd


def test_wheel_carries_the_package_data(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry_points = next(z.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    for name in ("autotile/_data/templates/matmul.cu.j2", "autotile/_data/templates/matvec.cu.j2",
                 "autotile/_data/templates/common.cuh.j2", "autotile/_data/search_spaces/matmul.yaml",
                 "autotile/_data/search_spaces/matvec.yaml", "autotile/__init__.py", "autotile/cli/main.py",
                 "autotile/codegen/resources.py", "autotile/library/calls.py", "autotile/tuning/tuner.py"):
        assert name in names, name
    assert any(n.startswith("autotile/_data/cache/") for n in names), "the shipped cache folder is missing"
    assert not any(n.startswith(("tests/", "templates/", "search_spaces/")) for n in names)
    assert "autotile = autotile.cli.main:main" in entry_points
    with zipfile.ZipFile(wheel) as z:
        assert z.read("autotile/_data/templates/matmul.cu.j2") == (REPO / "templates" / "matmul.cu.j2").read_bytes()


def test_installed_module_renders_outside_the_source_tree(venv, outside):
    proc = _run([venv / "bin" / "python", "-m", "autotile", "render", "matmul", "--config", "seed-tiled16"], outside)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (GOLDEN / "matmul-seed-tiled16-float32-row.cu").read_text()


def test_installed_console_script(venv, outside):
    script = venv / "bin" / "autotile"
    assert script.is_file()
    proc = _run([script, "render", "matmul", "--config", "seed-tiled16"], outside)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (GOLDEN / "matmul-seed-tiled16-float32-row.cu").read_text()
    proc = _run([script, "space", "matvec", "--device", "p100", "--layout", "col"], outside)
    assert proc.returncode == 0, proc.stderr
    assert "seed-matvec-colmajor" in proc.stdout and "feasible" in proc.stdout
    proc = _run([script, "render", "conv2d"], outside)
    assert proc.returncode == 2 and proc.stderr.startswith("autotile: error: unknown kernel 'conv2d'")


def test_installed_package_reads_its_data_from_site_packages(venv, outside):
    code = ("import sysconfig, autotile, autotile.codegen.resources as r; "
            "print(sysconfig.get_paths()['purelib']); print(autotile.__file__); print(r.templates_dir()); "
            "print(r.search_spaces_dir()); print(r.shipped_cache_dir())")
    proc = _run([venv / "bin" / "python", "-c", code], outside)
    assert proc.returncode == 0, proc.stderr
    purelib, module, templates, spaces, cache = (Path(line).resolve() for line in proc.stdout.splitlines())
    assert venv.resolve() in purelib.parents
    for path in (module, templates, spaces, cache):
        assert purelib in path.parents, path
        assert REPO not in path.parents, path
    assert templates == purelib / "autotile" / "_data" / "templates"
    assert (templates / "matmul.cu.j2").is_file() and (spaces / "matmul.yaml").is_file()
