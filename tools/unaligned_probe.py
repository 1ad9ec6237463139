"""What rows that do not start 16-byte aligned cost the generated kernels on batched problems (needs a GPU).

`python tools/unaligned_probe.py`: for a few batched shapes, each aligned and then with N, K or all sizes
made odd, the speed of named tf32x3 configs over cuBLAS (strided batched SGEMM) in the same run, CUDA
events, L2 flushed, median. Where an operand's rows are not a multiple of 4 floats, the kernels copy one
element at a time instead of four (templates/mma_pipeline.j2).
"""

from __future__ import annotations

from typing import Any

NAMES = ("tf32x3-32", "tf32x3-64", "tf32x3-32x128")
SHAPES = ((64, 256, 256, 256), (16, 512, 512, 512), (128, 128, 128, 128), (8, 1024, 1024, 256))


def variants(b: int, m: int, n: int, k: int) -> list[tuple[str, tuple[int, int, int, int]]]:
    """The aligned shape and its unaligned neighbours (labelled)."""
    return [("aligned", (b, m, n, k)), ("N+1", (b, m, n + 1, k)), ("K+1", (b, m, n, k + 1)),
            ("N+2,K+2", (b, m, n + 2, k + 2)), ("all+1", (b, m + 1, n + 1, k + 1))]


def main() -> int:
    import cupy

    from autotile.codegen import kernels
    from autotile.codegen.problem import ProblemKey
    from autotile.runtime.device import live_device
    from autotile.runtime.impl import Cublas, Generated
    from autotile.runtime.timing import L2Flusher, time_launch

    flush = L2Flusher(live_device().l2_bytes)
    spec = kernels.get("bmm")
    rng = cupy.random.default_rng(1)

    def median_ms(runner: Any, inputs: Any, out: Any) -> float:
        return time_launch(lambda: runner.run(inputs, out), flush, warmup=3, min_reps=10, max_reps=30,
                           target_ms=30.0).median_ms

    print("shape".ljust(24), "cublas_ms", *[n.rjust(14) for n in NAMES])
    for base in SHAPES:
        for label, shape in variants(*base):
            key = ProblemKey("bmm", "float32", "nn", shape)
            inputs = spec.make_inputs(shape, "float32", "nn", rng, cupy)
            out = cupy.empty(spec.output_shape(shape), dtype="float32")
            cublas_ms = median_ms(Cublas().prepare(key), inputs, out)
            ratios = [cublas_ms / median_ms(Generated(spec.space.named(n)).prepare(key), inputs, out) for n in NAMES]
            print(f"{label:8s}{'x'.join(map(str, shape)):16s} {cublas_ms:8.4f}",
                  *[f"{r:6.2f}x".rjust(14) for r in ratios], flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
