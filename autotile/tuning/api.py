"""`autotile.tune`: what the `autotile tune` command does, for Python callers."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Callable

from autotile.codegen import kernels
from autotile.codegen.limits import DeviceLimits
from autotile.codegen.problem import ProblemKey, parse_shape
from autotile.errors import AutotileError, InvalidValueError
from autotile.runtime.worker import IsolatedRunner, Setup
from autotile.tuning import validate
from autotile.tuning.results import save_result
from autotile.tuning.transfer import WARM_STARTS
from autotile.tuning.tuner import Progress, TuneOptions, Tuner, TuneResult

log = logging.getLogger(__name__)


def tune(kernel: str, shape: str | tuple[int, ...], *, dtype: str = "float32", layout: str = "row",
         trials: int = 100, timeout: float | None = None, sampler: str = "tpe", seed: int = 0,
         storage: str | None = None, study_name: str | None = None, cache: Any = "default",
         progress: bool | Callable[[Progress], None] = False, evaluator: Any = None,
         candidate_timeout: float = 60.0, render_source: Callable[..., str] | None = None,
         fix: dict[str, Any] | None = None, start: dict[str, Any] | None = None,
         precision: str | None = None, devices: list[int] | None = None, backend: str | None = None,
         heartbeat_grace: float = 60.0, report: str | Path | None = None,
         warm_starts: int = WARM_STARTS) -> TuneResult:
    """Tune `kernel` for one problem on the current GPU and store the winner in the cache.

    `shape` is 'MxNxK' (matmul) or 'MxK' (matvec) or a tuple. `storage` is an optuna storage URL
    ('sqlite:///tune.db' resumes a stopped study); by default the study lives in memory. `cache=None`
    skips the cache write. `evaluator` replaces the GPU worker (a `ReplayEvaluator`, in tests). `fix`
    narrows the space: parameter -> value or list of values. `start` names configs (name -> parameter
    mapping) to run first (before the seeds), such as the config in use when re-tuning. `precision` is the
    float32 matmul precision setting the winner must run under (None: the process-wide one, "high" unless
    set): "highest" searches the SIMT configs only (MATH=simt), "high" and "medium" the tf32x3 ones too; the
    study is bound to it, and its default name ends in "-highest" under "highest".

    `devices` (GPU indices) runs one worker process per GPU on one study (`autotile.tuning.parallel`), in
    `storage` or else a journal file under the cache root; the winner is named once, on the first GPU.
    Any number of processes (other hosts) may work on the same `storage` and `study_name` at once: the
    budget is the study's total. `heartbeat_grace`: seconds after which a silent worker's trial is failed
    and its config retried. `backend` ("module:attribute") replaces the GPU in the workers (tests).

    `warm_starts` (tpe): how many configs of other shapes and GPUs, from the dispatch portfolio and the
    cache's records (`autotile.tuning.transfer`; a `cache` object given here is read, else the default one), run
    after the seeds; 0 for none.

    `report` (a folder) writes the study's report there at the end (`autotile.tuning.study_report`: plots and an
    index.html; matplotlib, the `report` extra, is checked before tuning starts). A report that cannot be
    written is said in the result's `report_error`; the result is returned all the same.
    """
    began = time.monotonic()
    key = ProblemKey.of(kernel, shape, dtype, layout)
    # Everything cheap is checked before a worker starts: the same checks, and words, as the command's.
    trials = validate.count(trials, name="trials")
    timeout = validate.seconds(timeout, name="timeout", allow_none=True)
    candidate_timeout = validate.seconds(candidate_timeout, name="candidate_timeout", allow_none=False)
    seed = validate.seed(seed)
    storage = validate.storage_url(storage)
    setting = validate.precision(precision)
    heartbeat_grace = validate.seconds(heartbeat_grace, name="heartbeat_grace", allow_none=False)
    fix = validate.fix_mapping(fix)
    if report is not None:
        from autotile.tuning.study_report import require_matplotlib

        require_matplotlib()  # before the GPU is spent, not after
    options = TuneOptions(trials=trials, timeout_s=timeout, sampler=sampler, seed=seed, storage=storage,
                          study_name=study_name, candidate_timeout_s=candidate_timeout,
                          start=tuple((name, dict(values)) for name, values in (start or {}).items()),
                          precision=setting, grace_s=heartbeat_grace,
                          warm_starts=validate.count(warm_starts, name="warm_starts", minimum=0),
                          cache=cache if hasattr(cache, "entries") else None)  # a TuningCache object
    if devices is not None:
        from autotile.tuning.gpu_workers import parse_devices
        from autotile.tuning.parallel import tune_on_devices

        if evaluator is not None or render_source is not None:
            raise InvalidValueError("devices runs workers in processes of their own: pass backend, not "
                                    "evaluator or render_source")
        if storage is not None and storage.startswith("sqlite") and (":memory:" in storage
                                                                     or storage.rstrip("/") == "sqlite:"):
            raise InvalidValueError(f"storage {storage!r} lives in one process's memory, and devices runs one "
                                    "process per GPU, which would not share it: leave storage out (the study "
                                    "goes to a journal file) or name a file (sqlite:///tune.db)")
        devices = parse_devices(list(devices), name="devices")
        assert devices is not None
        callback = _progress_bar(trials) if progress is True else (progress or None)
        try:
            result = tune_on_devices(key, options, devices, fix=fix, backend=backend, progress=callback,
                                     say=lambda m: None if progress is False else log.info(m))
        finally:
            if callback is not None and hasattr(callback, "close"):
                callback.close()
        if cache is not None:
            result = save_result(result, kernels.get(kernel).render(result.best.config, key.dtype, key.layout), cache)
        if report is not None:
            from autotile.dispatch.cache import default_root
            from autotile.tuning.study import default_journal

            storage = options.storage or default_journal(default_root(), result.study_name)
            result = _report(result, report, storage=storage)
        return result
    space = kernels.get(kernel).space.restricted(fix) if fix else None
    tuner = Tuner(key, options, space=space, render_source=render_source)
    owned = evaluator is None
    if owned:
        evaluator = IsolatedRunner(Setup(key, seed), timeout_s=candidate_timeout)
    callback = _progress_bar(trials) if progress is True else (progress or None)
    try:
        if owned:
            from autotile.runtime.device import live_device

            # No GPU: one clear DeviceUnavailableError from this process's own look (the worker would say
            # less), taken while the worker starts (0.5-0.8 s of CuPy's import and the device's query).
            evaluator.start(meanwhile=live_device)
        starting = time.monotonic() - began
        limits = DeviceLimits.from_json(evaluator.environment["limits"])
        search = tuner.search(evaluator, limits, callback)
        result = tuner.finish(evaluator, limits, search)
    finally:
        if owned:
            evaluator.close()
        if callback is not None and hasattr(callback, "close"):
            callback.close()
    if cache is not None:
        result = save_result(result, tuner.render(result.best.config), cache)
    if report is not None:
        result = _report(result, report, study=search.study)
    return dataclasses.replace(result, phases=_whole(result.phases, starting, time.monotonic() - began))


def _whole(phases: dict[str, float], starting: float, wall: float) -> dict[str, float]:
    """The tune's phases with the worker's start added and "other" grown to what no phase accounts for, so
    that they add up to `wall` (seconds); none where the search's are unknown."""
    if not phases:
        return {}
    out = dict(phases, start=starting)
    out["other"] = out.get("other", 0.0) + max(0.0, wall - sum(out.values()))
    return out


