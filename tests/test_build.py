"""autotile.codegen.build without a GPU: ptxas' report, the option list, the target architecture, memoization,
CompileError, and the loading path with CuPy's device and driver calls replaced by fakes. Tests that run
NVRTC skip, with the reason, where it cannot be loaded."""

from __future__ import annotations

import contextlib
import re
from typing import Any, Iterator

import pytest

from autotile.codegen import build
from autotile.errors import CompileError, InvalidValueError
from autotile.runtime.timing import HARNESS_SOURCE

NVRTC_MISSING = build.nvrtc_unavailable_reason()
needs_nvrtc = pytest.mark.skipif(NVRTC_MISSING is not None, reason=f"NVRTC cannot be loaded ({NVRTC_MISSING})")

SMEM_SOURCE = """
extern "C" __global__ void smem_kernel(float* p) {
    __shared__ float s[256];
    s[threadIdx.x] = p[threadIdx.x];
    __syncthreads();
    p[threadIdx.x] = s[255 - threadIdx.x];
}
"""


@pytest.fixture(autouse=True)
def _fresh_memo() -> Iterator[None]:
    build.clear_memo()
    yield
    build.clear_memo()


# --- the report -----------------------------------------------------------------------------------------


def test_parse_nvcc_report() -> None:
    log = ("ptxas info    : 0 bytes gmem\n"
           "ptxas info    : Compiling entry function 'autotile_matmul' for 'sm_90'\n"
           "ptxas info    : Function properties for autotile_matmul\n"
           "    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n"
           "ptxas info    : Used 255 registers, used 1 barriers, 2048 bytes smem\n"
           "ptxas info    : Compile time = 29.696 ms\n"
           "ptxas info    : Compiling entry function 'autotile_matvec' for 'sm_80'\n"
           "ptxas info    : Function properties for autotile_matvec\n"
           "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
           "ptxas info    : Used 32 registers, used 1 barriers, 384 bytes cmem[0]\n")
    assert build.parse_ptxas(log) == [build.ResourceUsage("autotile_matmul", "sm_90", 255, 2048, 8, 4, 12),
                                      build.ResourceUsage("autotile_matvec", "sm_80", 32, 0, 0, 0, 0)]


def test_parse_nvrtc_report() -> None:
    # NVRTC's form: the frame line starts with "ptxas         ."; a device function that was not inlined
    # gets its own "Function properties" after the entry, which must not be taken for the entry's.
    log = ("ptxas info    : 0 bytes gmem\n"
           "ptxas info    : Compiling entry function 'k' for 'sm_80'\n"
           "ptxas info    : Function properties for k\n"
           "ptxas         .     256 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
           "ptxas info    : Used 40 registers, used 1 barriers, 256 bytes cumulative stack size, 800 bytes smem, "
           "360 bytes cmem[0], 8 bytes cmem[2]\n"
           "ptxas info    : Compile time = 5.866 ms\n"
           "ptxas info    : Function properties for _Z1fPfi\n"
           "ptxas         .     16 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
           "ptxas info    : Compiling entry function 'hold' for 'sm_90'\n"
           "ptxas info    : Function properties for hold\n"
           "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
           "ptxas info    : Used 8 registers, used 0 barriers\n"
           "ptxas info    : Compile time = 3.032 ms\n\n")
    assert build.parse_ptxas(log) == [build.ResourceUsage("k", "sm_80", 40, 800, 256, 0, 0),
                                      build.ResourceUsage("hold", "sm_90", 8, 0, 0, 0, 0)]


def test_parse_empty_and_malformed_reports() -> None:
    assert build.parse_ptxas("") == []  # PTX target: ptxas does not run
    with pytest.raises(ValueError, match="unexpected ptxas report"):
        build.parse_ptxas("ptxas info    : Compiling entry function 'k' for 'sm_90'\nptxas info    : Used 8 things\n")


# --- options and target ----------------------------------------------------------------------------------


