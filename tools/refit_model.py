"""Refit the selection model's parameters of shape databases (no GPU): leave-one-out over each database,
the result stored in its environment (`model`), as `autotile survey` does at the end of a survey.

    python tools/refit_model.py cache/*/database/*.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from autotile.codegen.limits import PROFILES, DeviceLimits
from autotile.dispatch import database
from autotile.dispatch.model import Model, fitted_environment


def device_of(db: database.ShapeDatabase) -> DeviceLimits:
    """The offline profile of the database's GPU (the model reads only its SM count and limits)."""
    for profile in PROFILES.values():
        if profile.fingerprint == db.device:
            return profile
    raise SystemExit(f"no offline profile for {db.device}")


def main(paths: list[str]) -> None:
    for path in paths:
        db = database.ShapeDatabase.from_json(json.loads(Path(path).read_text()))
        params, held_out = Model(db, device_of(db)).fit()
        db.environment["model"] = fitted_environment(params, held_out)
        Path(path).write_text(json.dumps(db.to_json(), separators=(",", ":"), allow_nan=False) + "\n")
        print(f"{path}: {params}; leave-one-out {held_out}")


if __name__ == "__main__":
    main(sys.argv[1:])
