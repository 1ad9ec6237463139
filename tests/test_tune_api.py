"""`autotile.tune` on a machine without a GPU: typed errors, results that are never lost, re-tunes that
replace retired entries, studies bound to their problem, and a worker that never re-runs the caller's
script. The tuning loop itself is replayed from recorded timings (tests/data)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from replay_space import DATA

from autotile.codegen import build, kernels
from autotile.codegen.problem import ProblemKey
from autotile.dispatch.cache import TuningCache
from autotile.dispatch.record import Record
from autotile.errors import AutotileError, DeviceUnavailableError, InvalidValueError
from autotile.runtime.worker import IsolatedRunner, Setup, WorkerError
from autotile.tuning import api, study_report
from autotile.tuning.testing import ReplayEvaluator

REPO = Path(__file__).resolve().parent.parent
SHAPE = (1024, 1024, 1024)
NARROW = yaml.safe_load((DATA / "matmul_replay_space.yaml").read_text())["choices"]


@pytest.fixture(scope="module")
def table() -> dict:
    from test_tuner import load_table

    return load_table()


def _tune(table: dict, **kwargs):
    kwargs.setdefault("trials", 6)
    kwargs.setdefault("cache", None)
    return api.tune("matmul", SHAPE, evaluator=ReplayEvaluator(json.loads(json.dumps(table))), fix=NARROW, **kwargs)


def _no_gpu(monkeypatch) -> None:
    """Make the GPU check fail as it does on a machine without one, whatever this machine has."""
    from autotile.runtime import device

    def live_device(device_id=None):
        raise DeviceUnavailableError("no usable CUDA GPU: cudaErrorNoDevice")

    monkeypatch.setattr(device, "live_device", live_device)


def test_tune_without_a_gpu_raises_a_typed_error(monkeypatch):
    _no_gpu(monkeypatch)
    with pytest.raises(DeviceUnavailableError, match="no usable CUDA GPU"):
        api.tune("matmul", SHAPE, trials=2)


def test_the_gpu_check_runs_while_the_worker_starts_and_its_error_stops_the_worker():
    from autotile.codegen.problem import ProblemKey
    from autotile.runtime.worker import IsolatedRunner, Setup

    runner = IsolatedRunner(Setup(ProblemKey.of("matmul", "8x8x8")))
    started = []

    def check():
        started.append(runner._proc)
        assert runner._proc is not None and runner._proc.poll() is None  # the worker is starting meanwhile
        raise DeviceUnavailableError("no usable CUDA GPU: cudaErrorNoDevice")

    with pytest.raises(DeviceUnavailableError, match="no usable CUDA GPU"):
        runner.start(meanwhile=check)
    assert started[0].poll() is not None  # stopped, not left behind


@pytest.mark.parametrize("kwargs,named", [
    ({"seed": -3}, "-3"), ({"timeout": -5}, "-5"), ({"candidate_timeout": float("nan")}, "nan"),
    ({"trials": 0}, "0"), ({"storage": "garbage://x"}, "garbage"), ({"shape": "4096x4096²x4"}, "²"),
    ({"shape": (1.5, 2.9, 3)}, "1.5"), ({"shape": (True, 2, 3)}, "True"), ({"shape": (2**31, 2, 3)}, "2147483648"),
    ({"precision": "bogus"}, "'bogus'"), ({"precision": "highest", "fix": {"MATH": "tf32x3"}}, "tf32x3"),
])
def test_bad_options_fail_before_any_gpu_work(monkeypatch, kwargs, named):
    _no_gpu(monkeypatch)  # were the GPU asked for first, the error would be DeviceUnavailableError
    shape = kwargs.pop("shape", SHAPE)
    with pytest.raises(InvalidValueError) as info:
        api.tune("matmul", shape, **kwargs)
    assert named in str(info.value) and "\n" not in str(info.value)


def test_a_result_that_cannot_be_saved_is_returned_with_the_reason(tmp_path, table):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    cache = TuningCache(root=blocker, shipped_root=None)
    result = _tune(table, cache=cache)
    assert result.best.median_ms > 0  # the tuning result is there...
    assert result.save_error and str(blocker) in result.save_error  # ...and says why it was not saved
    assert result.saved_path is None


def _record(config, time_ms: float, source_sha: str, device: str, options=build.COMPILE_OPTIONS,
            compiler="nvrtc-13.0") -> Record:
    """An entry tuned with `compiler` and `options` (None: from before records named them, -ftz=true)."""
    env = {"source_sha": source_sha, "compiler": compiler}
    if options is not None:
        env["compile_options"] = list(options)
    return Record(kernel="matmul", dtype="float32", layout="row", shape=SHAPE, compat=kernels.compat_hash("matmul"),
                  config=dict(config), time_ms=time_ms, spread=0.01, metric=1.0, metric_unit="GFLOP/s",
                  baseline_ms=1.0, device=device, environment=env)


def test_a_retune_replaces_a_faster_entry_whose_kernel_changed(tmp_path, table):
    device = table["environment"]["device"]
    cache = TuningCache(root=tmp_path, shipped_root=None)
    retired = kernels.get("matmul").space.named("regtile-128")
    cache.put(_record(retired, 1e-6, "0" * 16, device))  # faster than anything, but its source is gone
    result = _tune(table, cache=cache)
    assert result.save_error is None and result.save_note is None
    stored = cache.get(device, ProblemKey("matmul", "float32", "row", SHAPE), kernels.compat_hash("matmul"))
    assert stored is not None and stored.config == dict(result.best.config)


def test_a_retune_keeps_a_faster_current_entry_and_says_so(tmp_path, table, monkeypatch):
    monkeypatch.setattr(build, "compiler_version", lambda: "nvrtc-13.0")  # the entry's compiler
    device = table["environment"]["device"]
    cache = TuningCache(root=tmp_path, shipped_root=None)
    spec = kernels.get("matmul")
    current = spec.space.named("regtile-128")
    cache.put(_record(current, 1e-6, kernels.source_hash(spec.render(current)), device))
    result = _tune(table, cache=cache)
    assert result.save_note and "kept" in result.save_note
    stored = cache.get(device, ProblemKey("matmul", "float32", "row", SHAPE), kernels.compat_hash("matmul"))
    assert stored is not None and stored.time_ms == 1e-6


@pytest.mark.parametrize("compiler,options", [("nvrtc-13.0", None), ("nvrtc-12.8", build.COMPILE_OPTIONS)])
def test_a_retune_replaces_a_faster_entry_of_another_build(tmp_path, table, monkeypatch, compiler, options):
    """A faster entry of the same kernel source but built with other compile options (from before the
    numerics change: -ftz=true) or another compiler is only the selection's fallback: kept, it would hide
    the new result, which the selection serves first."""
    from autotile.codegen.limits import PROFILES
    from autotile.dispatch import select

    monkeypatch.setattr(build, "compiler_version", lambda: "nvrtc-13.0")
    device = table["environment"]["device"]
    cache = TuningCache(root=tmp_path, shipped_root=None)
    spec = kernels.get("matmul")
    current = spec.space.named("regtile-128")
    old = _record(current, 1e-6, kernels.source_hash(spec.render(current)), device, options, compiler)
    cache.put(old)
    assert select.is_current(old) and not select.counts(old)
    result = _tune(table, cache=cache)
    assert result.save_error is None and result.save_note is None and result.saved_path
    key = ProblemKey("matmul", "float32", "row", SHAPE)
    stored = cache.get(device, key, kernels.compat_hash("matmul"))
    assert stored is not None and stored.config == dict(result.best.config) and select.counts(stored)
    profile = next(p for p in PROFILES.values() if p.fingerprint == device)
    assert select.select(key, profile, cache).source == "exact"


def test_a_study_is_bound_to_its_problem(tmp_path, table):
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    first = _tune(table, storage=storage, study_name="mine", trials=4)
    again = _tune(table, storage=storage, study_name="mine", trials=6)  # the same problem resumes
    assert first.trials == 4 and again.trials == 2
    with pytest.raises(InvalidValueError, match="study 'mine' tunes matmul float32 nn 1024x1024x1024"):
        api.tune("matmul", (512, 1024, 1024), evaluator=ReplayEvaluator(table), fix=NARROW, trials=6,
                 storage=storage, study_name="mine", cache=None)
    with pytest.raises(InvalidValueError, match="float64"):
        api.tune("matmul", SHAPE, dtype="float64", evaluator=ReplayEvaluator(table), fix=NARROW, trials=6,
                 storage=storage, study_name="mine", cache=None)


@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_a_study_resumed_after_the_space_gained_choices_keeps_the_ones_it_was_made_with(tmp_path, table, kind):
    # A study made when BM had one choice (as one made before a MATH or VEC choice existed): optuna refuses to
    # draw BM from two in the same study, so the resumed search keeps BM's one choice, and queues no named
    # config outside it. A search narrowed below what the study drew is refused in one line.
    storage = f"journal:{tmp_path / 'studies.log'}" if kind == "journal" else f"sqlite:///{tmp_path / 'studies.db'}"
    before = dict(NARROW, BM=[16])
    first = api.tune("matmul", SHAPE, evaluator=ReplayEvaluator(json.loads(json.dumps(table))), fix=before,
                     trials=4, storage=storage, study_name="mine", cache=None)
    again = _tune(table, storage=storage, study_name="mine", trials=8)
    assert first.trials == 4 and again.trials == 4
    study = study_report.load_study(storage, "mine")
    drawn = {t.params.get("BM") for t in study.get_trials(deepcopy=False) if "BM" in t.params}
    assert drawn == {16}
    with pytest.raises(InvalidValueError, match="study 'mine' drew BM from \\[16\\], and 16 is not a choice"):
        api.tune("matmul", SHAPE, evaluator=ReplayEvaluator(table), fix=dict(NARROW, BM=[128]), trials=10,
                 storage=storage, study_name="mine", cache=None)


def test_every_failure_reaches_the_caller_as_an_autotile_error(table):
    failing = json.loads(json.dumps(table))
    for entry in failing["results"].values():
        entry.update(status="compile", message="error: nothing compiles today")
    with pytest.raises(AutotileError, match="no candidate of matmul float32 nn 1024x1024x1024 ran correctly"):
        api.tune("matmul", SHAPE, evaluator=ReplayEvaluator(failing), fix=NARROW, trials=4, cache=None)


def test_the_worker_never_reruns_the_callers_script(tmp_path):
    """A script without `if __name__ == "__main__":` that starts a worker: the worker is a fresh
    interpreter that imports autotile.runtime.worker, so the script runs once, and the worker's failure (no GPU
    here; on a GPU machine it answers) is an AutotileError, never multiprocessing's bootstrapping error."""
    script = tmp_path / "user_script.py"
    marker = tmp_path / "runs.txt"
    script.write_text(textwrap.dedent(f"""
        from pathlib import Path
        from autotile.codegen.problem import ProblemKey
        from autotile.runtime.worker import IsolatedRunner, Setup
        with open({str(marker)!r}, "a") as f:
            f.write("run\\n")
        runner = IsolatedRunner(Setup(ProblemKey("matmul", "float32", "row", (8, 8, 8))), setup_timeout_s=120)
        try:
            runner.start()
            print("worker ready")
        except Exception as exc:
            print(type(exc).__name__, exc)
        finally:
            runner.close()
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert marker.read_text() == "run\n", proc.stderr
    assert "bootstrapping" not in proc.stdout + proc.stderr
    assert proc.stdout.startswith(("worker ready", "WorkerError")), proc.stdout + proc.stderr


def test_results_cross_the_process_boundary():
    """The worker's messages unpickle in the parent: its classes are autotile.runtime.worker's, not __main__'s."""
    from autotile.runtime.worker import OK, CandidateResult

    runner = IsolatedRunner(Setup(ProblemKey("matmul", "float32", "row", (8, 8, 8))))
    runner._spawn()
    try:
        sent = CandidateResult(7, OK, "fine")
        runner._send({"op": "echo", "value": sent})
        assert runner._receive(60) == sent
    finally:
        runner.close()


def test_worker_error_is_typed():
    assert issubclass(WorkerError, AutotileError)
    runner = IsolatedRunner(Setup(ProblemKey("matmul", "float32", "row", (8, 8, 8))))
    runner.close()  # closing a runner that never started is harmless


# -- the precision setting ------------------------------------------------------------------------------

def _limits(table: dict):
    from test_select import DeviceLimitsFromTable

    return DeviceLimitsFromTable(table)


def test_highest_searches_simt_only_and_the_record_needs_what_its_winner_needs(tmp_path, table):
    from autotile.tuning.tuner import TuneOptions, Tuner

    full = Tuner(ProblemKey("matmul", "float32", "row", SHAPE), TuneOptions(precision="highest"))
    assert full.space.params["MATH"].choices == ("simt", "dmma")  # dmma: IEEE float64, infeasible on float32
    assert not any(c["MATH"] in ("tf32x3", "wgmma") for c in full.space.named_configs.values())
    high = Tuner(ProblemKey("matmul", "float32", "row", SHAPE)).space
    # wgmma (3xTF32 on Hopper) is in the "high" space too; wgmma_direct and mma (16-bit inputs) are "high"
    # choices that the dtype constraint leaves infeasible on float32, as dmma is
    assert high.params["MATH"].choices == ("simt", "tf32x3", "dmma", "wgmma", "wgmma_direct", "mma")
    cache = TuningCache(root=tmp_path, shipped_root=None)
    result = _tune(table, cache=cache, precision="highest")
    assert result.precision == "highest" and result.study_name.endswith("-highest")
    stored = cache.get(table["environment"]["device"], ProblemKey("matmul", "float32", "row", SHAPE),
                       kernels.compat_hash("matmul"), allowed_by="highest")
    assert stored is not None and stored.precision == "highest"
    assert stored.environment["precision_setting"] == "highest"


def test_tune_takes_the_process_default(table):
    import autotile

    assert _tune(table).precision == "high"
    autotile.set_float32_matmul_precision("highest")
    assert _tune(table).precision == "highest"


def test_default_study_names_differ_by_the_class_searched(table):
    from autotile.tuning.tuner import TuneOptions, Tuner

    key = ProblemKey("matmul", "float32", "row", SHAPE)
    limits = _limits(table)
    names = {p: Tuner(key, TuneOptions(precision=p)).default_study_name(limits) for p in ("highest", "high", "medium")}
    assert names["high"] == names["medium"] == f"matmul-float32-nn-1024x1024x1024-{limits.fingerprint}"
    assert names["highest"] == names["high"] + "-highest"
    # Where the setting narrows nothing (matvec, float64) every setting searches the same space.
    for other in (ProblemKey("matvec", "float32", "row", (64, 64)), ProblemKey("matmul", "float64", "row", SHAPE)):
        assert not Tuner(other, TuneOptions(precision="highest")).default_study_name(limits).endswith("-highest")


def test_a_study_is_bound_to_its_precision(tmp_path, table):
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    _tune(table, storage=storage, study_name="mine", trials=4)
    with pytest.raises(InvalidValueError) as info:
        _tune(table, storage=storage, study_name="mine", trials=6, precision="highest")
    text = str(info.value)
    assert "at precision high, not" in text and "at precision highest" in text and "\n" not in text
    assert _tune(table, storage=storage, study_name="mine", trials=6, precision="medium").trials == 2  # same space


def test_a_study_bound_before_precisions_resumes_as_high(tmp_path, table):
    import optuna

    from autotile.tuning.tuner import PROBLEM_ATTR

    storage = f"sqlite:///{tmp_path / 'old.db'}"
    _tune(table, storage=storage, study_name="old", trials=4)
    study = optuna.load_study(study_name="old", storage=storage)
    bound = dict(study.user_attrs[PROBLEM_ATTR])
    del bound["precision"]  # as an autotile before precision settings bound it
    study.set_user_attr(PROBLEM_ATTR, bound)
    assert _tune(table, storage=storage, study_name="old", trials=6).trials == 2
    with pytest.raises(InvalidValueError, match="at precision highest"):
        _tune(table, storage=storage, study_name="old", trials=8, precision="highest")


@pytest.mark.parametrize("warm_starts", [0, 2])
def test_warm_starts_come_from_the_cache_given_and_can_be_turned_off(table, tmp_path, warm_starts):
    """The winner's record of another shape, in a cache object passed to tune, is a warm start of the next
    tune (and none with warm_starts=0)."""
    from autotile.dispatch.cache import TuningCache
    from autotile.tuning.tuner import PROPOSED, TRANSFER

    cache = TuningCache(root=tmp_path / "cache", shipped_root=None)
    first = _tune(table, trials=8, cache=cache)
    seen: list = []
    original = api.Tuner._enqueue_warm_starts

    def spy(self, study, problem, taken):
        original(self, study, problem, taken)
        seen.extend(t.user_attrs["transfer"] for t in study.get_trials(deepcopy=False)
                    if t.user_attrs.get(PROPOSED) == TRANSFER)

    import unittest.mock

    with unittest.mock.patch.object(api.Tuner, "_enqueue_warm_starts", spy):
        api.tune("matmul", (1024, 1024, 512), evaluator=ReplayEvaluator(json.loads(json.dumps(table))),
                 fix=NARROW, trials=6, cache=cache, warm_starts=warm_starts)
    if warm_starts == 0:
        assert seen == []
    else:
        from autotile.codegen.limits import DeviceLimits

        assert seen == [f"1024x1024x1024@{DeviceLimits.from_json(first.environment['limits']).fingerprint}"]


class _TimedReplay(ReplayEvaluator):
    """The recorded answers after a pause per candidate, split into phases as a GPU worker reports them."""

    PAUSE_S = 0.02

    def evaluate(self, candidates):
        import dataclasses
        import time

        time.sleep(self.PAUSE_S * len(candidates))
        return [dataclasses.replace(r, compile_wait_s=0.25 * self.PAUSE_S, check_s=0.25 * self.PAUSE_S,
                                    timing_s=0.4 * self.PAUSE_S)
                for r in super().evaluate(candidates)]


def test_the_phases_add_up_to_the_tunes_wall_time_and_are_printed(table):
    import time

    from autotile.cli.tune import format_phases, format_result
    from autotile.tuning.tuner import PHASES

    began = time.monotonic()
    result = api.tune("matmul", SHAPE, evaluator=_TimedReplay(json.loads(json.dumps(table))), fix=NARROW, trials=12,
                      cache=None)
    wall = time.monotonic() - began
    phases = result.phases
    assert set(phases) == {key for key, _ in PHASES}
    assert phases["compile"] == pytest.approx(12 * 0.25 * _TimedReplay.PAUSE_S)
    assert phases["timing"] == pytest.approx(12 * 0.4 * _TimedReplay.PAUSE_S)
    # The pauses' unreported part (0.1 of each) is the evaluator's "other"; the whole is the call's wall time.
    assert phases["other"] >= 12 * 0.1 * _TimedReplay.PAUSE_S * 0.9
    assert 0 < phases["start"] < wall / 2  # the checks and the space (the caller's evaluator is started)
    assert sum(phases.values()) == pytest.approx(wall, rel=0.05, abs=0.02)
    lines = format_phases(phases)
    assert lines[1].startswith("time: ") and len(lines) == 2 + len(PHASES)
    assert "waiting for compiles" in format_result(result) and "%" in lines[-1]
    assert format_phases({}) == []
    # a tune that mostly waited for compiles says how to compile ahead; one that did not, nothing more
    ahead = "autotile cache compile --kernel matmul --shape 9x9x9"
    waited = format_phases({"compile": 3.0, "timing": 1.0, "other": 1.0}, ahead)
    assert waited[-1].endswith(": " + ahead) and len(waited) == 2 + 3 + 1
    assert not any(ahead in line for line in format_phases({"compile": 1.0, "timing": 3.0}, ahead))
    waiting = dataclasses.replace(result, phases=dict(phases, compile=10 * sum(phases.values())))
    assert format_result(waiting).endswith(f"autotile cache compile --kernel matmul --dtype {result.dtype} "
                                           f"--layout {result.layout} --shape {'x'.join(map(str, result.shape))}")


def test_the_worker_compiles_each_source_once_and_takes_up_what_prepare_started(monkeypatch):
    """The worker's message loop with the GPU left out: a "prepare" starts compiles, the "evaluate" that
    follows takes them up instead of compiling again, and two candidates that render alike compile once."""
    import concurrent.futures
    import types

    from autotile.runtime import worker
    from autotile.runtime.timing import Timing

    compiled = []

    def compile_many(jobs, threads, clock=None):
        futures = []
        for job in jobs:
            compiled.append(job[0])
            future = concurrent.futures.Future()
            future.set_result(object())
            futures.append(future)
        return futures

    state = types.SimpleNamespace(compiling={}, compile_clock={}, kernels={}, baseline=None, environment=lambda: {},
                                  setup=types.SimpleNamespace(compile_threads=4, compile_deadline=True))
    await_compile = worker._WorkerState.await_compile  # the real one: _WorkerState itself is replaced below
    state.await_compile = lambda job, future, wait_until=None: await_compile(state, job, future, wait_until)
    monkeypatch.setattr(build, "compile_many", compile_many)
    monkeypatch.setattr(worker, "_WorkerState", lambda setup: state)
    monkeypatch.setattr(worker, "_evaluate", lambda state, cand, kernel, compile_s:
                        worker.CandidateResult(cand.id, worker.OK, "", Timing(1.0, 1.0, 1.0, 1.0, 5)))

    def cand(i, source):
        return worker.Candidate(i, source, "k", {}, f"key{i}")

    class Conn:
        def __init__(self, messages):
            self.messages, self.sent = list(messages), []

        def recv(self):
            return self.messages.pop(0)

        def send(self, message):
            self.sent.append(message)

    conn = Conn([{"op": "setup", "setup": None},
                 {"op": "prepare", "candidates": [cand(1, "a"), cand(2, "b"), cand(3, "a")]},
                 {"op": "evaluate", "candidates": [cand(4, "a"), cand(5, "b"), cand(6, "a"), cand(7, "c")]},
                 {"op": "stop"}])
    worker._serve(conn)
    assert compiled == ["a", "b", "c"]
    assert [(r.id, r.status) for r in conn.sent[1:]] == [(4, "ok"), (5, "ok"), (6, "ok"), (7, "ok")]
    assert state.compiling == {}


def test_the_compile_deadline_is_ten_median_compiles_and_at_least_the_floor():
    from autotile.runtime import worker

    assert worker.compile_deadline_s([]) == worker.COMPILE_DEADLINE_FLOOR_S
    assert worker.compile_deadline_s([0.01] * 30) == worker.COMPILE_DEADLINE_FLOOR_S  # compile-cache hits
    assert worker.compile_deadline_s([1.0, 3.0, 5.0, 60.0]) == worker.COMPILE_DEADLINE_FACTOR * 5.0


@pytest.mark.parametrize("deadline", [True, False])
def test_a_compile_past_its_deadline_is_not_waited_for_unless_told_to(monkeypatch, deadline):
    import concurrent.futures
    import time as time_mod
    import types

    from autotile.runtime import worker

    job = ("source", "k")
    state = types.SimpleNamespace(setup=types.SimpleNamespace(compile_deadline=deadline),
                                  compile_clock={("done", "k"): (0.0, 2.0)})
    started = time_mod.monotonic()
    limit = worker.compile_deadline_s([2.0])  # the finished compile's
    state.compile_clock[job] = (started - limit - 1, None)  # still running, too long
    future: concurrent.futures.Future = concurrent.futures.Future()
    if deadline:
        with pytest.raises(worker.CompileTooSlow, match=f"still running after {limit:.0f} s"):
            worker._WorkerState.await_compile(state, job, future)
        assert time_mod.monotonic() - started < 5
    else:  # a sweep waits for every compile: here, for a compile that ends a moment later
        import threading

        threading.Timer(0.2, lambda: future.set_result("kernel")).start()
        assert worker._WorkerState.await_compile(state, job, future) == "kernel"
    on_time: concurrent.futures.Future = concurrent.futures.Future()
    on_time.set_result("fast")
    assert worker._WorkerState.await_compile(state, ("other", "k"), on_time) == "fast"