def _report(result: TuneResult, out_dir: str | Path, *, study: Any = None, storage: str | None = None) -> TuneResult:
    """Write the run's report (of `study`, or of the result's study in `storage`); a report that cannot be
    written costs the run nothing: the result says why."""
    from autotile.tuning import study_report

    try:
        if study is None:
            study = study_report.load_study(storage, result.study_name)
        path = study_report.write_report(study, out_dir)
    except (AutotileError, OSError) as exc:
        return dataclasses.replace(result, report_error=" ".join(str(exc).split()))
    return dataclasses.replace(result, report_path=str(path))


class _progress_bar:
    """A tqdm bar: trial n of N, the best so far and its ratio to cuBLAS."""

    def __init__(self, total: int):
        from tqdm import tqdm

        self.bar = tqdm(total=total, unit="trial", dynamic_ncols=True)
        self.done = 0

    def __call__(self, p: Progress) -> None:
        self.bar.update(max(0, p.done - self.done))
        self.done = p.done
        if p.best_ms is not None:
            ratio = f" {p.baseline_ms / p.best_ms:.2f}x cuBLAS" if p.baseline_ms else ""
            self.bar.set_postfix_str(f"best {p.best_metric:,.0f} {p.metric_unit}{ratio}", refresh=False)

    def close(self) -> None:
        self.bar.close()


__all__ = ["tune", "parse_shape", "TuneResult"]
