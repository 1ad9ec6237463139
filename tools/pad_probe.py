"""The padded plan against cuBLAS and against the library without it (needs a GPU).

`python tools/pad_probe.py [--shapes N] [--seed S] [--all]`: random float32 matmul shapes whose N or K is
not a multiple of 4 (sides 256-8192; every third shape a batch of 2-80 matrices of sides 64-2048), each
timed in one run (CUDA events, L2 flushed, median): cuBLAS (`cupy.matmul`), `autotile.matmul` with the
padded plan turned off (`autotile.library.padding.enabled(False)`), and `autotile.matmul` as it is, which
takes the padded plan where `padding.pays` and `padding.worth` say so ("padded" column). With `--all`,
every shape is also timed through the padded plan whatever the rule says (`padding.MIN_*` set to 1), to
see what the rule leaves out. Prints each shape's ratios to cuBLAS and the result's error against float64,
and the geometric means.
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


def measure(shape: tuple[int, ...], gen: Any, median_ms: Callable[[Callable[[], object]], float],
            forced: bool) -> dict[str, Any]:
    """One shape: cuBLAS, the library without and with the padded plan (forced: whatever the rule says)."""
    import cupy

    import autotile
    from autotile.codegen import kernels
    from autotile.library import calls, padding
    from autotile.runtime.timing import relative_error

    *batch, M, N, K = shape
    kernel = "bmm" if batch else "matmul"
    A = gen.standard_normal((*batch, M, K), dtype=cupy.float32)
    B = gen.standard_normal((*batch, K, N), dtype=cupy.float32)
    C = cupy.full((*batch, M, N), cupy.nan, cupy.float32)
    row: dict[str, Any] = {"cublas": median_ms(lambda: cupy.matmul(A, B, out=C))}
    padding.enabled(False)
    row["plain"] = median_ms(lambda: autotile.matmul(A, B, out=C))
    padding.enabled(True)
    saved = padding.MIN_SIDE, padding.MIN_K, padding.MIN_VOLUME
    if forced:
        padding.MIN_SIDE = padding.MIN_K = padding.MIN_VOLUME = 1
        calls.forget()  # the signature's memoized call, made without the plan
    try:
        row["takes"] = padding.pays("float32", "high", kernel, "nn", tuple(shape)) and padding.worth(
            calls.selection_for(kernel, "float32", "nn", padding.padded_shape("nn", tuple(shape), "float32")))
        C.fill(cupy.nan)
        autotile.matmul(A, B, out=C)
        row["error"] = relative_error(C, kernels.to_float64(A) @ kernels.to_float64(B))
        row["library"] = median_ms(lambda: autotile.matmul(A, B, out=C))
    finally:
        padding.MIN_SIDE, padding.MIN_K, padding.MIN_VOLUME = saved
        calls.forget()
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=int, default=24)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--all", action="store_true", help="time the padded plan on every shape")
    args = parser.parse_args()

    import cupy

    from autotile.runtime.device import live_device
    from autotile.runtime.timing import L2Flusher, time_launch

    flush = L2Flusher(live_device().l2_bytes)

    def median_ms(launch: Callable[[], object]) -> float:
        return time_launch(launch, flush, warmup=3, min_reps=10, max_reps=40, target_ms=40.0).median_ms

    gen = cupy.random.default_rng(0)
    print(f"{'shape':>22} {'cublas ms':>9} {'no pad':>9} {'library':>9}  padded  no pad/cuBLAS  library/cuBLAS  "
          "error")
    ratios: list[tuple[float, float]] = []
    for shape in random_shapes(args.shapes, args.seed):
        row = measure(shape, gen, median_ms, args.all)
        ratios.append((row["cublas"] / row["plain"], row["cublas"] / row["library"]))
        print(f"{'x'.join(map(str, shape)):>22} {row['cublas']:9.4f} {row['plain']:9.4f} {row['library']:9.4f}  "
              f"{'yes' if row['takes'] else 'no':>6}  {ratios[-1][0]:13.2f}  {ratios[-1][1]:14.2f}  "
              f"{row['error']:.1e}", flush=True)

    def geomean(values: list[float]) -> float:
        return math.exp(sum(map(math.log, values)) / len(values))

    print(f"geomean x cuBLAS: without the padded plan {geomean([r[0] for r in ratios]):.3f}, "
          f"with it {geomean([r[1] for r in ratios]):.3f}, better of the two {geomean([max(r) for r in ratios]):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
