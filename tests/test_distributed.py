"""Many workers on one study, and the batch command: real processes on a journal file and on a throwaway
PostgreSQL server, timing through the replay backend (`autotile.tuning.testing.ReplayBackend`: the recorded H200
table, with a pause per candidate). No GPU is needed.

Every worker appends "PID PROBLEM CONFIG" to an evaluation log before it times a candidate, so the tests
count what was timed, by whom, across processes.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
import yaml
from replay_space import DATA, replay_space

from autotile.codegen.space import Problem
from autotile.errors import InvalidValueError
from autotile.tuning import study as study_mod
from autotile.tuning.batch import INDEX, read_problems
from autotile.tuning.testing import ReplayBackend

REPO = Path(__file__).resolve().parents[1]
BACKEND = "autotile.tuning.testing:ReplayBackend"
SHAPE = "1024x1024x1024"
SEEDS = ("seed-naive", "seed-tiled16")


# -- fixtures ----------------------------------------------------------------------------------------------

@pytest.fixture
def replay(tmp_path, monkeypatch):
    """Configures the replay backend for the processes a test starts; returns a function (delay_s) -> the
    evaluation log's path."""
    monkeypatch.setenv("AUTOTILE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))

    def configure(delay_s: float = 0.0) -> Path:
        log = tmp_path / "evaluations.log"
        settings = {"table": str(DATA / "matmul_replay_h200.json"), "space": str(DATA / "matmul_replay_space.yaml"),
                    "delay_s": delay_s, "log": str(log)}
        (tmp_path / "replay.json").write_text(json.dumps(settings))
        monkeypatch.setenv(ReplayBackend.ENV_VAR, str(tmp_path / "replay.json"))
        return log

    return configure


def _pg_tool(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def postgres():
    """A throwaway PostgreSQL server on loopback (initdb + pg_ctl in a temporary folder, removed after);
    yields the URL of an empty database. As root, the server runs as the `postgres` user (initdb refuses
    root)."""
    initdb, pg_ctl = _pg_tool("initdb"), _pg_tool("pg_ctl")
    if not initdb or not pg_ctl:
        reason = "PostgreSQL server binaries (initdb, pg_ctl) not found"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}: CI installs them (.ci/run)")
        pytest.skip(reason)
    psycopg = pytest.importorskip("psycopg", reason="psycopg (the postgres extra) is not installed")
    root = Path(tempfile.mkdtemp(prefix="autotile-pg-"))
    prefix: list[str] = []
    if os.geteuid() == 0:
        import pwd

        user = pwd.getpwnam("postgres")
        os.chown(root, user.pw_uid, user.pw_gid)
        prefix = ["runuser", "-u", "postgres", "--"]
    port = _free_port()
    data = root / "data"
    subprocess.run(prefix + [initdb, "-D", str(data), "-U", "autotile", "--auth=trust", "-E", "UTF8"], check=True,
                   capture_output=True)
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off"
    subprocess.run(prefix + [pg_ctl, "-D", str(data), "-l", str(root / "server.log"), "-o", options, "-w", "start"],
                   check=True, capture_output=True)
    try:
        with psycopg.connect(f"host=127.0.0.1 port={port} user=autotile dbname=postgres", autocommit=True) as conn:
            conn.execute("CREATE DATABASE tune")
        yield f"postgresql://autotile@127.0.0.1:{port}/tune"
    finally:
        subprocess.run(prefix + [pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(params=["journal", "postgres"])
def storage(request, tmp_path):
    """A storage URL of each kind, with a study name of its own per test."""
    if request.param == "journal":
        return f"journal:{tmp_path / 'studies.journal'}"
    return request.getfixturevalue("postgres")


def autotile(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autotile", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "autotile", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def evaluations(log: Path) -> list[tuple[int, str, str]]:
    if not log.exists():
        return []
    return [(int(p), tag, key) for p, tag, key in (line.split(" ", 2) for line in log.read_text().splitlines())]


def load(storage: str, name: str):
    return optuna.load_study(study_name=name, storage=study_mod.open_storage(storage))


def seed_keys() -> set[str]:
    space = replay_space()
    return {space.named_configs[s].key() for s in SEEDS}


def medians() -> dict[str, float]:
    space = replay_space()
    raw = json.loads((DATA / "matmul_replay_h200.json").read_text())
    return {space.config(dict(i.split("=", 1) for i in k.split(","))).key(): e["timing"]["median_ms"]
            for k, e in raw["results"].items() if e["status"] == "ok"}


def tune_args(storage: str, name: str, trials: int, devices: str = "0,1,2,3") -> list[str]:
    return ["tune", "matmul", "--shape", SHAPE, "--layout", "nn", "--trials", str(trials), "--devices", devices,
            "--backend", BACKEND, "--storage", storage, "--study-name", name]


def cached_config(cache: Path) -> str:
    (record,) = cache.rglob("matmul-float32-nn-1024x1024x1024-*.json")
    config = json.loads(record.read_text())["config"]
    return replay_space().config({k: str(v) for k, v in config.items()}).key()


def _trials_told(study, keys: list[str]) -> str:
    """Each trial of `study` as number, state, verdict, retry-of and whether its config was timed more than
    once: a failing count's explanation."""
    twice = {k for k, n in Counter(keys).items() if n > 1}
    rows = []
    for t in study.get_trials(deepcopy=False):
        key = t.user_attrs.get(study_mod.KEY) or t.user_attrs.get("drew") or t.user_attrs.get(study_mod.QUEUED)
        rows.append(f"{t.number} {t.state.name} {t.user_attrs.get(study_mod.VERDICT)} "
                    f"{t.user_attrs.get(study_mod.RETRY_OF)}{' TIMED TWICE' if key in twice else ''}")
    return f"{len(keys)} timed, {len(set(keys))} configs; trials: " + "; ".join(rows)


def runs(study) -> list:
    """The study's runs finished with a result."""
    return [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get(study_mod.VERDICT) == study_mod.RUN
            and t.state.is_finished() and (t.state == optuna.trial.TrialState.COMPLETE or "failure" in t.user_attrs)]


# -- many workers, one study ---------------------------------------------------------------------------------

def test_four_workers_share_one_budget_and_time_each_config_once(replay, storage, tmp_path):
    log = replay(delay_s=0.05)
    name = f"four-{tmp_path.name}"
    done = autotile(*tune_args(storage, name, 24))
    assert done.returncode == 0, done.stderr
    timed = evaluations(log)
    keys = [k for _, _, k in timed]
    # the budget exactly, no config twice (else: what each trial was, to tell a race from a retry)
    assert len(keys) == 24 and len(set(keys)) == 24, _trials_told(load(storage, name), keys)
    assert len({pid for pid, _, _ in timed}) >= 2  # the work was shared
    assert Counter(keys)[min(seed_keys())] == 1 and seed_keys() <= set(keys)  # each seed once
    study = load(storage, name)
    assert len(runs(study)) == 24
    assert not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    # The winner is the best of the trials run (the replay's re-timing keeps each config's median).
    recorded = medians()
    # (two configs of the table share a median: either is the best; which one depends on the workers' order)
    winner = cached_config(tmp_path / "cache")
    assert winner in keys and recorded[winner] == min(recorded[k] for k in keys)
    for t in runs(study):  # readable in optuna-dashboard
        assert t.user_attrs["config_key"] and t.user_attrs["GFLOP_per_s"] > 0 and t.user_attrs["x_cublas"] > 0

    # The same command again resumes: nothing left to do; a larger budget runs only the difference.
    again = autotile(*tune_args(storage, name, 24))
    assert again.returncode == 0, again.stderr
    assert len(evaluations(log)) == 24
    more = autotile(*tune_args(storage, name, 30))
    assert more.returncode == 0, more.stderr
    keys = [k for _, _, k in evaluations(log)]
    assert len(keys) == 30 and len(set(keys)) == 30
    assert len(runs(load(storage, name))) == 30


def test_a_killed_worker_has_its_trial_recovered_and_the_study_completes(replay, storage, tmp_path):
    log = replay(delay_s=0.4)
    name = f"killed-{tmp_path.name}"
    parent = start(*tune_args(storage, name, 24))
    try:
        deadline = time.monotonic() + 120
        while len(evaluations(log)) < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        victim, _, victim_key = evaluations(log)[-1]  # mid-candidate: its pause has just begun
        os.kill(victim, signal.SIGKILL)
        out, _ = parent.communicate(timeout=240)
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
    assert parent.returncode == 0, out
    study = load(storage, name)
    assert len(runs(study)) == 24
    dead = [t for t in study.get_trials(deepcopy=False)
            if t.state == optuna.trial.TrialState.FAIL and "failure" not in t.user_attrs]
    assert dead, "the killed worker's trial was not failed"
    retries = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get(study_mod.RETRY_OF)]
    described = [(t.number, t.state.name, t.user_attrs.get(study_mod.RETRY_OF), t.user_attrs.get(study_mod.VERDICT))
                 for t in retries]
    assert retries and any(t.state.is_finished() for t in retries), described
    # The killed worker held a compile batch of RUNNING trials: each is failed and its config queued again.
    # A retry the budget did not need stays queued (WAITING) for a larger budget to take first: trials
    # asked before the retries were queued, and judged after, may fill the budget's last places (CI's two
    # cores, 2026-11-28: retries 29-31 ran, 32 waited, the study complete with its 24 runs).
    dead_numbers = {t.number for t in dead}
    for t in retries:
        assert t.state.is_finished() or t.state == optuna.trial.TrialState.WAITING, described
        assert set(t.user_attrs[study_mod.RETRY_OF]) <= dead_numbers, described
    assert not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    # Only configs a dead worker had begun were started twice; every run finished once.
    counts = Counter(k for _, _, k in evaluations(log))
    started_by_victim = {k for pid, _, k in evaluations(log) if pid == victim}
    assert victim_key in started_by_victim
    assert all(n == 1 or k in started_by_victim for k, n in counts.items())
    assert len({t.user_attrs["config_key"] for t in runs(study)}) == 24


def test_a_worker_on_another_host_is_taken_for_dead_by_its_heartbeat(tmp_path):
    study = optuna.create_study(storage=study_mod.open_storage(f"journal:{tmp_path / 's.journal'}"),
                                study_name="hb")
    trial = study.ask({"BM": optuna.distributions.CategoricalDistribution([16, 32])})
    trial.set_user_attr(study_mod.KEY, "BM=16")
    trial.set_user_attr(study_mod.VERDICT, study_mod.RUN)
    storage = study._storage
    storage.set_trial_system_attr(trial._trial_id, study_mod.WORKER, {"machine": "elsewhere", "pid": 1})
    storage.set_trial_system_attr(trial._trial_id, study_mod.HEARTBEAT, time.time() - 30)
    assert study_mod.recover_dead(study, grace_s=60) == []  # still within its grace
    assert study_mod.recover_dead(study, grace_s=10) == [trial.number]
    assert study_mod.recover_dead(study, grace_s=10) == []  # failed once, retried once
    (waiting,) = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert waiting.user_attrs[study_mod.RETRY_OF] == [trial.number]
    assert study.trials[trial.number].state == optuna.trial.TrialState.FAIL


def test_judge_orders_claims_by_trial_number(tmp_path):
    """Two trials drawing one config: the lower number runs, the higher is a repeat; past the budget, over."""
    study = optuna.create_study(storage=study_mod.open_storage(f"journal:{tmp_path / 's.journal'}"),
                                study_name="judge")
    dist = {"BM": optuna.distributions.CategoricalDistribution([16, 32, 64])}
    a, b, c = study.ask(dist), study.ask(dist), study.ask(dist)
    assert study_mod.judge(study, a, "BM=16", budget=2) == (study_mod.RUN, None)
    assert study_mod.judge(study, b, "BM=16", budget=2) == (study_mod.REPEAT, None)
    study.tell(b, state=optuna.trial.TrialState.PRUNED)
    assert study_mod.judge(study, c, "BM=32", budget=2) == (study_mod.RUN, None)
    study.tell(a, 1.5)
    d = study.ask(dist)
    assert study_mod.judge(study, d, "BM=64", budget=2) == (study_mod.OVER, None)
    e = study.ask(dist)
    assert study_mod.judge(study, e, "BM=16", budget=3) == (study_mod.REPEAT, 1.5)


def test_judge_counts_the_trials_queued_below_a_claim(tmp_path):
    """A trial queued (WAITING) with a number below a fresh trial, as when one worker enqueues its proposal
    while another's ask creates a new trial: judged later, it sees only the trials below it. So the fresh
    trial counts the queued one's place and config as taken: the budget is never exceeded and no config
    runs twice, whichever is asked first."""
    study = optuna.create_study(storage=study_mod.open_storage(f"journal:{tmp_path / 's.journal'}"),
                                study_name="queued")
    dist = {"BM": optuna.distributions.CategoricalDistribution([16, 32, 64])}
    first = study.ask(dist)
    assert study_mod.judge(study, first, "BM=16", budget=2) == (study_mod.RUN, None)
    study_mod.enqueue(study, {"BM": 32}, "BM=32")  # trial 1, WAITING
    # trial 2, created while trial 1 still waits (another worker's ask that did not see it)
    fresh = optuna.trial.Trial(study, study._storage.create_new_trial(study._study_id))
    assert study_mod.judge(study, fresh, "BM=64", budget=2) == (study_mod.OVER, None)  # the budget's last place
    assert study_mod.judge(study, fresh, "BM=32", budget=3) == (study_mod.REPEAT, None)  # the queued config
    queued = study.ask(dist)
    assert queued.number == 1 and queued.params["BM"] == 32
    assert study_mod.judge(study, queued, "BM=32", budget=2) == (study_mod.RUN, None)


def test_gpus_of_different_models_are_refused(replay):
    from autotile.tuning.gpu_workers import same_model

    replay()

    class Mixed(ReplayBackend):
        def limits(self, device):
            import dataclasses

            limits = super().limits(device)
            return limits if device == 0 else dataclasses.replace(limits, name="NVIDIA A100")

    with pytest.raises(InvalidValueError, match="GPU 1 is NVIDIA-A100_sm_90, GPU 0 is NVIDIA-H200_sm_90"):
        same_model(Mixed(), [0, 1])


@pytest.mark.parametrize("text,message", [("0,x", "'x' is not a GPU index"), ("1,1", "named twice"),
                                          ("", "is not a GPU index")])
def test_devices_are_checked(text, message):
    from autotile.tuning.gpu_workers import parse_devices

    with pytest.raises(InvalidValueError, match=message):
        parse_devices(text)


def test_journal_storage_urls_are_checked(tmp_path):
    from autotile.tuning import validate

    assert validate.storage_url(f"journal:{tmp_path}/s.journal") == f"journal:{tmp_path}/s.journal"
    with pytest.raises(InvalidValueError, match="names no file"):
        validate.storage_url("journal:")
    with pytest.raises(InvalidValueError, match="is a folder"):
        validate.storage_url(f"journal:{tmp_path}")
    assert study_mod.postgres_url("postgres://u@h/db").startswith(("postgresql://", "postgresql+psycopg://"))


# -- autotune ------------------------------------------------------------------------------------------------

def test_autotune_is_autotile_tune(capsys):
    from autotile.cli import main as cli

    with pytest.raises(SystemExit):
        cli.main(["tune", "--help"])
    tune_help = capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.autotune_main(["--help"])
    autotune_help = capsys.readouterr().out
    # The same text, but for the name (whose length re-wraps the usage lines).
    assert " ".join(autotune_help.split()).replace("usage: autotune", "usage: autotile tune") == \
        " ".join(tune_help.split())
    assert "--devices" in tune_help
    import tomllib

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["autotune"] == "autotile.cli.main:autotune_main"


# -- batch ---------------------------------------------------------------------------------------------------

SHAPES = [(256 * (i + 1), 512, 128 * (i % 4 + 1)) for i in range(20)]


def problems_file(tmp_path: Path) -> Path:
    path = tmp_path / "problems.yaml"
    path.write_text(yaml.safe_dump([{"kernel": "matmul", "shape": "x".join(map(str, s)), "layout": "nn"}
                                    for s in SHAPES]))
    return path


def batch_args(path: Path, storage: str, trials: int = 5) -> list[str]:
    return ["batch", str(path), "--trials", str(trials), "--devices", "0,1,2", "--backend", BACKEND,
            "--storage", storage]


def check_batch(storage: str, log: Path, trials: int) -> None:
    """Every problem tuned once: one finished trial per problem in the batch study, `trials` runs in each
    problem's study, and no config timed twice within a problem by workers that finished it."""
    storage_obj = study_mod.open_storage(storage)
    names = [s.study_name for s in optuna.get_all_study_summaries(storage_obj)]
    (batch,) = [n for n in names if n.startswith("batch-")]
    done = [t for t in optuna.load_study(study_name=batch, storage=storage_obj).get_trials(deepcopy=False)
            if t.state == optuna.trial.TrialState.COMPLETE]
    assert sorted(t.user_attrs[INDEX] for t in done) == list(range(20))
    problems = [n for n in names if n.startswith("matmul-")]
    assert len(problems) == 20
    for n in problems:
        assert len(runs(optuna.load_study(study_name=n, storage=storage_obj))) == trials
    tags = Counter(tag for _, tag, _ in evaluations(log))
    assert set(tags) == {"x".join(map(str, s)) for s in SHAPES}


def test_batch_tunes_every_problem_once(replay, tmp_path):
    log = replay(delay_s=0.0)
    storage = f"journal:{tmp_path / 'batch.journal'}"
    done = autotile(*batch_args(problems_file(tmp_path), storage))
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("[")]
    assert len(lines) == 20 and lines[-1].startswith("[20/20]")  # one progress line per problem
    rows = [line for line in done.stdout.splitlines() if line.startswith("matmul ") and " done " in line]
    assert "20 of 20 problems tuned" in done.stdout and len(rows) == 20  # the closing table
    check_batch(storage, log, 5)
    per_problem = Counter((tag, key) for _, tag, key in evaluations(log))
    assert set(per_problem.values()) == {1} and len(per_problem) == 100
    assert len({pid for pid, _, _ in evaluations(log)}) == 3
    again = autotile(*batch_args(problems_file(tmp_path), storage))  # resumed: nothing is tuned again
    assert again.returncode == 0 and "(20 done before)" in again.stdout
    assert len(evaluations(log)) == 100


def test_batch_resumes_after_a_kill(replay, tmp_path):
    log = replay(delay_s=0.1)
    storage = f"journal:{tmp_path / 'batch.journal'}"
    path = problems_file(tmp_path)
    first = start(*batch_args(path, storage))
    try:
        deadline = time.monotonic() + 120
        while len(evaluations(log)) < 40 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the command and its workers, at once
        first.communicate()
    before = evaluations(log)
    assert 40 <= len(before) < 100
    done = autotile(*batch_args(path, storage))
    assert done.returncode == 0, done.stdout + done.stderr
    check_batch(storage, log, 5)
    # Nothing finished before the kill was timed again: within each problem, a config timed twice was one
    # that a killed worker had begun.
    killed = {pid for pid, _, _ in before}
    counts = Counter((tag, key) for _, tag, key in evaluations(log))
    begun = {(tag, key) for pid, tag, key in before if pid in killed}
    assert all(n == 1 or k in begun for k, n in counts.items())
    assert len(evaluations(log)) - len(before) <= 100 - len(before) + 3 * 4  # at most a batch per worker again


def test_problem_files_are_checked(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("kernel,shape,dtype,layout,trials\nmatmul,64x64x64,float32,nn,7\nmatvec,128x64,,,\n")
    items = read_problems(path)
    assert [i.key.shape for i in items] == [(64, 64, 64), (128, 64)] and items[0].trials == 7
    assert items[1].key.layout == "row" and items[1].trials is None
    bad = tmp_path / "bad.yaml"
    for rows, message in [([{"kernel": "matmul", "shape": "64x64"}], "bad.yaml problem 1"),
                          ([{"kernel": "conv", "shape": "64x64x64"}], "problem 1"),
                          ([{"kernel": "matmul", "shape": "8x8x8", "color": 1}], "unknown field"),
                          ([{"kernel": "matmul", "shape": "8x8x8"}] * 2, "problem 2: .* listed twice"),
                          ([], "lists no problem")]:
        bad.write_text(yaml.safe_dump(rows))
        with pytest.raises(InvalidValueError, match=message):
            read_problems(bad)


def test_replay_evaluator_answers_an_unrecorded_config_as_a_failure():
    from autotile.runtime.worker import COMPILE, Candidate
    from autotile.tuning.testing import ReplayEvaluator

    table = json.loads((DATA / "matmul_replay_h200.json").read_text())
    (result,) = ReplayEvaluator(table).evaluate([Candidate(1, "", "k", {}, "BM=999")])
    assert result.status == COMPILE and "not recorded" in result.message


def test_replay_space_helper_matches_the_tests_one():
    from autotile.tuning.testing import replay_space as library_replay_space

    narrow = yaml.safe_load((DATA / "matmul_replay_space.yaml").read_text())
    ours, theirs = library_replay_space(narrow), replay_space()
    limits = ReplayBackend.__new__(ReplayBackend)
    limits.table = json.loads((DATA / "matmul_replay_h200.json").read_text())
    problem = Problem(limits.limits(0), "float32", "row")
    assert [c.key() for c in ours.feasible(problem)] == [c.key() for c in theirs.feasible(problem)]
