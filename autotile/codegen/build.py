"""Rendered source -> compiled binary -> loaded kernel, with NVRTC and one explicit list of options.

Two steps, so that the library, the tuner and the tests build every kernel the same way:

* `compile(source, arch)` runs NVRTC and needs no GPU: it returns the cubin (or PTX), the compiler log
  and ptxas' resource report of each entry function (`ResourceUsage`). The compile tests call it for the
  profiles' architectures; `compile_kernel` calls it for the current device's.
* `compile_kernel(source, name)` loads that binary on the current device through CuPy's driver module
  and returns a `Kernel`, callable like `cupy.RawKernel`.

Options come from `COMPILE_OPTIONS` plus the target architecture and `-Xptxas=-v` (`nvrtc_options`);
nothing is added behind our back, as CuPy's own compile path would (it appends `-ftz=true`). Results are
memoized by the hash of source and options (`compile`) and per device (`compile_kernel`), and kept on disk
across processes (`compile_cache`: a kernel compiles once per machine). CuPy is imported
on first use, so importing this module needs neither a GPU nor CuPy.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import hashlib
import os
import re
import threading
import time
from typing import Any, Callable, Iterable

from autotile.codegen import compile_cache
from autotile.errors import CompileError, InvalidValueError

# Every option NVRTC gets, apart from the target (`-arch=`, per device) and `-Xptxas=-v` (the report). Each
# is NVRTC's default too, spelled out so that no default (and no wrapper: CuPy's RawModule appends
# -ftz=true) decides the arithmetic. The tuner, the library and the compile tests all build with these;
# records keep them (`compile_options`) and the selection prefers records made with today's.
COMPILE_OPTIONS: tuple[str, ...] = (
    # The language standard the templates are written and tested against.
    "-std=c++17",
    # IEEE float32 semantics, as cuBLAS SGEMM has them: denormal inputs and results are kept, not flushed
    # to zero (with -ftz=true a denormal operand of an FMA reads as zero), division and square root are
    # correctly rounded, and a*b+c may be contracted to one FMA (one rounding, as SGEMM's inner loop).
    "-ftz=false",
    "-prec-div=true",
    "-prec-sqrt=true",
    "-fmad=true",
    # Functions and namespace-scope variables without __host__/__device__ are device code (CuPy's habit;
    # the templates annotate their functions, so it changes no kernel).
    "--device-as-default-execution-space",
)
# ptxas prints registers, static shared memory, stack frame and spills of each entry function: the
# resource report `compile` parses. It changes nothing in the generated code.
REPORT_OPTION = "-Xptxas=-v"
STATIC_SMEM_LIMIT = 48 * 1024  # bytes a kernel may use without opting in to more (all GPUs since sm_20)
MEMO_SIZE = 512  # compile results kept in memory (a cubin is tens of kilobytes)

_ARCH = re.compile(r"(sm|compute)_(\d+)[af]?")


@dataclasses.dataclass(frozen=True)
class ResourceUsage:
    """What ptxas reports for one entry function: registers per thread, bytes of the rest."""

    function: str
    arch: str  # the SASS target, for example "sm_90"
    registers: int
    static_smem: int  # shared memory the kernel declares statically (dynamic shared memory is not in it)
    stack_frame: int
    spill_stores: int
    spill_loads: int


@dataclasses.dataclass(frozen=True)
class CompileResult:
    """One NVRTC compile: the binary the driver loads, the log, and the report of each entry function."""

    binary: bytes = dataclasses.field(repr=False)  # cubin for arch "sm_XX", PTX text for "compute_XX"
    kind: str  # "cubin" or "ptx"
    arch: str
    options: tuple[str, ...]  # everything NVRTC got, arch and REPORT_OPTION included
    compiler: str  # compiler_version(), for example "nvrtc-12.9"
    log: str = dataclasses.field(repr=False)
    usages: tuple[ResourceUsage, ...]  # empty for PTX: ptxas runs in the driver then, and reports nothing
    key: str  # source_hash(source, options), the memo key

    def usage(self, function: str) -> ResourceUsage | None:
        """The report of the entry function `function`, or None (PTX, or no such function)."""
        return next((u for u in self.usages if u.function == function), None)


# --- the ptxas report ------------------------------------------------------------------------------------

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
_FRAME = r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
_USED = re.compile(r"Used (\d+) registers([^\n]*)")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(log: str) -> list[ResourceUsage]:
    """ptxas' `-v` report (as NVRTC or nvcc print it), one `ResourceUsage` per entry function, in order.

    Raises ValueError on a block that does not read as expected, so that a change of format shows."""
    usages = []
    # One block per entry function; it starts at "Compiling entry function" and runs to the next one.
    for block in re.split(r"(?=ptxas\s+info\s*:\s*Compiling entry function)", log)[1:]:
        entry, used = _ENTRY.search(block), _USED.search(block)
        # The entry's own frame line follows "Function properties for <entry>"; lines for device functions
        # that were not inlined come before it, under their own names. NVRTC starts the line with
        # "ptxas         ." where nvcc indents it.
        frame = entry and re.search(r"Function properties for " + re.escape(entry.group(1)) + r"\s*\n[^\n]*?"
                                    + _FRAME, block)
        if not (entry and used and frame):
            raise ValueError(f"unexpected ptxas report: {block.strip()[:300]!r}")
        smem = _SMEM.search(used.group(2))  # absent when the kernel declares no static shared memory
        usages.append(ResourceUsage(entry.group(1), entry.group(2), int(used.group(1)),
                                    int(smem.group(1)) if smem else 0, *(int(g) for g in frame.groups())))
    return usages


# --- NVRTC -----------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _nvrtc() -> tuple[Any, str]:
    """CuPy's NVRTC binding and "" if NVRTC loads, else (None, the reason it does not)."""
    try:
        from cupy.cuda import nvrtc

        nvrtc.getVersion()  # loads libnvrtc: from a CUDA toolkit or the nvidia-cuda-nvrtc wheel
        return nvrtc, ""
    except Exception as exc:  # ImportError without CuPy; CuPy's own errors when libnvrtc is missing
        return None, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"