def test_compile_options_are_explicit() -> None:
    # IEEE float32 arithmetic spelled out (no flush-to-zero: issue 11); a change makes every record a
    # fallback (options_key changes), so it must be deliberate.
    assert build.COMPILE_OPTIONS == ("-std=c++17", "-ftz=false", "-prec-div=true", "-prec-sqrt=true", "-fmad=true",
                                     "--device-as-default-execution-space")
    assert not any("ftz=true" in o or "use_fast_math" in o for o in build.COMPILE_OPTIONS)
    assert build.nvrtc_options("sm_90") == (*build.COMPILE_OPTIONS, "-arch=sm_90", "-Xptxas=-v")
    assert build.nvrtc_options("compute_89", ("-std=c++17",)) == ("-std=c++17", "-arch=compute_89", "-Xptxas=-v")
    with pytest.raises(InvalidValueError, match="sm_XX"):
        build.nvrtc_options("90")


def test_options_key_names_compiler_and_options() -> None:
    assert re.fullmatch(r"nvrtc-(\d+\.\d+|unknown)\+[0-9a-f]{8}", build.options_key())
    assert build.options_key().startswith(build.compiler_version() + "+")
    assert build.options_hash() == build.options_hash(build.COMPILE_OPTIONS)
    assert build.options_hash() != build.options_hash(build.COMPILE_OPTIONS[:1])
    assert build.options_hash(("-a", "-b")) != build.options_hash(("-b", "-a"))


def test_target_arch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "supported_archs", lambda: (75, 80, 86, 89, 90))
    assert build.target_arch("90") == "sm_90"
    assert build.target_arch((8, 0)) == "sm_80"
    assert build.target_arch(87) == "compute_86"  # unknown to this NVRTC: PTX for the newest below it
    assert build.target_arch((12, 0)) == "compute_90"
    with pytest.raises(CompileError, match="cannot build for sm_70"):
        build.target_arch(70)


@needs_nvrtc
def test_supported_archs_include_the_profiles() -> None:
    from autotile.codegen.limits import PROFILES

    assert {90, 80} <= set(build.supported_archs())
    assert build.target_arch(PROFILES["h100"].compute_capability) == "sm_90"


# --- compile ---------------------------------------------------------------------------------------------


@needs_nvrtc
def test_compile_gives_cubin_log_options_and_report() -> None:
    result = build.compile(SMEM_SOURCE, "sm_90")
    assert result.kind == "cubin" and result.arch == "sm_90"
    assert result.binary[:4] == b"\x7fELF"
    assert result.options == build.nvrtc_options("sm_90")
    assert result.compiler == build.compiler_version()
    assert "Compiling entry function 'smem_kernel' for 'sm_90'" in result.log
    usage = result.usage("smem_kernel")
    assert usage is not None and usage.static_smem == 1024 and usage.spill_stores == 0
    assert 0 < usage.registers <= 255
    assert result.usage("missing") is None


@needs_nvrtc
def test_compile_for_ptx() -> None:
    result = build.compile(SMEM_SOURCE, "compute_80")
    assert result.kind == "ptx" and b".entry smem_kernel" in result.binary
    assert result.usages == ()  # the driver runs ptxas on load: no report here


@needs_nvrtc
def test_compile_is_memoized_by_source_options_and_arch() -> None:
    first = build.compile(SMEM_SOURCE, "sm_90")
    assert build.compile(SMEM_SOURCE, "sm_90") is first
    assert first.key == build.source_hash(SMEM_SOURCE, build.nvrtc_options("sm_90"))
    other_arch = build.compile(SMEM_SOURCE, "sm_80")
    other_options = build.compile(SMEM_SOURCE, "sm_90", (*build.COMPILE_OPTIONS, "-DUNUSED=1"))
    other_source = build.compile(SMEM_SOURCE + "\n", "sm_90")
    assert len({id(r) for r in (first, other_arch, other_options, other_source)}) == 4
    assert len({r.key for r in (first, other_arch, other_options, other_source)}) == 4


