"""Test support: replaying timings recorded on a GPU, so the tuner's loop runs without one.

Like `optuna.testing`, this lives apart from the production modules: nothing in the library imports it.
`ReplayEvaluator` stands in for `worker.IsolatedRunner` (the same `evaluate` / `retime` methods), answering
from a table that `record_table` builds from real measurements (tests/data/record_replay_table.py).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from autotile.codegen.limits import DeviceLimits
from autotile.codegen.problem import ProblemKey
from autotile.codegen.space import Config, Space
from autotile.runtime.timing import Timing
from autotile.runtime.worker import COMPILE, OK, Candidate, CandidateResult
from autotile.safe_files import load_own_yaml


class ReplayEvaluator:
    """Answers from a table recorded on a GPU (see `record_table`): the tuner's loop, tested without one.

    The table maps config keys to what the GPU measured (status, median, spread, message). A config the
    table lacks is a failed candidate (status compile, message "not recorded"), as a GPU answers a config
    it cannot build: a tuning run goes on past it.
    """

    def __init__(self, table: dict[str, Any], space: Space | None = None, *, delay_s: float = 0.0,
                 log: str | Path | None = None, tag: str = "-", compile_wait_s: float = 0.0):
        """`space`, if given, re-keys the table through it: a parameter added since the recording (with
        a default) then appears in the keys with its default value, as in the tuner's candidates.
        `delay_s`: seconds each candidate takes (a GPU's compile and timing). `compile_wait_s`: seconds each
        candidate reports having waited for its compile (none pass): over 0, the tuner stays compile-bound
        and asks ahead, as a tune from a cold compile cache does. `log`: a file that gets one
        line per candidate evaluated, "PID TAG CONFIG_KEY" (appended whole: several processes may share it;
        `tag` names the problem, without spaces)."""
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
        self.delay_s = delay_s
        self.compile_wait_s = compile_wait_s
        self.log = Path(log) if log is not None else None
        self.tag = tag

    @classmethod
    def load(cls, path: str | Path) -> "ReplayEvaluator":
        return cls(json.loads(Path(path).read_text()))

    def _entry(self, key: str) -> dict[str, Any]:
        return self.table["results"].get(key) or {"status": COMPILE, "message": "not recorded in the replay table"}

    def prepare(self, candidates: list[Candidate]) -> None:
        """What the GPU worker does to compile ahead (`IsolatedRunner.prepare`): nothing to compile here, but
        present, so that a replay takes the tuner's compile-ahead path as a GPU tune does."""

    def evaluate(self, candidates: list[Candidate]) -> list[CandidateResult]:
        out = []
        for cand in candidates:
            if self.log is not None:
                # Logged before the pause: a worker killed mid-candidate still shows what it had begun.
                fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, f"{os.getpid()} {self.tag} {cand.config_key}\n".encode())
                finally:
                    os.close(fd)
            if self.delay_s:
                time.sleep(self.delay_s)
            entry = self._entry(cand.config_key)
            self.evaluated.append(cand.config_key)
            if entry["status"] == OK:
                t = entry["timing"]
                timing = Timing(t["median_ms"], t["p25_ms"], t["p75_ms"], t["min_ms"], t["reps"])
                out.append(CandidateResult(cand.id, OK, "", timing, entry.get("error"),
                                           compile_wait_s=self.compile_wait_s))
            else:
                out.append(CandidateResult(cand.id, entry["status"], entry.get("message", ""),
                                           compile_wait_s=self.compile_wait_s))
        return out

    def retime(self, candidates: dict[int, Candidate], rounds: int) -> tuple[dict[int, list[float]], Timing]:
        # The recorded quartiles stand in for round-to-round noise: rounds alternate p25, median, p75.
        out = {}
        for i, cand in candidates.items():
            t = self._entry(cand.config_key)["timing"]
            cycle = [t["p25_ms"], t["median_ms"], t["p75_ms"]]
            out[i] = [cycle[r % 3] for r in range(rounds)]
        return out, self.baseline


