"""How tuning scales over GPUs of one host (needs 2 GPUs of one model; about 6-8 minutes on two H200s).

(a) one shape, the same total trials: `autotile tune --devices 0` against `--devices 0,1` on fresh
    studies; trials per second over the search (first candidate started to last finished, from the
    study's own timestamps) and the best config each found (study's best time, and the winner re-timed);
(b) `autotile batch` of 20 shapes on 1 GPU against 2 GPUs: wall time of the whole command.

Runs offline with the project's wheel and optuna only: the studies live in journal files in a temporary
folder, and nothing is written to the user cache (`--no-cache`). Prints a markdown table and writes JSON:

    python tools/scaling_bench.py                    # defaults: 80 trials for (a), 20 shapes x 10 trials for (b)
    python tools/scaling_bench.py --out scaling.json --trials 80 --batch-trials 10
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SHAPE = "4096x4096x4096"
BATCH_SHAPES = [(m, n, k) for m in (1024, 2048, 4096) for n in (1024, 3072) for k in (512, 2048, 4096)] + \
    [(8192, 1024, 1024), (333, 4096, 777)]


def autotile(*args: str) -> tuple[float, str]:
    """Run `python -m autotile ARGS`; (wall seconds, stdout). Raises with the output where it fails."""
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "autotile", *args], capture_output=True, text=True)
    seconds = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"autotile {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return seconds, done.stdout


def search_rate(storage: str, name: str) -> dict[str, Any]:
    """Runs, their span (s) and rate, and the best time, read from the study."""
    import optuna

    from autotile.tuning.study import Ledger, open_storage

    study = optuna.load_study(study_name=name, storage=open_storage(storage))
    trials = study.get_trials(deepcopy=False)
    ledger = Ledger.of(trials)
    ran = [t for t in trials if t.user_attrs.get("config_key") and t.state.is_finished() and t.datetime_start
           and t.datetime_complete]
    span = (max(t.datetime_complete for t in ran) - min(t.datetime_start for t in ran)).total_seconds()
    values = [v for v, _ in ledger.results().values() if v is not None]
    return {"runs": ledger.finished, "span_s": round(span, 2), "trials_per_s": round(ledger.finished / span, 3),
            "best_study_ms": min(values) if values else None}


def best_line(stdout: str) -> dict[str, Any]:
    match = re.search(r"best: ([0-9.]+) ms, ([0-9,]+) ([^,\s]+)(?:, ([0-9.]+)x cuBLAS)?", stdout)
    if not match:
        return {}
    return {"winner_ms": float(match[1]), "winner_metric": float(match[2].replace(",", "")), "unit": match[3],
            "x_cublas": float(match[4]) if match[4] else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trials", type=int, default=80, help="(a): total trials, each run (default 80)")
    parser.add_argument("--shape", default=SHAPE, help=f"(a): the shape (default {SHAPE})")
    parser.add_argument("--batch-trials", type=int, default=10, help="(b): trials per shape (default 10)")
    parser.add_argument("--devices", default="0,1", help="the two GPUs (default 0,1)")
    parser.add_argument("--out", default="scaling.json", help="JSON results (default scaling.json)")
    parser.add_argument("--skip-batch", action="store_true", help="only (a)")
    # A dry run of this script without GPUs: autotile.tuning.testing:ReplayBackend, with $AUTOTILE_REPLAY set.
    parser.add_argument("--backend", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    extra = ["--backend", args.backend] if args.backend else []

    from autotile.runtime.device import live_devices

    gpus = [d.name for d in live_devices()] if not args.backend else ["replay", "replay"]
    both = args.devices.split(",")
    if len(both) != 2 or len(gpus) < 2:
        raise SystemExit(f"needs two GPUs (found {len(gpus)}: {gpus}) and --devices A,B")
    one = both[0]
    work = Path(tempfile.mkdtemp(prefix="autotile-scaling-"))
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M"), "gpus": [gpus[int(d)] for d in both],
                              "shape": args.shape, "trials": args.trials, "folder": str(work)}

    # (a) one study, 1 worker vs 2 workers, equal total trials.
    for label, devices in (("1 worker", one), ("2 workers", args.devices)):
        storage = f"journal:{work / ('a-' + label.replace(' ', '-') + '.journal')}"
        name = f"scaling-{label.replace(' ', '-')}"
        print(f"(a) {label}: {args.trials} trials of matmul {args.shape} ...", flush=True)
        wall, out = autotile("tune", "matmul", "--shape", args.shape, "--trials", str(args.trials), "--devices",
                             devices, "--storage", storage, "--study-name", name, "--no-cache", *extra)
        result[label] = dict(search_rate(storage, name), wall_s=round(wall, 1), **best_line(out))
    speedup = result["2 workers"]["trials_per_s"] / result["1 worker"]["trials_per_s"]
    result["trials_per_s_ratio"] = round(speedup, 3)

    # (b) the batch command, 20 shapes, 1 GPU vs 2 GPUs.
    if not args.skip_batch:
        problems = work / "problems.yaml"
        problems.write_text("".join(f"- {{kernel: matmul, shape: {m}x{n}x{k}, layout: nn}}\n"
                                    for m, n, k in BATCH_SHAPES))
        for label, devices in (("batch 1 GPU", one), ("batch 2 GPUs", args.devices)):
            storage = f"journal:{work / ('b-' + label.replace(' ', '-') + '.journal')}"
            print(f"(b) {label}: {len(BATCH_SHAPES)} shapes x {args.batch_trials} trials ...", flush=True)
            wall, out = autotile("batch", str(problems), "--trials", str(args.batch_trials), "--devices", devices,
                                 "--storage", storage, "--no-cache", *extra)
            result[label] = {"wall_s": round(wall, 1), "shapes": len(BATCH_SHAPES), "trials": args.batch_trials}
        result["batch_wall_ratio"] = round(result["batch 2 GPUs"]["wall_s"] / result["batch 1 GPU"]["wall_s"], 3)

    Path(args.out).write_text(json.dumps(result, indent=2))
    a1, a2 = result["1 worker"], result["2 workers"]
    lines = [f"\nScaling, {result['date']}, {', '.join(result['gpus'])}", "",
             "| run | trials | search s | trials/s | best in study ms | winner ms | x cuBLAS | wall s |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, r in (("1 worker", a1), ("2 workers", a2)):
        lines.append(f"| {label}, matmul {args.shape} | {r['runs']} | {r['span_s']} | {r['trials_per_s']} | "
                     f"{r['best_study_ms']:.4f} | {r.get('winner_ms', float('nan')):.4f} | {r.get('x_cublas')} | "
                     f"{r['wall_s']} |")
    lines.append(f"\n2 workers / 1 worker, trials per second: **{speedup:.2f}x** (target >= 1.8x)")
    if not args.skip_batch:
        b1, b2 = result["batch 1 GPU"], result["batch 2 GPUs"]
        lines += ["", "| batch, 20 shapes x %d trials | wall s |" % args.batch_trials, "| --- | ---: |",
                  f"| 1 GPU | {b1['wall_s']} |", f"| 2 GPUs | {b2['wall_s']} |",
                  f"\n2 GPUs / 1 GPU, wall time: **{result['batch_wall_ratio']:.2f}x** (target <= 0.55x)"]
    print("\n".join(lines))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
