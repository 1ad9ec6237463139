"""The padded plan against cuBLAS and against the library without it (needs a GPU).

`python tools/pad_probe.py [--shapes N] [--seed S] [--all] [--bmm] [--json FILE]`: random float32 matmul
shapes whose N or K is not a multiple of 4 (sides 256-8192; every third shape a batch of 2-80 matrices of
sides 64-2048; with `--bmm`, issue 28's random batches instead), each timed in one run (CUDA events, L2
flushed, median): cuBLAS (`cupy.matmul`), `autotile.matmul` with the padded plan turned off
(`autotile.library.padding.enabled(False)`), and `autotile.matmul` as it is, which takes the padded plan
where `autotile.library.calls.padded_plan` says so ("padded" column). With `--all`, every shape is also
timed through the padded plan whatever `padding.pays` says, and the padded product alone on padded arrays:
what the rule's constants are measured from (the predicted times are recorded next to them in the JSON).
Prints each shape's ratios to cuBLAS and the result's error against float64, and the geometric means.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections.abc import Callable
from pathlib import Path
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
    """One shape: cuBLAS, the library without and with the padded plan; with `forced`, also the plan
    whatever the rule says and the padded product alone (on padded arrays), for the rule's calibration."""
    import cupy

    import autotile
    from autotile.codegen import kernels
    from autotile.codegen.problem import ProblemKey
    from autotile.dispatch.select import select
    from autotile.library import calls, padding
    from autotile.runtime.device import live_device
    from autotile.runtime.timing import relative_error

    *batch, M, N, K = shape
    kernel = "bmm" if batch else "matmul"
    A = gen.standard_normal((*batch, M, K), dtype=cupy.float32)
    B = gen.standard_normal((*batch, K, N), dtype=cupy.float32)
    C = cupy.full((*batch, M, N), cupy.nan, cupy.float32)
    reference = kernels.to_float64(A) @ kernels.to_float64(B)
    row: dict[str, Any] = {"cublas": median_ms(lambda: cupy.matmul(A, B, out=C))}
    padding.enabled(False)
    row["plain"] = median_ms(lambda: autotile.matmul(A, B, out=C))
    padding.enabled(True)
    row["takes"] = calls.padded_plan(kernel, "float32", "nn", tuple(shape), "high") is not None
    C.fill(cupy.nan)
    autotile.matmul(A, B, out=C)
    row["error"] = relative_error(C, reference)
    row["library"] = median_ms(lambda: autotile.matmul(A, B, out=C))
    padded_shape = padding.padded_shape("nn", tuple(shape), "float32")
    device = live_device()
    direct = select(ProblemKey(kernel, "float32", "nn", tuple(shape)), device, precision="high")
    padded = select(ProblemKey(kernel, "float32", "nn", padded_shape), device, precision="high")
    row["predicted"] = (direct.predicted_ms, padded.predicted_ms, padding.copy_ms("nn", tuple(shape), "float32"))
    if forced and padded.config is not None:
        saved = padding.pays
        padding.pays = lambda *args, **kwargs: True
        calls.forget()
        try:
            C.fill(cupy.nan)
            autotile.matmul(A, B, out=C)
            row["forced_error"] = relative_error(C, reference)
            row["forced"] = median_ms(lambda: autotile.matmul(A, B, out=C))
        finally:
            padding.pays = saved
            calls.forget()
        *_, mp, np_, kp = padded_shape
        Ap = cupy.zeros((*batch, mp, kp), cupy.float32)
        Bp = cupy.zeros((*batch, kp, np_), cupy.float32)
        Cp = cupy.empty((*batch, mp, np_), cupy.float32)
        row["product"] = median_ms(lambda: autotile.matmul(Ap, Bp, out=Cp))
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=int, default=24)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--all", action="store_true",
                        help="also time the padded plan on every shape, and the padded product alone")
    parser.add_argument("--bmm", action="store_true",
                        help="issue 28's random batched shapes (autotile.cli.bench_torch.random_bmm_shapes)")
    parser.add_argument("--json", metavar="FILE", help="also write every shape's measurements there")
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
    rows = []
    if args.bmm:
        from autotile.cli.bench_torch import random_bmm_shapes

        shapes: list[tuple[int, ...]] = list(random_bmm_shapes(args.shapes, args.seed))
    else:
        shapes = random_shapes(args.shapes, args.seed)
    for shape in shapes:
        row = measure(shape, gen, median_ms, args.all)
        rows.append({"shape": shape, **row})
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        ratios.append((row["cublas"] / row["plain"], row["cublas"] / row["library"]))
        print(f"{'x'.join(map(str, shape)):>22} {row['cublas']:9.4f} {row['plain']:9.4f} {row['library']:9.4f}  "
              f"{'yes' if row['takes'] else 'no':>6}  {ratios[-1][0]:13.2f}  {ratios[-1][1]:14.2f}  "
              f"{row['error']:.1e}" + (f"  forced {row['cublas'] / row['forced']:.2f}x" if "forced" in row else ""),
              flush=True)

    def geomean(values: list[float]) -> float:
        return math.exp(sum(map(math.log, values)) / len(values))

    print(f"geomean x cuBLAS: without the padded plan {geomean([r[0] for r in ratios]):.3f}, "
          f"with it {geomean([r[1] for r in ratios]):.3f}, better of the two {geomean([max(r) for r in ratios]):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
