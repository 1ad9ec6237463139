"""A tuning result as a cache record, and its writing: the one place records are made from timings.

Both the tuner (`save_result`, after a tuning run) and tuning at first call (`save_timed_config`) write
through here, then announce the change (`autotile.dispatch.events`) so the library selects again.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from autotile.codegen import build, kernels
from autotile.codegen.limits import DeviceLimits
from autotile.codegen.problem import ProblemKey
from autotile.dispatch import events
from autotile.errors import CacheError
from autotile.tuning.tuner import TuneResult


def to_record(result: TuneResult, compat: str, source: str | None = None) -> Any:
    """The cache record of a tuning result; `source` is the winner's CUDA source (rendered if None)."""
    from autotile.dispatch.record import Record

    if source is None:
        source = kernels.get(result.kernel).render(result.best.config, result.dtype, result.layout)
    env = dict(result.environment)
    env.pop("limits", None)
    env["source_sha"] = kernels.source_hash(source)
    env.setdefault("compile_options", list(build.COMPILE_OPTIONS))
    env.update(spread_rounds_ms=list(result.best.round_ms), trials=result.trials,
               seconds=round(result.seconds, 1), study=result.study_name, precision_setting=result.precision,
               best_seed=result.best_seed.seed_name if result.best_seed else None,
               best_seed_ms=result.best_seed.median_ms if result.best_seed else None)
    # cuBLAS is one more candidate, timed with the finalists: where it won, the library runs it (and the
    # best config is kept in the record all the same). The record's precision class is what its winner
    # needs (derived by Record), which may be stricter than the setting it was tuned under.
    cublas_won = result.baseline_ms is not None and result.baseline_ms < result.best.median_ms
    return Record(kernel=result.kernel, dtype=result.dtype, layout=result.layout, shape=result.shape,
                  compat=compat, config=dict(result.best.config), time_ms=result.best.median_ms,
                  spread=result.best.spread, metric=result.metric, metric_unit=result.metric_unit,
                  baseline_ms=result.baseline_ms, device=env["device"], environment=env,
                  implementation="cublas" if cublas_won else "generated")


def save_result(result: TuneResult, source: str, cache: Any) -> TuneResult:
    """Store the winner; a result that cannot be stored is returned all the same, saying why."""
    from autotile.dispatch.cache import TuningCache
    from autotile.dispatch.select import counts

    try:
        store = TuningCache() if cache == "default" else cache
        record = to_record(result, kernels.compat_hash(result.kernel), source)
        # An existing entry is kept only if it is faster and counts: it still times the kernel its config
        # renders today, built by this compiler with these options. A retired one (its source changed since)
        # or another build's (served only as a fallback) is replaced.
        outcome = store.put(record, is_current=counts)
    except CacheError as exc:
        return dataclasses.replace(result, save_error=str(exc))
    events.records_changed()  # the library forgets what it selected before
    path = str(getattr(outcome, "path", "")) or None
    note = getattr(outcome, "reason", None) if not getattr(outcome, "written", bool(outcome)) else None
    return dataclasses.replace(result, saved_path=path, save_note=note)


def save_timed_config(key: ProblemKey, config: Any, time_ms: float, baseline_ms: float | None, cache: Any,
                 device: DeviceLimits, extra: dict[str, Any]) -> Any:
    """Store a config timed outside a tuning run (at first call): the record names cuBLAS where it was
    faster. Returns the cache's `PutOutcome`."""
    import time

    from autotile.dispatch.record import Record
    from autotile.dispatch.select import counts

    spec = kernels.get(key.kernel)
    metric, unit = kernels.metric(key.kernel, key.shape, key.dtype, time_ms)
    env = {"gpu": device.name, "device": device.fingerprint, "date": time.strftime("%Y-%m-%d"),
           "compiler": build.compiler_version(), "compile_options": list(build.COMPILE_OPTIONS),
           "source_sha": kernels.source_hash(spec.render(config, key.dtype, key.layout)), **extra}
    cublas_won = baseline_ms is not None and baseline_ms < time_ms
    record = Record(kernel=key.kernel, dtype=key.dtype, layout=key.layout, shape=key.shape,
                    compat=kernels.compat_hash(key.kernel), config=dict(config), time_ms=time_ms, spread=0.0,
                    metric=metric, metric_unit=unit, baseline_ms=baseline_ms, device=device.fingerprint,
                    environment=env, implementation="cublas" if cublas_won else "generated")
    return cache.put(record, is_current=counts)  # as `_save`: never kept behind an entry served only as a fallback


