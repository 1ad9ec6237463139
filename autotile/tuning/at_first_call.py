"""Tuning at first call (opt-in): the first library call on a shape with no tuned record times a short
portfolio and cuBLAS in-process, runs the winner, and stores it in the cache for every later process.

Off by default; the switch, and the slot this tuner is plugged into, are `autotile.dispatch.first_call`.
Only configs that already passed
verification on this device are timed (the candidates of its shape database, which `autotile survey`
verified, and the configs tuned on it), so no candidate can crash or hang the caller's process and no
isolation is needed. Where a database exists, the model's best-ranked candidates are timed, not all. Only
candidates the float32 matmul precision setting allows are timed (`autotile.dispatch.precision`: under "highest",
no tf32x3 config); cuBLAS always is.

Cost: one compile per candidate not yet in the compile cache (all of them in parallel), plus a few timed runs
of each on scratch inputs of the call's shape (the caller's arrays are never written but by the final run).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import TYPE_CHECKING, Any

from autotile.codegen import dtypes, kernels
from autotile.codegen.limits import DeviceLimits
from autotile.codegen.problem import ProblemKey
from autotile.dispatch import precision as precision_mod

if TYPE_CHECKING:  # the selection chain reads the cache (filelock): imported where it is used
    from autotile.dispatch.select import Selection

MAX_CANDIDATES = 6  # generated candidates timed per shape, besides cuBLAS
_flusher: Any = None


class FirstCallWarning(UserWarning):
    """Tuning at first call failed; the call went on with the selection chain's choice."""


def candidates(key: ProblemKey, device: DeviceLimits, cache: Any, precision: str | None = None) -> list[Selection]:
    """What is timed: the model's ranking of the usable candidates of the problem's database, or of the
    first database it borrows (`dispatch.select.borrowed_keys`: float16 bfloat16's, the 8-bit floats
    int8's), this GPU's before a sibling GPU's (`database.find_first`), at most MAX_CANDIDATES,
    or, without one, the configs tuned on this device; and cuBLAS where it can run the problem. Only what
    the precision setting allows (None: the process-wide setting)."""
    from autotile.codegen.space import Problem
    from autotile.dispatch import database
    from autotile.dispatch.model import model_for, worth_timing
    from autotile.dispatch.select import Selection, database_families, is_current, record_config
    from autotile.runtime.cublas import unsupported_reason

    setting = precision_mod.resolve(precision)
    spec = kernels.get(key.kernel)
    problem = Problem(device, key.dtype, key.layout)
    cublas_runs = unsupported_reason(key) is None
    found: dict[Any, Selection] = {}
    lender = database.find_first(cache, device.fingerprint, database_families(key),
                                 accept=lambda db: bool(db.shapes) and db.covers(key.shape))
    if lender is not None:
        m = model_for(lender, device, cublas_runs)
        ranked = m.rank(key.shape, setting=setting)
        if m.reference is not None and m.configs[m.reference] is not None:
            ranked.append(m.reference)  # a generated reference (where cuBLAS cannot run) is a candidate too
        for j in ranked:
            config = m.configs[j]
            if config is None or not spec.space.is_feasible(config, problem) or len(found) >= MAX_CANDIDATES:
                continue
            found.setdefault(config, Selection(config, "first call", None, step="first call",
                                               why=f"survey candidate {lender.candidates[j].name}", precision=setting))
    else:
        for _, record in cache.entries(device.fingerprint, include_shipped=True):
            if (record.kernel, record.dtype, record.layout) != (key.kernel, key.dtype, key.layout):
                continue
            config = record_config(record)
            if (config is not None and is_current(record) and spec.space.is_feasible(config, problem)
                    and precision_mod.allows(setting, precision_mod.needed(key.kernel, key.dtype, config))
                    and worth_timing(key.kernel, config, key.shape, device.sm_count)):
                found.setdefault(config, Selection(config, "first call", None, step="first call",
                                                   why="tuned on " + "x".join(map(str, record.shape)),
                                                   precision=setting))
    cublas = ([Selection(None, "first call", None, None, "cublas", precision=setting, step="first call")]
              if cublas_runs else [])
    return cublas + list(found.values())[:MAX_CANDIDATES]


def compile_ahead(key: ProblemKey, listed: list[Selection]) -> None:
    """Compile the generated candidates of `listed` for `key` all at once, before any is timed, and wait for
    them: NVRTC runs without the GIL, so a first call that finds none of them in the compile cache waits about
    as long as the slowest compile rather than their sum (on an H100, 2026-12-06: 1.6-4.0 s for a batch shape
    whose six candidates compiled one after another). A candidate that fails to compile is not reported here:
    preparing it fails again, and the timing loop skips it with its reason."""
    from autotile.codegen import build

    spec = kernels.get(key.kernel)
    jobs = sorted({(spec.render(sel.config, key.dtype, key.layout), spec.function_name)
                   for sel in listed if sel.config is not None})
    if len(jobs) < 2:  # nothing to overlap
        return
    for future in build.compile_many(jobs, workers=min(len(jobs), build.host_compile_threads())):
        future.exception()  # waits; the error, if any, comes back when the candidate is prepared


