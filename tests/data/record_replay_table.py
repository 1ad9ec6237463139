"""Measure every feasible config of the replay space on this GPU and write the table the tuner tests
replay (`python tests/data/record_replay_table.py OUT.json`). Needs a GPU; takes a few minutes."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from replay_space import replay_space  # noqa: E402

from autotile.codegen.limits import DeviceLimits  # noqa: E402
from autotile.codegen.problem import ProblemKey  # noqa: E402
from autotile.codegen.space import Problem  # noqa: E402
from autotile.runtime.worker import IsolatedRunner, Setup  # noqa: E402
from autotile.tuning.testing import record_table  # noqa: E402
from autotile.tuning.tuner import TuneOptions, Tuner  # noqa: E402

SHAPE = (1024, 1024, 1024)


def main(out: str) -> None:
    space = replay_space()
    tuner = Tuner(ProblemKey("matmul", "float32", "row", SHAPE), TuneOptions(), space=space)
    start = time.time()
    with IsolatedRunner(Setup(ProblemKey("matmul", "float32", "row", SHAPE), compile_threads=12)) as runner:
        limits = DeviceLimits(**{k: tuple(v) if k == "compute_capability" else v
                                 for k, v in runner.environment["limits"].items()})
        configs = space.feasible(Problem(limits))
        pairs = []
        for i in range(0, len(configs), 32):
            chunk = configs[i:i + 32]
            results = runner.evaluate([tuner.candidate(c) for c in chunk])
            pairs += list(zip(chunk, results, strict=True))
        table = record_table(pairs, runner.baseline, {k: v for k, v in runner.environment.items() if k != "limits"},
                             {"kernel": "matmul", "shape": list(SHAPE), "dtype": "float32", "layout": "row"})
        table["environment"]["limits"] = runner.environment["limits"]
    Path(out).write_text(json.dumps(table, indent=1, sort_keys=True))
    statuses: dict[str, int] = {}
    for _, r in pairs:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    print(f"recorded {len(pairs)} configs in {time.time() - start:.0f} s: {statuses}")


if __name__ == "__main__":
    main(sys.argv[1])
