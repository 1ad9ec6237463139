"""The benchmark suite: `python -m autotile.bench` (needs a GPU).

For every shape, in one run on one GPU: cuBLAS through CuPy, the seed kernels, and autotile's tuned
kernel (the config the library would pick: exact, nearest or default), each verified against float64
and timed the same way (CUDA events, warm-up, L2 flushed, median). Ratios are to cuBLAS measured in the
same run and to the measured ceilings (device-to-device copy, a full read, the FP32 peak from SM count
and clock). Writes the table as Markdown and JSON, with the GPU, date, driver, CUDA and CuPy versions, and the
README's summary tables (`summary.md`, see autotile.report).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from . import build, kernels, ops
from .impl import Cublas, Generated
from .problem import ProblemKey
from .report import summary_markdown
from .select import select
from .space import Problem

MATMUL_SHAPES = [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192),
                 (4095, 4095, 4095), (3000, 3000, 3000), (1000, 3000, 500), (8192, 8192, 128),
                 (4096, 4096, 64), (128, 8192, 8192), (16384, 64, 16384)]
MATVEC_SHAPES = [(1000, 1000), (4096, 4096), (8192, 8192), (16384, 16384), (32768, 32768), (65536, 4096),
                 (4096, 65536)]
QUICK_MATMUL = [(4096, 4096, 4096), (4095, 4095, 4095), (1000, 3000, 500), (8192, 8192, 128)]
QUICK_MATVEC = [(8192, 8192), (16384, 16384), (4096, 65536)]
# Shapes that no shipped config was tuned for: the library serves them the nearest tuned shape's config.
FALLBACK = [("matmul", (3072, 3072, 3072), "row"), ("matmul", (6000, 2000, 1000), "row"),
            ("matvec", (12000, 12000), "row"), ("matvec", (20000, 3000), "col")]
MATMUL_SEEDS = ("seed-naive", "seed-tiled16", "seed-tiled32")
MATVEC_SEEDS = ("seed-matvec-colmajor",)


@dataclasses.dataclass
class Row:
    kernel: str
    layout: str
    shape: tuple[int, ...]
    name: str  # cuBLAS, a seed, or autotile (with where its config came from)
    time_ms: float
    spread: float
    metric: float
    unit: str
    vs_cublas: float
    vs_ceiling: float
    error: float | None
    config: str = ""


def measure_ceilings(limits: Any) -> dict[str, float]:
    """Device-to-device copy and full-read bandwidth (GB/s) of 1 GiB buffers; FP32 peak (TFLOP/s)."""
    import cupy

    from .timing import HARNESS_SOURCE, time_launch

    n = (1 << 30) // 4
    a = cupy.ones(n, dtype=cupy.float32)
    b = cupy.empty_like(a)
    copy = time_launch(lambda: cupy.copyto(b, a), None, min_reps=10, target_ms=100)
    out = cupy.zeros(1, dtype=cupy.float32)
    reader = build.compile_kernel(HARNESS_SOURCE, "read_all")
    grid, args = (limits.sm_count * 16,), (a, np.uint64(n // 4), out)
    read = time_launch(lambda: reader(grid, (256,), args), None, min_reps=10, target_ms=100)
    clock_khz = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id).get("clockRate", 0)
    # FP32 lanes (FMA units) per SM, from the CUDA C Programming Guide's table of arithmetic-instruction
    # throughput per SM and clock cycle. Not a function of the major version alone: the A100 (sm_80) and
    # the V100 (sm_70) have 64, the consumer and inference parts of the same generation as the A100 (sm_86,
    # sm_89) and the H100/H200 (sm_90) 128; the P100 (sm_60) 64, the other Pascals (sm_61) 128.
    lanes_by_cc = {(5, 0): 128, (6, 0): 64, (6, 1): 128, (7, 0): 64, (7, 5): 64, (8, 0): 64, (8, 6): 128,
                   (8, 9): 128, (9, 0): 128, (10, 0): 128, (12, 0): 128}
    cc = tuple(limits.compute_capability)
    # A version the table lacks (sm_72, sm_87, a newer GPU) takes the entry below it, its likeliest kin.
    lanes = lanes_by_cc[max((k for k in lanes_by_cc if k <= cc), default=(5, 0))]
    return {
        "copy_gbps": 2 * n * 4 / (copy.median_ms * 1e-3) / 1e9,
        "read_gbps": n * 4 / (read.median_ms * 1e-3) / 1e9,
        "fp32_peak_tflops": limits.sm_count * lanes * 2 * clock_khz * 1e3 / 1e12,
        "clock_mhz": clock_khz / 1e3,
    }


class _Problem:
    """Inputs, float64 reference and output of one benchmark problem, and how to measure a launch on it."""

    def __init__(self, kernel: str, shape: tuple[int, ...], layout: str, dtype: str, ceilings: dict[str, float],
                 flush: Any, rng: Any):
        import cupy

        self.key = ProblemKey(kernel, dtype, layout, shape)
        self.spec = kernels.get(kernel)
        self.kernel, self.shape, self.layout, self.dtype, self.flush = kernel, shape, layout, dtype, flush
        self.inputs = self.spec.make_inputs(shape, dtype, layout, rng, cupy)
        self.ref = self.spec.reference(self.inputs)
        self.out = cupy.empty(self.spec.output_shape(shape), dtype=dtype)
        self.tol = kernels.tolerance(dtype, shape[-1])
        self.ceiling = ceilings["fp32_peak_tflops"] * 1e3 if kernel == "matmul" else ceilings["read_gbps"]

    def cublas(self) -> Any:
        return self._run(Cublas())

    def launcher(self, config: Any) -> Any:
        return self._run(Generated(config))

    def _run(self, implementation: Any) -> Any:
        """A function that runs the implementation on this problem's inputs (prepared once, here)."""
        runner, inputs, out = implementation.prepare(self.key), self.inputs, self.out
        return lambda: runner.run(inputs, out)

    def measure(self, name: str, run: Any, config: str = "") -> Row:
        """Verify (output poisoned first), then time. A wrong result is kept, with its error as NaN."""
        from .timing import relative_error, time_launch

        self.out.fill(float("nan"))
        run()
        err = relative_error(self.out, self.ref)
        timing = time_launch(run, self.flush)
        metric, unit = kernels.metric(self.kernel, self.shape, self.dtype, timing.median_ms)
        return Row(self.kernel, self.layout, self.shape, name, timing.median_ms, timing.spread, metric, unit, 0.0,
                   metric / self.ceiling, err if err <= self.tol else float("nan"), config)


