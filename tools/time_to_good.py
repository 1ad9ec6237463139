"""Time to a good kernel: `autotile.tune` of one shape with several seeds, each from an empty tuning cache,
and how soon each came within 3% of the best known config.

    python tools/time_to_good.py --shape 96x5120x3072 [--kernel matmul] [--layout nn] [--trials 40] [--seeds 5]
        [--fix MATH=wgmma] [--sweep FILE] [--replay [--others R]] [--first-seed N] [--timeout S]

Per seed: the wall seconds of the call, its phases (`TuneResult.phases`: start, compiles, timing, the search
itself...), the winner's time and its ratio to cuBLAS, and the seconds from the call's start until the best
time measured so far came within 3% of the reference: the sweep's optimum where a sweep of the shape is
given (`--sweep`, recorded by `autotile sweep`) unless a seed measured better (a whole-space search can beat
the sweep's sub-space), else the best time any seed measured; and the sweep's own time of the winner's config
against its optimum (`by sweep`: one GPU run's figures, free of the drift between runs). On a GPU, after the
seeds, the sweep optimum's config and the seeds' winners are timed again side by side in one worker
(`side by`: the optimum's time / the winner's), and the reference is the optimum's time measured then: a
sweep recorded earlier carries the drift of a shared GPU between runs (a few percent). The compile cache is
shared by the seeds and kept (the first seed compiles cold unless an earlier run compiled its kernels); the
tuning cache is a fresh folder per seed, so no seed starts from a record of the shape. `--replay` answers
from the sweep's recorded times instead of a GPU, over the sweep's sub-space: the CPU check of this tool;
with `--others R` as well, over the whole space, every config outside the sweep taking at least the sweep
optimum's time / R (`autotile.tuning.testing.SubspaceReplay`: does a whole-space search find the sweep's
family and its optimum past a basin of other configs at R of it?).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

WITHIN = 0.03  # "good": within 3% of the reference time
AGREE = 0.02  # a re-tune "names the same winner" when the two winners' times are within 2%


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--kernel", default=None, help="matmul, bmm or matvec (default: the sweep's, else matmul)")
    parser.add_argument("--shape", help="MxNxK, or MxK for matvec (default: the sweep's)")
    parser.add_argument("--dtype", default=None, help="element type (default: the sweep's, else float32)")
    parser.add_argument("--layout", default=None, help="nn, nt, tn or tt (default: the sweep's, else nn)")
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds after which each tune draws no new candidates (as autotile tune --timeout)")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed's number (the others follow)")
    parser.add_argument("--fix", action="append", default=[], help="PARAM=V1,V2 (as autotile tune)")
    parser.add_argument("--sweep", help="a recorded sweep of the shape: its optimum is the reference")
    parser.add_argument("--replay", action="store_true", help="answer from the sweep's times, no GPU")
    parser.add_argument("--others", type=float, default=None, metavar="R",
                        help="with --replay: search the whole space, every config outside the sweep taking at "
                             "least the sweep optimum's time / R (`testing.SubspaceReplay`)")
    args = parser.parse_args(argv)

    from autotile.codegen import compile_cache, kernels, resources
    from autotile.tuning import api
    from autotile.tuning.sweep import load
    from autotile.tuning.testing import ReplayEvaluator, SubspaceReplay
    from autotile.tuning.validate import fix_items

    sweep = load(args.sweep) if args.sweep else None
    if args.replay and sweep is None:
        parser.error("--replay answers from a sweep: give --sweep")
    if args.others is not None and not (args.replay and 0 < args.others <= 1):
        parser.error("--others R goes with --replay, 0 < R <= 1")
    if args.shape is None and sweep is None:
        parser.error("give --shape or --sweep")
    shape = args.shape or "x".join(map(str, sweep.key.shape))  # type: ignore[union-attr]
    kernel = args.kernel or (sweep.key.kernel if sweep is not None else "matmul")
    layout = args.layout or (sweep.key.layout if sweep is not None else ("row" if kernel == "matvec" else "nn"))
    dtype = args.dtype or (sweep.key.dtype if sweep is not None else "float32")
    whole = args.others is not None
    fix: Any = sweep.sub.choices if args.replay and not whole and sweep is not None else (fix_items(args.fix) or None)
    # The compile cache outlives the seeds' tuning caches (each a temporary folder under which it would
    # otherwise live): it is the user's, or the one this environment names.
    os.environ.setdefault(compile_cache.ENV_VAR, str(compile_cache.root() or compile_cache.OFF))
    saved_root = os.environ.get(resources.CACHE_DIR_ENV)
    runs = []
    try:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            with tempfile.TemporaryDirectory(prefix="autotile-time-to-good-") as tmp:
                os.environ[resources.CACHE_DIR_ENV] = tmp
                evaluator: Any = None
                if args.replay and sweep is not None:
                    evaluator = (SubspaceReplay(sweep.table(), sweep.space(), kernels.get(kernel).space,
                                                sweep.best_ms() / args.others) if whole
                                 else ReplayEvaluator(sweep.table(), sweep.space()))
                timeline: list[tuple[float, float]] = []  # (seconds since the start, best ms so far)
                start = time.monotonic()

                def seen(p: Any, start: float = start, timeline: list[tuple[float, float]] = timeline) -> None:
                    if p.best_ms is not None:
                        timeline.append((time.monotonic() - start, p.best_ms))

                result = api.tune(kernel, shape, dtype=dtype, layout=layout, trials=args.trials, seed=seed,
                                  timeout=args.timeout, evaluator=evaluator, fix=fix, progress=seen)
                runs.append((seed, time.monotonic() - start, result, timeline))
    finally:
        if saved_root is None:
            os.environ.pop(resources.CACHE_DIR_ENV, None)
        else:
            os.environ[resources.CACHE_DIR_ENV] = saved_root
    measured = min(r.best.median_ms for _, _, r, _ in runs)
    # The sweep ran minutes or days before these tunes, and a shared GPU drifts a few percent between runs:
    # on a GPU the sweep's optimum config is timed again now, interleaved with the seeds' winners.
    now: dict[str, float] = {}
    if sweep is not None and not args.replay:
        try:
            now = remeasure(sweep, runs, kernel, shape, dtype, layout)
        except Exception as exc:  # the seeds' figures stand without it
            print(f"timing the sweep optimum again failed: {type(exc).__name__}: {exc}")
    sweep_ms = now.get("optimum", sweep.best_ms() if sweep is not None else None)
    # A whole-space search may beat the sweep's sub-space: the reference is then what it found.
    reference = min(sweep_ms, measured) if sweep_ms is not None else measured
    source = ("the best any seed measured" if sweep_ms is None or measured < sweep_ms else
              "the sweep optimum's config, timed again now" if now else "the sweep optimum")
    recorded = sweep.results() if sweep is not None else {}
    print(f"{kernel} {dtype} {shape} {layout}, {args.trials} trials, reference {reference * 1000:.1f} us ({source})")
    print(f"{'seed':>4} {'wall s':>7} {'start':>6} {'compile':>8} {'timing':>7} {'search':>7} {'retime':>7} "
          f"{'best us':>8} {'x cuBLAS':>8} {'ref/best':>8} {'by sweep':>8} {'side by':>8} {'to 97% s':>9}  winner")
    reached = []
    for seed, wall, result, timeline in runs:
        p = result.phases
        good = next((t for t, best in timeline if best <= (1 + WITHIN) * reference), None)
        reached.append(good)
        ratio = f"{result.vs_baseline:.2f}" if result.vs_baseline else "-"
        phases = "".join(f" {p.get(k, 0.0):>{w}.1f}" for k, w in
                         (("start", 6), ("compile", 8), ("timing", 7), ("search", 7), ("retime", 7)))
        # The winner's time in the sweep, against the sweep's optimum: both from one run of the GPU, so
        # free of the drift between runs that `ref/best` carries (a few percent on a shared GPU).
        row = recorded.get(result.best.config.key(), {})
        by_sweep = f"{sweep.best_ms() / row['median_ms']:.3f}" if sweep and row.get("median_ms") else "-"
        # The sweep optimum's config against this winner, timed side by side in one process (on a GPU).
        winner_now = now.get(result.best.config.key())
        side_by = f"{now['optimum'] / winner_now:.3f}" if winner_now else "-"
        print(f"{seed:>4} {wall:>7.1f}{phases} {result.best.median_ms * 1000:>8.1f} {ratio:>8} "
              f"{reference / result.best.median_ms:>8.3f} {by_sweep:>8} {side_by:>8} "
              f"{'never' if good is None else f'{good:.1f}':>9}  {winner_label(result.best.config)}")
        if result.failures:  # compiles not waited for among them
            print(f"{'':>6}failed: {', '.join(f'{n} {status}' for status, n in sorted(result.failures.items()))}")
    got = [g for g in reached if g is not None]
    print(f"within {WITHIN:.0%} of the reference: {len(got)} of {len(runs)} seeds"
          + (f", median {statistics.median(got):.1f} s after the start" if got else ""))
    winners = [r.best.median_ms for _, _, r, _ in runs]
    pairs = [(a, b) for i, a in enumerate(winners) for b in winners[i + 1:]]
    agree = sum(max(a, b) <= (1 + AGREE) * min(a, b) for a, b in pairs)
    print(f"winners' times: fastest {min(winners) * 1000:.1f} us, slowest {max(winners) * 1000:.1f} us "
          f"({max(winners) / min(winners) - 1:.1%} apart); pairs of seeds within {AGREE:.0%}: {agree} of {len(pairs)}")
    return 0


def remeasure(sweep: Any, runs: list[Any], kernel: str, shape: str, dtype: str, layout: str,
              rounds: int = 9) -> dict[str, float]:
    """The sweep optimum's config and every seed's winner timed again in one worker, interleaved (`rounds`
    rounds, each candidate's median of its rounds, ms): "optimum" and each winner's config key."""
    from autotile.codegen import kernels
    from autotile.codegen.problem import ProblemKey
    from autotile.runtime.worker import IsolatedRunner, Setup
    from autotile.tuning.tuner import TuneOptions, Tuner

    key = ProblemKey.of(kernel, shape, dtype, layout)
    best_ms = sweep.best_ms()
    optimum = next(c for c, r in sweep.feasible_rows() if r.get("median_ms") == best_ms)
    configs = {"optimum": kernels.get(kernel).space.config(dict(optimum))}
    for _, _, result, _ in runs:
        configs.setdefault(result.best.config.key(), result.best.config)
    tuner = Tuner(key, TuneOptions())
    candidates = {name: tuner.candidate(config) for name, config in configs.items()}
    runner = IsolatedRunner(Setup(key))
    runner.start()
    try:
        medians, _ = runner.retime({c.id: c for c in candidates.values()}, rounds)
    finally:
        runner.close()
    return {name: statistics.median(medians[c.id]) for name, c in candidates.items() if medians.get(c.id)}


def winner_label(config: Any) -> str:
    """The winner's family and the parameters that tell that family's configs apart, in one short line."""
    values = dict(config)
    family = values.get("MATH")
    keys = LABEL_KEYS.get(family, ("BM", "BN", "BK", "STAGES", "SPLIT_K")) if family else MATVEC_LABEL_KEYS
    return " ".join([str(family)] * bool(family) + [f"{k}={values[k]}" for k in keys if k in values])


LABEL_KEYS = {
    "simt": ("BM", "BN", "TM", "TN", "BK", "STAGES", "SPLIT_K"),
    "tf32x3": ("BM", "BN", "WM", "WN", "BK", "STAGES", "SPLIT_K"),
    "dmma": ("BM", "BN", "WM", "WN", "MMA_K", "BK", "STAGES", "SPLIT_K"),
    "wgmma": ("BM", "BN", "BK", "STAGES", "PRODUCERS", "LOADER", "SPLIT_K"),
    "wgmma_direct": ("BM", "BN", "BK", "STAGES", "CLUSTER_M", "PERSISTENT", "PINGPONG", "STORE", "SPLIT_K"),
    "skinny": ("BM", "BN", "TN", "THREADS_K", "STEPS", "SPLIT_K"),
}
MATVEC_LABEL_KEYS = ("ROWS", "THREADS_K", "VEC", "UNROLL", "SPLIT_K")

if __name__ == "__main__":
    sys.exit(main())
