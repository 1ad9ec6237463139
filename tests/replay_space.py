"""The narrowed matmul space whose every feasible config has a recorded GPU timing (see data/)."""

from __future__ import annotations

from pathlib import Path

import yaml

from autotile.codegen.resources import search_space_path
from autotile.codegen.space import Space

DATA = Path(__file__).parent / "data"


def replay_space() -> Space:
    narrow = yaml.safe_load((DATA / "matmul_replay_space.yaml").read_text())
    data = yaml.safe_load(search_space_path("matmul").read_text())
    for name, choices in narrow["choices"].items():
        data["params"][name]["choices"] = choices
    data["configs"] = {k: v for k, v in data["configs"].items() if k in narrow["seeds"]}
    data.pop("default", None)
    return Space(data, "matmul replay space")
