"""SASS for the tests that read it (tests/test_dmma.py, test_wgmma.py, test_skinny.py): NVRTC's PTX with the
library's options, assembled by the toolkit's ptxas and listed by nvdisasm; skipped where either is missing."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from autotile.codegen import build


def tool(name: str) -> str | None:
    """`name` from the PATH, a CUDA toolkit, or an NVIDIA wheel (nvidia/*/bin)."""
    found = shutil.which(name)
    if found:
        return found
    candidates = [Path("/usr/local/cuda/bin") / name]
    try:
        import nvidia  # the namespace package of NVIDIA's CUDA wheels

        candidates += [p / name for root in nvidia.__path__ for p in Path(root).glob("*/bin")]
    except ImportError:
        pass
    return next((str(c) for c in candidates if c.is_file()), None)


PTXAS, NVDISASM = tool("ptxas"), tool("nvdisasm")
needs_sass = pytest.mark.skipif(
    PTXAS is None or NVDISASM is None,
    reason="ptxas (a CUDA toolkit) or nvdisasm (pip install nvidia-cuda-nvdisasm) is missing")


def sass(source: str, arch: str) -> str:
    """SASS of `source` for `arch` (sm_90, sm_90a, ...): NVRTC to PTX, ptxas, nvdisasm."""
    ptx = build.compile(source, arch.replace("sm_", "compute_")).binary
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "k.ptx").write_bytes(ptx if isinstance(ptx, bytes) else ptx.encode())
        subprocess.run([str(PTXAS), f"-arch={arch}", "k.ptx", "-o", "k.cubin"], cwd=tmp, check=True,
                       capture_output=True)
        return subprocess.run([str(NVDISASM), "-c", "k.cubin"], cwd=tmp, check=True, capture_output=True,
                              text=True).stdout
