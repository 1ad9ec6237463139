"""Shared fixtures. GPU tests carry the `gpu` marker and skip, with the reason, where there is no GPU."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


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


def pytest_collection_modifyitems(config, items):
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
