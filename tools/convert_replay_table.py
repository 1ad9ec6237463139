"""Write the first recorded replay table (tests/data/matmul_replay_h200.json, 256 SIMT configs of
1024x1024x1024 float32 on an H200, recorded by tests/data/record_replay_table.py) as a sweep file:
`python tools/convert_replay_table.py sweeps/matmul-simt-1024-h200.jsonl.gz`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from autotile.codegen import kernels
from autotile.tuning.sweep import SubSpace, from_table

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"


def main(out: str) -> None:
    table = json.loads((DATA / "matmul_replay_h200.json").read_text())
    narrow = yaml.safe_load((DATA / "matmul_replay_space.yaml").read_text())["choices"]
    space = kernels.get("matmul").space
    # Parameters added after the recording take the default that renders the kernels it timed.
    choices = {name: list(narrow[name]) if name in narrow else [p.default] for name, p in space.params.items()}
    sweep = from_table(out, table, SubSpace("matmul", choices),
                       "python tests/data/record_replay_table.py OUT.json (then tools/convert_replay_table.py)")
    print(f"{out}: {len(sweep.rows)} rows, {len(sweep.feasible_rows())} feasible today, optimum "
          f"{sweep.best_ms() * 1000:.1f} us")


if __name__ == "__main__":
    main(sys.argv[1])
