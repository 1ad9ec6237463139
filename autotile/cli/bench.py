"""The benchmark suite: `python -m autotile.cli.bench` (needs a GPU).

For every shape, in one run on one GPU: cuBLAS through CuPy, the seed kernels, and autotile's tuned
kernel (the config the library would pick: exact, nearest or default), each verified against float64
and timed the same way (CUDA events, warm-up, L2 flushed, median). Ratios are to cuBLAS measured in the
same run and to the measured ceilings (device-to-device copy, a full read, the FP32 peak from SM count
and clock). Writes the table as Markdown and JSON, with the GPU, date, driver, CUDA and CuPy versions, and the
README's summary tables (`summary.md`, see autotile.tuning.bench_results).

Float32 matmul's autotile rows are timed under each precision setting of `--precision` (default: "high",
then "highest", both against the cuBLAS of the same run): what the library picks differs between them (no
tf32x3 config under "highest"). Matvec and float64, where the setting changes nothing, are timed once.

`--random N [--seed S]` times instead N random shapes per kernel (`random_shapes`; seed 0 by default), each
as the library runs it (`autotile.library.calls`' prepared runner, whatever the selection chain picked for the shape;
the call itself where it takes the padded plan, `autotile.library.padding`)
against cuBLAS, and writes the distribution of the ratios (`random.md`, `random.json`); the fixed shape
list is then skipped.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from autotile.codegen import build, dtypes, kernels
from autotile.codegen.dtypes import DTYPE_NAMES
from autotile.codegen.problem import ProblemKey
from autotile.codegen.space import Problem
from autotile.dispatch import precision as precision_mod
from autotile.dispatch.select import select
from autotile.library import calls as ops
from autotile.library import padding
from autotile.library.api import matmul, matvec
from autotile.runtime.impl import Cublas, Generated
from autotile.tuning.bench_results import random_groups, ratio_summary, summary_markdown

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
# --random: sizes drawn log-uniformly (every octave as likely: small shapes, where launch geometry and
# fallback configs matter most, are as frequent as large ones) as (smallest, largest, cap on the product of
# the sizes). The matmul cap, 2^37 multiply-adds (0.27 TFLOP, a few ms), keeps each shape's timing short; the
# matvec cap, 2^31 elements of A (8 GiB in float32), keeps a float64 run's inputs and reference inside an
# 80 GB GPU's memory. Draws over the cap are drawn again.
RANDOM_RANGES: dict[str, tuple[int, int, int]] = {
    "matmul": (16, 12288, 2**37),
    "matvec": (64, 65536, 2**31),
}
RANDOM_LAYOUTS = {"matmul": ("row",), "matvec": ("row", "col")}
# Fewer repetitions than the fixed shapes get (time_launch's defaults aim at 200 ms per implementation):
# a random run has hundreds of problems, and its statistic is over shapes, not over repetitions of one.
RANDOM_TIMING: dict[str, Any] = {"min_reps": 5, "max_reps": 50, "target_ms": 50.0}
_RANDOM_STREAM = {"matmul": 0, "matvec": 1}  # each kernel its own stream: its shapes do not depend on --kernels
# The precision settings float32 matmul is timed under without --precision: the default, then IEEE only.
DEFAULT_PRECISIONS = ("high", "highest")
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
    error: float | None  # NaN where beyond kernels.tolerance (a wrong result)
    config: str = ""
    rel_error: float | None = None  # the error as measured, beyond the tolerance or not
    precision: str = ""  # the setting an autotile row was chosen under; "" where it changes nothing


@dataclasses.dataclass
class RandomRow:
    """One problem of `--random`: cuBLAS and the library's pick, timed the same way in the same run."""

    kernel: str
    layout: str
    shape: tuple[int, ...]
    cublas_ms: float
    autotile_ms: float
    ratio: float  # cublas_ms / autotile_ms: above 1 the library is faster
    cublas_error: float | None  # ||out - ref|| / ||ref|| against float64, as measured
    autotile_error: float | None
    tolerance: float
    wrong: bool  # either result beyond the tolerance; the row is kept, and flagged
    source: str  # the selection step that chose the config (exact, nearest, ...)
    selection: str  # Selection.explain(): the step, the shape it was tuned on, the config
    config: str
    precision: str = ""  # the setting the library ran under; "" where it changes nothing (matvec, float64)


