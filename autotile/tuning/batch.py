"""`autotile batch FILE`: tune a list of problems (kernel, shape, dtype, layout), spread over GPUs and hosts.

The list itself is an optuna study (the *batch study*, in the same storage as the problems' own studies):
one enqueued trial per problem, in decreasing order of work, so that the longest go first and the GPUs
finish together. A worker takes the next waiting problem (optuna hands a waiting trial to one process
only), tunes it alone in the problem's own study, stores the winner in its host's cache and tells the
problem's trial the best time (user attributes: config, GFLOP/s, ratio to cuBLAS, failure reason). Its
heart beats while it works: a worker that dies has its problem failed and enqueued again (`study.py`),
and whoever takes it resumes the problem's study where it stopped. Running the same command again
resumes the batch: finished problems are not tuned again.

Rebuilding a shape database: the survey's portfolio holds every config tuned on the device, so
`autotile batch problems.yaml --survey` tunes the list and then re-runs `autotile survey` on the first GPU.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import math
import time
from pathlib import Path
from typing import Any, Callable

from autotile import safe_files
from autotile.codegen import kernels
from autotile.codegen.problem import LAYOUT_ALIASES, ProblemKey
from autotile.errors import AutotileError, InvalidValueError, shown
from autotile.tuning import validate

BATCH_ATTR = "autotile_batch"  # the batch study's user attribute: its problems and device
INDEX = "problem_index"  # a problem trial's user attribute: its row in the list
FIELDS = ("kernel", "shape", "dtype", "layout", "trials")


@dataclasses.dataclass(frozen=True)
class Item:
    """One problem of the list, and the trials its study gets (None: the command's --trials)."""

    key: ProblemKey
    trials: int | None = None

    @property
    def label(self) -> str:
        return f"{self.key.kernel} {self.key.shape_text} {self.key.dtype} {self.key.layout}"

    def to_json(self) -> dict[str, Any]:
        return dict(self.key.to_json(), trials=self.trials)


def read_problems(path: str | Path) -> list[Item]:
    """The problems of a YAML file (a list of mappings, or {"problems": [...]}) or a CSV file (a header
    naming kernel, shape and optionally dtype, layout, trials), checked; a bad row is one line naming it."""
    path = Path(path)
    text = safe_files.read_text(path, "problems file")
    rows: list[Any]
    if path.suffix.lower() == ".csv":
        try:
            rows = list(csv.DictReader(io.StringIO(text)))
        except csv.Error as exc:
            raise InvalidValueError(f"{path}: not a valid CSV file: {exc}") from None
    else:
        data = safe_files.load_yaml(text, str(path))
        listed = data.get("problems") if isinstance(data, dict) else data
        if not isinstance(listed, list):
            raise InvalidValueError(f"problems file {str(path)!r} must hold a list of problems "
                                    "(or a mapping with a 'problems' list)")
        rows = listed
    if not rows:
        raise InvalidValueError(f"problems file {str(path)!r} lists no problem")
    items, seen = [], set()
    for n, row in enumerate(rows, 1):
        where = f"{path.name} problem {n}"
        if not isinstance(row, dict):
            raise InvalidValueError(f"{where}: expected a mapping with {', '.join(FIELDS)}, got {row!r}")
        # A CSV row with more cells than the header has names has a None key (csv's restkey)
        unknown = sorted("(a cell without a column name)" if k is None else str(k) for k in set(row) - set(FIELDS))
        if unknown:
            named = ", ".join(shown(k) for k in unknown[:5]) + (", ..." if len(unknown) > 5 else "")
            raise InvalidValueError(f"{where}: unknown field(s) {named}; fields: {', '.join(FIELDS)}")
        if not row.get("kernel") or not row.get("shape"):
            raise InvalidValueError(f"{where}: kernel and shape are required")
        try:
            spec = kernels.get(str(row["kernel"]).strip())
            shape = row["shape"]
            if not isinstance(shape, str) and not (isinstance(shape, list) and shape and all(
                    isinstance(n, int) and not isinstance(n, bool) for n in shape)):
                raise InvalidValueError(f"shape must be text such as '4096x4096x4096' or a list of integers, "
                                        f"not {shown(shape)}")
            shape = spec.parse_shape(shape if isinstance(shape, str) else "x".join(map(str, shape)))
            layout = str(row.get("layout") or "").strip() or spec.space.layouts[0]
            layout = LAYOUT_ALIASES.get(spec.name, {}).get(layout, layout)
            if layout not in spec.space.layouts:
                raise InvalidValueError(f"{spec.name} supports layout(s) {list(spec.space.layouts)}, not {layout!r}")
            dtype = str(row.get("dtype") or "").strip() or "float32"
            key = ProblemKey.of(spec.name, shape, dtype, layout)
            trials = row.get("trials")
            trials = validate.count(trials, name="trials") if trials not in (None, "") else None
        except (AutotileError, ValueError) as exc:
            raise InvalidValueError(f"{where}: {exc}") from None
        if key in seen:
            raise InvalidValueError(f"{where}: {key} is listed twice")
        seen.add(key)
        items.append(Item(key, trials))
    return items


def batch_name(items: list[Item], trials: int, fingerprint: str) -> str:
    """The batch study's default name: the same list, budget and GPU model resume the same batch."""
    text = json.dumps([i.to_json() for i in items] + [trials, fingerprint], sort_keys=True)
    return f"batch-{fingerprint}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def work(key: ProblemKey) -> float:
    """A problem's size, for the order: FLOPs (or bytes for matvec), the largest tuned first."""
    return float(math.prod(key.shape))


# -- the batch study --------------------------------------------------------------------------------------

def open_batch(storage: str, name: str, items: list[Item], fingerprint: str) -> Any:
    """The batch study (created, or resumed), with every problem that has no trial yet enqueued."""
    import optuna

    from autotile.tuning.study import open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize", storage=open_storage(storage), study_name=name,
                                load_if_exists=True)
    mine = {"problems": [i.to_json() for i in items], "device": fingerprint}
    bound = study.user_attrs.get(BATCH_ATTR)
    if bound is None:
        study.set_user_attr(BATCH_ATTR, mine)
    elif bound != mine:
        raise InvalidValueError(f"study {name!r} is a batch of other problems or another GPU model; "
                                "use another --study-name")
    present = {t.user_attrs.get(INDEX) for t in study.get_trials(deepcopy=False)}
    for index in sorted(range(len(items)), key=lambda i: -work(items[i].key)):
        if index not in present:
            study.enqueue_trial({}, user_attrs={INDEX: index, "problem": items[index].label})
    return study


