"""What rows that do not start 16-byte aligned cost the generated kernels (needs a GPU).

`python tools/unaligned_probe.py [--kernel bmm|matmul] [--dtype D] [--layout L] [--names A,B,...]
[--random N | --decode N] [--seed S] [--twins]`: for a few shapes, each aligned and then with N, K or all sizes
made odd (with `--random`, issue 28's random batches instead, `autotile.cli.bench_torch.random_bmm_shapes`; with
`--decode`, matmul's random decode-size shapes, `random_decode_shapes`; with `--twins` as well, each followed by
its aligned twin, N and K rounded up to 16 bytes of elements), the speed of configs over cuBLAS in the same run,
CUDA events, L2 flushed, median, and each result's error against float64 (output poisoned with NaN first). A
config is a named config of the kernel's space, with parameters changed after `+`
(`wgmma-128x64-persistent-p4+STORE=staged`, `mma-32+REALIGN=true`). Where an operand's rows are not a multiple
of 16 bytes, the tf32x3 and mma kernels copy one element at a time instead of a vector (templates/mma_pipeline.j2;
mma with REALIGN: aligned pieces shifted into place); the wgmma kernels' producers load four elements apart
(templates/matmul_wgmma.cu.j2). Prints the geometric mean of each config's ratios, and of the best of them per
shape.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from autotile.errors import ArgumentError

NAMES = ("tf32x3-32", "tf32x3-64", "tf32x3-32x128")
SHAPES = ((64, 256, 256, 256), (16, 512, 512, 512), (128, 128, 128, 128), (8, 1024, 1024, 256))


MATMUL_SHAPES = ((2048, 2048, 2048), (512, 1024, 4096), (16, 8192, 8192), (64, 4096, 4096))


def variants(*shape: int) -> list[tuple[str, tuple[int, ...]]]:
    """The aligned shape (batch, M, N, K or M, N, K) and its unaligned neighbours (labelled)."""
    *lead, m, n, k = shape
    return [("aligned", (*lead, m, n, k)), ("N+1", (*lead, m, n + 1, k)), ("K+1", (*lead, m, n, k + 1)),
            ("N+2,K+2", (*lead, m, n + 2, k + 2)), ("all+1", (*lead, m + 1, n + 1, k + 1))]


def aligned_twin(shape: tuple[int, ...], elements: int = 4) -> tuple[int, ...]:
    """A shape (batch, M, N, K or M, N, K) with N and K rounded up to multiples of `elements` (16 bytes of
    them: 4 float32, 8 bfloat16): every operand's and C's rows start 16-byte aligned where the matrices do."""
    *lead, m, n, k = shape
    return (*lead, m, -(-n // elements) * elements, -(-k // elements) * elements)


def with_twins(cases: list[tuple[str, tuple[int, ...]]], elements: int = 4) -> list[tuple[str, tuple[int, ...]]]:
    """The (label, shape) cases, each unaligned one followed by its aligned twin (labelled "twin")."""
    out = []
    for label, shape in cases:
        out.append((label, shape))
        twin = aligned_twin(shape, elements)
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
    parser.add_argument("--kernel", choices=("bmm", "matmul"), default="bmm")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--layout", default="nn")
    parser.add_argument("--names", default=",".join(NAMES),
                        help="named configs of the kernel's space, each with +PARAM=VALUE changes if any")
    parser.add_argument("--random", type=int, default=0, metavar="N", help="N of issue 28's random batches (bmm)")
    parser.add_argument("--decode", type=int, default=0, metavar="N", help="N random decode-size shapes (matmul)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--twins", action="store_true", help="each shape followed by its aligned twin")
    args = parser.parse_args(argv)
    names = args.names.split(",")
    if (args.random and args.kernel != "bmm") or (args.decode and args.kernel != "matmul"):
        raise ArgumentError("--random draws batches (--kernel bmm), --decode matmul's shapes (--kernel matmul)")

    from autotile.codegen import dtypes, kernels

    spec = kernels.get(args.kernel)
    configs = {n: config_of(spec.space, n) for n in names}  # a bad entry fails before the GPU is touched
    elements = 16 // dtypes.DTYPE_SIZES[args.dtype]

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

    cases: list[tuple[str, tuple[int, ...]]]
    if args.random:
        from autotile.cli.bench_torch import random_bmm_shapes

        cases = [("random", s) for s in random_bmm_shapes(args.random, args.seed)]
    elif args.decode:
        from autotile.cli.bench_torch import random_decode_shapes

        cases = [("decode", s) for s in random_decode_shapes(args.decode, args.seed)]
    else:
        cases = [case for base in (SHAPES if args.kernel == "bmm" else MATMUL_SHAPES) for case in variants(*base)]
    if args.twins:
        cases = with_twins(cases, elements)
    print("shape".ljust(26), "cublas_ms", *[n.rjust(max(14, len(n) + 1)) for n in names], " worst error")
    logs: list[list[float]] = [[] for _ in names]
    best: list[float] = []
    for label, shape in cases:
        key = ProblemKey(args.kernel, args.dtype, args.layout, shape)
        inputs = spec.make_inputs(shape, args.dtype, args.layout, rng, cupy)
        reference = spec.reference(inputs, args.dtype)
        out = cupy.empty(spec.output_shape(shape), dtype=dtypes.output_storage(args.dtype))
        cublas_ms = median_ms(Cublas().prepare(key), inputs, out)
        ratios, worst = [], 0.0
        for n in names:
            runner = Generated(configs[n]).prepare(key)
            kernels.poison(out)
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
