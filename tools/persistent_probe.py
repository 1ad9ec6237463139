"""Persistent tf32x3 wgmma blocks on batches: each config with and without PERSISTENT (needs a GPU).

`python tools/persistent_probe.py [--names A,B,...] [--random N --seed S]`: for a few batched shapes (with
`--random`, issue 28's random batches instead, `autotile.cli.bench_torch.random_bmm_shapes`), the speed of
each named wgmma config that loads through registers or presplit tiles, as a block per tile and as a line
of about one block per SM going through tile after tile (PERSISTENT, templates/matmul_wgmma.cu.j2), over cuBLAS's
strided batched SGEMM in the same run: CUDA events, L2 flushed, median; each result checked against float64 (output
poisoned first). Prints the geometric mean of each column's ratios.
"""

from __future__ import annotations

import argparse
import math

NAMES = ("wgmma-128", "wgmma-128x64", "wgmma-128-presplit", "wgmma-128x64-presplit")
# batches of mid-sized matrices (16-64 K steps a tile), where a block per tile spends a large share of its
# time filling its stages and storing its tile; and one large batch for comparison
SHAPES = ((64, 512, 512, 512), (256, 512, 512, 512), (128, 256, 256, 256), (170, 323, 183, 537),
          (8, 2048, 2048, 2048))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", default=",".join(NAMES), help="named wgmma configs (LOADER=registers or presplit)")
    parser.add_argument("--random", type=int, default=0, metavar="N", help="N random batches instead")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--also", default="",
                        help="named configs timed as they are, for comparison (comma-separated; '' for none)")
    args = parser.parse_args()

    import cupy

    from autotile.cli.bench_torch import random_bmm_shapes
    from autotile.codegen import kernels
    from autotile.codegen.problem import ProblemKey
    from autotile.runtime.impl import Cublas, Generated
    from autotile.runtime.timing import L2Flusher, relative_error, time_launch

    spec = kernels.get("bmm")
    flush = L2Flusher(cupy.cuda.Device().attributes["L2CacheSize"])
    shapes = random_bmm_shapes(args.random, args.seed) if args.random else SHAPES
    columns: list[tuple[str, bool | None, int | None]] = [
        (name, persistent, producers) for name in args.names.split(",") for persistent in (False, True)
        for producers in ((1,) if spec.space.named(name)["LOADER"] == "presplit" else (1, 2))]
    columns += [(name, None, None) for name in args.also.split(",") if name]
    ratios: dict[str, list[float]] = {}
    rng = cupy.random.default_rng(args.seed)
    for shape in shapes:
        key = ProblemKey("bmm", "float32", "nn", tuple(shape))
        inputs = spec.make_inputs(key.shape, "float32", "nn", rng, cupy)
        ref = spec.reference(inputs)
        out = cupy.empty(spec.output_shape(key.shape), dtype=cupy.float32)
        cublas = Cublas().prepare(key)
        base = time_launch(lambda c=cublas, i=inputs, o=out: c.run(i, o), flush).median_ms
        line = f"{'x'.join(map(str, shape))}: cuBLAS {base * 1e3:.1f} us"
        for name, persistent, producers in columns:
            label = f"{name}{'-persistent' if persistent else ''}{'-p2' if producers == 2 else ''}"
            config = spec.space.named(name)
            if persistent is not None:
                config = spec.space.with_overrides(config, {"PERSISTENT": persistent, "PRODUCERS": producers})
            runner = Generated(config).prepare(key)
            kernels.poison(out)
            runner.run(inputs, out)
            error = relative_error(out, ref)
            if not error <= kernels.tolerance("float32", shape[-1]):
                line += f"  {label} WRONG ({error:.1e})"
                continue
            ms = time_launch(lambda r=runner, i=inputs, o=out: r.run(i, o), flush).median_ms
            ratios.setdefault(label, []).append(base / ms)
            line += f"  {label} {base / ms:.2f}x"
        print(line, flush=True)
    for label, values in ratios.items():
        print(f"{label}: geomean {math.exp(sum(map(math.log, values)) / len(values)):.3f}x cuBLAS over {len(values)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
