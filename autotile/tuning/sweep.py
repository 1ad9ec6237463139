"""Exhaustive sweeps: every feasible config of a sub-space timed on one GPU, kept as a compact file.

A sweep is a kernel's space restricted to a few varying parameters (the others fixed at a base config's
values, or at `--fix` values), for one problem (shape, dtype, layout) on one device. Its file is gzip'd
JSON lines: a header line (format, problem, the restriction, device limits, environment, cuBLAS baseline,
the command line, date), then one row per config: its values in the header's parameter order, status,
median, 25th and 75th percentile, minimum (ms), repetitions, max error, message. Rows are appended as the
GPU measures them (each append is its own gzip member), so an interrupted recording resumes where it
stopped; a member cut short by a crash is ignored on reading.

Only `record` touches a GPU, through an evaluator (`worker.IsolatedRunner`, or a replay in the tests).
`Sweep.table()` turns a sweep into the table `autotile.tuning.testing.ReplayEvaluator` answers from.
"""

from __future__ import annotations

import dataclasses
import datetime
import gzip
import json
import zlib
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

from autotile import safe_files
from autotile.codegen import kernels
from autotile.codegen.limits import DeviceLimits
from autotile.codegen.problem import ProblemKey, canonical_layout
from autotile.codegen.space import Config, Problem, Space
from autotile.errors import AutotileError, InvalidValueError, UnknownNameError
from autotile.runtime.timing import Timing
from autotile.runtime.worker import OK, Candidate, CandidateResult

FORMAT = "autotile-sweep/1"
MAX_SWEEP_BYTES = 16 << 20  # a recorded sweep of a thousand configs is about 100 kB
MAX_SWEEP_TEXT = 64 << 20  # what one gzip member of a sweep may expand to
SUFFIX = ".jsonl.gz"
SWEEPS_DIR = Path(__file__).resolve().parents[2] / "sweeps"  # the recorded sweeps of the source tree
ROW_FIELDS = ("status", "median_ms", "p25_ms", "p75_ms", "min_ms", "reps", "error", "message")


class SweepError(AutotileError, ValueError):
    """A sweep file that cannot be read, or that belongs to another sub-space than the one asked for."""


class SweepEvaluator(Protocol):
    baseline: Timing | None
    environment: dict[str, Any]

    def evaluate(self, candidates: list[Candidate]) -> list[CandidateResult]: ...


@dataclasses.dataclass(frozen=True)
class SubSpace:
    """A kernel's space restricted for a sweep: `choices` maps every parameter to the values it may take."""

    kernel: str
    choices: dict[str, list[Any]]

    @classmethod
    def of(cls, kernel: str, vary: Iterable[str], base: str | None = None,
           fix: dict[str, Any] | None = None, layout: str | None = None) -> "SubSpace":
        """The sub-space where the `vary` parameters take every choice of the kernel's space, `fix`
        parameters the values given (one or a list), and every other parameter its value in `base` (a named
        config; default: the space's default config for `layout`)."""
        space = kernels.get(kernel).space
        vary = list(vary)
        fix = dict(fix or {})
        for name in [*vary, *fix]:
            if name not in space.params:
                raise UnknownNameError(f"{kernel}: unknown parameter {name!r}; parameters: {', '.join(space.params)}")
        both = sorted(set(vary) & set(fix))
        if both:
            raise InvalidValueError(f"parameter {both[0]} is both varied and fixed; name it once")
        base_config = space.named(base) if base else space.default_config(layout or space.layouts[0])
        choices: dict[str, list[Any]] = {}
        for name, param in space.params.items():
            if name in vary:
                choices[name] = list(param.choices)
            elif name in fix:
                values = fix[name] if isinstance(fix[name], (list, tuple)) else [fix[name]]
                choices[name] = [space._coerce(param, v) for v in values]
            else:
                choices[name] = [base_config[name]]
            # A conditional parameter takes its inactive value where it is off: keep that value reachable.
            if param.active is not None and param.inactive not in choices[name] and name in vary:
                choices[name].append(param.inactive)
        return cls(kernel, choices)

    def space(self) -> Space:
        return kernels.get(self.kernel).space.restricted(self.choices)

    @classmethod
    def recorded(cls, kernel: str, choices: dict[str, Any]) -> "SubSpace":
        """A sweep file's sub-space: a parameter its choices lack came after the sweep was recorded, which
        ran that parameter's default (the value that renders the kernels of before), so it takes that (a
        parameter made active for more kernels, as STORE for tf32x3, would otherwise vary in a replay)."""
        complete = {name: list(values) for name, values in choices.items()}
        for name, param in kernels.get(kernel).space.params.items():
            if name not in complete and param.has_default:
                complete[name] = [param.default]
        return cls(kernel, complete)

    @property
    def varying(self) -> list[str]:
        return [n for n, c in self.choices.items() if len(c) > 1]

    def to_json(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "choices": self.choices}


