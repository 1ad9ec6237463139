"""Split-K summed by the last block (SPLIT_REDUCE=last_block), without a GPU: the knob leaves every
existing kernel as it was, the kernels it renders carry the workspace and tickets and no atomics on the
output, the launch sizes them, the runner passes them per stream, and the new named configs compile
(NVRTC). The GPU side (results, determinism, tickets reset between launches) is in test_gpu.py."""

from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import re
import sys
import types
from typing import Any

import numpy as np
import pytest

from autotile.codegen import build, kernels
from autotile.codegen.limits import PROFILES
from autotile.codegen.problem import ProblemKey
from autotile.codegen.space import Problem
from autotile.dispatch import select
from autotile.errors import CompileError
from autotile.runtime.impl import KernelRunner, ParameterBlock

# The named starting points that use last_block, with the layout they were made for.
NAMED = [("matmul", "row", "tf32x3-64-split8"), ("matmul", "row", "tf32x3-32x64-split8"),
         ("matmul", "row", "regtile-64-split8"), ("matvec", "row", "warp-per-row-split8"),
         ("matvec", "row", "warp-per-row-vec2-split8"), ("matvec", "col", "col-vec4-split8"),
         ("matvec", "col", "col-vec2-split8")]


def _named_cases() -> list[tuple[str, str, str, str, str]]:
    """(profile, kernel, layout, dtype, name) for every new named config that is feasible there."""
    out = []
    for profile in ("h100", "a100"):
        for kernel, layout, name in NAMED:
            space = kernels.get(kernel).space
            for dtype in ("float32", "float64"):
                if space.is_feasible(space.named(name), Problem(PROFILES[profile], dtype, layout)):
                    out.append((profile, kernel, layout, dtype, name))
    return out


NAMED_CASES = _named_cases()


@functools.lru_cache(maxsize=None)
def _last_block_sample(kernel: str, layout: str, dtype: str) -> tuple:
    """31 last_block configs per problem, drawn once: the tests take slices, and all of them as their atomic
    twins (a draw costs seconds whatever its size, `Space.sample`)."""
    space = kernels.get(kernel).space.restricted({"SPLIT_REDUCE": "last_block"})
    return tuple(space.sample(Problem(PROFILES["h100"], dtype, layout), 31, seed=31))


CASES = [(k, lay, dt) for k, layouts in (("matmul", ("row",)), ("matvec", ("row", "col")))
         for lay in layouts for dt in ("float32", "float64")]


def test_the_named_configs_use_last_block_and_are_feasible_where_they_should_be():
    for kernel, layout, name in NAMED:
        config = kernels.get(kernel).space.named(name)
        assert config["SPLIT_K"] == 8 and config["SPLIT_REDUCE"] == "last_block", name
        assert (PROFILES["h100"].name, kernel, layout, "float32", name) in {
            (PROFILES[p].name, k, lay, d, n) for p, k, lay, d, n in NAMED_CASES}, name
    # float64 takes the 2-wide ones (16 bytes per load at most), and no tensor-core one
    f64 = {n for p, k, lay, d, n in NAMED_CASES if d == "float64"}
    assert f64 == {"warp-per-row-vec2-split8", "col-vec2-split8"}


@pytest.mark.parametrize("kernel", ["matmul", "matvec"])
def test_the_knob_is_a_defaulted_conditional_parameter(kernel):
    """Added with default atomic (today's kernels), active only where SPLIT_K > 1, and left out of the
    cache's compatibility hash: old records keep reading."""
    space = kernels.get(kernel).space
    param = space.params["SPLIT_REDUCE"]
    assert param.choices == ("atomic", "last_block")
    assert param.has_default and param.default == "atomic" and param.inactive == "atomic"
    assert param.active is not None and param.active.text == "SPLIT_K > 1"
    old = {k: v for k, v in next(iter(space.named_configs.values())).items() if k != "SPLIT_REDUCE"}
    assert space.config(old)["SPLIT_REDUCE"] == "atomic"
    names = list(space.params)
    assert names.index("SPLIT_REDUCE") > names.index("SPLIT_K")  # its condition reads SPLIT_K


