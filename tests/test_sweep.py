"""Sweep files: the sub-space, the enumeration, the file format, resuming, and the replay table they make.
The GPU part of `autotile sweep` is an evaluator; here a replay of the first recorded sweep stands in."""

from __future__ import annotations

import gzip
import json

import pytest
from replay_space import DATA

from autotile.cli import main as cli
from autotile.codegen.limits import PROFILES
from autotile.codegen.space import Problem
from autotile.errors import InvalidValueError, UnknownNameError
from autotile.runtime.worker import OK
from autotile.tuning import sweep
from autotile.tuning.testing import ReplayEvaluator
from autotile.tuning.tuner import TuneOptions, Tuner

FIRST = sweep.SWEEPS_DIR / "matmul-simt-1024x1024x1024-h200.jsonl.gz"


@pytest.fixture(scope="module")
def first() -> sweep.Sweep:
    return sweep.load(FIRST)


def test_subspace_varies_what_it_names_and_fixes_the_rest():
    sub = sweep.SubSpace.of("matmul", ["BM", "BN", "WM", "WN", "BK", "STAGES"], base="tf32x3-128")
    assert sub.varying == ["BM", "BN", "WM", "WN", "BK", "STAGES"]
    assert sub.choices["MATH"] == ["tf32x3"] and sub.choices["SWIZZLE"] == [8]
    fixed = sweep.SubSpace.of("matmul", ["BM", "BN"], base="tf32x3-128", fix={"SWIZZLE": ["1", "8"]})
    assert fixed.choices["SWIZZLE"] == [1, 8] and fixed.varying == ["BM", "BN", "SWIZZLE"]
    with pytest.raises(UnknownNameError, match="'BX'"):
        sweep.SubSpace.of("matmul", ["BX"])
    with pytest.raises(InvalidValueError, match="BM is both varied and fixed"):
        sweep.SubSpace.of("matmul", ["BM"], fix={"BM": 64})


def test_a_recorded_subspace_gives_later_parameters_their_defaults():
    """A sweep recorded before a parameter existed (or was active for its kernel) ran its default: a tf32x3
    sweep of before STORE keeps STORE=direct, so a replay draws only the configs it recorded."""
    choices = {"MATH": ["tf32x3"], "BM": [32, 64], "STORE": ["direct"]}
    old = {k: v for k, v in choices.items() if k != "STORE"}
    sub = sweep.SubSpace.recorded("matmul", old)
    assert sub.choices["STORE"] == ["direct"] and sub.choices["BM"] == [32, 64]
    assert sub.choices["LOADER"] == ["registers"] and "BN" not in sub.choices  # BN has no default: as recorded
    assert sweep.SubSpace.recorded("matmul", choices).choices == sub.choices


def test_plan_is_every_feasible_config_of_the_subspace():
    sub = sweep.SubSpace.of("matmul", ["BM", "BN", "TM", "TN", "BK"], base="regtile-128")
    configs = sweep.plan(sub, PROFILES["h100"], "float32", "nn")
    problem = Problem(PROFILES["h100"], "float32", "nn")
    space = sub.space()  # built once: a restricted space takes tens of milliseconds, and there are 328 configs
    assert len(configs) == space.count(problem).feasible == len({c.key() for c in configs})
    assert all(space.is_feasible(c, problem) for c in configs)
    assert {c["TM"] for c in configs} > {1} and {c["SWIZZLE"] for c in configs} == {8}


def test_first_sweep_holds_the_recorded_table(first):
    """The converted file answers exactly what tests/data/matmul_replay_h200.json recorded."""
    raw = json.loads((DATA / "matmul_replay_h200.json").read_text())
    assert len(first.rows) == len(raw["results"]) == 256
    table = first.table()
    space = first.space()
    for key, entry in raw["results"].items():
        mine = table["results"][space.config(dict(i.split("=", 1) for i in key.split(","))).key()]
        assert mine["status"] == entry["status"]
        if entry["status"] == OK:
            assert mine["timing"]["median_ms"] == entry["timing"]["median_ms"]
    assert table["baseline"]["median_ms"] == raw["baseline"]["median_ms"]
    assert first.header["device"] == "NVIDIA-H200_sm_90" and first.key.layout == "nn"
    # The optimum is over what today's model admits (208 of the 256 recorded).
    assert len(first.feasible_rows()) == 208 == first.header["feasible"]
    assert first.best_ms() == min(r["median_ms"] for _, r in first.feasible_rows() if r["status"] == OK)


