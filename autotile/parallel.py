"""One host, several GPUs: a worker process per GPU on one study (`autotile tune --devices 0,1`).

The parent opens (or resumes) the study, starts one worker per GPU (`python -m autotile.parallel`, with
CUDA_VISIBLE_DEVICES set to its GPU), reports progress from the study, fails the trials of a worker
that died and starts it again, and once the budget is spent names the winner itself, once, on the first
GPU (re-timing the best few there) for the cache. Without `--storage` the study lives in optuna's journal
file under the cache root (no server), so running the same command again resumes it.

A `Backend` is what a worker times with: the GPU (`GpuBackend`), or a recorded table in the tests
(`autotile.testing.ReplayBackend`), named as "module:attribute" and created in each process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any, Callable, Protocol

from .device import DeviceLimits
from .errors import AutotileError, InvalidValueError
from .problem import ProblemKey
from .space import Problem, Space
from .tuner import Evaluator, Progress, Search, TuneOptions, Tuner, TuneResult

RESTARTS = 2  # times a worker that died (not by a bad option) is started again, per GPU
POLL_S = 0.5  # seconds between looks at the study and the workers


class Backend(Protocol):
    def limits(self, device: int) -> DeviceLimits: ...

    def space(self, kernel: str) -> Space | None: ...

    def evaluator(self, key: ProblemKey, seed: int, device: int, candidate_timeout_s: float) -> Evaluator: ...


class GpuBackend:
    """Candidates compiled and timed on a GPU, in an isolated worker process (`worker.IsolatedRunner`)."""

    def limits(self, device: int) -> DeviceLimits:
        from .device import live_device

        return live_device(device)

    def space(self, kernel: str) -> Space | None:
        return None

    def evaluator(self, key: ProblemKey, seed: int, device: int, candidate_timeout_s: float) -> Evaluator:
        from .worker import IsolatedRunner, Setup

        return IsolatedRunner(Setup(key, seed, device_id=device), timeout_s=candidate_timeout_s)


def load_backend(spec: str | None) -> Backend:
    """The backend "module:attribute" names (called with no arguments), or the GPU where None."""
    if spec is None:
        return GpuBackend()
    module, sep, attr = spec.partition(":")
    if not sep:
        raise InvalidValueError(f"backend {spec!r} must look like MODULE:ATTRIBUTE")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise InvalidValueError(f"backend {spec!r} cannot be loaded: {exc}") from None
    backend: Backend = factory()
    return backend


def device_count() -> int:
    from .device import live_devices

    return len(live_devices())


def parse_devices(text: str | list[int] | None, *, name: str = "--devices") -> list[int] | None:
    """'0,1,3' or 'all' (every visible GPU) -> GPU indices, checked: whole numbers, no repeats."""
    if text is None:
        return None
    if isinstance(text, list):
        items = [str(i) for i in text]
    elif text.strip() == "all":
        n = device_count()
        if n == 0:
            from .errors import DeviceUnavailableError

            raise DeviceUnavailableError(f"{name} all: no CUDA GPU is visible")
        return list(range(n))
    else:
        items = [v.strip() for v in text.split(",")]
    out = []
    for item in items:
        if not item.isdigit():
            raise InvalidValueError(f"{name} {text!r}: {item!r} is not a GPU index; use 0,1,... or all")
        out.append(int(item))
    if not out:
        raise InvalidValueError(f"{name} {text!r}: name at least one GPU (0,1,... or all)")
    if len(set(out)) != len(out):
        raise InvalidValueError(f"{name} {text!r}: a GPU is named twice")
    return out


def same_model(backend: Backend, devices: list[int]) -> DeviceLimits:
    """The limits of the first GPU, where every GPU listed is the same model: results of different models
    never meet in one ranking (a study is bound to one device fingerprint)."""
    first = backend.limits(devices[0])
    for d in devices[1:]:
        other = backend.limits(d)
        if other.fingerprint != first.fingerprint:
            raise InvalidValueError(f"--devices: GPU {d} is {other.fingerprint}, GPU {devices[0]} is "
                                    f"{first.fingerprint}; a study tunes one GPU model: run each model apart")
    return first


# -- workers ------------------------------------------------------------------------------------------------

def worker_command(payload: dict[str, Any]) -> list[str]:
    return [sys.executable, "-m", "autotile.parallel", json.dumps(payload)]


def worker_env(device: int, backend: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if backend is None:  # the GPU: each worker sees its own only, as device 0
        # --devices counts the GPUs this process sees: where CUDA_VISIBLE_DEVICES narrows them already,
        # index its list (which may hold UUIDs) rather than the machine's.
        visible = [v.strip() for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        env["CUDA_VISIBLE_DEVICES"] = visible[device] if device < len(visible) else str(device)
    return env


@dataclasses.dataclass
class Worker:
    """One worker process and how often it was started."""

    device: int
    payload: dict[str, Any]
    backend: str | None
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    last_rc: int | None = None

    def start(self) -> None:
        self.starts += 1
        self.process = subprocess.Popen(worker_command(self.payload), env=worker_env(self.device, self.backend))

    def poll(self) -> int | None:
        assert self.process is not None
        rc = self.process.poll()
        if rc is not None:
            self.last_rc = rc
        return rc

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def supervise(workers: list[Worker], done: Callable[[], bool], tick: Callable[[], None],
              say: Callable[[str], None]) -> list[Worker]:
    """Run the workers until all have exited; one that died (status other than 0, or 2: a bad option that
    would fail again) is started again, up to RESTARTS times, while `done()` is False. `tick` runs every
    POLL_S (progress, recovery of dead workers' trials). Returns the workers that ended badly."""
    for w in workers:
        w.start()
    try:
        while True:
            tick()
            running = 0
            for w in workers:
                rc = w.poll()
                if rc is None:
                    running += 1
                elif rc not in (0, 2) and w.starts <= RESTARTS and not done():
                    say(f"worker on GPU {w.device} ended with status {rc}; starting it again")
                    w.start()
                    running += 1
            if running == 0:
                break
            time.sleep(POLL_S)
    finally:
        for w in workers:
            w.stop()
    tick()
    return [w for w in workers if w.last_rc not in (0, None)]


def tune_on_devices(key: ProblemKey, options: TuneOptions, devices: list[int], *, fix: dict[str, Any] | None,
                    backend: str | None, progress: Callable[[Progress], None] | None,
                    say: Callable[[str], None]) -> TuneResult:
    """Tune `key` with one worker process per GPU in `devices` on one study; name the winner once, here."""
    from . import kernels
    from .cache import default_root
    from .study import Ledger, default_journal, recover_dead

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

    from .study import FAILURE, INFEASIBLE, REPEAT, RUN, VERDICT

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


def key_of(data: dict[str, Any]) -> ProblemKey:
    """A key from `ProblemKey.to_json`'s form."""
    return ProblemKey(data["kernel"], data["dtype"], data["layout"], tuple(int(n) for n in data["shape"]))


# -- the worker process ----------------------------------------------------------------------------------

def run_tune_worker(payload: dict[str, Any]) -> None:
    """Search the study as one worker until its budget is spent (no winner: the parent names it)."""
    from . import kernels

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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    payload = json.loads(argv[0])
    try:
        if payload["role"] == "tune":
            run_tune_worker(payload)
        elif payload["role"] == "batch":
            from .batch import run_batch_worker

            run_batch_worker(payload)
        else:
            raise InvalidValueError(f"unknown worker role {payload['role']!r}")
    except AutotileError as exc:
        print(f"autotile worker: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
