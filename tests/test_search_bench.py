"""The search benchmark over the recorded sweeps (sweeps/), and the pin on the default search's quality."""

from __future__ import annotations

import functools
import re
import statistics

import pytest

from autotile.cli import main as cli
from autotile.errors import InvalidValueError
from autotile.tuning import search_bench, sweep
from autotile.tuning.tuner import TuneOptions

# The recorded sweeps are read on first use, not at collection (a second of every pytest-xdist worker's start,
# though one worker runs this file): the parametrization below needs only their files, in sweeps()'s order.
SWEEP_FILES = sorted(p for p in sweep.SWEEPS_DIR.glob("*" + sweep.SUFFIX) if p.is_file())


@functools.lru_cache(maxsize=None)
def sweeps() -> tuple[sweep.Sweep, ...]:
    """Every recorded sweep (`sweep.sweeps()`), read once."""
    return tuple(sweep.sweeps())


def _sweep(path) -> sweep.Sweep:
    return next(s for s in sweeps() if s.path == path)

# The default search's median of optimum / best found at 40 trials, on every recorded sweep. Measured
# 2026-11-27 over the 20 recorded sweeps, 20 seeds: 0.979-1.000 (docs/search.md);
# the pin sits below by a margin that optuna's version changes should not cross.
PIN_AT_40 = 0.95


def test_there_is_a_recorded_sweep():
    assert sweeps(), "no sweep file in sweeps/"
    assert [s.path for s in sweeps()] == SWEEP_FILES  # the parametrization's files


@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_replay_counts_runs_only_and_repeats_itself(sampler):
    s = sweeps()[0]
    a = search_bench.replay(s, sampler, seed=1, trials=30)
    b = search_bench.replay(s, sampler, seed=1, trials=30)
    assert a.curve == b.curve and len(a.curve) == 30  # infeasible and repeated draws not counted
    assert all(x <= y for x, y in zip(a.curve, a.curve[1:], strict=False))  # best so far
    assert 0 < a.curve[-1] <= 1.0
    assert a.asks >= 30 and a.cpu_s > 0


def test_the_optimum_is_reached_by_a_search_of_every_config():
    s = sweeps()[0]
    whole = search_bench.replay(s, "grid", seed=0, trials=len(s.feasible_rows()))
    assert whole.curve[-1] == 1.0


class _BuiltOnce(sweep.Sweep):
    """A sweep that builds its space, replay table and optimum once for all the seeds replayed over it; a
    replay builds them from the same rows each time (about a third of its time at 40 trials). The replays
    are the same: every sweep's curves at these seeds were compared, with and without, when this was added."""

    def space(self):
        if "_space" not in self.__dict__:
            self._space = super().space()
        return self._space

    def table(self):
        if "_table" not in self.__dict__:
            self._table = super().table()
        return self._table

    def best_ms(self):
        if "_best_ms" not in self.__dict__:
            self._best_ms = super().best_ms()
        return self._best_ms


@pytest.mark.parametrize("path", SWEEP_FILES, ids=[p.name.removesuffix(sweep.SUFFIX) for p in SWEEP_FILES])
def test_default_search_median_at_40_trials(path):
    # 7 seeds, not the benchmark's 20: the pin sits well below every sweep's median and 10th percentile
    # (0.966-1.000 over 20), and 20 sweeps at 20 seeds took two and a half minutes of the suite's CPU.
    s = _sweep(path)
    s = _BuiltOnce(s.header, s.rows, s.path)
    ratios = [search_bench.replay(s, TuneOptions.sampler, seed, 40).at(40) for seed in range(7)]
    assert statistics.median(ratios) >= PIN_AT_40, sorted(ratios)


def test_quantile_interpolates():
    assert search_bench.quantile([1, 2, 3, 4, 5], 0.5) == 3
    assert search_bench.quantile([0, 10], 0.1) == pytest.approx(1.0)


