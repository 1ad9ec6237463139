"""One host, several GPUs: a worker process per GPU on one study (`autotile tune --devices 0,1`).

The parent opens (or resumes) the study, starts one worker per GPU (`python -m autotile.tuning.host_worker`, with
CUDA_VISIBLE_DEVICES set to its GPU), reports progress from the study, fails the trials of a worker
that died and starts it again, and once the budget is spent names the winner itself, once, on the first
GPU (re-timing the best few there) for the cache. Without `--storage` the study lives in optuna's journal
file under the cache root (no server), so running the same command again resumes it.
The processes themselves are `autotile.tuning.gpu_workers`'s.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import socket
import time
from typing import Any, Callable

from autotile.codegen.limits import DeviceLimits
from autotile.codegen.problem import ProblemKey
from autotile.codegen.space import Problem
from autotile.tuning.gpu_workers import Worker, key_of, load_backend, same_model, supervise
from autotile.tuning.tuner import Progress, Search, TuneOptions, Tuner, TuneResult


def tune_on_devices(key: ProblemKey, options: TuneOptions, devices: list[int], *, fix: dict[str, Any] | None,
                    backend: str | None, progress: Callable[[Progress], None] | None,
                    say: Callable[[str], None]) -> TuneResult:
    """Tune `key` with one worker process per GPU in `devices` on one study; name the winner once, here."""
    from autotile.codegen import kernels
    from autotile.dispatch.cache import default_root
    from autotile.tuning.study import Ledger, default_journal, recover_dead

    impl = load_backend(backend)
    limits = same_model(impl, devices)
    base = impl.space(key.kernel) or kernels.get(key.kernel).space
    space = base.restricted(fix) if fix else base
    probe = Tuner(key, options, space=space)
    study_name = options.study_name or probe.default_study_name(limits)
    storage = options.storage or default_journal(default_root(), study_name)
    options = dataclasses.replace(options, study_name=study_name, storage=storage)
    tuner = Tuner(key, options, space=space)
    study = tuner.open_study(limits)  # created and bound here, before the workers race to it
    # The seeds, starting points (and a grid) are queued once, here, rather than by each worker at once.
    tuner.enqueue_fixed(study, Problem(limits, key.dtype, key.layout))
    before = {t.number for t in study.get_trials(deepcopy=False)}
    say(f"{len(devices)} workers on study {study_name!r} in {storage}")
    opts_json = dataclasses.asdict(options)
    # Each worker reseeds its sampler by its index, so that they do not draw one sequence. On a storage the
    # user named, other hosts may be at work with the same indices: their parents' host and PID tell apart.
    first = 0 if options.storage == default_journal(default_root(), study_name) else \
        int.from_bytes(hashlib.sha256(f"{socket.gethostname()}/{os.getpid()}".encode()).digest()[:3], "little") << 8
    workers = [Worker(d, {"role": "tune", "key": key.to_json(), "options": dict(opts_json, worker=first + i),
                          "fix": fix, "backend": backend, "device": 0 if backend is None else d}, backend)
               for i, d in enumerate(devices)]
    started = time.monotonic()
    unit = kernels.metric(key.kernel, key.shape, key.dtype, 1.0)[1]

    def tick() -> None:
        recover_dead(study, options.grace_s)
        if progress is not None:
            ledger = Ledger.of(study.get_trials(deepcopy=False))
            best = min((v for v, _ in ledger.results().values() if v is not None), default=None)
            progress(Progress(ledger.finished, options.trials, best,
                              kernels.metric(key.kernel, key.shape, key.dtype, best)[0] if best else None, unit,
                              None, ""))

    def done() -> bool:
        return Ledger.of(study.get_trials(deepcopy=False)).finished >= options.trials

    failed = supervise(workers, done, tick, say)
    if failed and not done():
        say(f"{len(failed)} worker(s) ended early (status {', '.join(str(w.last_rc) for w in failed)}); "
            "naming the winner from the trials there are")
    search = _search_of(study, before, time.monotonic() - started)
    evaluator = impl.evaluator(key, options.seed, devices[0], options.candidate_timeout_s)
    try:
        if hasattr(evaluator, "start"):
            evaluator.start()
        return tuner.finish(evaluator, limits, search)
    finally:
        if hasattr(evaluator, "close"):
            evaluator.close()


def _search_of(study: Any, before: set[int], seconds: float) -> Search:
    """The counts of this command's trials (numbered after those there were), read from the study."""
    import optuna

    from autotile.tuning.study import FAILURE, INFEASIBLE, REPEAT, RUN, VERDICT

    ran = pruned = duplicates = 0
    failures: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        if t.number in before or not t.state.is_finished():
            continue
        verdict = t.user_attrs.get(VERDICT)
        if verdict == INFEASIBLE:
            pruned += 1
        elif verdict == REPEAT:
            duplicates += 1
        elif verdict == RUN and (t.state == optuna.trial.TrialState.COMPLETE or FAILURE in t.user_attrs):
            ran += 1
            if FAILURE in t.user_attrs:
                failures[t.user_attrs[FAILURE]] = failures.get(t.user_attrs[FAILURE], 0) + 1
    return Search(study, ran, pruned, duplicates, failures, seconds)


# -- the worker process ----------------------------------------------------------------------------------

def run_tune_worker(payload: dict[str, Any]) -> None:
    """Search the study as one worker until its budget is spent (no winner: the parent names it)."""
    from autotile.codegen import kernels

    key = key_of(payload["key"])
    raw = dict(payload["options"])
    raw["start"] = tuple((name, dict(values)) for name, values in raw.get("start") or ())
    options = TuneOptions(**raw)
    impl = load_backend(payload.get("backend"))
    base = impl.space(key.kernel) or kernels.get(key.kernel).space
    fix = payload.get("fix")
    tuner = Tuner(key, options, space=base.restricted(fix) if fix else base)
    evaluator = impl.evaluator(key, options.seed, payload.get("device", 0), options.candidate_timeout_s)
    try:
        if hasattr(evaluator, "start"):
            evaluator.start()
        limits = DeviceLimits.from_json(evaluator.environment["limits"]) if "limits" in evaluator.environment \
            else impl.limits(payload.get("device", 0))
        tuner.search(evaluator, limits)
    finally:
        if hasattr(evaluator, "close"):
            evaluator.close()
