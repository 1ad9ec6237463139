"""Where a repeated library call spends its host time (needs a GPU and torch): `python tools/profile_call.py`.

Times the pieces of the per-call path in isolation (microseconds per call, the best of 5 rounds of N calls),
then profiles N repeated calls with cProfile and prints the functions that take the most time of their own.
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time
from typing import Any, Callable


def per_call(fn: Callable[[], Any], n: int = 20000) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n * 1e6)
    return best


def main() -> int:
    import cupy
    import numpy as np
    import torch

    import autotile
    from autotile.library import calls
    from autotile.runtime.operands import framework_of

    torch.backends.cuda.matmul.allow_tf32 = False
    a, b = torch.rand(64, 64, device="cuda"), torch.rand(64, 64, device="cuda")
    out = torch.empty(64, 64, device="cuda")
    x = torch.rand(64, device="cuda")
    for _ in range(100):
        autotile.matmul(a, b)
        autotile.matmul(a, b, out=out)
        autotile.matvec(a, x)
    torch.cuda.synchronize()
    framework = framework_of(a, b)
    signature = (framework.signature(a), framework.signature(b), None, "high")
    prepared = calls._prepare("matmul", "float32", "nn", (64, 64, 64))
    runner = prepared.runner
    stream = framework.current_stream(0)
    pointers = (a.data_ptr(), b.data_ptr())
    from autotile.codegen.problem import ProblemKey
    from autotile.runtime.cublas import CublasCall

    gemv_a, gemv_x = torch.rand(3000, 3000, device="cuda").T, torch.rand(3000, device="cuda")
    gemv_y = torch.empty(3000, device="cuda")
    for _ in range(20):
        autotile.matvec(gemv_a, gemv_x)
    gemv = CublasCall(ProblemKey("matvec", "float32", "col", (3000, 3000)), 0)
    gemv_ptrs = (gemv_a.data_ptr(), gemv_x.data_ptr())
    for sig, fn in calls._calls.items():  # which repeated calls take the shortest launch
        print(getattr(fn, "__name__", fn), str(sig)[:150])
    mv = calls._prepare("matvec", "float32", "row", (64, 64))
    print("matvec runner plain:", getattr(mv.runner, "plain", None), mv.runner.geometry)
    print("matvec 64x64 runs", calls.selection_for("matvec", "float32", "row", (64, 64)).explain())
    print("matmul 64x64x64 runs", calls.selection_for("matmul", "float32", "nn", (64, 64, 64)).explain())
    empty = cupy.RawKernel('extern "C" __global__ void empty() {}', "empty")
    pieces = {
        "cupy RawKernel empty launch": lambda: empty((1,), (32,), ()),
        "runner.launch (packed cuLaunchKernel)": lambda: runner.launch(pointers, out.data_ptr(), 16384, "float32",
                                                                        stream),
        "kernel.launch_packed alone": lambda: runner.kernel.launch_packed(
            runner.geometry.grid, runner.geometry.block, runner.geometry.dynamic_smem_bytes, stream, runner.parameters),
        "torch.empty 64x64": lambda: torch.empty(64, 64, device="cuda"),
        "streamIsCapturing": lambda: cupy.cuda.runtime.streamIsCapturing(stream),
        "CublasCall gemv col 3000 (direct)": lambda: gemv(gemv_ptrs, gemv_y.data_ptr(), stream),
        "autotile.matvec gemv col 3000": lambda: autotile.matvec(gemv_a, gemv_x),
        "autotile.matvec gemv col 3000, out=": lambda: autotile.matvec(gemv_a, gemv_x, out=gemv_y),
        "torch.mv gemv col 3000": lambda: torch.mv(gemv_a, gemv_x),
        "framework.signature x2": lambda: (framework.signature(a), framework.signature(b)),
        "framework_of": lambda: framework_of(a, b),
        "current_stream": lambda: framework.current_stream(0),
        "cupy getDevice": lambda: cupy.cuda.runtime.getDevice(),
        "dict lookup by signature": lambda: calls._calls.get(signature),
        "autotile.matmul(a, b, out=)": lambda: autotile.matmul(a, b, out=out),
        "autotile.matmul(a, b)": lambda: autotile.matmul(a, b),
        "autotile.matvec(a, x)": lambda: autotile.matvec(a, x),
        "torch.mv(a, x)": lambda: torch.mv(a, x),
        "library.calls.matmul_no_autograd(a, b)": lambda: calls.matmul_no_autograd(a, b),
        "torch.matmul(a, b, out=)": lambda: torch.matmul(a, b, out=out),
        "torch.matmul(a, b)": lambda: torch.matmul(a, b),
    }
    # cuBLAS's pieces on a small problem (the GPU keeps up, so the host's cost is what is measured)
    from autotile.runtime import cublas as cublas_mod

    xs, ws = torch.rand(16, 256, device="cuda"), torch.rand(256, 256, device="cuda")
    ys = torch.empty(16, 256, device="cuda")
    small = CublasCall(ProblemKey("matmul", "float32", "nt", (16, 256, 256)), 0)
    small_ptrs = (xs.data_ptr(), ws.data_ptr())
    own = cublas_mod.handle(0)
    get_stream = cublas_mod._library().routines["cublasGetStream_v2"]
    import ctypes

    slot = ctypes.c_void_p()
    from cupy_backends.cuda.libs import cublas as cupy_cublas

    cupy_handle = cupy.cuda.device.get_cublas_handle()
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
    pieces.update({
        "ctypes cublasGetStream (a 2-argument call)": lambda: get_stream(own.handle, ctypes.byref(slot)),
        "CublasCall sgemm nt 16x256x256 (direct, ctypes)": lambda: small(small_ptrs, ys.data_ptr(), stream),
        "CuPy binding sgemm nt 16x256x256": lambda: cupy_cublas.sgemm(
            cupy_handle, 1, 0, 256, 16, 256, one.ctypes.data, ws.data_ptr(), 256, xs.data_ptr(), 256,
            zero.ctypes.data, ys.data_ptr(), 256),
        "torch.matmul(x16, W.T) 16x256x256": lambda: torch.matmul(xs, ws.T),
        "torch.matmul(x16, W.T, out=) 16x256x256": lambda: torch.matmul(xs, ws.T, out=ys),
        "torch.empty(16, 256)": lambda: torch.empty(16, 256, device="cuda"),
    })
    for name, fn in pieces.items():
        us = per_call(fn, 5000)
        torch.cuda.synchronize()
        print(f"{us:8.2f} us  {name}")
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(20000):
        autotile.matmul(a, b, out=out)
    profiler.disable()
    torch.cuda.synchronize()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(16)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(20000):
        autotile.matvec(a, x)
    profiler.disable()
    torch.cuda.synchronize()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