@pytest.mark.parametrize("kernel", ["matmul", "matvec"])
def test_source_key_names_the_knob_only_for_last_block(kernel):
    spec = kernels.get(kernel)
    for name, config in spec.space.named_configs.items():
        layout = spec.space.named_layouts.get(name, "row")
        src = spec.render(config, "float32", layout)
        if config["SPLIT_REDUCE"] == "atomic":
            assert "SPLIT_REDUCE" not in src and "partials" not in src and "tickets" not in src, name
        else:
            assert "SPLIT_REDUCE=last_block" in spec.space.source_key(config)
            assert f"// config: {spec.space.source_key(config)}\n" in src


def test_last_block_is_feasible_only_with_split_k():
    space = kernels.get("matmul").space
    problem = Problem(PROFILES["h100"])
    base = space.named("regtile-64-split8")
    assert space.is_feasible(base, problem)
    one = space.with_overrides(base, {"SPLIT_K": 1})
    assert any("SPLIT_REDUCE only where SPLIT_K > 1" in v for v in space.violations(one, problem))
    assert space.is_feasible(space.with_overrides(one, {"SPLIT_REDUCE": "atomic"}), problem)


@pytest.mark.parametrize("kernel,layout,dtype", CASES)
def test_last_block_kernels_take_the_buffers_and_use_no_atomics_on_the_output(kernel, layout, dtype):
    spec = kernels.get(kernel)
    out = "C" if kernel == "matmul" else "y"
    sizes = "int M, int N, int K" if kernel == "matmul" else "int M, int K"
    configs = _last_block_sample(kernel, layout, dtype)[:25]
    assert len(configs) == 25 and {c["smem"] for c in configs} >= {"static", "dynamic"}
    for config in configs:
        src = spec.render(config, dtype, layout)
        code = "\n".join(line.split("//", 1)[0] for line in src.splitlines())
        assert config["SPLIT_K"] > 1
        assert re.search(sizes + r",\s+T\* __restrict__ partials, unsigned int\* __restrict__ tickets\)", code)
        assert f"atomicAdd(&{out}" not in code and "atomicAdd(out" not in code, config.key()
        assert code.count("atomicAdd(") == 1  # the ticket, in split_arrived_last
        assert f"split_arrived_last<{config['SPLIT_K']}>(tickets + " in code
        assert f"sum_splits<{config['SPLIT_K']}>(partials + " in code
        assert "__ldcg(p" in code and "__syncthreads_or(last)" in code and "atomicExch(ticket, 0u)" in code
        # every split stores its slice of the workspace, indexed like the output
        slice_store = "slice" if kernel == "matmul" else "partials[(size_t)blockIdx.y * M + row"
        assert slice_store in code
        assert src.count("{") == src.count("}")


@pytest.mark.parametrize("kernel,layout,dtype", CASES)
def test_atomic_split_k_kernels_are_as_before(kernel, layout, dtype):
    """SPLIT_REDUCE=atomic renders no trace of the new path: same parameters, atomics into the output.
    (Byte-identity with the sources tuned records hashed is checked by the golden files and by
    test_select's shipped records.)"""
    spec = kernels.get(kernel)
    out = "C" if kernel == "matmul" else "y"
    space = spec.space
    problem = Problem(PROFILES["h100"], dtype, layout)
    # The atomic twins of the last_block sample: for these dtypes no constraint tells the two reductions apart,
    # so the twins are a uniform sample of the atomic split-K configs, without a draw of their own (a draw of
    # the matmul space walks its millions of configs: 15 seconds each, where these cost nothing).
    configs = [space.with_overrides(c, {"SPLIT_REDUCE": "atomic"}) for c in _last_block_sample(kernel, layout, dtype)]
    assert len(configs) == 31
    for config in configs:
        assert config["SPLIT_K"] > 1 and config["SPLIT_REDUCE"] == "atomic"
        assert space.is_feasible(config, problem), space.violations(config, problem)
        src = spec.render(config, dtype, layout)
        assert "partials" not in src and "split_arrived_last" not in src and "SPLIT_REDUCE" not in src
        assert f"atomicAdd(&{out}[" in src or "atomicAdd(out" in src
        launch = spec.launch(config, (100, 90, 80)[:len(spec.dims)], dtype, layout)
        assert launch.zero_output and (launch.workspace_elems, launch.tickets) == (0, 0)