class Interrupted(Exception):
    pass


class Flaky(ReplayEvaluator):
    """A replay that dies after `chunks` calls, as a recording cut off."""

    def __init__(self, table, space, chunks):
        super().__init__(table, space)
        self.chunks = chunks

    def evaluate(self, candidates):
        if self.chunks == 0:
            raise Interrupted
        self.chunks -= 1
        return super().evaluate(candidates)


def test_record_resumes_where_it_stopped(tmp_path, first):
    out = tmp_path / "s.jsonl.gz"
    sub, key, limits = first.sub, first.key, first.limits
    tuner = Tuner(key, TuneOptions(), space=sub.space())
    with pytest.raises(Interrupted):
        sweep.record(out, sub, key, limits, Flaky(first.table(), sub.space(), 2), tuner.candidate,
                     command="autotile sweep ...", chunk=50)
    assert len(sweep.load(out).rows) == 100
    replay = ReplayEvaluator(first.table(), sub.space())
    done = sweep.record(out, sub, key, limits, replay, tuner.candidate, chunk=50)
    assert len(replay.evaluated) == 208 - 100  # only what was missing
    assert len(done.rows) == 208 == len(done.results())
    assert done.header["command"] == "autotile sweep ..." and done.header["varying"] == first.sub.varying
    assert done.best_ms() == first.best_ms()
    assert done.header["baseline"]["median_ms"] == first.header["baseline"]["median_ms"]
    # A crash mid-append leaves a member cut short: it is ignored, the rows before it stay.
    whole = out.read_bytes()
    out.write_bytes(whole + gzip.compress(b'[1,2,3]\n[4,5')[:-9])
    assert len(sweep.load(out).rows) == 208
    # Another sub-space is refused rather than mixed in.
    other = sweep.SubSpace.of("matmul", ["BM", "BN"], base="regtile-128")
    with pytest.raises(sweep.SweepError, match="not this one"):
        sweep.record(out, other, key, limits, replay, tuner.candidate)


def test_a_file_that_is_no_sweep_is_refused(tmp_path):
    bad = tmp_path / "x.jsonl.gz"
    bad.write_bytes(gzip.compress(b'{"format": "other"}\n'))
    with pytest.raises(sweep.SweepError, match="not a sweep file"):
        sweep.load(bad)
    bad.write_text("plain text")
    with pytest.raises(sweep.SweepError, match="not a sweep file"):
        sweep.load(bad)


def test_cli_counts_feasible_configs_per_profile(capsys):
    assert cli.main(["sweep", "matmul", "--shape", "2048x2048x2048", "--vary", "BM,BN,WM,WN,BK,STAGES",
                     "--base", "tf32x3-128", "--count"]) == 0
    out = capsys.readouterr().out.splitlines()
    sub = sweep.SubSpace.of("matmul", ["BM", "BN", "WM", "WN", "BK", "STAGES"], base="tf32x3-128")
    n = len(sweep.plan(sub, PROFILES["h200"], "float32", "nn"))
    assert len(out) == 2 and all(line.endswith(f": {n} feasible configs") for line in out)
    assert cli.main(["sweep", "matmul", "--shape", "64x64x64", "--vary", "BM,NOPE", "--count"]) == 2
    assert "unknown parameter 'NOPE'" in capsys.readouterr().err
    assert cli.main(["sweep", "matmul", "--shape", "64x64x64", "--vary", "BM"]) == 2
    assert "--out FILE" in capsys.readouterr().err