def tune_here(key: ProblemKey, device: DeviceLimits, cache: Any, fallback: Selection,
              precision: str | None = None) -> Selection:
    """Time the candidates the precision setting allows (None: the process-wide one) on scratch inputs of
    `key`'s shape, store the winner, return it. Any failure warns and returns `fallback`: the user's call
    never fails because tuning did."""
    setting = precision_mod.resolve(precision)  # a bad setting is the caller's error, not a tuning failure
    try:
        return _tune(key, device, cache, setting)
    except Exception as exc:  # never the caller's problem: run what the chain chose
        warnings.warn(FirstCallWarning(f"tuning {key.kernel} {key.dtype} {key.layout} "
                                       f"{'x'.join(map(str, key.shape))} at first call failed ({exc}); "
                                       f"running {fallback.explain()}"), stacklevel=3)
        return fallback


def tune_listed(keys: list[ProblemKey], device: DeviceLimits, cache: Any, setting: str | None,
                say: Any = print) -> dict[ProblemKey, str | None]:
    """Tuning at first call's timing for each problem of `keys` in turn, in this process (`autotile batch
    --shortlist`: seconds per problem where an optuna search takes minutes): its record stored, a line said per
    problem. A problem with a current record of its own already (`Selection.tuned_here`, under `setting`; None:
    the process-wide one) is skipped, so a run stopped part way resumes; one that fails is said and the next goes
    on. Returns, per problem, None where it is tuned (now or before) and the reason where it failed."""
    from autotile.dispatch.select import select

    setting = precision_mod.resolve(setting)
    outcome: dict[ProblemKey, str | None] = {}
    for n, key in enumerate(keys, 1):
        where = f"[{n}/{len(keys)}] {key}"
        try:
            if select(key, device, cache, precision=setting).tuned_here:
                say(f"{where}: tuned before")
                outcome[key] = None
                continue
            chosen = _tune(key, device, cache, setting)
        except Exception as exc:  # one problem's failure never ends the list
            outcome[key] = f"{type(exc).__name__}: {exc}"
            say(f"{where}: failed ({outcome[key]})")
            continue
        outcome[key] = None
        say(f"{where}: {chosen.why}; {'cuBLAS' if chosen.config is None else 'a generated kernel'} is faster")
    return outcome


def _tune(key: ProblemKey, device: DeviceLimits, cache: Any, setting: str) -> Selection:
    listed = candidates(key, device, cache, setting)
    if not listed:  # before anything touches the GPU
        raise RuntimeError("nothing to time: no surveyed or tuned config of this problem family on this GPU or "
                           "its siblings, and cuBLAS cannot run it")
    import cupy

    from autotile.runtime.cublas import unsupported_reason
    from autotile.runtime.timing import L2Flusher, relative_error, time_launch
    from autotile.tuning.results import save_timed_config

    global _flusher
    started = time.monotonic()
    spec = kernels.get(key.kernel)
    compile_ahead(key, listed)
    rng = cupy.random.default_rng(0)
    inputs = spec.make_inputs(key.shape, key.dtype, key.layout, rng, cupy)
    ref = spec.reference(inputs, key.dtype)
    out = cupy.empty(spec.output_shape(key.shape), dtype=dtypes.output_storage(key.dtype))
    tol = kernels.tolerance(key.dtype, key.shape[-1])
    if _flusher is None:
        _flusher = L2Flusher(device.l2_bytes)
    timed: list[tuple[float, Selection]] = []
    failed: list[str] = []
    for sel in listed:
        try:
            runner = sel.implementation_object().prepare(key)

            def run(runner: Any = runner) -> None:
                runner.run(inputs, out)

            kernels.poison(out)
            run()
            error = relative_error(out, ref)
            if not error <= tol:
                failed.append(f"{sel.explain()}: error {error:.3g} above {tol:.3g}")
                continue
            ms = time_launch(run, _flusher, warmup=1, min_reps=3, max_reps=10, target_ms=10.0).median_ms
        except Exception as exc:  # a candidate that cannot run here is skipped, not fatal
            failed.append(f"{sel.explain()}: {type(exc).__name__}: {exc}")
            continue
        timed.append((ms, sel))
    if not timed:
        raise RuntimeError(f"none of {len(listed)} candidates ran correctly; the first: {failed[0]}")
    cublas_ms = next((ms for ms, s in timed if s.implementation == "cublas"), None)
    best_ms, best = min(timed, key=lambda t: t[0])
    generated = [(ms, s) for ms, s in timed if s.config is not None]
    seconds = time.monotonic() - started
    # a record needs the baseline it beat or lost to, unless cuBLAS cannot run the problem at all
    if generated and (cublas_ms is not None or unsupported_reason(key) is not None):
        gen_ms, gen = min(generated, key=lambda t: t[0])
        save_timed_config(key, gen.config, gen_ms, cublas_ms, cache, device,
                     {"tuned_by": "first call", "candidates": len(timed), "seconds": round(seconds, 3),
                      "precision_setting": setting})
    why = f"timed {len(timed)} candidates in {seconds:.2f} s: {best_ms:.4f} ms" + (
        f", cuBLAS {cublas_ms:.4f} ms" if cublas_ms is not None else "")
    return dataclasses.replace(best, why=why)


__all__ = ["FirstCallWarning", "MAX_CANDIDATES", "candidates", "compile_ahead", "tune_here", "tune_listed"]
