"""The emulation against the native path on random shapes in a band of its size rule (needs a GPU).

`python tools/emulation_band.py [--dtype D] [--count N] [--seed S] [--min-k K] [--max-k K] [--volume LO HI]
[--json FILE]`: N random shapes, K log-uniform in [min-k, max-k], M and N log-uniform in [2048, 16384], kept
where 2^LO <= M N K < 2^HI (defaults: float64, 10 shapes, seed 44, K from 8192 to 16384, M N K from 2^37.5 to
2^39: the band under float64's old MIN_VOLUME), each timed by `autotile.cli.bench_emulation.bench_case` (the
emulation forced, the library's int8 products; cuBLAS in the same run; CUDA events, L2 flushed, median), with
the errors against exact products and whether `autotile.library.emulation.pays` takes the shape. The
measurement behind `MIN_K` and `MIN_VOLUME`."""

from __future__ import annotations

import argparse
import json
import math

import numpy as np


def band_shapes(count: int, seed: int, min_k: int, low: float, high: float,
                max_k: int = 16384) -> list[tuple[int, int, int]]:
    """`count` shapes drawn from `seed` as the module's docstring says (the same seed, the same shapes)."""
    rng = np.random.default_rng(seed)
    shapes: list[tuple[int, int, int]] = []
    while len(shapes) < count:
        m, n = (int(x) for x in np.exp(rng.uniform(math.log(2048), math.log(16384), 2)))
        k = int(np.exp(rng.uniform(math.log(min_k), math.log(max_k))))
        if 2**low <= m * n * k < 2**high:
            shapes.append((m, n, k))
    return shapes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--seed", type=int, default=44)
    parser.add_argument("--min-k", type=int, default=8192)
    parser.add_argument("--max-k", type=int, default=16384)
    parser.add_argument("--volume", type=float, nargs=2, default=[37.5, 39.0], metavar=("LO", "HI"),
                        help="log2 of the band's M N K")
    parser.add_argument("--json", default=None, help="write every row here")
    args = parser.parse_args()
    import cupy

    from autotile.cli.bench_emulation import bench_case
    from autotile.runtime.timing import L2Flusher

    flush = L2Flusher(int(cupy.cuda.Device().attributes["L2CacheSize"]))
    rows = []
    for shape in band_shapes(args.count, args.seed, args.min_k, *args.volume, max_k=args.max_k):
        row = bench_case(shape, args.dtype, "normal", flush, seed=1)
        rows.append(row)
        name = "x".join(map(str, shape))
        print(f"{name:>18} 2^{math.log2(math.prod(shape)):.2f}  emulated {row['emulated_ms']:8.3f} ms  "
              f"cuBLAS {row['cublas_ms']:8.3f} ms  {row['speedup']:.2f}x  taken: {row['picked']}  "
              f"errors {row['emulated_error']:.1e} ({row['cublas_error']:.1e})", flush=True)
        cupy.get_default_memory_pool().free_all_blocks()
    speedups = np.array([r["speedup"] for r in rows])
    print(f"geomean {np.exp(np.log(speedups).mean()):.3f}, min {speedups.min():.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
