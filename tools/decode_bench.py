"""Decode-size matmul (M of 1 to 64 against large N and K) on a GPU: the skinny kernels against cuBLAS.

`python tools/decode_bench.py [--shapes N] [--seed S]`: random shapes drawn at run time (M log-uniform in
1-64, N and K log-uniform in 1024-16384, layouts nt (x @ W.T) and nn (x @ W) in turn), float32. For each:
cuBLAS SGEMM (CuPy's matmul, the tuner's baseline), what the library selects today, and every named
MATH=skinny config with K splits of 1, 2, 4 and 8 (each verified against cuBLAS's output first); CUDA
events, L2 flushed, median. Prints one row per shape and the distribution of best-skinny / cuBLAS.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--shapes", type=int, default=24)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    import cupy
    import numpy as np

    from autotile.codegen import kernels
    from autotile.codegen.problem import ProblemKey
    from autotile.library.calls import selection_for
    from autotile.runtime.impl import Generated
    from autotile.runtime.timing import L2Flusher, time_launch

    space = kernels.get("matmul").space
    bases = [n for n, c in space.named_configs.items() if c["MATH"] == "skinny" and c["SPLIT_K"] == 1]
    candidates = [(f"{n}/s{s}", space.with_overrides(space.named(n), {"SPLIT_K": s, "SPLIT_REDUCE": "last_block"})
                   if s > 1 else space.named(n)) for n in bases for s in (1, 2, 4, 8)]
    rng = np.random.default_rng(args.seed)
    flush = L2Flusher(cupy.cuda.Device().attributes["L2CacheSize"])
    rows = []
    for i in range(args.shapes):
        M = int(round(math.exp(rng.uniform(0, math.log(64)))))
        N, K = (int(round(math.exp(rng.uniform(math.log(1024), math.log(16384))))) for _ in range(2))
        layout = "nt" if i % 2 == 0 else "nn"
        a = cupy.asarray(rng.standard_normal((M, K), dtype=np.float32))
        w = cupy.asarray(rng.standard_normal((N, K) if layout == "nt" else (K, N), dtype=np.float32))
        b = w.T if layout == "nt" else w
        out = cupy.empty((M, N), dtype=cupy.float32)
        ref = cupy.matmul(a, b)
        cublas = time_launch(lambda a=a, b=b, out=out: cupy.matmul(a, b, out=out), flush).median_ms
        times = {}
        for name, config in candidates:
            runner = Generated(config).prepare(ProblemKey("matmul", "float32", layout, (M, N, K)))
            out.fill(cupy.nan)
            runner.run((a, w), out)
            err = float(cupy.linalg.norm(out - ref) / cupy.linalg.norm(ref))
            if not err < 1e-5:
                print(f"WRONG {name} {layout} {M}x{N}x{K}: error {err:.2e}", file=sys.stderr)
                return 1
            times[name] = time_launch(lambda r=runner, ops=(a, w), out=out: r.run(ops, out), flush).median_ms
        best = min(times, key=times.__getitem__)
        selection = selection_for("matmul", "float32", layout, (M, N, K))
        rows.append((layout, M, N, K, cublas, best, times[best], selection.explain()[:60]))
    print("| layout | M | N | K | cuBLAS us | best skinny | us | x cuBLAS | library today |")
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- |")
    ratios = []
    for layout, M, N, K, cublas, best, ms, today in rows:
        ratios.append(cublas / ms)
        print(f"| {layout} | {M} | {N} | {K} | {cublas * 1e3:.1f} | {best} | {ms * 1e3:.1f} | {cublas / ms:.2f} "
              f"| {today} |")
    ratios.sort()
    geomean = math.exp(statistics.fmean(map(math.log, ratios)))
    print(f"\nbest skinny / cuBLAS over {len(ratios)} shapes: min {ratios[0]:.2f}, "
          f"p10 {ratios[len(ratios) // 10]:.2f}, median {statistics.median(ratios):.2f}, geomean {geomean:.2f}, "
          f"at or above 1.0: {sum(r >= 1.0 for r in ratios)}/{len(ratios)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