@needs_nvrtc
def test_compile_error_carries_source_options_and_log() -> None:
    source = 'extern "C" __global__ void broken(float* p) { p[0] = undeclared_name; }\n'
    with pytest.raises(CompileError) as info:
        build.compile(source, "sm_90")
    exc = info.value
    assert exc.source == source
    assert exc.options == build.nvrtc_options("sm_90")
    assert "undeclared_name" in exc.log and "error" in exc.log
    message = str(exc)
    assert "\n" not in message and message.startswith("NVRTC failed (sm_90): ")
    assert 'identifier "undeclared_name" is undefined' in message


@needs_nvrtc
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_cubin_is_the_one_cupys_rawmodule_built(monkeypatch: pytest.MonkeyPatch, arch: str) -> None:
    """Before build called NVRTC itself, kernels came from cupy.RawModule(code, options=("-std=c++17",)),
    which adds options of its own. Its compile path (CuPy internals: the device's arch and the module load
    replaced, as there is no GPU here) gives the very cubin of build.compile with the legacy options that
    older records name, and not today's: CuPy adds -ftz=true, which autotile no longer has."""
    from types import SimpleNamespace

    from autotile.codegen import kernels

    try:
        from cupy.cuda import compiler

        captured: dict[str, Any] = {}

        class Module:
            def load(self, cubin: bytes) -> None:
                captured["cubin"] = cubin

            def _set_mapping(self, mapping: Any) -> None:
                pass

        monkeypatch.setattr(compiler, "_get_arch_for_options_for_nvrtc", lambda a=None: (f"-arch=sm_{a}", "cubin"))
        monkeypatch.setattr(compiler, "function", SimpleNamespace(Module=Module))
        monkeypatch.setattr(compiler, "_get_cupy_cache_key", lambda: "")
        spec = kernels.get("matmul")
        source = spec.render(spec.space.named("seed-tiled32"), "float32", "row")
        compiler._compile_with_cache_cuda(source, ("-std=c++17",), arch[3:], cache_in_memory=True)
    except (AttributeError, TypeError) as exc:  # another CuPy's internals: nothing to compare with
        pytest.skip(f"CuPy's compile path differs from 14.2's ({type(exc).__name__}: {exc})")
    from autotile.dispatch.select import LEGACY_COMPILE_OPTIONS

    assert captured["cubin"] == build.compile(source, arch, LEGACY_COMPILE_OPTIONS).binary
    assert captured["cubin"] != build.compile(source, arch).binary  # FFMA.FTZ there, FFMA here


def test_missing_nvrtc_is_a_compile_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "_nvrtc", lambda: (None, "OSError: libnvrtc.so: cannot open shared object file"))
    with pytest.raises(CompileError, match=r"^NVRTC is not available \(OSError: .*\): install autotile\[dev\] "
                                           r"or a CUDA toolkit$"):
        build.compile("// nothing\n", "sm_90")
    assert build.compiler_version() == "nvrtc-unknown"
    assert build.nvrtc_unavailable_reason() == "OSError: libnvrtc.so: cannot open shared object file"


# --- loading, with the GPU side faked --------------------------------------------------------------------


class FakeFunction:
    def __init__(self, name: str):
        self.name = name
        self.ptr = 4096 + len(name)
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, grid: Any, block: Any, args: Any, shared_mem: int = 0, stream: Any = None) -> None:
        self.calls.append((grid, block, args, shared_mem, stream))


