"""What tuning at first call costs (needs a GPU): for a few untuned shapes, the wall time of the first
`autotile.matmul`/`matvec` call with tuning at first call on (compiles, timing of the short list, the
cache write), of the second call, and what was chosen.

    AUTOTILE_CACHE_DIR=$(mktemp -d) python tools/first_call_cost.py
"""

from __future__ import annotations

import time

import cupy

import autotile
from autotile.library import calls as ops

SHAPES = [("matmul", (777, 1333, 2111)), ("matmul", (96, 5000, 3000)), ("matmul", (3001, 2999, 37)),
          ("matvec", (3333, 777)), ("matvec", (50000, 300))]


def main() -> None:
    autotile.tune_at_first_call(True)
    rng = cupy.random.default_rng(1)
    print(f"{'kernel':<7} {'shape':<16} {'first call s':>12} {'second call ms':>15}  chosen")
    for kernel, shape in SHAPES:
        if kernel == "matmul":
            M, N, K = shape
            args = (rng.random((M, K), dtype=cupy.float32), rng.random((K, N), dtype=cupy.float32))
            call = autotile.matmul
        else:
            M, K = shape
            args = (rng.random((M, K), dtype=cupy.float32), rng.random(K, dtype=cupy.float32))
            call = autotile.matvec
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        call(*args)
        cupy.cuda.Device().synchronize()
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        call(*args)
        cupy.cuda.Device().synchronize()
        second = time.perf_counter() - t0
        layout = "row"
        sel = ops.selection_for(kernel, "float32", layout, shape)
        print(f"{kernel:<7} {'x'.join(map(str, shape)):<16} {first:12.2f} {second * 1e3:15.3f}  {sel.explain()}")


if __name__ == "__main__":
    main()
