"""`autotile survey` / `python -m autotile.tuning.survey`: build the shape database of this GPU (needs a GPU).

For each kernel, dtype and layout asked for: a portfolio of candidates (cuBLAS; the space's named starting
points; every config tuned on this device; K-split and short-row variants of them) is compiled once (a
kernel takes its sizes as arguments, so one compile serves every shape), then every candidate is
verified against a float64 reference (output poisoned first) and timed (CUDA events, L2 flushed, median)
on a grid of shapes: log-spaced sizes in every combination (square, skinny in each dimension, long K,
tiny K) and log-uniform random ones (odd sizes). The result goes to the user cache (or `--root`), where
the selection model reads it; `autotile survey --check` prints the model's held-out (leave-one-out) check.

Long surveys are saved as they go and resume where they stopped: a run cut short by `--budget` or
killed keeps every shape it finished.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from autotile.codegen import build, dtypes, kernels
from autotile.codegen.dtypes import DTYPE_NAMES
from autotile.codegen.limits import DeviceLimits
from autotile.codegen.problem import ProblemKey
from autotile.codegen.space import Config, Problem, Space
from autotile.errors import AutotileError

if TYPE_CHECKING:  # the cache needs filelock: imported where used, so that `autotile render` needs none
    from autotile.dispatch.cache import TuningCache
    from autotile.dispatch.database import Candidate, ShapeDatabase

# Sizes of the grid, log-spaced (a factor of about 2.8 apart), every combination, and as many random
# shapes again (log-uniform, odd sizes) drawn with a seed of their own: the benchmark's random shapes
# (`python -m autotile.cli.bench --random`) are drawn from other seeds, so they stay held out.
GRID = {"matmul": (16, 45, 128, 362, 1024, 2896, 8192), "matvec": (64, 174, 472, 1283, 3487, 9474, 25746, 65536)}
RANDOM_RANGE = {"matmul": (16, 12288), "matvec": (64, 65536)}
RANDOM_SHAPES = {"matmul": 80, "matvec": 40}
# matvec's random shapes with sizes rounded up to multiples of 8 (as frameworks pad them): a matvec kernel
# loads VEC elements at a time only where A's rows (or columns) start aligned to that, and the grid's sizes
# and the random ones above rarely are, so without these the model would judge aligned shapes by unaligned
# ones (measured on an H100, 2026-11-25: bfloat16 column-major 8192x8192 0.88x cuBLAS)
ALIGNED_RANDOM_SHAPES = {"matvec": 40}
# Decode-size rows (an LLM's tokens through a projection: M of 1 to 64 against large N and K), where the
# kernels that win (MATH=skinny) differ between layouts of B. matmul nn's grid has them as extra rows of A;
# other layouts get a database of their own over these rows only (DECODE_MAX_ROWS and below; their other
# shapes borrow nn's database, `ShapeDatabase.covers`).
DECODE_ROWS = (1, 2, 4, 8)
DECODE_MAX_ROWS = kernels.SKINNY_MAX_ROWS  # the rows of A the skinny kernels serve
DECODE_LAYOUTS = ("nt",)  # those of the types whose main layout is nn; of the 8-bit types (main nt): nn
# The decode-only databases' rows of A, denser than the main grid's between 8 and 64 (where the winner
# changes from a skinny kernel to a tensor-core tile with K splits), and their N and K.
DECODE_GRID_ROWS = (1, 2, 4, 8, 12, 16, 24, 32, 45, 64)
DECODE_SIZES = (128, 362, 1024, 2896, 8192)
DECODE_RANDOM_SHAPES = 30
# Batched matmul (bmm) has a database of its own: how a batch fills the GPU decides between tiles (a
# one-matrix choice run over a batch that already fills the GPU lost up to 0.57x torch.bmm). Its grid:
# every batch against every M, N and K of BMM_SIDES (within MAX_BMM_WORK), then random shapes drawn from
# BMM_RANGE, the range the benchmark draws its held-out batched problems from.
BMM_BATCHES = (2, 7, 24, 80, 256)
BMM_SIDES = (32, 128, 512, 2048)
BMM_RANGE = {"batch": (2, 256), "side": (32, 2048)}
MAX_BMM_WORK = 1 << 36  # batch x M x N x K: about 0.14 TFLOP, a few milliseconds of an H100's FP32 work
# Random rows of the bmm grid: most with rows that do not start 16-byte aligned (slower copies), as the grid has
# none. 360 rather than 120 (H100, 2026-12-06): held out, the model's pick on the first 120 rose 1.087 -> 1.110x
# cuBLAS (min 0.93 -> 0.99) and torch.bmm on the benchmark's random batches, seed 7, 1.10 -> 1.12x; 1,046 rows
# held out no better (1.106x on the first 120) and cost the grid's rows 1.368 -> 1.328x.
BMM_RANDOM_SHAPES = 360
SURVEYED_LAYOUTS = {"matmul": ("nn", *DECODE_LAYOUTS), "bmm": ("nn",), "matvec": ("row", "col")}
SURVEYED_KERNELS = tuple(SURVEYED_LAYOUTS)
MAX_MATMUL_WORK = 1 << 37  # M*N*K: the benchmark's bound, about 10 ms of an H100's FP32 work
MAX_MATVEC_ELEMENTS = 1 << 31  # M*K: 8 GiB of float32 (16 GiB of float64) for A, and its float64 reference
SURVEY_SEED = 20261122
SPLITS = {"matmul": (2, 4, 8, 16, 32, 64), "bmm": (2, 4, 8, 16, 32, 64), "matvec": (2, 4, 8, 16, 32)}
SAVE_EVERY_S = 30.0


def decode_only(kernel: str, layout: str | None, dtype: str = "float32") -> bool:
    """Whether a matmul database of `layout` is surveyed on decode-size shapes only: every layout but the
    dtype's main one (nn), which has the whole grid; an 8-bit type's kernels differ by layout (its nt
    copies with the TMA alone, its nn transposes B), so both of its layouts have the whole grid."""
    if kernel != "matmul" or layout not in SURVEYED_LAYOUTS["matmul"] or dtypes.get(dtype).k_major_only:
        return False
    return layout != dtypes.main_layout(dtype)


def grid(kernel: str, seed: int = SURVEY_SEED, random_shapes: int | None = None,
         layout: str | None = None, dtype: str = "float32") -> list[tuple[int, ...]]:
    """The survey's shapes: the grid's combinations, then log-uniform random ones (deterministic). The
    dtype's main matmul layout also has the decode rows; its other surveyed layout has only decode-size
    shapes (M up to DECODE_MAX_ROWS, `decode_grid`); bmm has its own (`bmm_grid`)."""
    if decode_only(kernel, layout, dtype):
        return decode_grid(seed, DECODE_RANDOM_SHAPES if random_shapes is None else random_shapes)
    if kernel == "bmm":
        return bmm_grid(seed, BMM_RANDOM_SHAPES if random_shapes is None else random_shapes)
    sizes = GRID[kernel]
    shapes: list[tuple[int, ...]]
    if kernel == "matmul":
        shapes = [(m, n, k) for m in sizes for n in sizes for k in sizes if m * n * k <= MAX_MATMUL_WORK]
        shapes += [(m, n, k) for m in DECODE_ROWS for n in sizes for k in sizes]
    else:
        shapes = [(m, k) for m in sizes for k in sizes if m * k <= MAX_MATVEC_ELEMENTS]
    want = RANDOM_SHAPES[kernel] if random_shapes is None else random_shapes
    bound = MAX_MATMUL_WORK if kernel == "matmul" else MAX_MATVEC_ELEMENTS
    seen = set(shapes)
    shapes += _log_uniform_shapes(np.random.default_rng(seed), [RANDOM_RANGE[kernel]] * len(shapes[0]), want, seen,
                                  bound)
    aligned = ALIGNED_RANDOM_SHAPES.get(kernel, 0) if random_shapes is None else 0
    # seed + 3: none of the other random shapes
    return shapes + _log_uniform_shapes(np.random.default_rng(seed + 3), [RANDOM_RANGE[kernel]] * len(shapes[0]),
                                        aligned, seen, bound, multiple=8)


def _log_uniform_shapes(rng: np.random.Generator, ranges: list[tuple[int, int]], count: int,
                        seen: set[tuple[int, ...]], max_product: float, multiple: int = 1) -> list[tuple[int, ...]]:
    """`count` shapes, each size log-uniform in its dimension's (low, high), rounded, then rounded up to a
    multiple of `multiple`; none of them in `seen` (which gains them) and none whose product exceeds
    `max_product`. Deterministic in `rng`."""
    lows = np.array([math.log(lo) for lo, _ in ranges])
    highs = np.array([math.log(hi) for _, hi in ranges])
    found: list[tuple[int, ...]] = []
    while len(found) < count:
        shape = tuple(-(-int(round(math.exp(v))) // multiple) * multiple for v in rng.uniform(lows, highs))
        if shape not in seen and math.prod(shape) <= max_product:
            seen.add(shape)
            found.append(shape)
    return found


def decode_grid(seed: int = SURVEY_SEED, random_shapes: int = DECODE_RANDOM_SHAPES) -> list[tuple[int, ...]]:
    """Decode-size matmul shapes: every M of DECODE_GRID_ROWS against every N and K of DECODE_SIZES, then
    random ones (M log-uniform in 1 to DECODE_MAX_ROWS, N and K in 128 to 12288)."""
    shapes: list[tuple[int, ...]] = [(m, n, k) for m in DECODE_GRID_ROWS for n in DECODE_SIZES for k in DECODE_SIZES]
    ranges = [(1, DECODE_MAX_ROWS), (128, 12288), (128, 12288)]
    # seed + 1: not the main grid's random shapes
    return shapes + _log_uniform_shapes(np.random.default_rng(seed + 1), ranges, random_shapes, set(shapes), math.inf)


def bmm_grid(seed: int = SURVEY_SEED, random_shapes: int = BMM_RANDOM_SHAPES) -> list[tuple[int, ...]]:
    """Batched matmul shapes (batch, M, N, K): every batch of BMM_BATCHES against every M, N and K of BMM_SIDES,
    then random ones (each size log-uniform in BMM_RANGE); all within MAX_BMM_WORK."""
    shapes: list[tuple[int, ...]] = [(b, m, n, k) for b in BMM_BATCHES for m in BMM_SIDES for n in BMM_SIDES
                                     for k in BMM_SIDES if b * m * n * k <= MAX_BMM_WORK]
    ranges = [BMM_RANGE["batch"], *[BMM_RANGE["side"]] * 3]
    # seed + 2: neither the main grid's random shapes nor the decode grid's
    return shapes + _log_uniform_shapes(np.random.default_rng(seed + 2), ranges, random_shapes, set(shapes),
                                        MAX_BMM_WORK)


def coverage(kernel: str, layout: str, dtype: str = "float32") -> list[int | None] | None:
    """The largest size per dimension a database of (kernel, layout, dtype) is surveyed for (None:
    unbounded), or None where it covers every shape."""
    if decode_only(kernel, layout, dtype):
        return [DECODE_MAX_ROWS, None, None]
    return None


def portfolio(kernel: str, dtype: str, layout: str, device: DeviceLimits,
              cache: TuningCache | None = None) -> list[tuple[str, Config]]:
    """The generated candidates (name, config), feasible on `device`, without duplicates: the space's named
    configs (not the seeds: they are baselines, never fast), the configs tuned on this device for any
    shape, and variants of them: K splits for shapes that leave the GPU under-filled, and for row-major
    matvec several short rows per warp."""
    from autotile.dispatch.cache import TuningCache

    spec = kernels.get(kernel)
    space = spec.space
    problem = Problem(device, dtype, layout)
    found: dict[Config, str] = {}

    def add(name: str, config: Config) -> None:
        if config not in found and space.is_feasible(config, problem):
            found[config] = name

    for name, config in space.named_configs.items():
        # wgmma with LOADER=registers is left out: its LOADER=tma twin loads through registers itself
        # wherever a tensor map cannot describe an operand, and copies faster everywhere else (a persistent
        # one has no twin: LOADER=tma takes no PERSISTENT).
        if config.get("MATH") == "wgmma" and config.get("LOADER") == "registers" and not config.get("PERSISTENT"):
            continue
        if not name.startswith("seed-") and space.named_layouts.get(name, layout) == layout:
            add(name, config)
    from autotile.dispatch.select import record_config

    for _, record in (cache or TuningCache()).entries(device.fingerprint, include_shipped=True):
        if (record.kernel, record.layout) != (kernel, layout):
            continue
        tuned = record_config(record)
        if tuned is None:
            continue
        shape = "x".join(map(str, record.shape))
        if record.dtype == dtype:
            add("tuned-" + shape, tuned)
        elif kernel == "matvec":  # a matvec is bandwidth-bound whatever it sums: another dtype's tunes lend
            lent = lent_matvec_config(space, tuned, record.dtype, dtype)
            if lent is not None:
                add(f"tuned-{record.dtype}-{shape}", lent)
    if kernel == "matvec" and layout == "row":
        vec = 16 // dtypes.get(dtype).size  # 16-byte loads
        for lanes in (2, 4, 8, 16):
            add(f"rows-{lanes}-lanes", space.config({
                "smem": "none", "ROWS": 256 // lanes, "THREADS_K": lanes, "VEC": vec, "X_SHARED": False,
                "STAGE_A": False, "TILE_K": 16, "SPLIT_K": 1, "UNROLL": 4, "BATCH": True}))
    # K-split variants of the named starting points (not of every tuned config: those are mostly the same
    # tiles again, and each variant costs survey time on every under-filled shape).
    # Large matmul tiles are left unsplit: a shape small enough to need splits is better served by a small
    # tile split (measured on an H100: every split winner had a tile of 128 x 64 or less).
    bases = [(config, name) for config, name in found.items()
             if not name.startswith("tuned-") and ("BM" not in config or config["BM"] * config["BN"] <= 128 * 64)]
    for config, name in bases:
        for split in SPLITS[kernel]:
            if split == config["SPLIT_K"]:
                continue
            overrides: dict[str, Any] = {"SPLIT_K": split}
            if "SPLIT_REDUCE" in space.params and split > 1:
                overrides["SPLIT_REDUCE"] = "last_block"  # no zeroing launch, no atomics on the output
            try:
                add(f"{name}/split{split}", space.with_overrides(config, overrides))
            except Exception:  # a variant the space refuses (a constraint on SPLIT_K): not a candidate
                continue
    # 16-byte-load variants of the 16-bit skinny kernels (split or not): VEC 8 where B's rows allow it (K a
    # multiple of 8 for x @ W.T, N for x @ W), as float32's VEC 4 loads; rows aligned to 4 elements only keep
    # the VEC 4 kernel's vector path, so both stay candidates.
    for config, name in list(found.items()):
        if config.get("MATH") == "skinny" and config.get("VEC") == 4 and dtypes.get(dtype).size == 2:
            add(f"{name}/vec8", space.with_overrides(config, {"VEC": 8}))  # `add` drops the infeasible ones
    # Staged-store variants of the float32 tensor-core kernels (wgmma, and mma.sync tf32x3 without K splits):
    # the same kernel where C's rows are 8-byte aligned, and where they are not (N odd: half of all random
    # shapes) row stores of 32 neighbours instead of two 4-byte stores per pair.
    for config, name in list(found.items()):
        if config.get("MATH") in ("wgmma", "tf32x3") and config.get("STORE") == "direct":
            try:
                add(f"{name}/staged", space.with_overrides(config, {"STORE": "staged"}))
            except AutotileError:  # a variant the space refuses: not a candidate
                continue
    # Narrow-copy variants (their staged twins included) of the mma.sync kernels that copy 4 elements at a time
    # (tf32x3 and mma) and of the wgmma kernels whose producers load into registers: where an operand's rows
    # start 2-element aligned but not 4 (a quarter of random sizes), copies of 2 elements instead of single
    # ones (wgmma: and no edge guards inside the matrix).
    for config, name in list(found.items()):
        narrowed = (config.get("MATH") in ("tf32x3", "mma") and config.get("VEC") == 4) or (
            config.get("MATH") == "wgmma" and config.get("LOADER") != "presplit")
        if narrowed and not config.get("NARROW_COPIES"):
            try:
                add(f"{name}/narrow", space.with_overrides(config, {"NARROW_COPIES": True}))
            except AutotileError:  # a variant the space refuses: not a candidate
                continue
    # Realigned variants of the mma.sync, wgmma_direct and skinny kernels (split or not; the space's constraint
    # keeps the types they serve, and `add` drops the rest): where an operand's rows do not start aligned (7 of
    # 8 random sizes for the 16-bit types), each vector read as the aligned pieces that hold it and shifted into
    # place, instead of single elements.
    for config, name in list(found.items()):
        realigned = config.get("MATH") in ("mma", "wgmma_direct", "skinny")
        if realigned and not config.get("NARROW_COPIES") and not config.get("REALIGN"):
            try:
                add(f"{name}/realign", space.with_overrides(config, {"REALIGN": True}))
            except AutotileError:  # a variant the space refuses: not a candidate
                continue
    return [(name, config) for config, name in found.items()]


def extension(previous: ShapeDatabase | None, configs: list[tuple[str, Config]], names: list[str]
              ) -> list[tuple[str, Config]]:
    """The candidates of a survey that extends `previous` by the portfolio entries `names` only: previous's
    generated candidates as they are (kept, not timed again), then those of `configs` (the portfolio) named.
    A name `*/VARIANT` stands for the portfolio's VARIANT twin of each of previous's columns, where it has one
    (`*/realign`: `mma-64/realign` for a column `mma-64`). Raises `InvalidValueError` for a name the
    portfolio lacks (or a `*/` name no column has a twin of), or where there is no database to extend."""
    from autotile.errors import InvalidValueError

    if previous is None:
        raise InvalidValueError("--add extends a shape database, and there is none for this problem family yet: "
                                "run the survey without --add first")
    offered = dict(configs)
    names = _expand_twins(names, [c.name for c in previous.candidates], offered)
    missing = [n for n in names if n not in offered]
    if missing:
        raise InvalidValueError(f"--add: {', '.join(missing)} not in the portfolio; it has {', '.join(offered)}")
    space = kernels.get(previous.kernel).space
    kept: list[tuple[str, Config]] = []
    for c in previous.candidates:
        if c.implementation == "generated" and c.config is not None:
            try:
                kept.append((c.name, space.config(c.config)))
            except AutotileError:  # a parameter or value this space no longer has: not a candidate now
                continue
    have = {name for name, _ in kept}
    return kept + [(n, offered[n]) for n in names if n not in have]


def _expand_twins(names: list[str], columns: list[str], offered: dict[str, Config]) -> list[str]:
    """`names` with each `*/VARIANT` replaced by the offered `COLUMN/VARIANT` names of `columns`, in their
    order (a `*/` name that matches none stays, for the caller to report as missing)."""
    out: list[str] = []
    for name in names:
        if not name.startswith("*/"):
            out.append(name)
            continue
        twins = [column + name[1:] for column in columns]  # name[1:] is "/VARIANT"
        out.extend([twin for twin in twins if twin in offered] or [name])
    return list(dict.fromkeys(out))


def lent_matvec_config(space: Space, config: Config, tuned_dtype: str, dtype: str) -> Config | None:
    """A matvec config tuned for `tuned_dtype`, as `dtype` would run it: the same bytes per load (VEC scaled
    by the ratio of the element sizes), and K splits summed by the last block, as the 16-bit types must (their
    float32 sums are rounded once); None where the space has no such config."""
    vec = config["VEC"] * dtypes.get(tuned_dtype).size // dtypes.get(dtype).size
    overrides: dict[str, Any] = {"VEC": vec}
    if config["SPLIT_K"] > 1:
        overrides["SPLIT_REDUCE"] = "last_block"
    try:
        return space.with_overrides(config, overrides)
    except AutotileError:
        return None


def survey(kernel: str, dtype: str, layout: str, device: DeviceLimits, shapes: list[tuple[int, ...]],
           configs: list[tuple[str, Config]], *, previous: ShapeDatabase | None = None,
           save: Callable[[ShapeDatabase], Any] | None = None, budget_s: float | None = None,
           log: Callable[[str], None] = print) -> ShapeDatabase:
    """Verify and time every candidate on every shape; returns the database (also passed to `save` every
    SAVE_EVERY_S and at the end).

    What `previous` timed is kept, not timed again: each of its candidates that is still a candidate (same
    name, config and kernel source) keeps its column. A candidate it lacks (a new named config, a newly
    tuned one) is timed on its shapes together with cuBLAS, and its times are scaled by cuBLAS's then
    over cuBLAS's now, so that each row's ratios to cuBLAS stay same-run ratios (clocks and neighbours
    move absolute times on a shared GPU by a few percent between runs)."""
    import cupy

    from autotile.dispatch.database import Candidate, ShapeDatabase
    from autotile.dispatch.model import Model, fitted_environment, worth_timing
    from autotile.runtime.cublas import unsupported_reason
    from autotile.runtime.impl import Cublas, Generated
    from autotile.runtime.timing import L2Flusher, relative_error, time_launch

    spec = kernels.get(kernel)
    candidates = [Candidate("cublas", "cublas")] + [
        Candidate(name, "generated", dict(config), kernels.source_hash(spec.render(config, dtype, layout)))
        for name, config in configs]
    implementations = [Cublas()] + [Generated(config) for _, config in configs]
    done: dict[tuple[int, ...], list[float | None]] = {}
    # previous's rows, by shape, re-indexed to today's candidates (_UNTIMED where a column is new)
    kept: dict[tuple[int, ...], list[float | None | str]] = {}
    env = _environment(device)
    env["failures"] = {}
    covered = coverage(kernel, layout, dtype)
    if covered is not None:
        env["max_shape"] = covered
    if previous is not None:
        where = [_column_of(c, previous, spec.space) for c in candidates]
        # Columns a budget stopped before they were timed on some shapes (saved as None there).
        pending = previous.environment.get("pending", {})
        pending_names = set(pending.get("candidates", []))
        pending_shapes = {tuple(p) for p in pending.get("shapes", [])}
        for shape, old_row in zip(previous.shapes, previous.times_ms, strict=True):
            kept_row: list[float | None | str] = [
                _UNTIMED if j is None or (tuple(shape) in pending_shapes and c.name in pending_names) else old_row[j]
                for c, j in zip(candidates, where, strict=True)]
            if _UNTIMED in kept_row:
                kept[tuple(shape)] = kept_row
            else:
                done[tuple(shape)] = [t for t in kept_row if not isinstance(t, str)]
        names = {c.name for c, j in zip(candidates, where, strict=True) if j is not None}
        env["failures"] = {n: why for n, why in previous.environment.get("failures", {}).items() if n in names}
        env["extended"] = list(previous.environment.get("extended", []))
        added = [c.name for c, j in zip(candidates, where, strict=True) if j is None or c.name in pending_names]
        if kept and added:
            env["extended"].append({"date": env["date"], "candidates": added, "over": previous.environment.get(
                "date", "?"), "scaled_by": "cuBLAS timed in the same run"})

    def database() -> ShapeDatabase:
        # Kept rows not completed yet are saved too, their new columns None and listed as pending, so that
        # the next run times them (and nothing the previous survey measured is dropped meanwhile).
        unfinished = [s for s in shapes if s in kept and s not in done]
        rows = {**{s: [None if isinstance(t, str) else t for t in kept[s]] for s in unfinished}, **done}
        order = [s for s in shapes if s in rows]
        untimed = sorted({candidates[j].name for s in unfinished for j, t in enumerate(kept[s]) if isinstance(t, str)})
        environment = {**env, "pending": {"candidates": untimed, "shapes": [list(s) for s in unfinished]}} \
            if unfinished else {k: v for k, v in env.items() if k != "pending"}
        return ShapeDatabase(kernel, dtype, layout, device.fingerprint, tuple(candidates), tuple(order),
                             tuple(tuple(rows[s]) for s in order), environment)

    # One compile per candidate, all in parallel before the first shape.
    futures = build.compile_many(((spec.render(c, dtype, layout), spec.function_name) for _, c in configs),
                                 workers=8)
    for (name, _), future in zip(configs, futures, strict=True):
        try:
            future.result()
        except Exception as exc:
            env["failures"][name] = f"compile: {' '.join(str(exc).split())[:200]}"
    flush = L2Flusher(device.l2_bytes)
    rng = cupy.random.default_rng(SURVEY_SEED)
    start = last_save = time.monotonic()
    # In a seeded random order, so that a survey stopped by its budget still covers the whole range.
    todo = [s for s in shapes if s not in done]
    todo = [todo[i] for i in np.random.default_rng(SURVEY_SEED).permutation(len(todo))]
    log(f"survey {kernel} {dtype} {layout}: {len(candidates)} candidates, {len(todo)} shapes to time "
        f"({len(done)} kept)")
    for n, shape in enumerate(todo):
        if budget_s is not None and time.monotonic() - start > budget_s:
            log(f"survey {kernel} {dtype} {layout}: stopped by the budget after {n} of {len(todo)} shapes; "
                "run again to continue")
            break
        key = ProblemKey(kernel, dtype, layout, shape)
        inputs = spec.make_inputs(shape, dtype, layout, rng, cupy)
        ref = spec.reference(inputs, dtype)
        out = cupy.empty(spec.output_shape(shape), dtype=dtypes.output_storage(dtype))
        tol = kernels.tolerance(dtype, shape[-1])
        old = kept.get(shape)
        row: list[float | None] = []
        for j, (cand, implementation) in enumerate(zip(candidates, implementations, strict=True)):
            before = old[j] if old is not None else _UNTIMED
            if not isinstance(before, str) and not (j == 0 and before is not None):
                row.append(before)  # timed before (cuBLAS, column 0, is timed again: the scale)
                continue
            if cand.name in env["failures"] or (
                    cand.config is not None
                    and not worth_timing(kernel, spec.space.config(cand.config), shape, device.sm_count)) or (
                    cand.config is None and unsupported_reason(key) is not None):  # int8's odd leading dimensions
                row.append(None)
                continue
            try:
                runner = implementation.prepare(key)

                def run(runner: Any = runner, inputs: Any = inputs, out: Any = out) -> None:
                    runner.run(inputs, out)

                kernels.poison(out)
                run()
                err = relative_error(out, ref)
                if not err <= tol:  # NaN fails too
                    env["failures"][cand.name] = f"wrong result on {'x'.join(map(str, shape))}: error {err:.2e}"
                    row.append(None)
                    continue
                row.append(time_launch(run, flush, warmup=2, min_reps=5, max_reps=15, target_ms=15.0).median_ms)
            except Exception as exc:  # one bad candidate never ends the survey
                env["failures"][cand.name] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
                row.append(None)
        if old is not None:
            row = _rescaled(row, old)
        done[shape] = row
        del inputs, ref, out
        if save is not None and time.monotonic() - last_save > SAVE_EVERY_S:
            save(database())
            last_save = time.monotonic()
        if (n + 1) % 25 == 0:
            log(f"  {n + 1}/{len(todo)} shapes, {time.monotonic() - start:.0f} s")
    db = database()
    if db.shapes:
        model = Model(db, device)
        params, held_out = model.fit(focus=[s for s, drawn in zip(db.shapes, drawn_rows(db), strict=True) if drawn])
        env["model"] = fitted_environment(params, held_out)
        db = database()
    if save is not None:
        save(db)
    return db


_UNTIMED = "untimed"  # a kept row's column that the previous survey did not have


def _column_of(candidate: Candidate, previous: ShapeDatabase, space: Any) -> int | None:
    """The column of `previous` that timed this very candidate: same name and implementation, the same
    config once completed with the defaults of parameters added since, and the same kernel source."""
    for j, old in enumerate(previous.candidates):
        if (old.name, old.implementation, old.source_sha) != (candidate.name, candidate.implementation,
                                                              candidate.source_sha):
            continue
        if old.config is None or candidate.config is None:
            return j if old.config is None and candidate.config is None else None
        try:
            same = space.config(old.config) == space.config(candidate.config)
        except Exception:  # a parameter or value the space no longer has: not this candidate
            same = False
        return j if same else None
    return None


def _rescaled(row: list[float | None], old: list[float | None | str]) -> list[float | None]:
    """A kept row completed: the previous times where it had them, the new columns' times (timed now, with
    cuBLAS in column 0) scaled by cuBLAS's previous time over its time now; unscaled where either cuBLAS
    time is missing."""
    then, now = old[0], row[0]
    scale = then / now if isinstance(then, (int, float)) and now is not None and now > 0 else 1.0
    out: list[float | None] = []
    for j, t in enumerate(row):
        previous = old[j]
        if j == 0 or not isinstance(previous, str):
            out.append(previous if not isinstance(previous, str) else t)  # what the previous survey measured
        else:
            out.append(None if t is None else t * scale)
    return out


def _environment(device: DeviceLimits) -> dict[str, Any]:
    import cupy

    rt = cupy.cuda.runtime
    return {"gpu": device.name, "date": time.strftime("%Y-%m-%d"), "driver": rt.driverGetVersion(),
            "cuda_runtime": rt.runtimeGetVersion(), "cupy": cupy.__version__,
            "compiler": build.compiler_version(), "compile_options": list(build.COMPILE_OPTIONS)}


def drawn_rows(db: ShapeDatabase) -> list[bool]:
    """Per row of `db`, whether its shape is off the survey's grid (drawn at random, as the benchmarks draw
    their held-out problems; a row of an older grid counts too): the grid's rows are mostly sides that are
    powers of two, on which the kernels fit their tiles, so their held-out figures run higher than random
    shapes see."""
    on_grid = set(grid(db.kernel, random_shapes=0, layout=db.layout, dtype=db.dtype))
    return [tuple(shape) not in on_grid for shape in db.shapes]


def check_report(db: ShapeDatabase, device: DeviceLimits) -> str:
    """The model's leave-one-out check on a database, as text: the distribution of measured speed-ups
    over cuBLAS of what the model chose for each held-out shape, the same for the grid's rows and for the
    rows drawn at random (the figure to expect on random shapes), and the worst shapes."""
    from autotile.dispatch.model import Model, params_of, summary

    model = Model(db, device)
    params = params_of(db)
    rows = model.cross_validate(params)
    s = summary([r for _, _, r, _ in rows])
    oracle = summary([b for _, _, _, b in rows])
    lines = [f"{db.kernel} {db.dtype} {db.layout} on {db.environment.get('gpu', db.device)}: "
             f"{len(db.shapes)} shapes, {len(db.candidates)} candidates; model {params}",
             f"  leave-one-out, {s.get('n', 0)} shapes: min {s.get('min', 0):.2f} p10 {s.get('p10', 0):.2f} "
             f"median {s.get('median', 0):.2f} geomean {s.get('geomean', 0):.2f}, "
             f">=1.0x {100 * s.get('at_least_1', 0):.0f}%, >=0.97x {100 * s.get('at_least_097', 0):.0f}%",
             f"  best candidate per shape (the oracle): geomean {oracle.get('geomean', 0):.2f}"]
    drawn = {tuple(shape) for shape, off_grid in zip(db.shapes, drawn_rows(db), strict=True) if off_grid}
    # cuBLAS, or the generated reference where cuBLAS has no call (int8's nn)
    reference = "none" if model.reference is None else db.candidates[model.reference].name
    for name, wanted in (("the grid's rows", False), ("rows drawn at random", True)):
        part = [r for r in rows if (tuple(r[0]) in drawn) == wanted]
        if part:
            p, o = summary([r[2] for r in part]), summary([r[3] for r in part])
            on_reference = sum(1 for r in part if r[1] == reference)
            lines.append(f"  {name}, {p['n']}: leave-one-out geomean {p['geomean']:.2f} (min {p['min']:.2f}, "
                         f">=0.97x {100 * p['at_least_097']:.0f}%, {reference} chosen on {on_reference}), "
                         f"oracle {o['geomean']:.2f}")
    for shape, name, ratio, best in sorted(rows, key=lambda r: r[2])[:5]:
        lines.append(f"  worst: {'x'.join(map(str, shape))} ran {name} at {ratio:.2f}x (best there {best:.2f}x)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="autotile survey", description=(__doc__ or "").splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kernels", default=",".join(SURVEYED_KERNELS),
                        help=f"comma-separated, from {', '.join(SURVEYED_KERNELS)} (bmm: batched matmul)")
    parser.add_argument("--dtype", default="float32", choices=list(DTYPE_NAMES),
                        help="element type (default float32)")
    parser.add_argument("--layouts", default="row,col,nn,nt",
                        help="layouts, each kernel taking its own: matvec row, col; matmul nn (the whole grid) and "
                             "nt (decode-size shapes only: its other shapes, and tn and tt, borrow nn's database; "
                             "for int8 both have the whole grid); bmm nn (its other layouts "
                             "borrow bmm nn's database)")
    parser.add_argument("--root", default=None, help="cache root to write to (default: the user cache)")
    parser.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                        help="stop each kernel's survey after this long (it resumes on the next run)")
    parser.add_argument("--random-shapes", type=int, default=None, metavar="N",
                        help="random shapes besides the grid (default 80 matmul, 40 matvec)")
    parser.add_argument("--add", default=None, metavar="NAMES",
                        help="extend the existing database (yours, else the shipped one) with these portfolio "
                             "candidates only (comma-separated names, such as mma-32,mma-64/split4; */realign: the "
                             "/realign twin of each of its columns): its columns are kept, the new ones timed with "
                             "cuBLAS again")
    parser.add_argument("--check", action="store_true",
                        help="only print the model's leave-one-out check of the databases there are")
    parser.add_argument("--device", default=None,
                        help="with --check: an offline profile (h100, h200, ...) instead of the live GPU")


def run(args: argparse.Namespace) -> int:
    from autotile.dispatch import database
    from autotile.dispatch.cache import TuningCache
    from autotile.errors import AutotileError, InvalidValueError
    from autotile.tuning import validate

    try:
        chosen = [k.strip() for k in args.kernels.split(",") if k.strip()]
        bad = [k for k in chosen if k not in SURVEYED_LAYOUTS]
        if bad or not chosen:
            raise InvalidValueError(f"--kernels {args.kernels!r}: choose from {', '.join(SURVEYED_KERNELS)} "
                                    "(comma-separated)")
        layouts = [v.strip() for v in args.layouts.split(",") if v.strip()]
        if not layouts or any(v not in sum(SURVEYED_LAYOUTS.values(), ()) for v in layouts):
            choices = "; ".join(f"{', '.join(v)} ({k})" for k, v in SURVEYED_LAYOUTS.items())
            raise InvalidValueError(f"--layouts {args.layouts!r}: choose from {choices}, comma-separated")
        budget = validate.seconds(args.budget, name="--budget", allow_none=True)
        if args.random_shapes is not None:
            validate.count(args.random_shapes, name="--random-shapes", minimum=0)
        root = Path(validate.writable_folder(args.root, name="--root")) if args.root else None
        from autotile.runtime.device import live_device, resolve

        if args.device is not None and not args.check:
            raise InvalidValueError("--device works only with --check (a survey times the live GPU)")
        device = resolve(args.device) if args.device is not None else live_device()
        cache = TuningCache(root=root) if root else TuningCache()
        # A survey resumes only its own root's database: the shipped one is for reading, not continuing.
        own = TuningCache(root=cache.root, shipped_root=None)
        for kernel in chosen:
            for layout in (v for v in layouts if v in SURVEYED_LAYOUTS[kernel]):
                previous = database.load(cache if args.check else own, device.fingerprint, kernel, args.dtype,
                                         layout)
                if args.check:
                    if previous is None:
                        print(f"{kernel} {args.dtype} {layout}: no shape database for {device.name}")
                    else:
                        print(check_report(previous, device))
                    continue
                configs = portfolio(kernel, args.dtype, layout, device, cache)
                if args.add:  # your database, else the shipped one
                    previous = previous or database.load(cache, device.fingerprint, kernel, args.dtype, layout)
                    configs = extension(previous, configs, [n.strip() for n in args.add.split(",") if n.strip()])
                shapes = grid(kernel, random_shapes=args.random_shapes, layout=layout, dtype=args.dtype)
                db = survey(kernel, args.dtype, layout, device, shapes,
                            configs, previous=previous, save=lambda d: database.save(cache, d),
                            budget_s=budget, log=lambda m: print(m, flush=True))
                print(f"wrote {database.path_in(cache.root, device.fingerprint, kernel, args.dtype, layout)}")
                print(check_report(db, device), flush=True)
    except AutotileError as exc:
        print(f"autotile survey: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("autotile survey: interrupted (the shapes timed so far are saved)", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
