"""What the MATH=wgmma_direct tests share (tests/test_wgmma_direct.py: bfloat16 and float16;
tests/test_int8.py: int8): compiling a list of (config name, dtype, layout, batched) cases for sm_90a in
parallel, the checks of each compile, and skipping where there is no Hopper GPU."""

from __future__ import annotations

import concurrent.futures

import pytest

from autotile.codegen import build, kernels
from autotile.codegen.limits import PROFILES
from autotile.codegen.space import Problem

Case = tuple[str, str, str, bool]  # (named config, dtype, layout, batched)


def compile_cases(cases: list[Case]) -> dict[Case, build.CompileResult]:
    """Every case compiled for sm_90a, two at a time (CI's two cores)."""
    space = kernels.get("matmul").space

    def job(case: Case) -> build.CompileResult:
        name, dtype, layout, batched = case
        spec = kernels.get("bmm" if batched else "matmul")
        return build.compile(spec.render(space.named(name), dtype, layout), "sm_90a")

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = {case: pool.submit(job, case) for case in cases}
        return {case: f.result() for case, f in futures.items()}


def check_compile(case: Case, result: build.CompileResult) -> None:
    """Registers within what the block was launched with, spills of 32 bytes at most (ptxas of CUDA 13 spills
    8-24 bytes in some 384-thread kernels, measured 2026-11-25: lower as it improves), no static shared
    memory, setmaxnreg kept and the wgmmas not serialised."""
    name, dtype, layout, _ = case
    space = kernels.get("matmul").space
    (usage,) = result.usages
    derived = space.derive(space.named(name), Problem(PROFILES["h100"], dtype, layout))
    assert usage.registers <= min(255, 65536 // derived["threads"] // 8 * 8)
    assert usage.spill_stores <= 32 and usage.static_smem == 0, (case, usage)
    assert "C7508" not in result.log and "C7510" not in result.log, result.log


def require_hopper() -> None:
    """Skip, with the reason, unless CuPy sees an sm_90 GPU."""
    cupy = pytest.importorskip("cupy")
    try:
        major = cupy.cuda.Device().compute_capability
    except Exception as exc:  # no GPU or no driver
        pytest.skip(f"no usable GPU: {exc}")
    if major != "90":
        pytest.skip("needs a Hopper GPU (sm_90)")