def settings_for(kernel: str, dtype: str, requested: Sequence[str] | None) -> list[str]:
    """The precision settings a problem's autotile rows are timed under: float32 matmul each of
    `requested` (None: DEFAULT_PRECISIONS); elsewhere the setting changes nothing, so once, as ""."""
    if not precision_mod.applies(kernel, dtype):
        return [""]
    return list(requested) if requested else list(DEFAULT_PRECISIONS)


def parse_precisions(text: str | None) -> list[str] | None:
    """--precision's text: settings separated by commas, each checked, in order, without repeats."""
    if text is None:
        return None
    from autotile.tuning import validate

    settings: list[str] = []
    for item in text.split(","):
        setting = validate.precision(item.strip(), name="--precision")
        if setting not in settings:
            settings.append(setting)
    return settings


def random_shapes(kernel: str, n: int, seed: int, multiple: int = 1) -> list[tuple[int, ...]]:
    """`n` shapes for `kernel` (MxNxK or MxK), each size an integer drawn log-uniformly from the kernel's
    RANDOM_RANGES and rounded up to a multiple of `multiple` (8: the shapes frameworks pad to), a draw whose
    product of sizes exceeds the cap drawn again. Deterministic in (kernel, n, seed, multiple); the first n
    of n + m shapes are the n shapes, and a kernel's shapes do not depend on the other's."""
    lo, hi, cap = RANDOM_RANGES[kernel]
    dims = len(kernels.get(kernel).dims)
    rng = np.random.default_rng([seed, _RANDOM_STREAM[kernel]])
    shapes: list[tuple[int, ...]] = []
    while len(shapes) < n:
        # floor(exp(U[log lo, log(hi + 1)))) gives each integer k in lo..hi the chance log((k+1)/k), the
        # discrete log-uniform law; the clamps only undo rounding at the ends.
        draw = rng.uniform(math.log(lo), math.log(hi + 1), size=dims)
        shape = tuple(-(-min(hi, max(lo, int(math.exp(v)))) // multiple) * multiple for v in draw)
        if math.prod(shape) <= cap:
            shapes.append(shape)
    return shapes


def measure_ceilings(limits: Any) -> dict[str, float]:
    """Device-to-device copy and full-read bandwidth (GB/s) of 1 GiB buffers; FP32 peak (TFLOP/s)."""
    import cupy

    from autotile.runtime.timing import HARNESS_SOURCE, time_launch

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

    def __init__(self, kernel: str, shape: tuple[int, ...], layout: str, dtype: str,
                 ceilings: dict[str, float] | None, flush: Any, rng: Any, timing: dict[str, Any] | None = None):
        """`ceilings` None: no ratio to a ceiling (NaN); `timing`: time_launch's repetition options."""
        import cupy

        self.key = ProblemKey(kernel, dtype, layout, shape)
        self.spec = kernels.get(kernel)
        self.kernel, self.shape, self.layout, self.dtype, self.flush = kernel, shape, layout, dtype, flush
        self.inputs = self.spec.make_inputs(shape, dtype, layout, rng, cupy)
        self.ref = self.spec.reference(self.inputs, dtype)
        self.out = cupy.empty(self.spec.output_shape(shape), dtype=dtypes.output_storage(dtype))
        self.tol = kernels.tolerance(dtype, shape[-1])
        self.timing = timing or {}
        if ceilings is None:
            self.ceiling = float("nan")
        else:
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
        from autotile.runtime.timing import relative_error, time_launch

        kernels.poison(self.out)
        run()
        err = relative_error(self.out, self.ref)
        timing = time_launch(run, self.flush, **self.timing)
        metric, unit = kernels.metric(self.kernel, self.shape, self.dtype, timing.median_ms)
        return Row(self.kernel, self.layout, self.shape, name, timing.median_ms, timing.spread, metric, unit, 0.0,
                   metric / self.ceiling, err if err <= self.tol else float("nan"), config, err)


def _relative_to_first(rows: list[Row]) -> list[Row]:
    for r in rows:
        r.vs_cublas = rows[0].time_ms / r.time_ms
    return rows


def _bench_problem(kernel: str, shape: tuple[int, ...], layout: str, dtype: str, seeds: tuple[str, ...],
                   limits: Any, ceilings: dict[str, float], flush: Any, rng: Any,
                   settings: Sequence[str] = ("",)) -> list[Row]:
    """cuBLAS, the seeds, and the config the library picks under each precision setting of `settings` ("":
    the process-wide one, for problems where it changes nothing), on one problem: every ratio is to the
    cuBLAS time of this run."""
    p = _Problem(kernel, shape, layout, dtype, ceilings, flush, rng)
    rows = [p.measure("cuBLAS", p.cublas())]
    problem = Problem(limits, dtype, layout)
    for name in seeds:
        config = p.spec.space.named(name)
        if p.spec.space.is_feasible(config, problem):
            rows.append(p.measure(name, p.launcher(config), config.key()))
    for setting in settings:
        padded = _padded_call(p, kernel, shape, layout, dtype, setting)
        if padded is not None:  # the library's call takes the padded plan: timed as it
            selection, run, padded_to = padded
            row = p.measure(f"autotile (padded to {padded_to}: {selection.source})", run, selection.config.key())
            row.precision = setting
            rows.append(row)
            continue
        selection = select(ProblemKey(kernel, dtype, layout, shape), limits, precision=setting or None)
        row = p.measure(f"autotile ({selection.source})", p._run(selection.implementation_object()),
                        selection.config.key() if selection.config is not None else "cuBLAS")
        row.precision = setting
        rows.append(row)
    return _relative_to_first(rows)


def _fallback_problem(kernel: str, shape: tuple[int, ...], layout: str, dtype: str, trials: int, limits: Any,
                      ceilings: dict[str, float], flush: Any, rng: Any) -> list[Row]:
    """The nearest tuned shape's config against a config tuned for this very shape, in one run."""
    from autotile.tuning.api import tune

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


def _padded_call(p: Any, kernel: str, shape: tuple[int, ...], layout: str, dtype: str,
                 precision: str) -> tuple[Any, Any, str] | None:
    """Where `autotile.matmul` takes the padded plan on this problem (row-major operands; `autotile.library.
    padding`) under the precision setting (""/None: the process-wide one): (the selection for the padded
    shape, the call on the problem's inputs, the padded shape's text); None elsewhere."""
    setting = precision_mod.resolve(precision or None)
    if layout not in ("nn", "row"):
        return None
    prepared = ops.padded_plan(kernel, dtype, "nn", shape, setting)
    if prepared is None:
        return None
    padded_shape = padding.padded_shape("nn", shape, dtype)
    run = functools.partial(ops.matmul_no_autograd, p.inputs[0], p.inputs[1], p.out, setting)
    return prepared.selection, run, _shape_text(padded_shape)


def _random_problem(kernel: str, shape: tuple[int, ...], layout: str, dtype: str, flush: Any,
                    rng: Any, precision: str = "") -> RandomRow:
    """cuBLAS and what `autotile.matmul`/`matvec` runs for this problem under the precision setting
    (""/None: the process-wide one): the runner `autotile.library.calls` prepared and memoized for it, whichever
    implementation the selection chain chose, or, where the call takes the padded plan
    (`autotile.library.padding`: a large float32 matmul with odd sizes), the call itself (its copies
    included). One reference, one set of inputs, the same timing for both."""
    p = _Problem(kernel, shape, layout, dtype, None, flush, rng, RANDOM_TIMING)
    padded = _padded_call(p, kernel, shape, layout, dtype, precision)
    if padded is not None:  # the library's call takes the padded plan: timed as it
        selection, run, padded_to = padded
    else:
        prepared = ops._prepare(kernel, dtype, layout, shape, precision or None)
        selection, run, padded_to = prepared.selection, functools.partial(prepared.runner.run, p.inputs, p.out), ""
    config = getattr(selection, "config", None)
    key = config.key() if config is not None else ""
    cublas = p.measure("cuBLAS", p.cublas())
    mine = p.measure("autotile", run, key)
    wrong = any(r.error is None or r.error != r.error for r in (cublas, mine))
    source, explained = selection.source, selection.explain()
    if padded_to:
        source, explained = f"padded to {padded_to}: {source}", f"padded to {padded_to}: {explained}"
    return RandomRow(kernel, layout, shape, cublas.time_ms, mine.time_ms, cublas.time_ms / mine.time_ms,
                     cublas.rel_error, mine.rel_error, p.tol, wrong, source, explained, key, precision)


def _fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def random_summaries(rows: list[RandomRow]) -> dict[str, dict[str, Any]]:
    """ratio_summary per "kernel layout" (and precision setting, where it applies), with the count of wrong
    results and the 5 slowest shapes."""
    result = {}
    for (kernel, layout, setting), group in random_groups([dataclasses.asdict(r) for r in rows]).items():
        worst = sorted(group, key=lambda r: r["ratio"])[:5]
        name = f"{kernel} {layout}" + (f" {setting}" if setting else "")
        result[name] = ratio_summary([r["ratio"] for r in group]) | {
            "wrong": sum(1 for r in group if r["wrong"]),
            "worst": [{"shape": r["shape"], "ratio": r["ratio"], "source": r["source"], "selection": r["selection"]}
                      for r in worst]}
    return result


def random_table(summaries: dict[str, dict[str, Any]]) -> list[str]:
    """The distribution per kernel and layout as Markdown table lines (stdout and random.md)."""
    lines = ["| kernel layout | N | min | p10 | median | geomean | >= 1.0x | >= 0.97x | wrong |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, s in summaries.items():
        lines.append(f"| {name} | {s['count']} | {_fmt(s['min'], '.2f')} | {_fmt(s['p10'], '.2f')} | "
                     f"{_fmt(s['median'], '.2f')} | {_fmt(s['geomean'], '.2f')} | {_fmt(s['frac_ge_1'], '.0%')} | "
                     f"{_fmt(s['frac_ge_097'], '.0%')} | {'**' + str(s['wrong']) + ' WRONG**' if s['wrong'] else 0} |")
    return lines


def _shape_text(shape: Any) -> str:
    return "x".join(map(str, shape))


def random_results_markdown(rows: list[RandomRow], summaries: dict[str, dict[str, Any]], env: dict[str, Any]) -> str:
    """random.md: the environment, the distribution, the 5 slowest shapes per kernel and layout, every wrong
    result, and every shape."""
    ranges = "; ".join(f"{k} sizes {lo}..{hi}, product <= 2^{int(math.log2(cap))}"
                       for k, (lo, hi, cap) in RANDOM_RANGES.items())
    lines = [f"## Random shapes: {env['gpu']}, {env['date']}",
             "",
             f"CuPy {env['cupy']}, CUDA runtime {env['cuda_runtime']}, driver {env['driver']}, {env['compiler']}. "
             f"{env['n']} shapes per kernel, {env['dtype']}, seed {env['seed']} "
             f"(`python -m autotile.cli.bench --random {env['n']} --seed {env['seed']}`), "
             f"sizes log-uniform ({ranges}); matvec timed in both layouts. "
             "Ratio = cuBLAS time / autotile time, both timed in this run the same way (L2 flushed, median of "
             f"{RANDOM_TIMING['min_reps']}..{RANDOM_TIMING['max_reps']} launches); autotile is what the library runs "
             "for the shape. Rel. error is ||out - ref|| / ||ref|| against a float64 product.",
             "", *random_table(summaries), ""]
    lines += ["Slowest shapes against cuBLAS:", "",
              "| kernel layout | shape | x cuBLAS | selection |", "| --- | --- | ---: | --- |"]
    for name, s in summaries.items():
        lines += [f"| {name} | {_shape_text(w['shape'])} | {w['ratio']:.2f} | {w['selection']} |" for w in s["worst"]]
    wrong = [r for r in rows if r.wrong]
    if wrong:
        lines += ["", f"**Wrong results ({len(wrong)})**, kept in the numbers above:", ""]
        lines += [f"- {r.kernel} {r.layout} {_shape_text(r.shape)}: error cuBLAS {_fmt(r.cublas_error, '.1e')}, "
                  f"autotile {_fmt(r.autotile_error, '.1e')} (tolerance {r.tolerance:.1e}); {r.selection}"
                  for r in wrong]
    lines += ["", "Every shape:", "",
              "| kernel | layout | shape | cuBLAS ms | autotile ms | x cuBLAS | rel. error cuBLAS / autotile | "
              "selection |",
              "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        lines.append(f"| {r.kernel}{' ' + r.precision if r.precision else ''} | {r.layout} | {_shape_text(r.shape)} | "
                     f"{r.cublas_ms:.4f} | {r.autotile_ms:.4f} | "
                     f"{r.ratio:.2f}{' (WRONG)' if r.wrong else ''} | {_fmt(r.cublas_error, '.1e')} / "
                     f"{_fmt(r.autotile_error, '.1e')} | {r.selection} |")
    return "\n".join(lines) + "\n"


def _run_random(chosen: list[str], n: int, seed: int, dtype: str, out: Path, limits: Any,
                precisions: Sequence[str] | None = None, multiple: int = 1) -> int:
    """--random: time every drawn shape (float32 matmul under each precision setting), write random.md and
    random.json, print the distribution."""
    import cupy

    from autotile.runtime.timing import L2Flusher

    env = environment(limits) | {"mode": "random", "seed": seed, "n": n, "dtype": dtype, "multiple": multiple,
                                 "ranges": {k: RANDOM_RANGES[k] for k in chosen}, "timing": RANDOM_TIMING}
    flush = L2Flusher(limits.l2_bytes)
    rng = cupy.random.default_rng(seed)  # the inputs' values
    pool = cupy.get_default_memory_pool()
    rows: list[RandomRow] = []
    for kernel in chosen:
        for shape in random_shapes(kernel, n, seed, multiple):
            for layout in RANDOM_LAYOUTS[kernel]:
                for setting in settings_for(kernel, dtype, precisions):
                    row = _random_problem(kernel, shape, layout, dtype, flush, rng, precision=setting)
                    # Every problem has other sizes: cached blocks of the last would only fragment the pool.
                    pool.free_all_blocks()
                    rows.append(row)
                    print(f"{kernel:<6} {layout:<3} {_shape_text(shape):<17} {setting:<7} cuBLAS "
                          f"{row.cublas_ms:9.4f} ms  autotile {row.autotile_ms:9.4f} ms  {row.ratio:5.2f}x  "
                          f"{row.selection}" + ("  WRONG RESULT" if row.wrong else ""), flush=True)
    summaries = random_summaries(rows)
    out.mkdir(parents=True, exist_ok=True)
    results = {"mode": "random", "environment": env, "summary": summaries,
               "rows": [dataclasses.asdict(r) for r in rows]}
    (out / "random.json").write_text(json.dumps(results, indent=1))
    (out / "random.md").write_text(random_results_markdown(rows, summaries, env))
    print()
    print("\n".join(random_table(summaries)))
    for name, s in summaries.items():
        print(f"slowest {name}: " + ", ".join(f"{_shape_text(w['shape'])} {w['ratio']:.2f}x ({w['source']})"
                                             for w in s["worst"]))
    print(f"wrote {out / 'random.md'} and {out / 'random.json'}")
    return 0


def _whole_number(text: str | None, name: str, what: str) -> int | None:
    """An option's text as an int (None stays None); InvalidValueError naming the option otherwise."""
    from autotile.errors import InvalidValueError

    if text is None:
        return None
    try:
        return int(text.strip(), 10)
    except ValueError:
        raise InvalidValueError(f"{name} must be {what}, got {text!r}") from None


def _retired_entry(kernel: str, dtype: str, layout: str, shape: tuple[int, ...], device: str,
                   setting: str = "") -> Any:
    """The config of this exact shape's cache entry that the precision setting allows ("": any), whether
    or not its kernel still renders the source that was timed; None where there is no entry or its config
    no longer parses."""
    from autotile.dispatch.cache import TuningCache

    spec = kernels.get(kernel)
    record = TuningCache().get(device, ProblemKey(kernel, dtype, layout, shape), kernels.compat_hash(kernel),
                               allowed_by=setting or None)
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
        "autotile.matmul (64x64x64)": lambda: matmul(a, b, out=out_mm),
        "cupy.matmul (64x64 @ 64)": lambda: cupy.matmul(a, x, out=out_mv),
        "autotile.matvec (64x64 @ 64)": lambda: matvec(a, x, out=out_mv),
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
             "rel. error is ||out - ref|| / ||ref|| against a float64 product. Precision: the float32 matmul "
             "setting an autotile row was chosen under (highest: IEEE FP32 only; high: tf32x3 allowed); - where "
             "it changes nothing.",
             "",
             "| kernel | layout | shape | implementation | precision | ms | TFLOP/s or GB/s | x cuBLAS | x ceiling | "
             "rel. error |",
             "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        value = f"{r.metric / 1e3:.1f} TFLOP/s" if r.unit == "GFLOP/s" else f"{r.metric:,.0f} GB/s"
        bad = "" if r.error == r.error else " (WRONG)"
        lines.append(f"| {r.kernel} | {r.layout} | {'x'.join(map(str, r.shape))} | {r.name}{bad} | "
                     f"{r.precision or '-'} | "
                     f"{r.time_ms:.4f} | {value} | {r.vs_cublas:.2f} | {r.vs_ceiling:.2f} | "
                     f"{'-' if r.error is None or r.error != r.error else format(r.error, '.1e')} |")
    return "\n".join(lines) + "\n"


@dataclasses.dataclass(frozen=True)
class _Request:
    """A benchmark run's arguments, checked before the GPU is touched (`_checked`)."""

    args: argparse.Namespace
    chosen: list[str]  # the kernels
    todo: list[tuple[str, tuple[int, ...], str, tuple[str, ...]]]  # (kernel, shape, layout, seeds) of the fixed list
    fix: dict[str, list[str]]
    out: Path
    random_n: int | None
    seed: int | None
    multiple: int | None
    precisions: list[str] | None


def _parser(prog: str) -> argparse.ArgumentParser:
    """The benchmark's command line (`prog`: how the usage line names it)."""
    parser = argparse.ArgumentParser(prog=prog, description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few representative shapes only")
    parser.add_argument("--kernels", default="matmul,matvec",
                        help="comma-separated, from matmul, matvec (default both)")
    parser.add_argument("--dtype", default="float32", choices=list(DTYPE_NAMES))
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
    parser.add_argument("--random", default=None, metavar="N",
                        help="instead of the fixed shapes: N random shapes per kernel (matvec in both layouts), "
                             "as the library runs them against cuBLAS; writes random.md and random.json")
    parser.add_argument("--multiple", default=None, metavar="Q",
                        help="with --random: every size rounded up to a multiple of Q (default 1)")
    parser.add_argument("--seed", default=None, metavar="S",
                        help="with --random: the seed of the shapes and of the inputs (default 0)")
    parser.add_argument("--precision", default=None, metavar="SETTING[,SETTING]",
                        help="float32 matmul precision settings to time autotile under, from highest, high, medium, "
                             "emulated (the int8 emulation where it pays: python -m autotile.cli.bench_emulation "
                             f"times it alone) (default {','.join(DEFAULT_PRECISIONS)}; matvec and float64 run once, "
                             "as the setting changes nothing for them); with --tune, each is tuned")
    # --random, --seed and --precision are read as text and checked by `_checked`: argparse's own error would be
    # two lines.
    return parser


def _checked(args: argparse.Namespace) -> _Request:
    """The run `args` ask for, every argument checked: `InvalidValueError` (one line) for the first bad one.
    All of this happens before CuPy is imported or the GPU touched: a bad argument found later would cost the
    ceilings' measurement first or, for --fix, hours of tuning the shapes before the one it breaks."""
    from autotile.errors import AutotileError, InvalidValueError
    from autotile.tuning import validate

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
    random_n = _whole_number(args.random, "--random", "a whole number of shapes per kernel, at least 1")
    seed = _whole_number(args.seed, "--seed", f"an integer in 0..{validate.SEED_MAX}")
    multiple = _whole_number(args.multiple, "--multiple", "a whole number of elements, at least 1")
    if multiple is not None:
        validate.count(multiple, name="--multiple", minimum=1)
        if random_n is None:
            raise InvalidValueError("--multiple acts only with --random N, which is not given")
    if random_n is not None:
        validate.count(random_n, name="--random", minimum=1)
        others = [flag for flag, given in (("--quick", args.quick), ("--only", args.only is not None),
                                           ("--tune", bool(args.tune)), ("--fallback", bool(args.fallback)),
                                           ("--overhead", args.overhead)) if given]
        if others:
            raise InvalidValueError(f"--random does not combine with {', '.join(others)}: it replaces the fixed "
                                    "shape list (it takes --kernels, --dtype, --seed and --out)")
    elif seed is not None:
        raise InvalidValueError("--seed acts only with --random N, which is not given")
    if seed is not None:
        validate.seed(seed, name="--seed")
    precisions = parse_precisions(args.precision)
    return _Request(args, chosen, todo, fix, out, random_n, seed, multiple, precisions)


def _tune_first(request: _Request, limits: Any) -> str | None:
    """--tune: tune each shape (under each precision setting) that has no exact record (every shape with
    --retune). Returns the error that stops the run (a winner the cache could not take: the next shapes'
    would be lost the same way, and the benchmark would not run them), else None."""
    from autotile.tuning.api import tune

    args = request.args
    for kernel, shape, layout, _ in request.todo:
        for setting in settings_for(kernel, args.dtype, request.precisions):
            sel = select(ProblemKey(kernel, args.dtype, layout, shape), limits, precision=setting or None)
            if sel.tuned_here and not args.retune:
                continue
            t0 = time.time()
            # Re-tuning starts from the config in use, so the new entry is never slower than the old one, and
            # from this shape's own entry where a template change has retired it (still a good guess). Both
            # as the setting allows: the tuner leaves out a start outside its space.
            start = ({f"in use ({sel.source})": sel.config}
                     if sel.source != "built-in default" and sel.config is not None else {})
            retired = _retired_entry(kernel, args.dtype, layout, shape, limits.fingerprint, setting)
            if retired is not None and retired != sel.config:
                start["this shape's retired entry"] = retired
            result = tune(kernel, shape, dtype=args.dtype, layout=layout, trials=args.tune,
                          timeout=args.tune_timeout, start=start or None, fix=request.fix or None,
                          precision=setting or None)
            label = f"{kernel} {layout} {'x'.join(map(str, shape))}" + (f" {setting}" if setting else "")
            print(f"tuned {label}: {result.best.median_ms:.4f} ms, {result.vs_baseline or 0:.2f}x cuBLAS, "
                  f"{time.time() - t0:.0f} s", flush=True)
            note = getattr(result, "save_note", None)  # fields of newer libraries: read with getattr
            if note:
                print(note, flush=True)
            error = getattr(result, "save_error", None)
            if error:
                where = getattr(result, "saved_path", None) or "the cache"
                return f"{label} was tuned but not saved to {where}: {' '.join(str(error).split())}"
    return None


def _run_fixed(request: _Request, limits: Any, env: dict[str, Any], ceilings: dict[str, float], flush: Any,
               rng: Any) -> str:
    """The fixed shape list (and --fallback's, --overhead's rows): each timed and printed as it is done, then
    results.md, results.json and summary.md written to --out. Returns results.md's text."""
    args, out = request.args, request.out
    rows: list[Row] = []
    for kernel, shape, layout, seeds in request.todo:
        new = _bench_problem(kernel, shape, layout, args.dtype, seeds, limits, ceilings, flush, rng,
                             settings_for(kernel, args.dtype, request.precisions))
        rows += new
        for r in new:
            print(f"{r.kernel:<6} {r.layout:<3} {'x'.join(map(str, r.shape)):<17} {r.name:<28} {r.precision:<7} "
                  f"{r.time_ms:9.4f} ms {r.metric:>10,.0f} {r.unit:<7} {r.vs_cublas:5.2f}x cuBLAS "
                  f"{r.vs_ceiling:5.2f}x ceiling" + ("" if r.error == r.error else "  WRONG RESULT"), flush=True)
    if args.fallback:
        for kernel, shape, layout in FALLBACK:
            new = _fallback_problem(kernel, shape, layout, args.dtype, args.fallback, limits, ceilings, flush, rng)
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
    return markdown


def main(argv: list[str] | None = None, prog: str = "python -m autotile.cli.bench") -> int:
    """The benchmark: arguments checked (`_checked`), then --random's run, or the ceilings, --tune's tuning
    (`_tune_first`) and the fixed shape list (`_run_fixed`). Exit status 2 for a bad argument or no GPU, 1
    for a tuning result the cache could not take, 130 when interrupted."""
    args = _parser(prog).parse_args(argv)
    name = prog.removeprefix("python -m ")  # error lines name the module, or `autotile bench`

    from autotile.errors import AutotileError

    def fail(message: str, status: int = 2) -> int:
        print(f"{name}: error: {message}", file=sys.stderr)
        return status

    try:
        request = _checked(args)
    except AutotileError as exc:
        return fail(str(exc))
    try:
        from autotile.runtime.device import live_device

        limits = live_device()  # before CuPy is imported: no GPU or no CuPy is one line, not a traceback

        if request.random_n is not None:
            return _run_random(request.chosen, request.random_n, request.seed or 0, args.dtype, request.out, limits,
                               request.precisions, request.multiple or 1)

        import cupy

        from autotile.runtime.timing import L2Flusher

        env = environment(limits) | {"dtype": args.dtype}
        ceilings = measure_ceilings(limits)
        flush = L2Flusher(limits.l2_bytes)
        rng = cupy.random.default_rng(2026)
        if args.tune:
            stopped = _tune_first(request, limits)
            if stopped is not None:  # the next shapes' winners would be lost the same way
                return fail(stopped, 1)
        if args.tune_only:
            return 0
        markdown = _run_fixed(request, limits, env, ceilings, flush, rng)
    except AutotileError as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    print()
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