def nvrtc_unavailable_reason() -> str | None:
    """None when NVRTC can be loaded, else why not (one line)."""
    return _nvrtc()[1] or None


def require_nvrtc() -> Any:
    """CuPy's NVRTC binding; CompileError naming why where it cannot be loaded."""
    nvrtc, reason = _nvrtc()
    if nvrtc is None:
        raise CompileError(f"NVRTC is not available ({reason}): install autotile[dev] or a CUDA toolkit")
    return nvrtc


def compiler_version() -> str:
    """The NVRTC version, for example "nvrtc-12.9", or "nvrtc-unknown" without NVRTC. Part of the cache key:
    a new compiler may change what is fastest."""
    nvrtc = _nvrtc()[0]
    if nvrtc is None:
        return "nvrtc-unknown"
    major, minor = nvrtc.getVersion()
    return f"nvrtc-{major}.{minor}"


def options_hash(options: tuple[str, ...] = COMPILE_OPTIONS) -> str:
    """8 hex digits that name a list of compile options (order included)."""
    return hashlib.sha256("\0".join(options).encode()).hexdigest()[:8]


def options_key() -> str:
    """Names the compiler and `COMPILE_OPTIONS`, for example "nvrtc-12.9+1a2b3c4d": a tuned record is only as
    good as the code it timed, which both decide. The architecture is not in it: the device's fingerprint
    in the cache key already names it."""
    return f"{compiler_version()}+{options_hash()}"


@functools.lru_cache(maxsize=None)
def supported_archs() -> tuple[int, ...]:
    """The architectures NVRTC can build SASS for, as 10 * major + minor (90 for sm_90)."""
    return tuple(int(a) for a in require_nvrtc().getSupportedArchs())


# A source that uses arch-specific instructions (wgmma, setmaxnreg: sm_90a) says so in a line of its own;
# `compile_kernel` then builds it for "sm_XXa". Other sources keep the plain target (and their cubins).
ARCH_SPECIFIC_MARKER = "// autotile-target: sm_90a"


def needs_arch_specific(source: str) -> bool:
    """Whether `source` asks for the arch-specific target (`ARCH_SPECIFIC_MARKER`)."""
    return ARCH_SPECIFIC_MARKER in source


def target_arch(compute_capability: str | int | tuple[int, int], arch_specific: bool = False) -> str:
    """The `-arch` value for a device: "sm_XX" (cubin) when NVRTC knows it, else PTX for the newest
    architecture it knows below it ("compute_XX", compiled by the driver on load). `arch_specific`:
    "sm_90a" on a cc 9.0 device (wgmma); elsewhere an error, since such code runs on that chip only.

    `compute_capability` as CuPy gives it ("90"), as 90, or as (9, 0)."""
    cc = compute_capability[0] * 10 + compute_capability[1] if isinstance(compute_capability, tuple) \
        else int(compute_capability)
    archs = supported_archs()
    if arch_specific:
        if cc != 90 or cc not in archs:
            raise CompileError(f"sm_90a code cannot be built for sm_{cc} ({compiler_version()})")
        return "sm_90a"
    if cc in archs:
        return f"sm_{cc}"
    older = [a for a in archs if a < cc]
    if not older:
        raise CompileError(f"{compiler_version()} cannot build for sm_{cc}: its oldest target is sm_{min(archs)}")
    return f"compute_{max(older)}"


