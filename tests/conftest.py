"""Shared fixtures. GPU tests carry the `gpu` marker and skip, with the reason, where there is no GPU."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# The compiled lookup of repeated torch calls builds in the background on a run's first repeated call, so
# whether a later call goes through it would depend on the build's pace: off for the tests, but for
# tests/test_torch_lookup.py, which turns it on and waits for it.
os.environ["AUTOTILE_COMPILED_LOOKUP"] = "off"


def _gpu_reason() -> str | None:
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA install
        return f"CuPy is not importable ({type(exc).__name__}: {exc})"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA GPU visible"
        cupy.zeros(1).sum().item()
    except Exception as exc:
        return f"no usable CUDA GPU ({type(exc).__name__}: {str(exc).splitlines()[0]})"
    return None


_REASON: list[str | None] = []


def gpu_skip_reason() -> str | None:
    if not _REASON:
        _REASON.append(_gpu_reason())
    return _REASON[0]


# The files that take most of the suite's time, with their seconds in a run of the whole suite on two cores
# (2026-12-07, no GPU). pytest-xdist's `--dist loadfile` hands whole files to its workers in the order they
# are queued, by default the files with the most tests first: test_distributed.py (12 tests, over a minute
# of worker processes) then came last and ran alone while the other core idled. Queued longest first, the
# two workers finish together. The table only orders the queue (a file missing from it runs after these, in
# collection order); it selects and skips nothing.
SECONDS_ON_TWO_CORES = {
    "test_compile.py": 230, "test_distributed.py": 150, "test_search_bench.py": 94, "test_dmma.py": 82,
    "test_space.py": 74, "test_wgmma.py": 66, "test_render.py": 57, "test_split_reduce.py": 47,
    "test_tuner.py": 37, "test_emulation.py": 35, "test_skinny.py": 30, "test_narrow_copies.py": 27,
    "test_realign.py": 22, "test_wgmma_direct.py": 19, "test_dispatch.py": 17, "test_int8.py": 17,
    "test_tune_api.py": 16, "test_mma.py": 15, "test_study_report.py": 13, "test_cli.py": 12,
    "test_matvec_half.py": 10,
}


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: queue the files in collection order
        config.option.loadscopereorder = False


def _longest_first(items):
    """`items` with whole files ordered by SECONDS_ON_TWO_CORES (longest first), each file's tests in order."""
    first_seen: dict[Path, int] = {}
    for i, item in enumerate(items):
        first_seen.setdefault(item.path, i)
    items.sort(key=lambda item: (-SECONDS_ON_TWO_CORES.get(item.path.name, 0), first_seen[item.path]))


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every worker collects the same list and orders it alike
        _longest_first(items)
    needs_gpu = [item for item in items if "gpu" in item.keywords]
    if not needs_gpu:
        return
    reason = gpu_skip_reason()
    if reason:
        marker = pytest.mark.skip(reason=f"needs a GPU: {reason}")
        for item in needs_gpu:
            item.add_marker(marker)


@pytest.fixture(scope="session", autouse=True)
def session_compile_cache(tmp_path_factory):
    """Kernels compiled by the tests (and the tuning workers they start) are kept on disk in a folder of the
    run's own, never in the user's cache: shared by every test of the run, and by pytest-xdist's worker
    processes (their temporary folders share a parent), so a kernel two test files compile is compiled
    once. Pytest removes it with its old temporary folders."""
    from autotile.codegen import compile_cache

    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "compiled"
    shared.mkdir(parents=True, exist_ok=True)
    before = os.environ.get(compile_cache.ENV_VAR)
    os.environ[compile_cache.ENV_VAR] = str(shared)
    yield
    if before is None:
        os.environ.pop(compile_cache.ENV_VAR, None)
    else:
        os.environ[compile_cache.ENV_VAR] = before


@pytest.fixture
def isolated_cache(tmp_path, monkeypatch):
    """A private user cache directory for the test."""
    root = tmp_path / "cache"
    monkeypatch.setenv("AUTOTILE_CACHE_DIR", str(root))
    return root


@pytest.fixture(autouse=True)
def default_precision(monkeypatch):
    """Every test starts with the process-wide float32 matmul precision unset and no
    $AUTOTILE_FLOAT32_MATMUL_PRECISION (so "high"), and a test that sets either leaves nothing behind."""
    from autotile.dispatch import precision

    monkeypatch.delenv(precision.ENV_VAR, raising=False)
    precision._reset()
    yield
    precision._reset()


@pytest.fixture
def shipped_subset(tmp_path):
    """`make(*families)`: a TuningCache whose shipped root holds only these of the shipped databases, each
    (profile name, kernel, dtype, layout), copied, and whose user root is empty, so that a test of which
    database serves a problem keeps its case (a GPU without a family) when the shipped cache gains that family."""
    import shutil

    from autotile.codegen import resources
    from autotile.codegen.limits import PROFILES
    from autotile.dispatch import database
    from autotile.dispatch.cache import TuningCache

    source = resources.shipped_cache_dir()
    assert source is not None

    def make(*families: tuple[str, str, str, str]) -> TuningCache:
        for profile, *family in families:
            device = PROFILES[profile].fingerprint
            copy = database.path_in(tmp_path / "shipped", device, *family)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(database.path_in(source, device, *family), copy)
        return TuningCache(tmp_path / "user", shipped_root=tmp_path / "shipped")

    return make
