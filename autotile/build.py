"""Rendered source -> loaded kernel, through CuPy's NVRTC, memoized by the hash of source and options.

CuPy is imported on first use, so importing this module needs no GPU. `compile_many` compiles several
sources on a thread pool: NVRTC compiles independent programs in parallel, which hides compile time
behind the timing of the candidate before.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import threading
from typing import Any, Iterable

from .errors import CompileError

COMPILE_OPTIONS: tuple[str, ...] = ("-std=c++17", "-ftz=true")
STATIC_SMEM_LIMIT = 48 * 1024

_lock = threading.Lock()
_kernels: dict[tuple[str, int], Any] = {}


def source_hash(source: str, options: tuple[str, ...] = COMPILE_OPTIONS) -> str:
    return hashlib.sha256((source + "\0" + "\0".join(options)).encode()).hexdigest()


def compile_kernel(source: str, name: str, options: tuple[str, ...] = COMPILE_OPTIONS) -> Any:
    """The `cupy.RawKernel` called `name` in `source`, compiled for the current device (memoized)."""
    import cupy

    key = (source_hash(source, options) + name, cupy.cuda.Device().id)
    with _lock:
        kernel = _kernels.get(key)
    if kernel is not None:
        return kernel
    module = cupy.RawModule(code=source, options=options, backend="nvrtc")
    try:
        module.compile()
    except cupy.cuda.compiler.CompileException as exc:
        log = exc.get_message() if hasattr(exc, "get_message") else str(exc)
        first = next((line for line in log.splitlines() if "error" in line), log.strip()[:200])
        raise CompileError(f"NVRTC failed for {name}: {first}", source, options, log) from None
    kernel = module.get_function(name)
    with _lock:
        _kernels[key] = kernel
    return kernel


def compile_many(jobs: Iterable[tuple[str, str]], workers: int = 4
                 ) -> list[concurrent.futures.Future]:
    """Start compiling (source, name) pairs in parallel; each future gives a kernel or raises."""
    pool = _pool(workers)
    return [pool.submit(compile_kernel, source, name) for source, name in jobs]


_pools: dict[int, concurrent.futures.ThreadPoolExecutor] = {}


def _pool(workers: int) -> concurrent.futures.ThreadPoolExecutor:
    with _lock:
        if workers not in _pools:
            _pools[workers] = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="autotile-nvrtc")
        return _pools[workers]


def allow_dynamic_smem(kernel: Any, nbytes: int) -> None:
    """Opt the kernel in to `nbytes` of dynamic shared memory; above 48 KB a launch fails without it."""
    if nbytes > STATIC_SMEM_LIMIT and getattr(kernel, "max_dynamic_shared_size_bytes", 0) < nbytes:
        kernel.max_dynamic_shared_size_bytes = nbytes


def compiler_version() -> str:
    """The NVRTC version, part of the cache key: a new compiler may change what is fastest."""
    try:
        from cupy.cuda import nvrtc

        major, minor = nvrtc.getVersion()
        return f"nvrtc-{major}.{minor}"
    except Exception:
        return "nvrtc-unknown"