def test_cli_prints_one_line_per_sweep_and_sampler(capsys, tmp_path):
    import shutil

    chosen = [s for s in sweeps() if s.key.kernel == "matvec"][:2]  # the fastest to replay; every sweep: the pin
    for s in chosen:
        shutil.copy(s.path, tmp_path / s.path.name)
    argv = ["search-bench", "--sweeps", str(tmp_path), "--samplers", "random,tpe", "--seeds", "2", "--budgets", "5,10",
            "--jobs", "1"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert "med@5" in out[0] and "p10@10" in out[0]
    assert [line.split()[:2] for line in out[1:-1]] == [[s.name, sampler] for s in chosen
                                                        for sampler in ("random", "tpe")]
    assert cli.main(["search-bench", "--samplers", "cmaes", "--seeds", "1"]) == 2
    assert "categorical" in capsys.readouterr().err


def test_unknown_sampler_is_refused():
    with pytest.raises(InvalidValueError, match="'anneal'"):
        search_bench.run(samplers=["anneal"], seeds=1)


def _first_configs(s, named_first, warm_starts, seed=0, trials=6):
    """The config keys the tuner's search over `s` ran, in order (the replay's evaluator answers)."""
    from autotile.tuning.testing import ReplayEvaluator
    from autotile.tuning.tuner import Tuner

    space = s.space()
    options = TuneOptions(trials=trials, sampler="tpe", seed=seed, cache=search_bench.shipped_cache(),
                          named_first=named_first, warm_starts=warm_starts)
    search = Tuner(s.key, options, space=space).search(ReplayEvaluator(s.table(), space), s.limits)
    trials_run = sorted(search.study.get_trials(deepcopy=False), key=lambda t: t.number)
    return [(t.user_attrs.get("seed") or t.user_attrs.get("named"), t.user_attrs.get("config_key"))
            for t in trials_run]


def test_no_seeds_runs_the_sampler_from_the_first_trial():
    s = next(s for s in sweeps() if s.space().named_configs)
    with_named = _first_configs(s, True, 0)
    without = _first_configs(s, False, 0)
    assert any(name for name, _ in with_named)  # a seed or named config among the first trials
    assert not any(name for name, _ in without)
    replayed = search_bench.replay(s, "tpe", seed=0, trials=10, named_first=False, warm_starts=0)
    assert len(replayed.curve) == 10 and not replayed.named_first and replayed.warm_starts == 0


def _one_sweep_of_each_kind(folder) -> str:
    """A folder holding a copy of the first recorded sweep of each kind (kernel, dtype, layout and the family
    its name gives: dmma, simt, tf32x3, wgmma nn and nt, matvec row and col), for the command-line tests of
    options that every replay takes alike: the replays of every sweep are the pin's, above. Seven of the
    twenty: the command over all of them took these two tests 16 seconds in one process (2026-12-07), 8 now."""
    import shutil

    kinds = {}
    for s in sweeps():
        kinds.setdefault((s.key.kernel, s.key.dtype, s.key.layout, s.name.split("-")[1]), s)
    assert len(kinds) >= 7, sorted(kinds)
    for s in kinds.values():
        shutil.copy(s.path, folder / s.path.name)
    return str(folder)


def test_cli_takes_no_seeds_and_warm_starts(capsys, tmp_path):
    argv = ["search-bench", "--sweeps", _one_sweep_of_each_kind(tmp_path), "--samplers", "random", "--seeds", "1",
            "--budgets", "3", "--jobs", "1"]
    assert cli.main([*argv, "--no-seeds", "--warm-starts", "0"]) == 0
    out = capsys.readouterr().out
    assert "no named configs, 0 warm starts" in out
    assert cli.main([*argv, "--warm-starts", "-1"]) == 2
    assert "--warm-starts" in capsys.readouterr().err


def test_a_compile_bound_replay_asks_ahead_as_a_tune_from_a_cold_compile_cache(capsys, tmp_path):
    s = next(s for s in sweeps() if s.space().named_configs)
    replayed = search_bench.replay(s, "tpe", seed=0, trials=16, compile_bound=True, ahead=2)
    assert len(replayed.curve) == 16 and replayed.compile_bound and replayed.ahead == 2
    assert not search_bench.replay(s, "tpe", seed=0, trials=4).compile_bound
    argv = ["search-bench", "--sweeps", _one_sweep_of_each_kind(tmp_path), "--samplers", "random", "--seeds", "1",
            "--budgets", "3", "--jobs", "1"]
    assert cli.main([*argv, "--compile-bound", "--ahead", "2"]) == 0
    assert "compile-bound, 2 batches asked ahead" in capsys.readouterr().out
    assert cli.main([*argv, "--ahead", "2"]) == 2  # asking ahead is what a compile-bound replay does
    err = capsys.readouterr().err
    assert "--ahead 2 goes with --compile-bound" in err and len(err.strip().splitlines()) == 1


def test_agreement_counts_seed_pairs_whose_winners_are_within_two_percent():
    def replays(*ratios):
        return [search_bench.Replay("s", "tpe", i, (r,), 0.0, 0) for i, r in enumerate(ratios)]

    assert search_bench.agreement(replays(1.0, 0.99, 0.985), 1) == 1.0
    assert search_bench.agreement(replays(1.0, 0.99, 0.9), 1) == pytest.approx(1 / 3)  # only 1.0 and 0.99
    assert search_bench.agreement(replays(0.8), 1) == 1.0  # no pair: nothing disagrees
    table = search_bench.format_table(replays(1.0, 0.5), budgets=(1,))
    assert "2%@1" in table.splitlines()[0] and "0.00" in table.splitlines()[1]


def test_time_to_good_replays_a_sweep_and_says_when_each_seed_came_within_three_percent(capsys, monkeypatch,
                                                                                         tmp_path):
    import importlib.util
    from pathlib import Path

    monkeypatch.setenv("AUTOTILE_CACHE_DIR", str(tmp_path / "user"))
    path = Path(__file__).resolve().parent.parent / "tools" / "time_to_good.py"
    spec = importlib.util.spec_from_file_location("time_to_good", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    sweep = next(s for s in sweeps() if s.name == "matmul-tf32x3-2048-h100")
    assert tool.main(["--sweep", str(sweep.path), "--replay", "--seeds", "2", "--trials", "12"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("matmul float32 2048x2048x2048 nn, 12 trials, reference 284.4 us (the sweep optimum)")
    assert [line.split()[0] for line in out[2:4]] == ["0", "1"]
    assert all(" tf32x3 BM=" in line for line in out[2:4])  # each seed's winner, named
    # a replay measures the sweep's own times: the winner's ratio and its ratio in the sweep are one
    assert all(line.split()[9] == line.split()[10] for line in out[2:4])
    assert out[-2].startswith("within 3% of the reference: ")
    # the summary's arithmetic, whichever winners the seeds' trajectories reached (a new parameter of the space
    # is one more draw of each trial, and moves them)
    summary = re.fullmatch(r"winners' times: fastest ([\d.]+) us, slowest ([\d.]+) us \(([\d.]+)% apart\); "
                           r"pairs of seeds within 2%: ([01]) of 1", out[-1])
    assert summary, out[-1]
    fastest, slowest, apart = (float(summary[i]) for i in (1, 2, 3))
    assert fastest == min(float(line.split()[7]) for line in out[2:4]) and apart == pytest.approx(
        100 * (slowest / fastest - 1), abs=0.06)
    assert summary[4] == ("1" if slowest <= 1.02 * fastest else "0")
    assert tool.main(["--sweep", str(sweep.path), "--replay", "--seeds", "1", "--first-seed", "7",
                      "--trials", "12"]) == 0
    assert capsys.readouterr().out.splitlines()[2].split()[0] == "7"
    dmma = next(s for s in sweeps() if s.key.dtype == "float64")  # tuned in the sweep's dtype
    assert tool.main(["--sweep", str(dmma.path), "--replay", "--seeds", "1", "--trials", "6"]) == 0
    assert capsys.readouterr().out.startswith(f"matmul float64 {'x'.join(map(str, dmma.key.shape))} nn, 6 trials")
    user = tmp_path / "user"
    assert not user.exists() or not any(user.iterdir())  # the seeds tuned in folders of their own


# The best a 40-trial GPU tune of the whole space found outside each wgmma sweep's sub-space (H200,
# 2026-11-27: tf32x3 at 0.937 of the sweep's optimum at the skinny shape; at the tall-K shape every
# winner was wgmma, the others under 0.71 of it: 0.90 here, a harder basin than the GPU's).
WHOLE_SPACE_FLOORS = {"matmul-wgmma-96x5120x3072-h200": 0.94, "matmul-wgmma-384x640x24576-h200": 0.90}


@pytest.mark.parametrize("name,others", sorted(WHOLE_SPACE_FLOORS.items()))
def test_a_whole_space_search_finds_the_family_that_holds_the_optimum(name, others, tmp_path, monkeypatch):
    from autotile.codegen import kernels
    from autotile.tuning import api
    from autotile.tuning.testing import SubspaceReplay

    monkeypatch.setenv("AUTOTILE_CACHE_DIR", str(tmp_path))
    s = next(s for s in sweeps() if s.name == name)
    for seed in range(2):
        evaluator = SubspaceReplay(s.table(), s.space(), kernels.get("matmul").space, s.best_ms() / others)
        result = api.tune("matmul", s.key.shape, layout=s.key.layout, trials=40, seed=seed, evaluator=evaluator,
                          cache=None)
        assert s.best_ms() / result.best.median_ms >= 0.97, (seed, dict(result.best.config))
        assert len({key.split(",", 1)[0] for key in evaluator.evaluated}) >= 3  # it searched other families