def _relative_to_first(rows: list[Row]) -> list[Row]:
    for r in rows:
        r.vs_cublas = rows[0].time_ms / r.time_ms
    return rows


def _bench_problem(kernel: str, shape: tuple[int, ...], layout: str, dtype: str, seeds: tuple[str, ...],
                   limits: Any, ceilings: dict[str, float], flush: Any, rng: Any) -> list[Row]:
    """cuBLAS, the seeds, and the config the library picks, on one problem."""
    p = _Problem(kernel, shape, layout, dtype, ceilings, flush, rng)
    rows = [p.measure("cuBLAS", p.cublas())]
    problem = Problem(limits, dtype, layout)
    for name in seeds:
        config = p.spec.space.named(name)
        if p.spec.space.is_feasible(config, problem):
            rows.append(p.measure(name, p.launcher(config), config.key()))
    selection = select(ProblemKey(kernel, dtype, layout, shape), limits)
    rows.append(p.measure(f"autotile ({selection.source})", p._run(selection.implementation_object()),
                          selection.config.key() if selection.config is not None else "cuBLAS"))
    return _relative_to_first(rows)


def _fallback_problem(kernel: str, shape: tuple[int, ...], layout: str, dtype: str, trials: int, limits: Any,
                      ceilings: dict[str, float], flush: Any, rng: Any) -> list[Row]:
    """The nearest tuned shape's config against a config tuned for this very shape, in one run."""
    from .api import tune

    nearest = select(ProblemKey(kernel, dtype, layout, shape), limits)
    tuned = tune(kernel, shape, dtype=dtype, layout=layout, trials=trials, cache=None).best.config
    p = _Problem(kernel, shape, layout, dtype, ceilings, flush, rng)
    source = f"autotile {nearest.source} ({'x'.join(map(str, nearest.tuned_shape or ()))})"
    return _relative_to_first([
        p.measure("cuBLAS", p.cublas()),
        p.measure(source, p._run(nearest.implementation_object()),
                  nearest.config.key() if nearest.config is not None else "cuBLAS"),
        p.measure("autotile tuned for this shape", p.launcher(tuned), tuned.key()),
    ])


