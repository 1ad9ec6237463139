"""The padded plan against cuBLAS and against the library without it (needs a GPU).

`python tools/pad_probe.py [--shapes N] [--seed S] [--all] [--bmm] [--dtype D] [--layout L] [--json FILE]`:
random matmul shapes whose rows do not start 16-byte aligned (`autotile.library.padding.misaligned`; sides
256-8192; every third shape a batch of 2-80 matrices of sides 64-2048; with `--bmm`, issue 28's random batches
instead), in float32 through CuPy or a 16-bit type through torch, layout nn or nt (B = W.T), each timed in one
run (CUDA events, L2 flushed, median): cuBLAS (`cupy.matmul` or `torch.matmul`), `autotile.matmul` with the
padded plan turned off (`autotile.library.padding.enabled(False)`), and `autotile.matmul` as it is, which
takes the padded plan where `autotile.library.calls.padded_plan` says so ("padded" column). With `--all`,
every shape is also timed through the padded plan whatever `padding.pays` says, and the padded product alone
on padded arrays: what the rule's constants are measured from (the predicted times and both selections are
recorded next to them in the JSON). Prints each shape's ratios to cuBLAS (GPU time, and back to back:
30 calls enqueued with nothing between, the longer of the host's time and the GPU's) and the result's error
against float64, and the geometric means."""

from __future__ import annotations

import argparse
import json
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotile.runtime.timing import back_to_back_ms