def _retry(study: Any, dead: Any, history: list[int]) -> None:
    from autotile.tuning.study import RETRY_OF

    study.enqueue_trial({}, user_attrs={INDEX: dead.user_attrs.get(INDEX), "problem": dead.user_attrs.get("problem"),
                                        RETRY_OF: history})


def _take(study: Any) -> Any:
    """The next waiting problem's trial, now RUNNING and this process's, or None where none waits."""
    import optuna

    storage = study._storage
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
        try:
            if storage.set_trial_state_values(t._trial_id, state=optuna.trial.TrialState.RUNNING):
                return optuna.trial.Trial(study, t._trial_id)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
    return None


def _finished(study: Any, index: int, number: int) -> bool:
    """Whether another trial of problem `index` finished with a result (a batch enqueued twice by two hosts
    starting together, or a retry of a worker taken for dead that was only slow)."""
    import optuna

    return any(t.user_attrs.get(INDEX) == index and t.number != number and t.state == optuna.trial.TrialState.COMPLETE
               for t in study.get_trials(deepcopy=False))


def run_batch_worker(payload: dict[str, Any]) -> None:
    """Take problems from the batch study and tune them, one at a time, until none is left."""
    import optuna

    from autotile.tuning.gpu_workers import key_of, load_backend
    from autotile.tuning.results import save_result as _save
    from autotile.tuning.study import POLL_S, Heartbeat, recover_dead
    from autotile.tuning.tuner import TuneOptions, Tuner, TuningError

    items = [Item(key_of(p), p.get("trials")) for p in payload["problems"]]
    study = optuna.load_study(study_name=payload["study"], storage=_storage(payload["storage"]))
    impl = load_backend(payload.get("backend"))
    device = payload.get("device", 0)
    grace = payload["options"].get("grace_s", 60.0)
    with Heartbeat(study) as heart:
        while True:
            recover_dead(study, grace, retry=_retry)
            trial = _take(study)
            if trial is None:
                running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
                if not running:
                    return
                time.sleep(POLL_S * 5)  # another worker's problem may die and come back
                continue
            heart.add(trial._trial_id)
            index = trial.user_attrs[INDEX]
            if _finished(study, index, trial.number):
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                continue
            item = items[index]
            trial.set_user_attr("device", payload.get("gpu", device))  # the GPU as --devices named it
            options = TuneOptions(**dict(payload["options"], trials=item.trials or payload["trials"],
                                         storage=payload["storage"], study_name=None))
            tuner = Tuner(item.key, options, space=impl.space(item.key.kernel))
            evaluator = impl.evaluator(item.key, options.seed, device, options.candidate_timeout_s)
            started = time.monotonic()
            try:
                if hasattr(evaluator, "start"):
                    evaluator.start()
                from autotile.codegen.limits import DeviceLimits

                limits = DeviceLimits.from_json(evaluator.environment["limits"])
                result = tuner.run(evaluator, limits)
            except TuningError as exc:
                trial.set_user_attr("failure", " ".join(str(exc).split())[:1000])
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                continue
            finally:
                if hasattr(evaluator, "close"):
                    evaluator.close()
            if payload.get("cache"):
                from autotile.dispatch.cache import TuningCache

                root = payload.get("cache_root")
                result = _save(result, tuner.render(result.best.config),
                               TuningCache(root=Path(root)) if root else "default")
            trial.set_user_attr("config", result.best.config.key())
            trial.set_user_attr(result.metric_unit.replace("/", "_per_"), round(result.metric, 1))
            if result.vs_baseline:
                trial.set_user_attr("x_cublas", round(result.vs_baseline, 3))
            trial.set_user_attr("trials", result.trials)
            trial.set_user_attr("seconds", round(time.monotonic() - started, 1))
            trial.set_user_attr("study", result.study_name)
            if result.saved_path or result.save_error or result.save_note:
                trial.set_user_attr("saved", result.saved_path or result.save_note or f"not saved: {result.save_error}")
            study.tell(trial, result.best.median_ms)
            heart.remove(trial._trial_id)


