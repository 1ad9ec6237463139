"""Warm starts from the cache (autotile.tuning.transfer) and the default search's local improvement
(propose.improvement), on the recorded sweeps and the shipped records."""

from __future__ import annotations

import random

import pytest

from autotile.codegen.space import Problem
from autotile.tuning import propose, search_bench, sweep, transfer
from autotile.tuning.study import Ledger
from autotile.tuning.testing import ReplayEvaluator
from autotile.tuning.tuner import ENDGAME, IMPROVE, IMPROVE_EVERY, PROPOSED, STARTUP, TRANSFER, TuneOptions, Tuner

TF32X3 = sweep.load(sweep.SWEEPS_DIR / "matmul-tf32x3-2048-h100.jsonl.gz")


def _problem(s: sweep.Sweep) -> Problem:
    return Problem(s.limits, s.key.dtype, s.key.layout)


def test_project_takes_the_spaces_fixed_values_and_refuses_values_outside_it():
    space = TF32X3.space()
    fixed = {n: p.choices[0] for n, p in space.params.items() if len(p.choices) == 1}
    best = min(TF32X3.feasible_rows(), key=lambda cr: cr[1]["median_ms"])[0]
    values = dict(best, **{n: "bogus" for n in fixed})  # every fixed parameter off its value
    projected = transfer.project(space, values)
    assert projected is not None and all(projected[n] == v for n, v in fixed.items())
    assert all(projected[n] == best[n] for n in TF32X3.sub.varying)
    assert transfer.project(space, dict(best, BM=12345)) is None  # BM varies, and 12345 is not a choice


def test_warm_starts_alternate_portfolio_and_records_and_leave_out_the_problem_itself():
    space, problem, device = TF32X3.space(), _problem(TF32X3), TF32X3.header["device"]
    starts = transfer.warm_starts(TF32X3.key, device, space, problem, search_bench.shipped_cache())
    assert len(starts) == transfer.WARM_STARTS
    assert len({c.key() for _, c in starts}) == len(starts)
    assert all(space.is_feasible(c, problem) for _, c in starts)
    wheres = [where for where, _ in starts]
    # The shipped H100 has a shape database for float32 nn matmul: its fastest candidate on the nearest
    # shape comes first, then a record, in turn.
    assert [w.startswith("portfolio ") for w in wheres] == [True, False, True, False]
    shape = "x".join(map(str, TF32X3.key.shape))
    assert f"{shape}@{device}" not in wheres  # the problem's own record
    assert not any(w.startswith(f"portfolio tuned-{shape} ") for w in wheres)  # and the survey's copy of it
    records = [w.split("@")[1] for w in wheres if not w.startswith("portfolio ")]
    assert records == sorted(records, key=lambda g: g != device)  # this GPU's records before the others'


def test_portfolio_starts_are_ranked_by_the_selection_model_without_the_shape_itself():
    import dataclasses

    from autotile.dispatch import database
    from autotile.dispatch.model import model_for, params_of

    limits, cache = TF32X3.limits, search_bench.shipped_cache()
    found = transfer._from_portfolio(TF32X3.key, limits, cache)
    db = database.load(cache, limits.fingerprint, "matmul", "float32", "nn")
    ranked = model_for(db, limits).rank(TF32X3.key.shape, params_of(db), held_out=True)
    names = [db.candidates[j].name for j in ranked if db.candidates[j].config is not None]
    assert found and [w.split(" ")[1] for w, _ in found] == [n for n in names if n != "tuned-2048x2048x2048"]
    other = dataclasses.replace(limits, name="No Such GPU", compute_capability=(0, 0))
    assert transfer._from_portfolio(TF32X3.key, other, cache) == []


def test_improvement_moves_one_parameter_or_swaps_a_pair_from_the_fastest():
    space, problem = TF32X3.space(), _problem(TF32X3)
    ranked = [c for c, _ in sorted(TF32X3.feasible_rows(), key=lambda cr: cr[1]["median_ms"])]
    best = ranked[0]
    taken = {best.key()}
    seen = set()
    rng = random.Random(0)
    while (near := propose.improvement(space, problem, rng, ranked[:1], taken)) is not None:
        differ = {n for n in space.params if near[n] != best[n]}
        swapped = len(differ) == 2 and all(near[a] == best[b] for a in differ for b in differ - {a})
        assert len(differ) == 1 or swapped, differ
        assert space.is_feasible(near, problem)
        seen.add(near.key())
        taken.add(near.key())
    assert len(seen) > 3  # the whole neighbourhood was offered, then nothing