def random_shapes(count: int, seed: int, dtype: str = "float32", layout: str = "nn",
                  max_side: int = 8192) -> list[tuple[int, ...]]:
    """`count` shapes whose operands' rows in `layout` (or, for the 16-bit types, C's) do not start 16-byte
    aligned for `dtype` (`autotile.library.padding.misaligned`), sides 256 to `max_side`, at most 2^36
    multiply-adds each."""
    from autotile.library.padding import misaligned

    rng = random.Random(seed)
    shapes: list[tuple[int, ...]] = []
    while len(shapes) < count:
        if len(shapes) % 3 == 2 and dtype != "int8":  # torch._int_mm takes no batches
            shape: tuple[int, ...] = (rng.choice([2, 7, 24, 80]),
                                      *(int(math.exp(rng.uniform(math.log(64), math.log(2048)))) for _ in range(3)))
        else:
            shape = tuple(int(math.exp(rng.uniform(math.log(256), math.log(max_side)))) for _ in range(3))
        kernel = "bmm" if len(shape) == 4 else "matmul"
        if dtype == "int8":  # torch._int_mm's sides: M over 16, N and K multiples of 8
            shape = (*shape[:-3], max(shape[-3], 17), -(-shape[-2] // 8) * 8, -(-shape[-1] // 8) * 8)
        if misaligned(dtype, kernel, layout, shape) and math.prod(shape) <= 2 ** 36:
            shapes.append(shape)
    return shapes


class Arrays:
    """The operands, C and the reference of one shape, and the reference call (cuBLAS): CuPy arrays and
    `cupy.matmul` for float32, torch tensors and `torch.matmul` for the 16-bit types (CuPy has no
    bfloat16), torch._int_mm for int8. B of layout nt is a row-major N x K matrix, transposed (x @ W.T)."""

    def __init__(self, shape: tuple[int, ...], dtype: str, layout: str, gen: Any):
        import cupy

        from autotile.codegen import kernels

        *batch, m, n, k = shape
        self.dtype, self.layout = dtype, layout
        a_shape, b_shape = (*batch, m, k), ((*batch, n, k) if layout == "nt" else (*batch, k, n))
        if dtype != "int8":  # int8 draws its own values below
            a = gen.standard_normal(a_shape, dtype=cupy.float32)
            b = gen.standard_normal(b_shape, dtype=cupy.float32)
        if dtype == "float32":
            self.a, self.b = a, (b.swapaxes(-1, -2) if layout == "nt" else b)
            self.c = cupy.full((*batch, m, n), cupy.nan, cupy.float32)
            self.reference = kernels.to_float64(self.a) @ kernels.to_float64(self.b)
            self.cublas = lambda: cupy.matmul(self.a, self.b, out=self.c)
            return
        import torch

        kind = getattr(torch, dtype)
        if dtype == "int8":  # every value, torch._int_mm's contract (nt only): int32 C
            a_t = torch.randint(-128, 128, a_shape, dtype=kind, device="cuda")
            b_t = torch.randint(-128, 128, b_shape, dtype=kind, device="cuda")
        else:
            a_t, b_t = torch.as_tensor(a, device="cuda").to(kind), torch.as_tensor(b, device="cuda").to(kind)
        self.a, self.b = a_t, (b_t.transpose(-1, -2) if layout == "nt" else b_t)
        out_kind = torch.int32 if dtype == "int8" else kind
        self.c = torch.full((*batch, m, n), -12345 if dtype == "int8" else float("nan"), dtype=out_kind,
                            device="cuda")
        self.reference = cupy.asarray(self.a.double()) @ cupy.asarray(self.b.double())
        if dtype == "int8":
            self.cublas = lambda: torch._int_mm(self.a, self.b, out=self.c)
        else:
            self.cublas = lambda: torch.matmul(self.a, self.b, out=self.c)

    def error(self) -> float:
        """||C - reference|| / ||reference||."""
        import cupy

        from autotile.runtime.timing import relative_error

        c = self.c if self.dtype == "float32" else cupy.asarray(self.c.double())
        return relative_error(c, self.reference)

    def poison(self) -> None:
        if self.dtype == "float32":
            self.c.fill(float("nan"))
        else:
            self.c.fill_(-12345 if self.dtype == "int8" else float("nan"))

    def padded(self, padded_shape: tuple[int, ...]) -> tuple[Any, Any, Any]:
        """Zero operands and an empty C of the padded shape, as this shape's are stored."""
        import cupy

        *batch, mp, np_, kp = padded_shape
        if self.dtype == "float32":
            b = cupy.zeros((*batch, np_, kp) if self.layout == "nt" else (*batch, kp, np_), cupy.float32)
            return (cupy.zeros((*batch, mp, kp), cupy.float32), b.swapaxes(-1, -2) if self.layout == "nt" else b,
                    cupy.empty((*batch, mp, np_), cupy.float32))
        import torch

        kind = getattr(torch, self.dtype)
        b = torch.zeros((*batch, np_, kp) if self.layout == "nt" else (*batch, kp, np_), dtype=kind, device="cuda")
        return (torch.zeros((*batch, mp, kp), dtype=kind, device="cuda"),
                b.transpose(-1, -2) if self.layout == "nt" else b,
                torch.empty((*batch, mp, np_), dtype=self.c.dtype, device="cuda"))


def measure(shape: tuple[int, ...], dtype: str, layout: str, gen: Any,
            median_ms: Callable[[Callable[[], object]], float], forced: bool) -> dict[str, Any]:
    """One shape: cuBLAS, the library without and with the padded plan; with `forced`, also the plan
    whatever the rule says and the padded product alone (on padded arrays), for the rule's calibration."""
    import autotile
    from autotile.codegen.problem import ProblemKey
    from autotile.dispatch.select import select
    from autotile.library import calls, padding
    from autotile.runtime.device import live_device

    kernel = "bmm" if len(shape) == 4 else "matmul"
    setting = "high" if dtype == "float32" else "highest"
    arrays = Arrays(shape, dtype, layout, gen)
    a, b, c = arrays.a, arrays.b, arrays.c
    row: dict[str, Any] = {"cublas": median_ms(arrays.cublas)}
    padding.enabled(False)
    row["plain"] = median_ms(lambda: autotile.matmul(a, b, out=c))
    padding.enabled(True)
    row["takes"] = calls.padded_plan(kernel, dtype, layout, tuple(shape), setting) is not None
    arrays.poison()
    autotile.matmul(a, b, out=c)
    row["error"] = arrays.error()
    row["library"] = median_ms(lambda: autotile.matmul(a, b, out=c))
    # as a model's layer runs them: the longer of the host's time per call and the GPU's
    row["back_to_back"] = {"cublas": back_to_back_ms(arrays.cublas),
                           "library": back_to_back_ms(lambda: autotile.matmul(a, b, out=c))}
    padded_shape = padding.padded_shape(layout, tuple(shape), dtype)
    device = live_device()
    direct = select(ProblemKey(kernel, dtype, layout, tuple(shape)), device, precision=setting)
    padded = select(ProblemKey(kernel, dtype, layout, padded_shape), device, precision=setting)
    row["predicted"] = (direct.predicted_ms, padded.predicted_ms, padding.copy_ms(layout, tuple(shape), dtype))
    row["choices"] = (direct.explain(), padded.explain())
    if forced:
        saved = padding.pays
        padding.pays = lambda *args, **kwargs: True
        calls.forget()
        try:
            arrays.poison()
            autotile.matmul(a, b, out=c)
            row["forced_error"] = arrays.error()
            row["forced"] = median_ms(lambda: autotile.matmul(a, b, out=c))
        finally:
            padding.pays = saved
            calls.forget()
        ap, bp, cp = arrays.padded(padded_shape)
        row["product"] = median_ms(lambda: autotile.matmul(ap, bp, out=cp))
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=int, default=24)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--all", action="store_true",
                        help="also time the padded plan on every shape, and the padded product alone")
    parser.add_argument("--bmm", action="store_true",
                        help="issue 28's random batched shapes (autotile.cli.bench_torch.random_bmm_shapes)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16", "int8"),
                        help="float32 through CuPy (cuBLAS: cupy.matmul), or a 16-bit type or int8 through torch "
                             "(int8: layout nt against torch._int_mm, single matrices)")
    parser.add_argument("--layout", default="nn", choices=("nn", "nt"), help="nt: B is W.T of a row-major W")
    parser.add_argument("--max-side", type=int, default=8192, help="the random sides' largest (from 256)")
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
          "back to back  "
          "error")
    ratios: list[tuple[float, float]] = []
    rows = []
    if args.bmm:
        from autotile.cli.bench_torch import random_bmm_shapes

        shapes: list[tuple[int, ...]] = list(random_bmm_shapes(args.shapes, args.seed))
    else:
        shapes = random_shapes(args.shapes, args.seed, args.dtype, args.layout, args.max_side)
    for shape in shapes:
        row = measure(shape, args.dtype, args.layout, gen, median_ms, args.all)
        rows.append({"shape": shape, **row})
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        ratios.append((row["cublas"] / row["plain"], row["cublas"] / row["library"]))
        b2b = row["back_to_back"]
        print(f"{'x'.join(map(str, shape)):>22} {row['cublas']:9.4f} {row['plain']:9.4f} {row['library']:9.4f}  "
              f"{'yes' if row['takes'] else 'no':>6}  {ratios[-1][0]:13.2f}  {ratios[-1][1]:14.2f}  "
              f"{b2b['cublas'] / b2b['library']:12.2f}  {row['error']:.1e}"
              + (f"  forced {row['cublas'] / row['forced']:.2f}x" if "forced" in row else ""), flush=True)

    def geomean(values: list[float]) -> float:
        return math.exp(sum(map(math.log, values)) / len(values))

    print(f"geomean x cuBLAS: without the padded plan {geomean([r[0] for r in ratios]):.3f}, "
          f"with it {geomean([r[1] for r in ratios]):.3f}, better of the two {geomean([max(r) for r in ratios]):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