def plan(sub: SubSpace, limits: DeviceLimits, dtype: str, layout: str) -> list[Config]:
    """Every feasible config of the sub-space on this device, in the order of the declared choices."""
    return sub.space().feasible(Problem(limits, dtype, layout))


# -- the file ------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Sweep:
    """A sweep file's content: its header and its rows, each row a config and what the GPU measured."""

    header: dict[str, Any]
    rows: list[tuple[Config, dict[str, Any]]]
    path: Path | None = None

    @property
    def key(self) -> ProblemKey:
        p = self.header["problem"]
        return ProblemKey(p["kernel"], p["dtype"], p["layout"], tuple(p["shape"]))

    @property
    def sub(self) -> SubSpace:
        s = self.header["subspace"]
        return SubSpace.recorded(s["kernel"], s["choices"])

    @property
    def limits(self) -> DeviceLimits:
        return DeviceLimits.from_json(self.header["limits"])

    @property
    def name(self) -> str:
        return self.path.name[: -len(SUFFIX)] if self.path is not None and self.path.name.endswith(SUFFIX) \
            else f"{self.key}"

    def space(self) -> Space:
        return self.sub.space()

    def results(self) -> dict[str, dict[str, Any]]:
        """Config key -> row (the last row of a config wins: a re-measurement replaces the first)."""
        return {config.key(): row for config, row in self.rows}

    def feasible_rows(self) -> list[tuple[Config, dict[str, Any]]]:
        """The rows of configs today's constraint model admits (a sweep recorded before a constraint was
        added holds configs the tuner can no longer draw)."""
        space, problem = self.space(), Problem(self.limits, self.key.dtype, self.key.layout)
        return [(c, r) for c, r in self.rows if space.is_feasible(c, problem)]

    def best_ms(self) -> float:
        """The optimum: the fastest median of any correct config that today's model admits (ms)."""
        times = [r["median_ms"] for _, r in self.feasible_rows() if r["status"] == OK and r["median_ms"] is not None]
        if not times:
            raise SweepError(f"sweep {self.name} has no correct config")
        return min(times)

    def table(self) -> dict[str, Any]:
        """The table `autotile.tuning.testing.ReplayEvaluator` reads (keys through this sweep's space)."""
        results: dict[str, Any] = {}
        for config, row in self.rows:
            entry: dict[str, Any] = {"status": row["status"]}
            if row["status"] == OK:
                entry["timing"] = {k: row[k] for k in ("median_ms", "p25_ms", "p75_ms", "min_ms", "reps")}
                entry["error"] = row.get("error")
            if row.get("message"):
                entry["message"] = row["message"]
            results[config.key()] = entry
        env = dict(self.header.get("environment", {}), limits=self.header["limits"])
        return {"problem": self.header["problem"], "environment": env, "baseline": self.header["baseline"],
                "results": results}


def _timing(d: dict[str, Any]) -> Timing:
    return Timing(d["median_ms"], d["p25_ms"], d["p75_ms"], d["min_ms"], d["reps"])


def _row(config: Config, names: list[str], result: CandidateResult) -> list[Any]:
    t = result.timing
    timing = [t.median_ms, t.p25_ms, t.p75_ms, t.min_ms, t.reps] if t is not None and result.status == OK \
        else [None] * 5
    return [config[n] for n in names] + [result.status, *timing, result.error if t is not None else None,
                                         (result.message or "")[:300]]


def _append(path: Path, lines: list[Any]) -> None:
    """Append JSON lines as one gzip member: a crash loses at most the member being written."""
    data = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines).encode()
    with open(path, "ab") as f:
        f.write(gzip.compress(data, mtime=0))


def _lines(path: Path) -> list[Any]:
    """The JSON lines of every complete gzip member (a member cut short at the end is skipped)."""
    raw = safe_files.read_bytes(path, "sweep file", MAX_SWEEP_BYTES, SweepError)
    out: list[Any] = []
    while raw:
        d = zlib.decompressobj(wbits=31)
        try:  # at most MAX_SWEEP_TEXT bytes out of each member: a gzip bomb stops there
            data = d.decompress(raw, MAX_SWEEP_TEXT)
        except zlib.error as exc:
            raise SweepError(f"{path}: not a sweep file (gzip: {exc})") from None
        if d.unconsumed_tail:
            raise SweepError(f"{path}: a member of the sweep file expands past {MAX_SWEEP_TEXT} bytes")
        if not d.eof:
            break  # the last member was cut short: its rows were never acknowledged
        text = safe_files.decode(data, path, "sweep file", SweepError)
        if not text.endswith("\n"):
            break
        out += [safe_files.load_json(line, f"{path} line {len(out) + 1}", SweepError)
                for line in text.splitlines() if line]
        raw = d.unused_data
    return out


