"""Many workers, one optuna study: opening the storage, and the rules that let any number of processes
(GPUs of one host, or many hosts) share one study without a scheduler of their own.

The study is the only shared state; workers are stateless and replaceable. Every rule rests on one fact
that every optuna storage guarantees: trials get distinct numbers in creation order (RDB: the row order,
journal: the log order). So each worker, after drawing a config into a trial, decides that trial's fate
(its *verdict*) from the trials numbered below it alone, once all of those have a verdict of their own:

- ``run``: no trial below holds the same config in a live ``run`` or in the queue, and fewer than
  ``trials`` live runs and queued trials lie below: the study's budget, counted across all workers;
- ``repeat``: a trial below already runs (or ran, or waits in the queue to run) this config: it is not
  timed twice;
- ``over``: the budget is taken by the trials below.

Because every verdict is made from the same ordered prefix, two workers can never both win a config or
the last place in the budget, whatever the interleaving (a worker waits, briefly, for a trial below that
has been drawn but not judged yet). A queued (WAITING) trial is numbered when it is enqueued and judged
when some worker asks for it: an enqueue and another worker's ask can cross, so that a trial numbered
above it is judged first. While it waits, the trials above it count its place and its config (`enqueue`
records it) as taken; judged later, it sees only what lies below it. (Without that rule, both could win:
the likely cause of the 25 configs CI's two cores once timed on a budget of 24, 2026-11-28.) A run is
*live* while RUNNING with a beating heart, or finished with a result (COMPLETE, or FAIL with a failure
status such as ``compile``).

Dead workers: each worker beats the heart of its running trials (system attribute ``autotile_heartbeat``,
Unix seconds) every few seconds; any worker fails a RUNNING trial whose heart stopped for ``grace_s`` (or
at once, where its process is on this machine and gone) and enqueues its config again, for someone else
to run. Failing is a state change optuna applies once (the second attempt raises
`UpdateFinishedTrialError`), so exactly one worker enqueues the retry. optuna's own heartbeat covers only
RDB storages and `study.optimize` (not ask/tell, which the tuner needs for its compile batches); this one
works the same on the journal file and on PostgreSQL, and shows in optuna-dashboard.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from autotile.errors import InvalidValueError, StorageError, one_line

VERDICT = "autotile_verdict"  # user attribute: RUN, REPEAT, OVER or INFEASIBLE
KEY = "config_key"  # user attribute: the config a trial drew (Config.key())
FAILURE = "failure"  # user attribute: the status of a candidate that ran and failed (compile, wrong result...)
RETRY_OF = "autotile_retry_of"  # user attribute of a retry: the numbers of the dead trials it replaces
QUEUED = "autotile_queued_key"  # user attribute of an enqueued trial: the config it will run (Config.key())
HEARTBEAT = "autotile_heartbeat"  # system attribute: Unix time (s) of the last beat
WORKER = "autotile_worker"  # system attribute: {"host", "machine", "pid"} of the worker running the trial
RUN, REPEAT, OVER, INFEASIBLE = "run", "repeat", "over", "infeasible"

HEARTBEAT_S = 5.0  # seconds between beats
GRACE_S = 60.0  # a trial whose heart stopped this long is failed and its config retried
MAX_RETRIES = 2  # retries of one config after dead workers; then it is left to the sampler
POLL_S = 0.2  # seconds between looks at the study while waiting on other workers
JOURNAL = "journal:"  # storage prefix of optuna's journal file storage: journal:PATH


# -- storages ------------------------------------------------------------------------------------------

def open_storage(spec: str | None) -> Any:
    """The optuna storage that `spec` names: None (in memory), 'journal:PATH' (optuna's journal file, for
    processes of one host, no server), or a SQLAlchemy URL (RDB: sqlite:///FILE, postgresql://...).

    A bare postgresql:// URL uses psycopg (version 3, the `postgres` extra) where psycopg2 is absent."""
    if spec is None:
        return None
    if spec.startswith(JOURNAL):
        path = Path(spec[len(JOURNAL):]).expanduser()
        try:
            return _journal(path)
        except OSError as exc:
            raise StorageError(f"the journal file {path} cannot be opened: {exc.strerror or exc}") from None
        except Exception as exc:  # optuna replays the file as it opens it: a damaged line fails here
            raise StorageError(f"the journal file {path} cannot be read as an optuna journal "
                               f"({type(exc).__name__}: {_first_line(exc)}); move it aside to start afresh"
                               ) from None
    import optuna

    url = postgres_url(spec)
    # pool_pre_ping: a worker that waited long on its GPU finds its connection dropped by the server.
    kwargs = {"pool_pre_ping": True} if not url.startswith("sqlite") else {}
    # Several workers starting at once on a new database all create optuna's tables; the losers of that
    # race see an integrity error once, then the tables.
    for attempt in range(STORAGE_TRIES):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
        except Exception as exc:
            if attempt == STORAGE_TRIES - 1 or not _may_be_a_race(exc):
                what = ("check that the server runs and is reachable, the database exists and the user may "
                        "connect" if not url.startswith("sqlite") else "check that it is an SQLite database")
                raise StorageError(f"the study storage {redacted(spec)} cannot be opened ({type(exc).__name__}: "
                                   f"{_first_line(exc)}); {what}") from None
            time.sleep(0.5 + attempt)
    raise AssertionError("unreachable")


STORAGE_TRIES = 5


def _may_be_a_race(exc: Exception) -> bool:
    """Whether opening an RDB storage may succeed on a second try: two workers creating optuna's tables at
    once (an integrity error); not a refused connection, a wrong password or a file that is no database."""
    return "Integrity" in type(exc).__name__ or "already exists" in str(exc)


def _first_line(exc: BaseException) -> str:
    return one_line(str(exc).split("\n")[0], 200) or type(exc).__name__


def redacted(url: str) -> str:
    """`url` with its password, if any, replaced by ***: for messages and logs."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    credentials, at, host = rest.rpartition("@")
    if not at or ":" not in credentials:
        return url
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"


def postgres_url(url: str) -> str:
    """`url`, with postgresql:// (and postgres://) pointed at psycopg 3 where psycopg2 is not installed:
    SQLAlchemy's default PostgreSQL driver is psycopg2, while the `postgres` extra installs psycopg."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("postgresql", "postgres"):
        return url
    import importlib.util

    if importlib.util.find_spec("psycopg2") is None and importlib.util.find_spec("psycopg") is not None:
        return "postgresql+psycopg://" + rest
    return "postgresql://" + rest


def _journal(path: Path) -> Any:
    import optuna.storages as storages

    journal = getattr(storages, "journal", None)
    if journal is not None and hasattr(journal, "JournalFileBackend"):  # optuna >= 4.0
        backend, lock = journal.JournalFileBackend, journal.JournalFileOpenLock
    else:  # optuna 3.x
        backend, lock = storages.JournalFileStorage, storages.JournalFileOpenLock
    path.parent.mkdir(parents=True, exist_ok=True)
    # The open lock (an O_EXCL lock file) works on every file system, NFS included.
    return storages.JournalStorage(backend(str(path), lock_obj=lock(str(path))))


def default_journal(root: Path, study_name: str) -> str:
    """'journal:PATH' of the file that `--devices` keeps a study in when no --storage is named: under the
    cache root, so that running the same command again resumes it."""
    safe = "".join(c if c.isalnum() or c in "-_.x" else "_" for c in study_name)
    return JOURNAL + str(root / "studies" / f"{safe}.journal")


# -- who runs a trial ---------------------------------------------------------------------------------

def _machine() -> str:
    """This machine and PID namespace: two processes with the same value can see each other's PIDs."""
    parts = [socket.gethostname()]
    with contextlib.suppress(OSError):
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    with contextlib.suppress(OSError):
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    return "/".join(parts)


MACHINE = _machine()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _storage_of(study: Any) -> Any:
    return study._storage  # optuna keeps it private; trial-level writes by id need it


class Heartbeat:
    """Beats the hearts of this worker's running trials from a background thread (every HEARTBEAT_S)."""

    def __init__(self, study: Any, interval_s: float = HEARTBEAT_S):
        self._storage = _storage_of(study)
        self._interval = interval_s
        self._ids: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, trial_id: int) -> None:
        self._storage.set_trial_system_attr(trial_id, WORKER, {"host": socket.gethostname(), "machine": MACHINE,
                                                                "pid": os.getpid()})
        self._beat(trial_id)
        with self._lock:
            self._ids.add(trial_id)

    def remove(self, trial_id: int) -> None:
        with self._lock:
            self._ids.discard(trial_id)

    def _beat(self, trial_id: int) -> None:
        import optuna

        try:
            self._storage.set_trial_system_attr(trial_id, HEARTBEAT, time.time())
        except (optuna.exceptions.UpdateFinishedTrialError, KeyError):
            self.remove(trial_id)  # finished meanwhile (or failed by another worker as dead)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            with self._lock:
                ids = list(self._ids)
            for trial_id in ids:
                try:
                    self._beat(trial_id)
                except Exception:  # a storage hiccup: the next beat tries again
                    pass

    def __enter__(self) -> "Heartbeat":
        self._thread = threading.Thread(target=self._run, name="autotile-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def is_dead(trial: Any, grace_s: float, now: float | None = None) -> bool:
    """Whether a RUNNING trial's worker is gone: its process, where on this machine, or its heartbeat."""
    worker = trial.system_attrs.get(WORKER)
    if isinstance(worker, dict) and worker.get("machine") == MACHINE and isinstance(worker.get("pid"), int):
        if not _alive(worker["pid"]):
            return True
    beat = trial.system_attrs.get(HEARTBEAT)
    if not isinstance(beat, (int, float)):
        start = trial.datetime_start
        beat = start.timestamp() if start is not None else None
    return beat is not None and (now if now is not None else time.time()) - beat > grace_s


def enqueue(study: Any, params: dict[str, Any], key: str | None, user_attrs: dict[str, Any] | None = None) -> None:
    """Queue a trial of the config `key` (its `params`) in `study`: the next `ask` of any worker takes it, and
    while it waits, `judge` counts its place and its config for the trials numbered after it."""
    attrs = dict(user_attrs or {})
    if key:
        attrs[QUEUED] = key
    study.enqueue_trial(params, user_attrs=attrs)


def recover_dead(study: Any, grace_s: float = GRACE_S, max_retries: int = MAX_RETRIES,
                 retry: Callable[[Any, Any, list[int]], None] | None = None) -> list[int]:
    """Fail the RUNNING trials whose worker is gone, and enqueue each dead run's config again (unless it
    was retried `max_retries` times already). Returns the numbers of the trials this call failed.
    `retry(study, dead_trial, history)` replaces the re-enqueueing of a tuning trial (the batch's own)."""
    import optuna

    storage = _storage_of(study)
    failed = []
    now = time.time()
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if not is_dead(trial, grace_s, now):
            continue
        try:
            storage.set_trial_state_values(trial._trial_id, state=optuna.trial.TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # finished meanwhile, or failed by another worker first: that one retries it
        failed.append(trial.number)
        history = list(trial.user_attrs.get(RETRY_OF) or []) + [trial.number]
        if retry is not None:
            if len(history) <= max_retries:
                retry(study, trial, history)
        elif trial.user_attrs.get(VERDICT) == RUN and trial.params and len(history) <= max_retries:
            attrs = {k: v for k, v in trial.user_attrs.items() if k in ("seed", "named")}
            enqueue(study, dict(trial.params), trial.user_attrs.get(KEY), dict(attrs, **{RETRY_OF: history}))
    return failed


# -- the ledger: what the trials numbered below a trial add up to ------------------------------------------

@dataclasses.dataclass
class Ledger:
    """The runs of a study (or of the trials below one number), read from the trials' verdicts."""

    runs: int = 0  # live runs: RUNNING, or finished with a result
    finished: int = 0  # runs finished with a result (COMPLETE or a failure status)
    running: int = 0
    pending: int = 0  # RUNNING trials without a verdict yet (drawn, not judged)
    waiting: int = 0  # WAITING trials: enqueued, not asked for yet
    queued: set[str] = dataclasses.field(default_factory=set)  # the configs of the WAITING trials (`enqueue`)
    owned: dict[str, tuple[float | None, str | None, bool]] = dataclasses.field(default_factory=dict)
    # config key -> (time in ms or None: failed or still running, seed name, finished)

    @classmethod
    def of(cls, trials: Iterable[Any], below: int | None = None) -> "Ledger":
        import optuna

        state = optuna.trial.TrialState
        ledger = cls()
        for t in trials:
            if below is not None and t.number >= below:
                continue
            if t.state == state.WAITING:
                ledger.waiting += 1
                if t.user_attrs.get(QUEUED):
                    ledger.queued.add(t.user_attrs[QUEUED])
                continue
            if t.state == state.PRUNED:
                continue
            verdict = t.user_attrs.get(VERDICT)
            key = t.user_attrs.get(KEY)
            if t.state == state.RUNNING:
                if verdict is None:
                    ledger.pending += 1
                elif verdict == RUN and key:
                    ledger.runs += 1
                    ledger.running += 1
                    ledger.owned[key] = (None, t.user_attrs.get("seed"), False)
                continue
            # Finished. Trials of studies made before verdicts existed have a config key only if they ran.
            if verdict not in (RUN, None) or not key:
                continue
            if t.state == state.COMPLETE and verdict is None and key in ledger.owned:
                continue  # a repeat told its value, before verdicts
            if t.state == state.FAIL and FAILURE not in t.user_attrs:
                continue  # its worker died (or its evaluator broke): not a result, the config is free again
            if t.state not in (state.COMPLETE, state.FAIL):
                continue
            value = t.value if t.state == state.COMPLETE else None
            if value is not None and not math.isfinite(value):
                value = None
            ledger.runs += 1
            ledger.finished += 1
            ledger.owned[key] = (value, t.user_attrs.get("seed"), True)
        return ledger

    def results(self) -> dict[str, tuple[float | None, str | None]]:
        """Finished runs: config key -> (time in ms, or None where it failed; seed name)."""
        return {k: (v, s) for k, (v, s, done) in self.owned.items() if done}


class VerdictTimeout(RuntimeError):
    pass


def judge(study: Any, trial: Any, key: str, budget: int, *, grace_s: float = GRACE_S,
          wait_s: float = 600.0) -> tuple[str, float | None]:
    """Decide the fate of `trial`, which drew config `key`: (RUN, None), (REPEAT, its time or None), or
    (OVER, None). Written to the trial as its verdict before returning. Waits while trials below it are
    drawn but not yet judged (normally milliseconds; a dead worker's after `grace_s`, when it is failed)."""
    deadline = time.monotonic() + wait_s
    last_recovery = time.monotonic()
    while True:
        ledger = Ledger.of(study.get_trials(deepcopy=False), below=trial.number)
        if ledger.pending == 0:
            break
        if time.monotonic() > deadline:
            raise VerdictTimeout(f"trial {trial.number} waited {wait_s:.0f} s for the trials below it")
        if time.monotonic() - last_recovery > 1.0:
            recover_dead(study, grace_s)
            last_recovery = time.monotonic()
        time.sleep(POLL_S)
    # A trial below that still waits in the queue was numbered before this one but is judged after it (an
    # enqueue and another worker's ask crossed): its place and its config count as taken here, or both
    # could win them.
    if key in ledger.owned:
        verdict, value = REPEAT, ledger.owned[key][0]
    elif key in ledger.queued:
        verdict, value = REPEAT, None
    elif ledger.runs + ledger.waiting >= budget:
        verdict, value = OVER, None
    else:
        verdict, value = RUN, None
    # The key goes with a run only (a repeat or an over names its draw under "drew"), and before
    # the verdict: a reader that sees a run's verdict sees its key.
    trial.set_user_attr(KEY if verdict == RUN else "drew", key)
    trial.set_user_attr(VERDICT, verdict)
    return verdict, value


def check_name(name: str | None, *, what: str = "study name") -> str | None:
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise InvalidValueError(f"{what} must be a non-empty string, got {name!r}")
    return name


__all__ = ["GRACE_S", "HEARTBEAT_S", "Heartbeat", "Ledger", "OVER", "QUEUED", "REPEAT", "RUN", "INFEASIBLE", "VERDICT",
           "default_journal", "enqueue", "judge", "open_storage", "postgres_url", "recover_dead"]