def _retired_entry(kernel: str, dtype: str, layout: str, shape: tuple[int, ...], device: str) -> Any:
    """The config of this exact shape's cache entry, whether or not its kernel still renders the source
    that was timed; None where there is no entry or its config no longer parses."""
    from .cache import TuningCache

    spec = kernels.get(kernel)
    record = TuningCache().get(device, ProblemKey(kernel, dtype, layout, shape), kernels.compat_hash(kernel))
    try:
        return spec.space.config(record.config) if record is not None else None
    except Exception:
        return None


def host_overhead(calls: int = 2000) -> dict[str, float]:
    """Microseconds of host time per call, without synchronizing, on small problems where launch cost is
    all there is: autotile's library calls against cupy.matmul on the same arrays."""
    import cupy

    a = cupy.random.random((64, 64), dtype=cupy.float32)
    b = cupy.random.random((64, 64), dtype=cupy.float32)
    x = cupy.random.random(64, dtype=cupy.float32)
    out_mm, out_mv = cupy.empty((64, 64), dtype=cupy.float32), cupy.empty(64, dtype=cupy.float32)
    cases = {
        "cupy.matmul (64x64x64)": lambda: cupy.matmul(a, b, out=out_mm),
        "autotile.matmul (64x64x64)": lambda: ops.matmul(a, b, out=out_mm),
        "cupy.matmul (64x64 @ 64)": lambda: cupy.matmul(a, x, out=out_mv),
        "autotile.matvec (64x64 @ 64)": lambda: ops.matvec(a, x, out=out_mv),
    }
    result = {}
    for name, call in cases.items():
        for _ in range(50):
            call()
        cupy.cuda.Device().synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            call()
        elapsed = time.perf_counter() - start
        cupy.cuda.Device().synchronize()
        result[name] = elapsed / calls * 1e6
    return result


def environment(limits: Any) -> dict[str, Any]:
    import cupy

    rt = cupy.cuda.runtime
    return {"gpu": limits.name, "device": limits.fingerprint, "date": time.strftime("%Y-%m-%d"),
            "driver": rt.driverGetVersion(), "cuda_runtime": rt.runtimeGetVersion(), "cupy": cupy.__version__,
            "compiler": build.compiler_version()}