class FakeModule:
    def __init__(self, binary: bytes):
        self.binary = binary

    def get_function(self, name: str) -> FakeFunction:
        return FakeFunction(name)


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A device of compute capability 9.0 whose current id the test sets; records every module load."""
    state: dict[str, Any] = {"device": 0, "loads": []}

    def load(binary: bytes) -> FakeModule:
        state["loads"].append(binary)
        return FakeModule(binary)

    @contextlib.contextmanager
    def use(device_id: int) -> Iterator[None]:
        before, state["device"] = state["device"], device_id
        try:
            yield
        finally:
            state["device"] = before

    monkeypatch.setattr(build, "_current_device", lambda: (state["device"], "90"))
    monkeypatch.setattr(build, "_load_module", load)
    monkeypatch.setattr(build, "_use_device", use)
    return state


@needs_nvrtc
def test_compile_kernel_uses_the_same_compile_as_the_tests(fake_gpu: dict[str, Any]) -> None:
    kernel = build.compile_kernel(SMEM_SOURCE, "smem_kernel")
    # The library's kernel is the very result the compile tests look at: same options, same memo entry.
    assert kernel.result is build.compile(SMEM_SOURCE, "sm_90")
    assert kernel.result.options == (*build.COMPILE_OPTIONS, "-arch=sm_90", "-Xptxas=-v")
    assert fake_gpu["loads"] == [kernel.result.binary]
    usage = kernel.usage
    assert usage is not None and usage == kernel.result.usage("smem_kernel")
    assert kernel.registers == kernel.num_regs == usage.registers


@needs_nvrtc
def test_compile_kernel_is_memoized_per_device(fake_gpu: dict[str, Any]) -> None:
    first = build.compile_kernel(HARNESS_SOURCE, "read_all")
    assert build.compile_kernel(HARNESS_SOURCE, "read_all") is first
    hold = build.compile_kernel(HARNESS_SOURCE, "hold")  # same module, another function: loaded once
    assert hold is not first and len(fake_gpu["loads"]) == 1
    fake_gpu["device"] = 1
    other = build.compile_kernel(HARNESS_SOURCE, "read_all")
    assert other is not first and other.device_id == 1 and other.result is first.result
    assert len(fake_gpu["loads"]) == 2


@needs_nvrtc
def test_compile_kernel_rejects_a_missing_entry(fake_gpu: dict[str, Any]) -> None:
    with pytest.raises(CompileError, match="no entry function 'nope'.*smem_kernel"):
        build.compile_kernel(SMEM_SOURCE, "nope")
    assert fake_gpu["loads"] == []


@needs_nvrtc
def test_compile_many_compiles_for_the_callers_device(fake_gpu: dict[str, Any]) -> None:
    fake_gpu["device"] = 3
    clock: dict = {}
    futures = build.compile_many([(HARNESS_SOURCE, "read_all"), (SMEM_SOURCE, "smem_kernel")], workers=2,
                                 clock=clock)
    kernels = [f.result(timeout=120) for f in futures]
    assert [k.name for k in kernels] == ["read_all", "smem_kernel"]
    assert {k.device_id for k in kernels} == {3}
    # each job's (began, ended), as the worker's compile deadline reads them
    assert set(clock) == {(HARNESS_SOURCE, "read_all"), (SMEM_SOURCE, "smem_kernel")}
    assert all(end is not None and 0 <= end - began < 120 for began, end in clock.values())


@needs_nvrtc
def test_kernel_launch_and_dynamic_smem(fake_gpu: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from cupy.cuda import driver

    set_calls: list[tuple[int, int, int]] = []
    monkeypatch.setattr(driver, "funcSetAttribute", lambda f, attr, value: set_calls.append((f, attr, value)))
    kernel = build.compile_kernel(SMEM_SOURCE, "smem_kernel")
    kernel([2], [256, 1], ["a", 3], shared_mem=512)
    assert kernel._function.calls == [((2,), (256, 1), ("a", 3), 512, None)]

    build.allow_dynamic_smem(kernel, 40 * 1024)  # under 48 KB: nothing to opt in to
    assert set_calls == [] and kernel.max_dynamic_shared_size_bytes == 0
    build.allow_dynamic_smem(kernel, 100 * 1024)
    kernel.allow_dynamic_smem(64 * 1024)  # already allowed
    build.allow_dynamic_smem(kernel, 120 * 1024)
    assert driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES == 8
    assert set_calls == [(kernel._function.ptr, 8, 100 * 1024), (kernel._function.ptr, 8, 120 * 1024)]
    assert kernel.max_dynamic_shared_size_bytes == 120 * 1024
