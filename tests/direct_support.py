"""What the MATH=wgmma_direct tests share (tests/test_wgmma_direct.py: bfloat16 and float16;
tests/test_int8.py: int8): compiling a list of (config name, dtype, layout, batched) cases for sm_90a in
parallel, the checks of each compile, and skipping where there is no Hopper GPU; and, with the MATH=mma
tests (tests/test_mma.py), cuBLAS's result on the same inputs."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import pytest

from autotile.codegen import build, dtypes, kernels
from autotile.codegen.limits import PROFILES
from autotile.codegen.space import Problem

Case = tuple[str, str, str, bool]  # (named config, dtype, layout, batched)


def code(source: str) -> str:
    """`source` with each line that is only a // comment emptied (the line kept, so that nothing else moves):
    what the compiler sees of it. Named configs that differ only in how they are launched (PERSISTENT:
    direct-128x256 and direct-128x256-p) render the same code under another `// config:` line."""
    return "\n".join("" if line.lstrip().startswith("//") else line for line in source.split("\n"))


def compile_cases(cases: list[Case]) -> dict[Case, build.CompileResult]:
    """Every case compiled for sm_90a, two at a time (CI's two cores); cases whose sources are the same code
    (`code`) share one compile: the same program gives ptxas' same report."""
    space = kernels.get("matmul").space

    def source(case: Case) -> str:
        name, dtype, layout, batched = case
        spec = kernels.get("bmm" if batched else "matmul")
        return spec.render(space.named(name), dtype, layout)

    sources = {case: source(case) for case in cases}
    first: dict[str, str] = {}  # code -> the first case's source, the one compiled
    for text in sources.values():
        first.setdefault(code(text), text)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = {text: pool.submit(build.compile, text, "sm_90a") for text in first.values()}
        return {case: futures[first[code(text)]].result() for case, text in sources.items()}


_compiled: dict[tuple[str, str], build.CompileResult] = {}


def compile_once(source: str, arch: str) -> build.CompileResult:
    """`build.compile(source, arch)`, or the result of an earlier source of the same code (`code`)."""
    key = (code(source), arch)
    if key not in _compiled:
        _compiled[key] = build.compile(source, arch)
    return _compiled[key]


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


# A persistent block goes through several tiles only where the tiles outnumber the SMs (132 on an H100 or
# H200): shapes of 300 to 600 tiles, with K of one K step (17: the stages' phases wrap from tile to tile) and
# of two to four (200, the last one partial). With PINGPONG the two consumer warpgroups then take turns.
MANY_TILES = [(4099, 2050, 200), (4001, 3001, 17)]


def several_tiles_per_block(config: dict[str, Any], shape: tuple[int, int, int]) -> bool:
    """Whether a persistent launch of `config` on `shape` gives the current GPU's blocks more than two tiles
    on average."""
    import cupy

    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    tiles = -(-shape[0] // config["BM"]) * -(-shape[1] // config["BN"])
    return tiles > 2 * sms


def _compute_capability() -> int:
    """CuPy's current GPU's compute capability (90 on sm_90); a skip, with the reason, without one."""
    cupy = pytest.importorskip("cupy")
    try:
        return int(cupy.cuda.Device().compute_capability)
    except Exception as exc:  # no GPU or no driver
        pytest.skip(f"no usable GPU: {exc}")


def require_hopper() -> None:
    """Skip, with the reason, unless CuPy sees an sm_90 GPU."""
    if _compute_capability() != 90:
        pytest.skip("needs a Hopper GPU (sm_90)")


def require_sm80() -> None:
    """Skip, with the reason, unless CuPy sees a GPU of sm_80 or newer (mma.sync's 16-bit and int8 shapes)."""
    if _compute_capability() < 80:
        pytest.skip("needs a GPU of sm_80 or newer")


def cublas_output(key: Any, a: Any, b: Any) -> Any:
    """cuBLAS's result of `key` (a ProblemKey) on the CuPy arrays `a` and `b`, through autotile's own call
    (`CublasCall`: GemmEx for the 16-bit types, float32 sums), the output poisoned first."""
    import cupy

    from autotile.runtime.cublas import CublasCall

    spec = kernels.get(key.kernel)
    out = cupy.empty(spec.output_shape(key.shape), dtype=dtypes.output_storage(key.dtype))
    kernels.poison(out)
    strides = tuple(int(s) for s in kernels.batch_strides((a, b))) if spec.batched else ()
    CublasCall(key, cupy.cuda.Device().id)((int(a.data.ptr), int(b.data.ptr)), int(out.data.ptr),
                                            cupy.cuda.get_current_stream().ptr, strides)
    cupy.cuda.Device().synchronize()
    return out
