"""Test support: replaying timings recorded on a GPU, so the tuner's loop runs without one.

Like `optuna.testing`, this lives apart from the production modules: nothing in the library imports it.
`ReplayEvaluator` stands in for `worker.IsolatedRunner` (the same `evaluate` / `retime` methods), answering
from a table that `record_table` builds from real measurements (tests/data/record_replay_table.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .space import Config, Space
from .timing import Timing
from .worker import OK, Candidate, CandidateResult


class ReplayEvaluator:
    """Answers from a table recorded on a GPU (see `record_table`): the tuner's loop, tested without one.

    The table maps config keys to what the GPU measured (status, median, spread, message). A config the
    table lacks raises KeyError: a test that reaches one has drawn outside the recorded space.
    """

    def __init__(self, table: dict[str, Any], space: Space | None = None):
        """`space`, if given, re-keys the table through it: a parameter added since the recording (with
        a default) then appears in the keys with its default value, as in the tuner's candidates."""
        if space is not None:
            results = {}
            for key, entry in table["results"].items():
                values = dict(item.split("=", 1) for item in key.split(","))
                results[space.config(values).key()] = entry
            table = dict(table, results=results)
        self.table = table
        b = table["baseline"]
        self.baseline = Timing(b["median_ms"], b["p25_ms"], b["p75_ms"], b["min_ms"], b["reps"])
        self.environment = dict(table.get("environment", {}))
        self.evaluated: list[str] = []

    @classmethod
    def load(cls, path: str | Path) -> "ReplayEvaluator":
        return cls(json.loads(Path(path).read_text()))

    def _entry(self, key: str) -> dict[str, Any]:
        return self.table["results"][key]

    def evaluate(self, candidates: list[Candidate]) -> list[CandidateResult]:
        out = []
        for cand in candidates:
            entry = self._entry(cand.config_key)
            self.evaluated.append(cand.config_key)
            if entry["status"] == OK:
                t = entry["timing"]
                timing = Timing(t["median_ms"], t["p25_ms"], t["p75_ms"], t["min_ms"], t["reps"])
                out.append(CandidateResult(cand.id, OK, "", timing, entry.get("error")))
            else:
                out.append(CandidateResult(cand.id, entry["status"], entry.get("message", "")))
        return out

    def retime(self, candidates: dict[int, Candidate], rounds: int) -> tuple[dict[int, list[float]], Timing]:
        # The recorded quartiles stand in for round-to-round noise: rounds alternate p25, median, p75.
        out = {}
        for i, cand in candidates.items():
            t = self._entry(cand.config_key)["timing"]
            cycle = [t["p25_ms"], t["median_ms"], t["p75_ms"]]
            out[i] = [cycle[r % 3] for r in range(rounds)]
        return out, self.baseline


def record_table(result_pairs: list[tuple[Config, CandidateResult]], baseline: Timing,
                 environment: dict[str, Any], problem: dict[str, Any]) -> dict[str, Any]:
    """The JSON table `ReplayEvaluator` reads, from results measured on a GPU."""
    results = {}
    for config, r in result_pairs:
        entry: dict[str, Any] = {"status": r.status}
        if r.timing is not None:
            entry["timing"] = r.timing.to_json()
            entry["error"] = r.error
        if r.message:
            entry["message"] = r.message[:500]
        results[config.key()] = entry
    return {"problem": problem, "environment": environment, "baseline": baseline.to_json(), "results": results}


__all__ = ["ReplayEvaluator", "record_table"]
