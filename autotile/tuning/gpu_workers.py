"""Worker processes, one per GPU: how they are started, watched and restarted, and what they time with.

A `Backend` is what a worker times with: the GPU (`GpuBackend`), or a recorded table in the tests
(`autotile.tuning.testing.ReplayBackend`), named as "module:attribute" and created in each process.
Every worker runs `python -m autotile.tuning.host_worker PAYLOAD` (the payload says which role:
one tuning study, or a batch of problems).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable, Protocol

from autotile.codegen.limits import DeviceLimits
from autotile.codegen.problem import ProblemKey
from autotile.codegen.space import Space
from autotile.errors import InvalidValueError
from autotile.tuning.tuner import Evaluator

RESTARTS = 2  # times a worker that died (not by a bad option) is started again, per GPU
POLL_S = 0.5  # seconds between looks at the study and the workers


class Backend(Protocol):
    def limits(self, device: int) -> DeviceLimits: ...

    def space(self, kernel: str) -> Space | None: ...

    def evaluator(self, key: ProblemKey, seed: int, device: int, candidate_timeout_s: float) -> Evaluator: ...


class GpuBackend:
    """Candidates compiled and timed on a GPU, in an isolated worker process (`worker.IsolatedRunner`)."""

    def limits(self, device: int) -> DeviceLimits:
        from autotile.runtime.device import live_device

        return live_device(device)

    def space(self, kernel: str) -> Space | None:
        return None

    def evaluator(self, key: ProblemKey, seed: int, device: int, candidate_timeout_s: float) -> Evaluator:
        from autotile.runtime.worker import IsolatedRunner, Setup

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
    from autotile.runtime.device import live_devices

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
            from autotile.errors import DeviceUnavailableError

            raise DeviceUnavailableError(f"{name} all: no CUDA GPU is visible")
        return list(range(n))
    else:
        items = [v.strip() for v in text.split(",")]
    out = []
    for item in items:
        if not (item.isascii() and item.isdigit()):  # str.isdigit alone takes '²' and Arabic-Indic digits
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
    return [sys.executable, "-m", "autotile.tuning.host_worker", json.dumps(payload)]


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


def key_of(data: dict[str, Any]) -> ProblemKey:
    """A key from `ProblemKey.to_json`'s form."""
    return ProblemKey(data["kernel"], data["dtype"], data["layout"], tuple(int(n) for n in data["shape"]))