def to_markdown(rows: list[Row], env: dict[str, Any], ceilings: dict[str, float]) -> str:
    lines = [f"## {env['gpu']}, {env['date']}",
             "",
             f"CuPy {env['cupy']}, CUDA runtime {env['cuda_runtime']}, driver {env['driver']}, {env['compiler']}. "
             f"Ceilings measured in the same run: copy {ceilings['copy_gbps']:,.0f} GB/s, read "
             f"{ceilings['read_gbps']:,.0f} GB/s, FP32 peak {ceilings['fp32_peak_tflops']:.1f} TFLOP/s "
             f"({ceilings['clock_mhz']:.0f} MHz). Times are medians with L2 flushed; ratios within this run; "
             "rel. error is ||out - ref|| / ||ref|| against a float64 product.",
             "",
             "| kernel | layout | shape | implementation | ms | TFLOP/s or GB/s | x cuBLAS | x ceiling | rel. error |",
             "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        value = f"{r.metric / 1e3:.1f} TFLOP/s" if r.unit == "GFLOP/s" else f"{r.metric:,.0f} GB/s"
        bad = "" if r.error == r.error else " (WRONG)"
        lines.append(f"| {r.kernel} | {r.layout} | {'x'.join(map(str, r.shape))} | {r.name}{bad} | "
                     f"{r.time_ms:.4f} | {value} | {r.vs_cublas:.2f} | {r.vs_ceiling:.2f} | "
                     f"{'-' if r.error is None or r.error != r.error else format(r.error, '.1e')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autotile.bench", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few representative shapes only")
    parser.add_argument("--kernels", default="matmul,matvec",
                        help="comma-separated, from matmul, matvec (default both)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--out", default="bench-results", help="folder for results.md and results.json")
    parser.add_argument("--tune", type=int, default=0, metavar="TRIALS",
                        help="first tune every shape that has no exact cache entry, with this many trials")
    parser.add_argument("--retune", action="store_true", help="with --tune: tune shapes that have an entry too")
    parser.add_argument("--tune-only", action="store_true", help="with --tune: tune, then stop (no benchmark)")
    parser.add_argument("--fix", action="append", default=[], metavar="PARAM=VALUE[,VALUE...]",
                        help="with --tune: narrow the space, as `autotile tune --fix` does (repeatable)")
    parser.add_argument("--tune-timeout", type=float, default=None, metavar="SECONDS",
                        help="with --tune: stop drawing candidates for a shape after this long")
    parser.add_argument("--only", default=None, metavar="SHAPE[,SHAPE]", help="only these shapes (MxNxK or MxK)")
    parser.add_argument("--overhead", action="store_true", help="measure host time per library call")
    parser.add_argument("--fallback", type=int, default=0, metavar="TRIALS",
                        help="also time untuned shapes: the nearest tuned config against one tuned for the shape")
    args = parser.parse_args(argv)

    from . import validate
    from .errors import AutotileError, InvalidValueError

    def fail(message: str, status: int = 2) -> int:
        print(f"autotile.bench: error: {message}", file=sys.stderr)
        return status

    # Every argument is checked before CuPy is imported or the GPU touched: a bad one found later would
    # cost the ceilings' measurement first or, for --fix, hours of tuning the shapes before the one it breaks.
    try:
        chosen = [k.strip() for k in args.kernels.split(",")]
        unknown = [k for k in chosen if k not in ("matmul", "matvec")]
        if unknown:
            raise InvalidValueError(f"--kernels {args.kernels!r}: unknown kernel(s) {', '.join(map(repr, unknown))}; "
                                    "choose from matmul, matvec (comma-separated)")
        todo: list[tuple[str, tuple[int, ...], str, tuple[str, ...]]] = []
        if "matmul" in chosen:
            todo += [("matmul", s, "row", MATMUL_SEEDS) for s in (QUICK_MATMUL if args.quick else MATMUL_SHAPES)]
        if "matvec" in chosen:
            for s in (QUICK_MATVEC if args.quick else MATVEC_SHAPES):
                todo += [("matvec", s, layout, MATVEC_SEEDS) for layout in ("row", "col")]
        if args.only:
            wanted = set()
            for item in args.only.split(","):
                parts = item.strip().split("x")
                if len(parts) not in (2, 3) or not all(p.isdigit() and int(p) > 0 for p in parts):
                    raise InvalidValueError(f"--only {args.only!r}: {item!r} is not a shape such as 4096x4096x4096 "
                                            "(matmul) or 8192x8192 (matvec)")
                wanted.add(tuple(int(p) for p in parts))
            known = sorted({t[1] for t in todo}, key=lambda s: (len(s), s))
            todo = [t for t in todo if t[1] in wanted]
            if not todo:
                raise InvalidValueError(
                    f"--only {args.only!r} matches none of the shapes benchmarked for --kernels {args.kernels}"
                    f"{' --quick' if args.quick else ''}: {', '.join('x'.join(map(str, s)) for s in known)}")
        validate.count(args.tune, name="--tune", minimum=0)
        validate.count(args.fallback, name="--fallback", minimum=0)
        unused = [flag for flag, given in (("--retune", args.retune), ("--tune-only", args.tune_only),
                                           ("--fix", bool(args.fix)), ("--tune-timeout", args.tune_timeout is not None))
                  if given]
        if unused and not args.tune:
            raise InvalidValueError(f"{' and '.join(unused)} {'act' if len(unused) > 1 else 'acts'} only with "
                                    "--tune TRIALS, which is not given")
        validate.seconds(args.tune_timeout, name="--tune-timeout", allow_none=True)
        fix = validate.fix_items(args.fix, name="--fix")
        for kernel in sorted({t[0] for t in todo}) if fix else ():
            try:
                kernels.get(kernel).space.restricted(fix)
            except AutotileError as exc:  # every kernel tuned takes the same --fix
                raise InvalidValueError(f"--fix: {exc} (--fix applies to every kernel in --kernels)") from None
        out: Path = validate.writable_folder(args.out, name="--out")
    except AutotileError as exc:
        return fail(str(exc))

    try:
        from .device import live_device

        limits = live_device()  # before CuPy is imported: no GPU or no CuPy is one line, not a traceback

        import cupy

        from .timing import L2Flusher

        env = environment(limits)
        ceilings = measure_ceilings(limits)
        flush = L2Flusher(limits.l2_bytes)
        rng = cupy.random.default_rng(2026)
        rows: list[Row] = []
        if args.tune:
            from .api import tune

            for kernel, shape, layout, _ in todo:
                sel = select(ProblemKey(kernel, args.dtype, layout, shape), limits)
                if sel.source == "exact" and not args.retune:
                    continue
                t0 = time.time()
                # Re-tuning starts from the config in use, so the new entry is never slower than the old one,
                # and from this shape's own entry where a template change has retired it (still a good guess).
                start = ({f"in use ({sel.source})": sel.config}
                         if sel.source != "built-in default" and sel.config is not None else {})
                retired = _retired_entry(kernel, args.dtype, layout, shape, limits.fingerprint)
                if retired is not None and retired != sel.config:
                    start["this shape's retired entry"] = retired
                result = tune(kernel, shape, dtype=args.dtype, layout=layout, trials=args.tune,
                              timeout=args.tune_timeout, start=start or None, fix=fix or None)
                label = f"{kernel} {layout} {'x'.join(map(str, shape))}"
                print(f"tuned {label}: {result.best.median_ms:.4f} ms, {result.vs_baseline or 0:.2f}x cuBLAS, "
                      f"{time.time() - t0:.0f} s", flush=True)
                note = getattr(result, "save_note", None)  # fields of newer libraries: read with getattr
                if note:
                    print(note, flush=True)
                error = getattr(result, "save_error", None)
                if error:  # the next shapes' tuning would be lost the same way, and the benchmark not use it
                    where = getattr(result, "saved_path", None) or "the cache"
                    return fail(f"{label} was tuned but not saved to {where}: {' '.join(str(error).split())}", 1)
        if args.tune_only:
            return 0
        for kernel, shape, layout, seeds in todo:
            new = _bench_problem(kernel, shape, layout, args.dtype, seeds, limits, ceilings, flush, rng)
            rows += new
            for r in new:
                print(f"{r.kernel:<6} {r.layout:<3} {'x'.join(map(str, r.shape)):<17} {r.name:<28} "
                      f"{r.time_ms:9.4f} ms {r.metric:>10,.0f} {r.unit:<7} {r.vs_cublas:5.2f}x cuBLAS "
                      f"{r.vs_ceiling:5.2f}x ceiling" + ("" if r.error == r.error else "  WRONG RESULT"), flush=True)
        if args.fallback:
            for kernel, shape, layout in FALLBACK:
                new = _fallback_problem(kernel, shape, layout, args.dtype, args.fallback, limits, ceilings, flush,
                                        rng)
                rows += new
                print(f"fallback {kernel} {layout} {'x'.join(map(str, shape))}: {new[1].name} runs at "
                      f"{new[2].time_ms / new[1].time_ms:.2f}x the speed of a config tuned for the shape "
                      f"({new[1].vs_cublas:.2f} vs {new[2].vs_cublas:.2f} x cuBLAS)", flush=True)
        overhead = host_overhead() if args.overhead else {}
        for name, us in overhead.items():
            print(f"host time per call: {name:<30} {us:6.1f} us", flush=True)
        out.mkdir(parents=True, exist_ok=True)
        markdown = to_markdown(rows, env, ceilings)
        (out / "results.md").write_text(markdown)
        results = {"environment": env, "ceilings": ceilings, "host_overhead_us": overhead,
                   "rows": [dataclasses.asdict(r) for r in rows]}
        (out / "results.json").write_text(json.dumps(results, indent=1))
        (out / "summary.md").write_text(summary_markdown(results))  # the README's tables
    except AutotileError as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        print("autotile.bench: interrupted", file=sys.stderr)
        return 130
    print()
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