def load(path: str | Path) -> Sweep:
    """Read a sweep file."""
    path = Path(path)
    lines = _lines(path)
    if not lines or not isinstance(lines[0], dict) or lines[0].get("format") != FORMAT:
        raise SweepError(f"{path}: not a sweep file (its first line is not a {FORMAT} header)")
    header = lines[0]
    names = header["params"]
    space = SubSpace.recorded(header["subspace"]["kernel"], header["subspace"]["choices"]).space()
    rows = []
    for line in lines[1:]:
        values = dict(zip(names, line[: len(names)], strict=True))
        row = dict(zip(ROW_FIELDS, line[len(names):], strict=True))
        rows.append((space.config(values), row))
    return Sweep(header, rows, path)


def header(sub: SubSpace, key: ProblemKey, limits: DeviceLimits, evaluator: SweepEvaluator,
           command: str, feasible: int) -> dict[str, Any]:
    baseline = evaluator.baseline.to_json() if evaluator.baseline is not None else None
    return {"format": FORMAT, "problem": key.to_json(), "subspace": sub.to_json(),
            "params": list(kernels.get(key.kernel).space.params), "varying": sub.varying, "feasible": feasible,
            "limits": dataclasses.asdict(limits), "device": limits.fingerprint,
            "environment": {k: v for k, v in evaluator.environment.items() if k != "limits"},
            "baseline": baseline, "command": command,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def record(path: str | Path, sub: SubSpace, key: ProblemKey, limits: DeviceLimits, evaluator: SweepEvaluator,
           make_candidate: Callable[[Config], Candidate], *, command: str = "", chunk: int = 32,
           progress: Callable[[int, int], None] | None = None) -> Sweep:
    """Time every feasible config of `sub` that `path` does not hold yet, appending rows as they come.
    A file of another problem, sub-space or device is refused rather than mixed into."""
    path = Path(path)
    configs = plan(sub, limits, key.dtype, key.layout)
    if path.exists():
        done = load(path)
        theirs = (done.key, done.sub.to_json(), done.header["device"])
        mine = (key, sub.to_json(), limits.fingerprint)
        if theirs != mine:
            raise SweepError(f"{path} holds a sweep of {done.key} on {done.header['device']} over "
                             f"{', '.join(done.sub.varying)}; not this one: use another file")
        measured = set(done.results())
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        _append(path, [header(sub, key, limits, evaluator, command, len(configs))])
        measured = set()
    todo = [c for c in configs if c.key() not in measured]
    names = list(kernels.get(key.kernel).space.params)
    for i in range(0, len(todo), chunk):
        part = todo[i:i + chunk]
        results = evaluator.evaluate([make_candidate(c) for c in part])
        _append(path, [_row(c, names, r) for c, r in zip(part, results, strict=True)])
        if progress is not None:
            progress(len(configs) - len(todo) + i + len(part), len(configs))
    return load(path)


def from_table(path: str | Path, table: dict[str, Any], sub: SubSpace, command: str) -> Sweep:
    """Write the replay table of `tests/data/record_replay_table.py` (JSON, keyed by config) as a sweep."""
    path = Path(path)
    if path.exists():
        raise SweepError(f"{path} exists; remove it first")
    p = table["problem"]
    key = ProblemKey(p["kernel"], p["dtype"], canonical_layout(p["kernel"], p["layout"]), tuple(p["shape"]))
    limits = DeviceLimits.from_json(table["environment"]["limits"])
    space = sub.space()
    names = list(kernels.get(key.kernel).space.params)

    class _Recorded:
        baseline: Timing | None = _timing(table["baseline"])
        environment = {k: v for k, v in table["environment"].items() if k != "limits"}

        def evaluate(self, candidates: list[Candidate]) -> list[CandidateResult]:
            raise SweepError("a converted table measures nothing")

    head = header(sub, key, limits, _Recorded(), command, len(plan(sub, limits, key.dtype, key.layout)))
    head["date"] = table["environment"].get("date", head["date"])
    lines: list[Any] = [head]
    for k, entry in table["results"].items():
        config = space.config(dict(item.split("=", 1) for item in k.split(",")))
        timing = _timing(entry["timing"]) if "timing" in entry else None
        result = CandidateResult(0, entry["status"], entry.get("message", ""), timing, entry.get("error"))
        lines.append(_row(config, names, result))
    _append(path, lines)
    return load(path)


def sweeps(folder: str | Path | None = None) -> list[Sweep]:
    """Every sweep file in `folder` (default: the repository's sweeps/), by name."""
    folder = Path(folder) if folder is not None else SWEEPS_DIR
    if not folder.is_dir():
        raise SweepError(f"{folder}: no such folder of sweep files")
    found = sorted(p for p in folder.glob("*" + SUFFIX) if p.is_file())
    if not found:
        raise SweepError(f"{folder}: holds no sweep file (*{SUFFIX})")
    return [load(p) for p in found]


__all__ = ["FORMAT", "SWEEPS_DIR", "SubSpace", "Sweep", "SweepError", "load", "plan", "record", "sweeps"]