def nvrtc_options(arch: str, options: tuple[str, ...] = COMPILE_OPTIONS) -> tuple[str, ...]:
    """The full option list of one compile: `options`, the target, then the request for ptxas' report."""
    if not _ARCH.fullmatch(arch):
        raise InvalidValueError(f"arch {arch!r} is not of the form sm_XX or compute_XX")
    return (*options, f"-arch={arch}", REPORT_OPTION)


def source_hash(source: str, options: tuple[str, ...] = COMPILE_OPTIONS) -> str:
    """SHA-256 (hex) of a source and its options: the memo key (the options carry the arch)."""
    return hashlib.sha256((source + "\0" + "\0".join(options)).encode()).hexdigest()


_lock = threading.Lock()
_results: collections.OrderedDict[str, CompileResult] = collections.OrderedDict()  # LRU, MEMO_SIZE entries


def compile(source: str, arch: str, options: tuple[str, ...] = COMPILE_OPTIONS) -> CompileResult:
    """Compile `source` for `arch` ("sm_90": cubin; "compute_90": PTX) with NVRTC; no GPU needed.

    Memoized by the hash of source and full options, in memory and on disk (`compile_cache`: another process
    reads the binary instead of compiling again). Raises CompileError (source, options and log attached,
    first error line in the message) when NVRTC rejects the source or cannot be loaded."""
    full = nvrtc_options(arch, options)
    key = source_hash(source, full)
    with _lock:
        if key in _results:
            _results.move_to_end(key)
            return _results[key]
    nvrtc = require_nvrtc()
    kind = "cubin" if arch.startswith("sm_") else "ptx"
    compiler = compiler_version()
    stored = compile_cache.load(key, compiler)
    if stored is not None and stored[0].get("kind") == kind and stored[0].get("arch") == arch:
        result = _result(stored[1], kind, arch, full, compiler, str(stored[0].get("log", "")), key)
    else:
        result = _run_nvrtc(nvrtc, source, kind, arch, full, compiler, key)
        compile_cache.store(key, compiler, {"kind": kind, "arch": arch, "options": list(full), "log": result.log},
                            result.binary)
    with _lock:
        _results[key] = result
        while len(_results) > MEMO_SIZE:
            _results.popitem(last=False)
    return result