class SubspaceReplay(ReplayEvaluator):
    """A whole-space search replayed against one recorded sub-space: the sweep's configs answer with their
    recorded times, every other config of the space (other kernel families, other values of the sweep's
    fixed parameters) with a made-up time of at least `floor_ms`: floor_ms x (1 + 2 h^2), h in [0, 1) a hash
    of its key, so that about a tenth of the others are within 10% of the floor.

    It asks what a whole-space search makes of a shape where the sweep's family holds the optimum and the
    best of everything else is `floor_ms` (set it from what GPU tunes at that shape found outside the
    sub-space): the family must be found, and searched to its optimum, past a basin of other configs."""

    def __init__(self, table: dict[str, Any], sweep_space: Space, space: Space, floor_ms: float):
        super().__init__(table, sweep_space)
        # keyed through the whole space, as the tuner keys its candidates
        results = {space.config(dict(item.split("=", 1) for item in key.split(","))).key(): entry
                   for key, entry in self.table["results"].items()}
        self.table = dict(self.table, results=results)
        self.floor_ms = floor_ms

    def _entry(self, key: str) -> dict[str, Any]:
        entry = self.table["results"].get(key)
        if entry is not None:
            return dict(entry)
        h = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 2**32
        ms = self.floor_ms * (1 + 2 * h * h)
        return {"status": OK, "timing": {"median_ms": ms, "p25_ms": ms, "p75_ms": ms, "min_ms": ms, "reps": 10}}


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


def replay_space(narrow: dict[str, Any]) -> Space:
    """The matmul space narrowed as `narrow` says ({"choices": {param: [...]}, "seeds": [names]}), as in
    tests/data/matmul_replay_space.yaml."""
    from autotile.codegen.resources import search_space_path

    data = load_own_yaml(search_space_path("matmul").read_text(), "matmul space")
    for name, choices in narrow["choices"].items():
        data["params"][name]["choices"] = choices
    data["configs"] = {k: v for k, v in data["configs"].items() if k in narrow["seeds"]}
    data.pop("default", None)
    return Space(data, "matmul replay space")


class ReplayBackend:
    """A tuning backend (`autotile.tuning.gpu_workers.Backend`) that replays a recorded table instead of timing on a
    GPU, for the tests of the multi-worker and batch commands (`--backend autotile.tuning.testing:ReplayBackend`).

    Configured by the JSON file that $AUTOTILE_REPLAY names: "table" (the recorded table's path), "space"
    (the narrowing YAML's path), "delay_s" (seconds per candidate), "log" (the evaluation log, see
    `ReplayEvaluator`). Any matmul shape replays the table's timings scaled by its FLOPs (the ranking of
    configs stays the table's), so a batch of shapes can be tuned from one recording.
    """

    ENV_VAR = "AUTOTILE_REPLAY"

    def __init__(self) -> None:
        settings = json.loads(Path(os.environ[self.ENV_VAR]).read_text())
        self.table = json.loads(Path(settings["table"]).read_text())
        self._space = replay_space(load_own_yaml(Path(settings["space"]).read_text(), settings["space"]))
        self.delay_s = float(settings.get("delay_s", 0.0))
        self.log = settings.get("log")

    def limits(self, device: int) -> DeviceLimits:
        return DeviceLimits.from_json(self.table["environment"]["limits"])

    def space(self, kernel: str) -> Space | None:
        return self._space if kernel == "matmul" else None

    def evaluator(self, key: ProblemKey, seed: int, device: int, candidate_timeout_s: float) -> ReplayEvaluator:
        scale = math.prod(key.shape) / math.prod(self.table["problem"]["shape"])
        table = json.loads(json.dumps(self.table))

        def scaled(t: dict[str, Any]) -> dict[str, Any]:
            return {k: (v * scale if k.endswith("_ms") else v) for k, v in t.items()}

        table["baseline"] = scaled(table["baseline"])
        for entry in table["results"].values():
            if "timing" in entry:
                entry["timing"] = scaled(entry["timing"])
        table["environment"]["device_index"] = device
        return ReplayEvaluator(table, self._space, delay_s=self.delay_s, log=self.log, tag=key.shape_text)


__all__ = ["ReplayBackend", "ReplayEvaluator", "record_table", "replay_space"]
