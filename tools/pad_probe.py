"""What zero-padding operands whose rows are not 16-byte multiples could give (needs a GPU).

`python tools/pad_probe.py [--shapes N] [--seed S]`: random float32 shapes whose N or K is not a multiple of
4 (sides 256-8192; every third shape a batch of 2-80 matrices of sides 64-2048), each timed in one run
(CUDA events, L2 flushed, median): cuBLAS (`cupy.matmul`), `autotile.matmul` on the operands as they are,
and the padded plan: A and B copied into zeroed buffers with K and N rounded up to 4, `autotile.matmul` on
those, C's first N columns copied back (CuPy slicing for the copies; all inside the timed interval), and
the copies alone. Prints each shape's ratios to cuBLAS, the padded result's error against float64, and
the geometric means of the library, the padded plan and the better of the two per shape.
"""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Callable
from typing import Any


def random_shapes(count: int, seed: int) -> list[tuple[int, ...]]:
    """`count` shapes with N or K not a multiple of 4, at most 2^36 multiply-adds each."""
    rng = random.Random(seed)
    shapes: list[tuple[int, ...]] = []
    while len(shapes) < count:
        if len(shapes) % 3 == 2:
            shape: tuple[int, ...] = (rng.choice([2, 7, 24, 80]),
                                      *(int(math.exp(rng.uniform(math.log(64), math.log(2048)))) for _ in range(3)))
        else:
            shape = tuple(int(math.exp(rng.uniform(math.log(256), math.log(8192)))) for _ in range(3))
        if (shape[-1] % 4 or shape[-2] % 4) and math.prod(shape) <= 2 ** 36:
            shapes.append(shape)
    return shapes


def measure(shape: tuple[int, ...], gen: Any, median_ms: Callable[[Callable[[], object]], float]) -> tuple[float, ...]:
    """(cuBLAS ms, autotile ms, padded ms, copies ms, padded error) for one shape."""
    import cupy

    import autotile
    from autotile.codegen import kernels
    from autotile.runtime.timing import relative_error

    *batch, M, N, K = shape
    A = gen.standard_normal((*batch, M, K), dtype=cupy.float32)
    B = gen.standard_normal((*batch, K, N), dtype=cupy.float32)
    A_pad = cupy.zeros((*batch, M, up(K)), cupy.float32)
    B_pad = cupy.zeros((*batch, up(K), up(N)), cupy.float32)
    C = cupy.empty((*batch, M, N), cupy.float32)
    C_pad = cupy.empty((*batch, M, up(N)), cupy.float32)

    def copies() -> None:
        A_pad[..., :K] = A
        B_pad[..., :K, :N] = B
        C[...] = C_pad[..., :N]

    def padded() -> None:
        A_pad[..., :K] = A
        B_pad[..., :K, :N] = B
        autotile.matmul(A_pad, B_pad, out=C_pad)
        C[...] = C_pad[..., :N]

    padded()
    error = relative_error(C, kernels.to_float64(A) @ kernels.to_float64(B))
    return (median_ms(lambda: cupy.matmul(A, B, out=C)), median_ms(lambda: autotile.matmul(A, B, out=C)),
            median_ms(padded), median_ms(copies), error)


def up(size: int) -> int:
    """`size` rounded up to a multiple of 4 (16 bytes of float32)."""
    return (size + 3) // 4 * 4


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=int, default=24)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    import cupy

    from autotile.runtime.device import live_device
    from autotile.runtime.timing import L2Flusher, time_launch

    flush = L2Flusher(live_device().l2_bytes)

    def median_ms(launch: Callable[[], object]) -> float:
        return time_launch(launch, flush, warmup=3, min_reps=10, max_reps=40, target_ms=40.0).median_ms

    gen = cupy.random.default_rng(0)
    print(f"{'shape':>22} {'cublas ms':>9} {'autotile':>9} {'padded':>9} {'copies':>9}  "
          "autotile/cuBLAS  padded/cuBLAS  padded error")
    ratios: list[tuple[float, float]] = []
    for shape in random_shapes(args.shapes, args.seed):
        cublas, library, pad, copy, error = measure(shape, gen, median_ms)
        ratios.append((cublas / library, cublas / pad))
        print(f"{'x'.join(map(str, shape)):>22} {cublas:9.4f} {library:9.4f} {pad:9.4f} {copy:9.4f}  "
              f"{cublas / library:15.2f}  {cublas / pad:13.2f}  {error:12.1e}", flush=True)

    def geomean(values: list[float]) -> float:
        return math.exp(sum(map(math.log, values)) / len(values))

    print(f"geomean: autotile {geomean([r[0] for r in ratios]):.3f}, padded {geomean([r[1] for r in ratios]):.3f}, "
          f"better of the two {geomean([max(r) for r in ratios]):.3f} (x cuBLAS)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