def _storage(spec: str) -> Any:
    from autotile.tuning.study import open_storage

    return open_storage(spec)


# -- the command's parent ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Outcome:
    """A problem's row in the closing table."""

    item: Item
    status: str  # done, failed, pending
    best_ms: float | None = None
    metric: float | None = None
    unit: str = ""
    x_cublas: float | None = None
    trials: int | None = None
    seconds: float | None = None
    device: int | None = None
    config: str = ""
    note: str = ""


def outcomes(study: Any, items: list[Item]) -> list[Outcome]:
    import optuna

    state = optuna.trial.TrialState
    best: dict[int, Outcome] = {}
    for t in study.get_trials(deepcopy=False):
        index = t.user_attrs.get(INDEX)
        if index is None or not 0 <= index < len(items):
            continue
        item = items[index]
        if t.state == state.COMPLETE:
            unit = kernels.metric(item.key.kernel, item.key.shape, item.key.dtype, 1.0)[1]
            a = t.user_attrs
            best[index] = Outcome(item, "done", t.value, a.get(unit.replace("/", "_per_")), unit, a.get("x_cublas"),
                                  a.get("trials"), a.get("seconds"), a.get("device"), a.get("config", ""),
                                  a.get("saved", ""))
        elif t.state == state.FAIL and "failure" in t.user_attrs and best.get(index, None) is None:
            best[index] = Outcome(item, "failed", note=t.user_attrs["failure"])
    return [best.get(i, Outcome(item, "pending")) for i, item in enumerate(items)]


