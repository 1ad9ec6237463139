"""The search benchmark: the tuner's own loop (`Tuner.search`), replayed over recorded sweeps, for every
sampler and many seeds. It reports how close each gets to the sweep's optimum within a trial budget, as
(optimum time / best time found): 1.0 is the optimum. Infeasible and repeated draws do not count toward a
budget (the tuner never runs them); the seeds and named configs of the sub-space do, as in a real tune.

The default search's warm starts (`autotile.tuning.transfer`) come from the records shipped in cache/, the sweep's
own problem on its own GPU left out, as for a user who tunes a new shape. The harder replay takes the space's
named configs away (`named_first=False`, the command's `--no-seeds`): where a sweep's optimum is a named
config, a search that starts with the named configs finds it at once, which says nothing of the sampler.
`warm_starts` (`--warm-starts N`) sets how many warm starts the replay takes (0: none). `compile_bound`
(`--compile-bound`) replays a tune that waits for its compiles throughout, as one from a cold compile cache:
the tuner then asks for `ahead` batches (`TuneOptions.ahead`, the tuner's 1 by default) before the results of
the batches before them are in.

Also measured: the search's own CPU time per trial (sampler, proposals, study bookkeeping), the part of a
tune's wall time that is not the GPU's.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from autotile.tuning.sweep import Sweep, sweeps
from autotile.tuning.transfer import WARM_STARTS
from autotile.tuning.tuner import SAMPLERS, TuneOptions

BUDGETS = (20, 40, 100)
AGREE_WITHIN = 0.02  # two tunes of one problem agree where their winners' times are within this of each other


@dataclasses.dataclass(frozen=True)
class Replay:
    """One search of one sweep: the best-so-far ratio after each run, and what the search cost."""

    sweep: str
    sampler: str
    seed: int
    curve: tuple[float, ...]  # optimum / best found, after run 1, 2, ...
    cpu_s: float  # the search's own time, the replayed GPU costing nothing
    asks: int
    named_first: bool = True  # the space's named configs ran first
    warm_starts: int = WARM_STARTS
    compile_bound: bool = False  # replayed as a tune waiting for its compiles (asking ahead)
    ahead: int = 0  # batches asked for ahead while compile-bound (0: not compile-bound)

    def at(self, budget: int) -> float:
        return self.curve[min(budget, len(self.curve)) - 1] if self.curve else 0.0


def replay(sweep: Sweep, sampler: str, seed: int, trials: int, named_first: bool = True,
           warm_starts: int = WARM_STARTS, compile_bound: bool = False, ahead: int | None = None) -> Replay:
    """Run the tuner's search over `sweep` (in memory, no GPU) and read its best-so-far curve; with the
    space's named configs first or not (`named_first`), at most `warm_starts` warm starts, and as a tune
    waiting for its compiles throughout or not (`compile_bound`, asking `ahead` batches ahead)."""
    import optuna

    from autotile.tuning.study import Ledger
    from autotile.tuning.testing import ReplayEvaluator
    from autotile.tuning.tuner import Tuner

    space = sweep.space()
    # An Evaluator (its baseline is never None); a compile-bound one reports a second's wait per candidate.
    evaluator: Any = ReplayEvaluator(sweep.table(), space, compile_wait_s=1.0 if compile_bound else 0.0)
    ahead = ahead or TuneOptions.ahead
    options = TuneOptions(trials=trials, sampler=sampler, seed=seed, cache=shipped_cache(), named_first=named_first,
                          warm_starts=warm_starts, ahead=ahead)
    tuner = Tuner(sweep.key, options, space=space)
    started = time.process_time()
    search = tuner.search(evaluator, sweep.limits)
    cpu_s = time.process_time() - started
    best = sweep.best_ms()
    results = Ledger.of(search.study.get_trials(deepcopy=False)).results()
    order = sorted((t for t in search.study.get_trials(deepcopy=False)
                    if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)
                    and t.user_attrs.get("config_key") in results), key=lambda t: t.number)
    curve, found = [], float("inf")
    for t in order:
        value = results[t.user_attrs["config_key"]][0]
        if value is not None:
            found = min(found, value)
        curve.append(best / found if found < float("inf") else 0.0)
    return Replay(sweep.name, sampler, seed, tuple(curve), cpu_s, getattr(search, "asks", 0), named_first,
                  warm_starts, compile_bound, ahead if compile_bound else 0)


def shipped_cache() -> Any:
    """The cache a replay's warm starts come from: the records shipped in cache/ alone, so that a replay
    gives the same answer on every machine (a user's own records left out)."""
    from autotile.dispatch.cache import TuningCache

    return TuningCache(root=Path(tempfile.gettempdir()) / "autotile-search-bench-no-user-records")


def _job(args: tuple[str, str, int, int, bool, int, bool, int | None]) -> Replay:
    from autotile.tuning.sweep import load

    logging.getLogger("autotile").setLevel(logging.ERROR)
    path, sampler, seed, trials, named_first, warm_starts, compile_bound, ahead = args
    return replay(load(path), sampler, seed, trials, named_first, warm_starts, compile_bound, ahead)


def run(folder: str | Path | None = None, samplers: Sequence[str] | None = None, seeds: int = 20,
        budgets: Sequence[int] = BUDGETS, jobs: int | None = None, named_first: bool = True,
        warm_starts: int = WARM_STARTS, compile_bound: bool = False, ahead: int | None = None) -> list[Replay]:
    """Every sampler over every sweep in `folder`, `seeds` seeds each, up to the largest budget; the
    space's named configs first or not, at most `warm_starts` warm starts (tpe's), compile-bound or not
    (`replay`)."""
    found = sweeps(folder)
    samplers = tuple(samplers or SAMPLERS)
    from autotile.tuning.tuner import check_sampler

    for s in samplers:
        check_sampler(s)
    work = [(str(s.path), sampler, seed, max(budgets), named_first, warm_starts, compile_bound, ahead) for s in found
            for sampler in samplers for seed in range(seeds)]
    jobs = jobs or os.cpu_count() or 1
    if jobs == 1:
        return [_job(w) for w in work]
    with concurrent.futures.ProcessPoolExecutor(jobs) as pool:
        return list(pool.map(_job, work, chunksize=4))


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of `values`, interpolated."""
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def agreement(replays: Sequence[Replay], budget: int, within: float = AGREE_WITHIN) -> float:
    """The share of pairs of replays (two tunes of one problem with different seeds: a tune and its re-tune)
    whose best configs at `budget` trials are within `within` of each other's time (0.02: 2%); 1.0 for
    fewer than two replays. The sweep's recorded times stand still, so this is the search's own
    reproducibility, not the GPU's noise."""
    values = [r.at(budget) for r in replays]
    pairs = [(a, b) for i, a in enumerate(values) for b in values[i + 1:]]
    if not pairs:
        return 1.0
    return sum(max(a, b) <= (1 + within) * min(a, b) for a, b in pairs) / len(pairs)


def format_table(results: Sequence[Replay], budgets: Sequence[int] = BUDGETS) -> str:
    """One line per sweep and sampler: median and 10th percentile of optimum/best at each budget, the share
    of seed pairs whose winners at the middle budget are within 2% (`agreement`), and the search's CPU time
    per trial."""
    groups: dict[tuple[str, str], list[Replay]] = {}
    for r in results:
        groups.setdefault((r.sweep, r.sampler), []).append(r)
    middle = sorted(budgets)[len(budgets) // 2]
    head = f"{'sweep':<40} {'sampler':<8}" + "".join(f"  med@{b:<4} p10@{b:<4}" for b in budgets) + \
        f"  2%@{middle:<4}  ms/trial  asks/run"
    lines = [head]
    for (sweep, sampler), rs in sorted(groups.items()):
        cells = ""
        for b in budgets:
            at = [r.at(b) for r in rs]
            cells += f"  {statistics.median(at):>8.3f} {quantile(at, 0.1):>8.3f}"
        runs = sum(len(r.curve) for r in rs)
        ms = 1000 * sum(r.cpu_s for r in rs) / max(runs, 1)
        lines.append(f"{sweep:<40} {sampler:<8}{cells}  {agreement(rs, middle):>7.2f}  {ms:>8.1f}  "
                     f"{sum(r.asks for r in rs) / max(runs, 1):>8.2f}")
    starts = {("named configs first" if r.named_first else "no named configs") + f", {r.warm_starts} warm starts"
              + (f", compile-bound, {r.ahead} batch{'es' * (r.ahead > 1)} asked ahead" if r.compile_bound else "")
              for r in results}
    lines.append(f"({len({r.seed for r in results})} seeds; {'; '.join(sorted(starts))}; optimum time / best found, "
                 "1.0 = the optimum)")
    return "\n".join(lines)


__all__ = ["AGREE_WITHIN", "BUDGETS", "Replay", "agreement", "format_table", "quantile", "replay", "run"]
