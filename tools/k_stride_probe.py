"""How the byte offset of an operand's rows against 128-byte lines moves a kernel's speed (needs a GPU).

`python tools/k_stride_probe.py [--dtype D] [--layout L] [--names A,B] [--shape MxNxK ...] [--offsets B ...]`:
for each shape, K is raised by each offset (in bytes, rounded to whole elements) so that the rows of the
K-major operands start that many bytes past a 128-byte line, and each named config of the matmul space (and
cuBLAS, always) is timed on it: CUDA events, L2 flushed, median; TFLOP/s (TOP/s for int8). A result is
checked against float64 first (output poisoned); a wrong one is flagged, not timed.

Two such effects were found this way (H200, 2026-11-28): the presplit tf32x3 workspace with rows 16 or 32 bytes
off a line (`kernels.PRESPLIT_K_ALIGN`, 1.5-1.8x SGEMM against 2.4-2.7x), and int8 K of an odd multiple of 16
bytes (`emulation.K_ALIGN`, 5-15% slower, in cuBLAS's int8 GEMM too). Next to look at with it: the padded plan's
rows (rounded up to 16 bytes) and the tensor-map loaders at K of an odd multiple of 16 bytes.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

DEFAULT_SHAPES = ("8192x8192x8192", "6144x6144x4096")
DEFAULT_OFFSETS = (0, 16, 32, 48, 64, 80, 96, 112, 128)


def shape_of(text: str) -> tuple[int, int, int]:
    """'MxNxK' as three ints."""
    m, n, k = (int(v) for v in text.lower().split("x"))
    return m, n, k


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16", "int8"])
    parser.add_argument("--layout", default="nn", choices=["nn", "nt", "tn", "tt"])
    parser.add_argument("--names", default="", help="named configs of the matmul space (comma-separated)")
    parser.add_argument("--shape", nargs="+", default=list(DEFAULT_SHAPES), help="MxNxK, K a multiple of 128 bytes")
    parser.add_argument("--offsets", nargs="+", type=int, default=list(DEFAULT_OFFSETS), help="bytes added to K")
    args = parser.parse_args()

    import cupy

    from autotile.codegen import dtypes, kernels
    from autotile.codegen.problem import ProblemKey
    from autotile.runtime.impl import Cublas, Generated
    from autotile.runtime.timing import L2Flusher, relative_error, time_launch

    spec = kernels.get("matmul")
    size = dtypes.DTYPE_SIZES[args.dtype]
    names = [n for n in args.names.split(",") if n]
    flush = L2Flusher(cupy.cuda.Device().attributes["L2CacheSize"])
    rng = cupy.random.default_rng(1)
    unit = "TOP/s" if args.dtype == "int8" else "TFLOP/s"
    print(f"{args.dtype} {args.layout}, {unit}; K's rows start that many bytes past a 128-byte line")
    for text in args.shape:
        m, n, k0 = shape_of(text)
        for offset in args.offsets:
            k = k0 + math.ceil(offset / size)
            key = ProblemKey("matmul", args.dtype, args.layout, (m, n, k))
            inputs = spec.make_inputs(key.shape, args.dtype, args.layout, rng, cupy)
            ref = spec.reference(inputs, args.dtype)
            out = cupy.empty(spec.output_shape(key.shape), dtype=dtypes.output_storage(args.dtype))
            tol = kernels.tolerance(args.dtype, k)
            line = f"{m}x{n}x{k} (+{k * size % 128:3d} B)"
            for name in ["cublas", *names]:
                try:
                    runner = (Cublas() if name == "cublas" else Generated(spec.space.named(name))).prepare(key)
                    kernels.poison(out)
                    runner.run(inputs, out)
                    err = relative_error(out, ref)
                    if not err <= tol:
                        line += f"  {name} WRONG ({err:.1e})"
                        continue
                    def launch(r: Any = runner, i: Any = inputs, o: Any = out) -> None:
                        r.run(i, o)

                    ms = time_launch(launch, flush).median_ms
                    line += f"  {name} {2 * m * n * k / ms / 1e9:6.0f}"
                except Exception as exc:  # a config that cannot run this shape: say so and go on
                    line += f"  {name} {type(exc).__name__}"
            print(line, flush=True)
            del inputs, ref, out
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
