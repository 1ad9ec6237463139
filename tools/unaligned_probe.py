"""What rows that do not start 16-byte aligned cost the generated kernels on batched problems (needs a GPU).

`python tools/unaligned_probe.py [--names A,B,...] [--random N --seed S] [--twins]`: for a few batched shapes,
each aligned and then with N, K or all sizes made odd (with `--random`, issue 28's random batches instead,
`autotile.cli.bench_torch.random_bmm_shapes`; with `--twins` as well, each followed by its aligned twin, N and K
rounded up to multiples of 4), the speed of configs over cuBLAS (strided batched SGEMM) in the same run, CUDA
events, L2 flushed, median, and each result's error against float64 (output poisoned with NaN first). A config
is a named config of the bmm space, with parameters changed after `+` (`wgmma-128x64-persistent-p4+STORE=staged`,
`wgmma-128x64+PRODUCERS=4+PERSISTENT=true`). Where an operand's rows are not a multiple of 4 floats, the tf32x3
kernels copy one element at a time instead of four (templates/mma_pipeline.j2); the wgmma kernels' producers load
four elements apart (templates/matmul_wgmma.cu.j2). Prints the geometric mean of each config's ratios, and of the
best of them per shape.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from autotile.errors import ArgumentError

NAMES = ("tf32x3-32", "tf32x3-64", "tf32x3-32x128")
SHAPES = ((64, 256, 256, 256), (16, 512, 512, 512), (128, 128, 128, 128), (8, 1024, 1024, 256))


def variants(b: int, m: int, n: int, k: int) -> list[tuple[str, tuple[int, int, int, int]]]:
    """The aligned shape and its unaligned neighbours (labelled)."""
    return [("aligned", (b, m, n, k)), ("N+1", (b, m, n + 1, k)), ("K+1", (b, m, n, k + 1)),
            ("N+2,K+2", (b, m, n + 2, k + 2)), ("all+1", (b, m + 1, n + 1, k + 1))]


def aligned_twin(shape: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """A batch (batch, M, N, K) with N and K rounded up to multiples of 4: every operand's and C's rows start
    16-byte aligned (float32) where the matrices do."""
    b, m, n, k = shape
    return (b, m, -(-n // 4) * 4, -(-k // 4) * 4)


def with_twins(cases: list[tuple[str, tuple[int, int, int, int]]]) -> list[tuple[str, tuple[int, int, int, int]]]:
    """The (label, shape) cases, each unaligned one followed by its aligned twin (labelled "twin")."""
    out = []
    for label, shape in cases:
        out.append((label, shape))
        twin = aligned_twin(shape)
        if twin != shape:
            out.append(("twin", twin))
    return out


def config_of(space: Any, entry: str) -> Any:
    """The config an entry of --names names: a named config, then `+PARAM=VALUE` changes (values as typed)."""
    name, *changes = entry.split("+")
    overrides = {}
    for change in changes:
        param, sep, value = change.partition("=")
        if not sep or not param or not value:
            raise ArgumentError(f"--names: {change!r} in {entry!r} is not PARAM=VALUE")
        overrides[param] = value
    config = space.named(name)
    return space.with_overrides(config, overrides) if overrides else config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", default=",".join(NAMES),
                        help="named configs of the bmm space, each with +PARAM=VALUE changes if any")
    parser.add_argument("--random", type=int, default=0, metavar="N", help="N of issue 28's random batches")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--twins", action="store_true", help="each shape followed by its aligned twin")
    args = parser.parse_args(argv)
    names = args.names.split(",")

    from autotile.codegen import kernels

    spec = kernels.get("bmm")
    configs = {n: config_of(spec.space, n) for n in names}  # a bad entry fails before the GPU is touched

    import cupy

    from autotile.codegen.problem import ProblemKey
    from autotile.runtime.device import live_device
    from autotile.runtime.impl import Cublas, Generated
    from autotile.runtime.timing import L2Flusher, relative_error, time_launch

    flush = L2Flusher(live_device().l2_bytes)
    rng = cupy.random.default_rng(1)

    def median_ms(runner: Any, inputs: Any, out: Any) -> float:
        return time_launch(lambda: runner.run(inputs, out), flush, warmup=3, min_reps=10, max_reps=30,
                           target_ms=30.0).median_ms

    if args.random:
        from autotile.cli.bench_torch import random_bmm_shapes

        cases = [("random", s) for s in random_bmm_shapes(args.random, args.seed)]
    else:
        cases = [case for base in SHAPES for case in variants(*base)]
    if args.twins:
        cases = with_twins(cases)
    print("shape".ljust(26), "cublas_ms", *[n.rjust(max(14, len(n) + 1)) for n in names], " worst error")
    logs: list[list[float]] = [[] for _ in names]
    best: list[float] = []
    for label, shape in cases:
        key = ProblemKey("bmm", "float32", "nn", shape)
        inputs = spec.make_inputs(shape, "float32", "nn", rng, cupy)
        reference = kernels.to_float64(inputs[0]) @ kernels.to_float64(inputs[1])
        out = cupy.empty(spec.output_shape(shape), dtype="float32")
        cublas_ms = median_ms(Cublas().prepare(key), inputs, out)
        ratios, worst = [], 0.0
        for n in names:
            runner = Generated(configs[n]).prepare(key)
            out.fill(cupy.nan)
            runner.run(inputs, out)
            worst = max(worst, relative_error(out, reference))
            ratios.append(cublas_ms / median_ms(runner, inputs, out))
        for log, r in zip(logs, ratios, strict=True):
            log.append(math.log(r))
        best.append(math.log(max(ratios)))
        print(f"{label:8s}{'x'.join(map(str, shape)):18s} {cublas_ms:8.4f}",
              *[f"{r:6.2f}x".rjust(max(14, len(n) + 1)) for r, n in zip(ratios, names, strict=True)],
              f" {worst:.1e}", flush=True)
    print("geomean".ljust(35), *[f"{math.exp(sum(v) / len(v)):6.3f}".rjust(max(14, len(n) + 1))
                                 for v, n in zip(logs, names, strict=True)],
          f" best of them {math.exp(sum(best) / len(best)):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