def test_swaps_exchange_parameters_of_the_same_choices_only():
    space = TF32X3.space()
    params = [p for p in space.params.values() if len(p.choices) > 1]
    best = min(TF32X3.feasible_rows(), key=lambda cr: cr[1]["median_ms"])[0]
    for swap in propose._swaps(params, best):
        a, b = sorted(swap)
        assert list(space.params[a].choices) == list(space.params[b].choices)
        assert (swap[a], swap[b]) == (best[b], best[a])


def _replay(sampler: str, trials: int, **options):
    space = TF32X3.space()
    tuner = Tuner(TF32X3.key, TuneOptions(trials=trials, sampler=sampler, seed=3,
                                          cache=search_bench.shipped_cache(), **options), space=space)
    return tuner, tuner.search(ReplayEvaluator(TF32X3.table(), space), TF32X3.limits)


def _ran(search):
    keys = set(Ledger.of(search.study.get_trials(deepcopy=False)).results())
    return [t for t in sorted(search.study.get_trials(deepcopy=False), key=lambda t: t.number)
            if t.user_attrs.get("config_key") in keys]


def test_tpe_runs_the_warm_starts_after_the_named_configs_once():
    tuner, search = _replay("tpe", 30)
    ran = _ran(search)
    kinds = [("fixed" if ("seed" in t.user_attrs or "named" in t.user_attrs) else t.user_attrs.get(PROPOSED))
             for t in ran]
    warm = [i for i, k in enumerate(kinds) if k == TRANSFER]
    assert warm and warm == list(range(kinds.count("fixed"), kinds.count("fixed") + len(warm)))
    assert all(t.user_attrs["transfer"].count("@") == 1 for t in ran if t.user_attrs.get(PROPOSED) == TRANSFER)
    # Resumed for more trials: the warm starts are not queued a second time.
    more = Tuner(tuner.key, TuneOptions(trials=40, seed=3, cache=search_bench.shipped_cache()), space=tuner.space)
    again = more.search(ReplayEvaluator(TF32X3.table(), tuner.space), TF32X3.limits, study=search.study)
    assert sum(t.user_attrs.get(PROPOSED) == TRANSFER for t in _ran(again)) == len(warm)


@pytest.mark.parametrize("sampler,options", [("random", {}), ("tpe", {"warm_starts": 0})])
def test_no_warm_starts_for_random_search_or_when_turned_off(sampler, options):
    _, search = _replay(sampler, 20, **options)
    assert not any(t.user_attrs.get(PROPOSED) == TRANSFER for t in _ran(search))


def test_tpe_gives_one_guided_proposal_in_improve_every_to_improvement_and_the_endgame_to_it_alone():
    _, search = _replay("tpe", 100)
    ran = _ran(search)
    last = round(ENDGAME * 100)
    guided = [t for t in ran[:-last] if "seed" not in t.user_attrs and "named" not in t.user_attrs
              and t.user_attrs.get(PROPOSED) not in (TRANSFER, "uniform")]
    share = sum(t.user_attrs.get(PROPOSED) == IMPROVE for t in guided) / len(guided)
    # STARTUP draws, and one more for each repeated or infeasible draw that had no unmeasured neighbour
    assert STARTUP <= sum(t.user_attrs.get(PROPOSED) == "uniform" for t in ran) <= STARTUP + 3
    assert abs(share - 1 / IMPROVE_EVERY) < 0.1, share
    # 100 trials exhaust the leaders' neighbourhoods on this sweep (the endgame then falls back on TPE);
    # 40 do not, and their last tenth is all the local step
    _, search = _replay("tpe", 40)
    last = round(ENDGAME * 40)
    assert [t.user_attrs.get(PROPOSED) for t in _ran(search)[-last:]] == [IMPROVE] * last