def line(o: Outcome, done: int, total: int) -> str:
    """One progress line for a problem that finished."""
    if o.status != "done":
        return f"[{done}/{total}] {o.item.label}: failed: {o.note}"
    ratio = f", {o.x_cublas:.2f}x cuBLAS" if o.x_cublas else ""
    return (f"[{done}/{total}] {o.item.label}: {o.best_ms:.4f} ms, {o.metric or 0:,.0f} {o.unit}{ratio} "
            f"(GPU {o.device}, {o.trials} trials, {o.seconds:.0f} s)")


def table(rows: list[Outcome]) -> str:
    out = [f"{'problem':<40} {'status':<8} {'ms':>9} {'metric':>16} {'x cuBLAS':>9} {'GPU':>4}  config"]
    for o in rows:
        metric = f"{o.metric:,.0f} {o.unit}" if o.metric is not None else "-"
        ms = f"{o.best_ms:.4f}" if o.best_ms is not None else "-"
        ratio = f"{o.x_cublas:.2f}" if o.x_cublas else "-"
        gpu = str(o.device) if o.device is not None else "-"
        out.append(f"{o.item.label:<40} {o.status:<8} {ms:>9} {metric:>16} {ratio:>9} {gpu:>4}  "
                   f"{o.config or o.note}")
    return "\n".join(out)


def run_batch(items: list[Item], *, devices: list[int], trials: int, options: dict[str, Any], storage: str | None,
              study_name: str | None, backend: str | None, cache: bool, cache_root: str | None,
              say: Callable[[str], None]) -> tuple[list[Outcome], float]:
    """Tune every problem of `items` with one worker per GPU; returns the closing rows and the wall time (s).
    `say` gets one line per problem as it finishes (and the start-up lines)."""
    from autotile.dispatch.cache import default_root
    from autotile.tuning.gpu_workers import Worker, load_backend, same_model, supervise
    from autotile.tuning.study import default_journal, recover_dead

    impl = load_backend(backend)
    limits = same_model(impl, devices)
    name = study_name or batch_name(items, trials, limits.fingerprint)
    storage = storage or default_journal(Path(cache_root) if cache_root else default_root(), name)
    study = open_batch(storage, name, items, limits.fingerprint)
    already = {i for i, o in enumerate(outcomes(study, items)) if o.status != "pending"}
    say(f"batch {name!r}: {len(items)} problems ({len(already)} done before), {len(devices)} worker(s), "
        f"storage {storage}")
    payload = {"role": "batch", "study": name, "storage": storage, "problems": [i.to_json() for i in items],
               "trials": trials, "options": options, "backend": backend, "cache": cache, "cache_root": cache_root}
    # `device` is the GPU as the worker sees it (its only one, 0, on a real GPU); `gpu` as --devices named it.
    workers = [Worker(d, dict(payload, device=0 if backend is None else d, gpu=d), backend) for d in devices]
    reported = set(already)
    started = time.monotonic()
    grace = options.get("grace_s", 60.0)

    def tick() -> None:
        recover_dead(study, grace, retry=_retry)
        rows = outcomes(study, items)
        for i, o in enumerate(rows):
            if o.status != "pending" and i not in reported:
                reported.add(i)
                say(line(o, len(reported), len(items)))

    def done() -> bool:
        return all(o.status != "pending" for o in outcomes(study, items))

    supervise(workers, done, tick, say)
    return outcomes(study, items), time.monotonic() - started


__all__ = ["Item", "Outcome", "read_problems", "run_batch", "table"]