# -- launch geometry ---------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,workspace,tickets", [
    ((1, 1, 1), 8 * 1 * 1, 1 * 1),
    ((1, 97, 4099), 8 * 1 * 97, 1 * 2),  # one row, a prime N over two 64-wide tiles
    ((131, 67, 257), 8 * 131 * 67, 3 * 2),
    ((64, 64, 8192), 8 * 64 * 64, 1),
    ((4096, 128, 4096), 8 * 4096 * 128, 64 * 2),
])
def test_matmul_last_block_launch_sizes(shape, workspace, tickets):
    spec = kernels.get("matmul")
    for name in ("regtile-64-split8", "tf32x3-64-split8"):
        launch = spec.launch(spec.space.named(name), shape)
        assert not launch.zero_output
        assert (launch.workspace_elems, launch.tickets) == (workspace, tickets), name
        assert launch.grid[2] == 8  # the splits along z
        assert launch.tickets == launch.grid[0] * launch.grid[1]  # SWIZZLE 1: one block per tile and split
    narrow = spec.launch(spec.space.named("tf32x3-32x64-split8"), shape)
    M, N, _ = shape
    assert (narrow.workspace_elems, narrow.tickets) == (workspace, -(-M // 32) * -(-N // 64))


def test_matmul_last_block_tickets_with_swizzle():
    """SWIZZLE puts all tiles on grid x: still one ticket per output tile."""
    spec = kernels.get("matmul")
    config = spec.space.with_overrides(spec.space.named("regtile-64-split8"), {"SWIZZLE": 8})
    launch = spec.launch(config, (131, 67, 257))
    assert launch.grid == (3 * 2, 1, 8) and launch.tickets == 6


@pytest.mark.parametrize("layout,name,rows", [("row", "warp-per-row-split8", 4), ("col", "col-vec4-split8", 64)])
@pytest.mark.parametrize("shape", [(1, 1), (1, 17), (29, 1), (1031, 2053), (4099, 509), (64, 100003)])
def test_matvec_last_block_launch_sizes(layout, name, rows, shape):
    spec = kernels.get("matvec")
    launch = spec.launch(spec.space.named(name), shape, "float32", layout)
    M = shape[0]
    assert not launch.zero_output
    assert launch.workspace_elems == 8 * M
    assert launch.tickets == -(-M // rows) == launch.grid[0]
    assert launch.grid[1] == 8


# -- the runner --------------------------------------------------------------------------------------

class _FakeArray:
    def __init__(self, n: int, dtype, log: list):
        self.size, self.dtype = n, np.dtype(dtype)
        self.nbytes = n * self.dtype.itemsize
        self.data = types.SimpleNamespace(ptr=1000 + len(log))
        log.append(("alloc", n, self.dtype.name))


class _FakeStream:
    def __init__(self, ptr: int, log: list):
        self.ptr, self._log = ptr, log

    def __enter__(self):
        self._log.append(("enter", self.ptr))

    def __exit__(self, *exc):
        self._log.append(("exit", self.ptr))


@pytest.fixture
def fake_cupy(monkeypatch):
    """Just enough of CuPy for KernelRunner.launch: memsetAsync and streams by pointer, logged."""
    import autotile.runtime.impl as impl

    log: list = []
    cupy = types.ModuleType("cupy")
    runtime = types.SimpleNamespace(memsetAsync=lambda ptr, value, n, stream: log.append(("memset", ptr, value, n,
                                                                                          stream)),
                                    streamIsCapturing=lambda stream: stream in CAPTURING)
    cupy.cuda = types.SimpleNamespace(runtime=runtime, ExternalStream=lambda ptr: _FakeStream(ptr, log))
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr(impl, "_external_streams", {})
    return log


CAPTURING = {77}  # the streams the fake CUDA runtime reports as being captured into a graph


def _allocator(log: list, name: str = "alloc"):
    """An allocator that logs what it is asked for and hands out distinct pointers."""
    def allocate(elems: int, dtype: str, stream_ptr: int):
        log.append((name, elems, dtype, stream_ptr))
        return object(), 5000 + 100 * len(log)
    return allocate


class _RecordingKernel:
    """Stands in for `build.Kernel`: records each launch's geometry, packed parameters and stream."""

    def __init__(self) -> None:
        self.calls: list = []

    def launch_packed(self, grid, block, shared_mem, stream_ptr, parameters):
        self.calls.append((grid, block, parameters.arguments(), stream_ptr))


def test_runner_passes_one_workspace_per_stream_and_zeroes_tickets_once(fake_cupy, monkeypatch):
    log = fake_cupy
    # Kept memory comes from CuPy's pool, but inside a capture (stream 77) from the caller's allocator
    import autotile.runtime.impl as impl

    monkeypatch.setattr(impl, "cupy_allocator", _allocator(log, "cupy"))
    spec = kernels.get("matvec")
    shape = (1031, 2053)
    launch = spec.launch(spec.space.named("warp-per-row-split8"), shape)
    kernel = _RecordingKernel()
    calls = kernel.calls
    runner = KernelRunner(kernel, launch, spec.size_args(shape))
    allocate = _allocator(log)
    for stream in (0, 0, 77, 77):
        runner.launch((11, 22), 33, 1031 * 4, "float32", stream, (), allocate)
    allocs = [e for e in log if e[0] == "alloc"]
    allocs = [e for e in log if e[0] in ("alloc", "cupy")]
    assert allocs == [("cupy", 8 * 1031, "float32", 0), ("cupy", 258, "uint32", 0),
                      ("alloc", 8 * 1031, "float32", 77), ("alloc", 258, "uint32", 77)]  # one pair per stream
    memsets = [e for e in log if e[0] == "memset"]
    assert [(m[2], m[3], m[4]) for m in memsets] == [(0, 258 * 4, 0), (0, 258 * 4, 77)]  # tickets only, once
    assert len(calls) == 4
    first, second, third, fourth = (c[2] for c in calls)
    assert [int(v) for v in first[:3]] == [11, 22, 33] and [int(v) for v in first[3:5]] == [1031, 2053]
    assert first[5] == second[5] and first[6] == second[6]  # the same pair on one stream
    assert third[5] != first[5] and third[6] != first[6] and third[5] == fourth[5]
    assert calls[2][3] == 77 and calls[0][3] == 0  # launched on the stream it was given


def test_runner_of_an_atomic_split_zeroes_the_output_and_passes_no_buffers(fake_cupy):
    log = fake_cupy
    spec = kernels.get("matvec")
    shape = (1031, 2053)
    launch = spec.launch(spec.space.named("warp-per-row"), shape)
    kernel = _RecordingKernel()
    runner = KernelRunner(kernel, launch, spec.size_args(shape))
    runner.launch((1, 2), 4096, 1031 * 4, "float32", 5, ())
    assert [e[0] for e in log] == ["memset"] and log[0][1:] == (4096, 0, 1031 * 4, 5)  # on the launch stream
    assert len(kernel.calls[0][2]) == 5 and kernel.calls[0][3] == 5


def test_a_batched_runner_passes_the_batch_strides_after_the_sizes(fake_cupy):
    spec = kernels.get("bmm")
    shape = (6, 131, 67, 257)
    config = spec.space.named("tf32x3-64")
    launch = spec.launch(config, shape)
    assert launch.grid[2] == 6 and launch.grid[:2] == kernels.get("matmul").launch(config, shape[1:]).grid[:2]
    kernel = _RecordingKernel()
    runner = KernelRunner(kernel, launch, spec.size_args(shape), spec.batched)
    runner.launch((1, 2), 3, 6 * 131 * 67 * 4, "float32", 0, (131 * 257, 0))
    args = kernel.calls[0][2]
    assert [int(v) for v in args[3:6]] == [131, 67, 257] and [int(v) for v in args[6:]] == [131 * 257, 0]
    assert [type(v) for v in args[3:]] == [np.int32] * 3 + [np.int64] * 2


# -- selection ---------------------------------------------------------------------------------------

def test_keep_grid_filled_keeps_the_reduction_as_tuned():
    spec = kernels.get("matmul")
    tuned = spec.space.with_overrides(spec.space.named("regtile-64-split8"), {"SPLIT_K": 2})
    key = ProblemKey("matmul", "float32", "row", (128, 128, 8192))
    raised = select.keep_grid_filled(key, tuned, (1024, 1024, 8192))
    assert raised["SPLIT_K"] > 2 and raised["SPLIT_REDUCE"] == "last_block"
    # from SPLIT_K 1 (reduction inactive) the raise keeps atomic, the reduction every raise was measured with
    plain = spec.space.named("regtile-128")
    raised = select.keep_grid_filled(key, plain, (4096, 4096, 8192))
    assert raised["SPLIT_K"] > 1 and raised["SPLIT_REDUCE"] == "atomic"


# -- compiles (NVRTC, no GPU) ------------------------------------------------------------------------

NVRTC_MISSING = build.nvrtc_unavailable_reason()
needs_nvrtc = pytest.mark.skipif(NVRTC_MISSING is not None, reason=f"NVRTC cannot be loaded ({NVRTC_MISSING})")


def _compile(kernel: str, config, dtype: str, layout: str, arch: str) -> build.ResourceUsage:
    try:
        result = build.compile(kernels.get(kernel).render(config, dtype, layout), arch)
    except CompileError as exc:
        raise AssertionError(f"{config.key()}: {exc}\n{exc.log[-3000:]}") from None
    (usage,) = result.usages
    return usage


def _compile_ahead(jobs: list[tuple[str, Any, str, str, str]]) -> None:
    """Compiles `jobs` ((kernel, config, dtype, layout, arch)) two at a time (NVRTC releases the GIL; CI has two
    cores), for the tests' own `build.compile` to read from its memo. A compile that fails here is not kept:
    its test compiles it again and reports the error."""
    def compile_one(job) -> None:
        kernel, config, dtype, layout, arch = job
        try:
            build.compile(kernels.get(kernel).render(config, dtype, layout), arch)
        except CompileError:
            pass

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(compile_one, jobs))


@pytest.fixture(scope="module")
def named_compiled() -> None:
    _compile_ahead([(kernel, kernels.get(kernel).space.named(name), dtype, layout, PROFILES[profile].arch)
                    for profile, kernel, layout, dtype, name in NAMED_CASES])


@pytest.fixture(scope="module")
def sampled_compiled() -> None:
    _compile_ahead([(kernel, config, dtype, layout, "sm_90") for kernel, layout, dtype in CASES
                    for config in _last_block_sample(kernel, layout, dtype)[25:]])


@needs_nvrtc
@pytest.mark.slow
@pytest.mark.parametrize("profile,kernel,layout,dtype,name", NAMED_CASES, ids=["-".join(c) for c in NAMED_CASES])
def test_named_last_block_configs_compile_without_spills(named_compiled, profile, kernel, layout, dtype, name):
    space = kernels.get(kernel).space
    config = space.named(name)
    usage = _compile(kernel, config, dtype, layout, PROFILES[profile].arch)
    assert usage.function == f"autotile_{kernel}"
    assert (usage.spill_stores, usage.spill_loads, usage.stack_frame) == (0, 0, 0), usage
    model = space.derive(config, Problem(PROFILES[profile], dtype, layout))
    # the ticket's answer travels through the barrier (__syncthreads_or), not through shared memory
    assert usage.static_smem == (model["smem_bytes"] if config["smem"] == "static" else 0)


@needs_nvrtc
@pytest.mark.slow
@pytest.mark.parametrize("kernel,layout,dtype", CASES)
def test_sampled_last_block_configs_compile(sampled_compiled, kernel, layout, dtype):
    configs = _last_block_sample(kernel, layout, dtype)[25:]
    assert len(configs) == 6
    for config in configs:
        usage = _compile(kernel, config, dtype, layout, "sm_90")
        assert usage.registers <= 255
        if config["smem"] == "static":
            model = kernels.get(kernel).space.derive(config, Problem(PROFILES["h100"], dtype, layout))
            assert usage.static_smem == model["smem_bytes"], config.key()


def test_parameter_block_points_the_driver_at_each_slot_with_the_value_in_its_type():
    parameters = ParameterBlock(("ptr", "int32", "int64"))
    parameters.set(0, 0xDEADBEEF00)
    parameters.set(1, 257)
    parameters.set(2, -3)
    pointers = (ctypes.c_void_p * 3).from_address(parameters.address)  # what cuLaunchKernel dereferences
    assert ctypes.c_uint64.from_address(pointers[0]).value == 0xDEADBEEF00
    assert ctypes.c_int32.from_address(pointers[1]).value == 257
    assert ctypes.c_int64.from_address(pointers[2]).value == -3
    assert parameters.arguments() == (np.uint64(0xDEADBEEF00), np.int32(257), np.int64(-3))