def _run_nvrtc(nvrtc: Any, source: str, kind: str, arch: str, full: tuple[str, ...], compiler: str,
               key: str) -> CompileResult:
    """One NVRTC compile of `source` with the full option list `full`."""
    prog = nvrtc.createProgram(source, "kernel.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, list(full))
        except nvrtc.NVRTCError as exc:
            log = _log(nvrtc, prog)
            raise CompileError(f"NVRTC failed ({arch}): {_first_error(log) or exc}", source, full, log) from None
        log = _log(nvrtc, prog)
        binary = nvrtc.getCUBIN(prog) if kind == "cubin" else nvrtc.getPTX(prog)
        if isinstance(binary, str):  # older CuPy gives PTX as str; Module.load takes bytes
            binary = binary.encode()
    finally:
        nvrtc.destroyProgram(prog)
    return _result(binary, kind, arch, full, compiler, log, key)


def _result(binary: bytes, kind: str, arch: str, full: tuple[str, ...], compiler: str, log: str,
            key: str) -> CompileResult:
    """A `CompileResult`, ptxas' report read from `log` (the same whether NVRTC just ran or the disk cache
    kept its log)."""
    try:
        usages = tuple(parse_ptxas(log))
    except ValueError:  # a report we cannot read must not stop the kernel; the compile tests would catch it
        usages = ()
    return CompileResult(binary, kind, arch, full, compiler, log, usages, key)


def _log(nvrtc: Any, prog: Any) -> str:
    return str(nvrtc.getProgramLog(prog)).rstrip("\0")  # NVRTC counts the terminating NUL in the log


def _first_error(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    return next((line for line in lines if "error" in line), lines[0] if lines else "")


def clear_memo() -> None:
    """Forget every memoized compile and loaded kernel (tests; a process never needs it)."""
    with _lock:
        _results.clear()
        _kernels.clear()
        _modules.clear()


# --- loading on the GPU ----------------------------------------------------------------------------------


class Kernel:
    """One entry function loaded on one device; call it as kernel(grid, block, args, shared_mem=0, stream=None),
    like `cupy.RawKernel`, or launch it with packed parameters (`launch_packed`, the library's per-call path)."""

    _launch_kernel: Callable[..., None] | None = None  # CuPy's cuLaunchKernel binding, imported on first launch

    def __init__(self, function: Any, name: str, result: CompileResult, device_id: int):
        self._function = function  # cupy.cuda.function.Function; it keeps its module loaded
        self.name = name
        self.result = result
        self.device_id = device_id
        self._dynamic_smem = 0  # bytes of dynamic shared memory opted in to; 0: the default 48 KB
        self._lock = threading.Lock()
        self._registers: int | None = None

    @property
    def usage(self) -> ResourceUsage | None:
        """ptxas' report for this function; None when the driver compiled it from PTX."""
        return self.result.usage(self.name)

    @property
    def registers(self) -> int:
        """Registers per thread: from ptxas' report, or asked of the driver (PTX)."""
        if self._registers is None:
            usage = self.usage
            if usage is not None:
                self._registers = usage.registers
            else:
                from cupy.cuda import driver

                self._registers = int(driver.funcGetAttribute(driver.CU_FUNC_ATTRIBUTE_NUM_REGS,
                                                              self._function.ptr))
        return self._registers

    @property
    def num_regs(self) -> int:
        """`registers` under `cupy.RawKernel`'s name."""
        return self.registers

    @property
    def max_dynamic_shared_size_bytes(self) -> int:
        """The dynamic shared memory (bytes) this kernel was opted in to; 0 if never."""
        return self._dynamic_smem

    def allow_dynamic_smem(self, nbytes: int) -> None:
        """Let launches use `nbytes` of dynamic shared memory; above 48 KB a launch fails without it.
        Raises CuPy's CUDADriverError when the device cannot give that much."""
        if nbytes <= STATIC_SMEM_LIMIT:
            return
        with self._lock:
            if self._dynamic_smem >= nbytes:
                return
            from cupy.cuda import driver

            # 8 in CUDA's enum; CuPy 14 names it, older CuPy may not.
            attribute = getattr(driver, "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", 8)
            with _use_device(self.device_id):
                driver.funcSetAttribute(self._function.ptr, attribute, int(nbytes))
            self._dynamic_smem = int(nbytes)

    def __call__(self, grid: Iterable[int], block: Iterable[int], args: Iterable[Any], shared_mem: int = 0,
                 stream: Any = None) -> None:
        """Launch on `stream` (None: the current stream); `shared_mem` bytes of dynamic shared memory."""
        # CuPy's Function wants tuples for grid and block.
        self._function(tuple(grid), tuple(block), tuple(args), shared_mem=int(shared_mem), stream=stream)

    @property
    def function_pointer(self) -> int:
        """The driver's handle of this kernel (CUfunction), for `launch_function`."""
        return int(self._function.ptr)

    @property
    def launch_function(self) -> Callable[..., None]:
        """cuLaunchKernel (CuPy's binding, imported on first use): (function, grid x, y, z, block x, y, z,
        shared memory, stream, kernelParams, extra)."""
        if Kernel._launch_kernel is None:
            from cupy.cuda import driver

            Kernel._launch_kernel = driver.launchKernel
        return Kernel._launch_kernel

    def launch_packed(self, grid: tuple[int, int, int], block: tuple[int, int, int], shared_mem: int,
                      stream_ptr: int, parameters: Any) -> None:
        """Launch with the parameters already packed (`impl.ParameterBlock`, its `address` the driver's
        array of pointers to each value) on the CUDA stream `stream_ptr`: cuLaunchKernel, nothing else."""
        self.launch_function(self._function.ptr, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                             shared_mem, stream_ptr, parameters.address, 0)

    def sibling(self, name: str) -> "Kernel":
        """The entry function `name` of the same compiled source, on the same device (a kernel's helpers,
        such as a wgmma LOADER=presplit kernel's split kernels). Raises CompileError where there is none."""
        with _lock:
            kernel = _kernels.get((self.result.key, self.device_id, name))
            module = _modules.get((self.result.key, self.device_id))
        if kernel is not None:
            return kernel
        if module is None or (self.result.usages and self.result.usage(name) is None):
            raise CompileError(f"no entry function {name!r} next to {self.name!r}", "", self.result.options,
                               self.result.log)
        with _use_device(self.device_id):
            return _entry(module, name, self.result, self.device_id)

    def __repr__(self) -> str:
        return f"Kernel({self.name!r}, {self.result.arch}, device {self.device_id})"


_modules: dict[tuple[str, int], Any] = {}  # (CompileResult.key, device id) -> cupy.cuda.function.Module
_kernels: dict[tuple[str, int, str], Kernel] = {}


def _current_device() -> tuple[int, str]:
    """(id, compute capability as "90") of CuPy's current device."""
    import cupy

    device = cupy.cuda.Device()
    return device.id, str(device.compute_capability)


def _use_device(device_id: int) -> Any:
    """A context manager that makes `device_id` CuPy's current device."""
    import cupy

    return cupy.cuda.Device(device_id)


def _load_module(binary: bytes) -> Any:
    """Load a cubin or PTX image on the current device."""
    from cupy.cuda import function

    module = function.Module()
    module.load(binary)
    return module


def compile_kernel(source: str, name: str, options: tuple[str, ...] = COMPILE_OPTIONS) -> Kernel:
    """The entry function `name` of `source`, compiled with `compile` for the current device and loaded there.

    Memoized per (source and options hash, device). Raises CompileError when NVRTC rejects the source or
    the source has no entry function `name`."""
    device_id, cc = _current_device()
    result = compile(source, target_arch(cc, needs_arch_specific(source)), options)
    with _lock:
        kernel = _kernels.get((result.key, device_id, name))
    if kernel is not None:
        return kernel
    if result.usages and result.usage(name) is None:
        found = ", ".join(u.function for u in result.usages)
        raise CompileError(f"no entry function {name!r} in the compiled source (it has {found})", source,
                           result.options, result.log)
    with _lock:
        module = _modules.get((result.key, device_id))
    if module is None:
        module = _load_module(result.binary)
        with _lock:  # two threads may have loaded it: keep the first, the other is unloaded when dropped
            module = _modules.setdefault((result.key, device_id), module)
    return _entry(module, name, result, device_id)


def _entry(module: Any, name: str, result: CompileResult, device_id: int) -> Kernel:
    """The entry function `name` of a loaded module, memoized (the first of two threads' wins)."""
    kernel = Kernel(module.get_function(name), name, result, device_id)
    with _lock:
        return _kernels.setdefault((result.key, device_id, name), kernel)


MAX_COMPILE_THREADS = 16  # NVRTC compiles at once; beyond this a tune has too few configs in flight to use more


def host_compile_threads() -> int:
    """Parallel compiles this process may run: one per CPU core it may use, at most MAX_COMPILE_THREADS (a
    tune's compiles are CPU-bound and otherwise leave the host's cores idle while the GPU waits)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(MAX_COMPILE_THREADS, cores))


def compile_many(jobs: Iterable[tuple[str, str]], workers: int = 4,
                 clock: dict[tuple[str, str], tuple[float, float | None]] | None = None
                 ) -> list[concurrent.futures.Future]:
    """Start compiling (source, name) pairs in parallel for the caller's current device; each future gives a
    `Kernel` or raises. NVRTC compiles independent programs in parallel and without the GIL, which hides
    compile time behind the timing of the candidate before. `clock`, if given, gets each job's
    (time.monotonic() when a thread took it up, and when it finished or None)."""
    device_id = _current_device()[0]  # the pool's threads have their own current device: pass the caller's

    def job(source: str, name: str) -> Kernel:
        started = time.monotonic()
        if clock is not None:
            clock[(source, name)] = (started, None)
        try:
            with _use_device(device_id):
                return compile_kernel(source, name)
        finally:
            if clock is not None:
                clock[(source, name)] = (started, time.monotonic())

    pool = _pool(workers)
    return [pool.submit(job, source, name) for source, name in jobs]


_pools: dict[int, concurrent.futures.ThreadPoolExecutor] = {}


def _pool(workers: int) -> concurrent.futures.ThreadPoolExecutor:
    with _lock:
        if workers not in _pools:
            _pools[workers] = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="autotile-nvrtc")
        return _pools[workers]


def allow_dynamic_smem(kernel: Any, nbytes: int) -> None:
    """Opt `kernel` in to `nbytes` of dynamic shared memory; above 48 KB a launch fails without it."""
    if isinstance(kernel, Kernel):
        kernel.allow_dynamic_smem(nbytes)
    elif nbytes > STATIC_SMEM_LIMIT and getattr(kernel, "max_dynamic_shared_size_bytes", 0) < nbytes:
        kernel.max_dynamic_shared_size_bytes = nbytes  # a cupy.RawKernel
