"""A study, and a benchmark run, as a folder of plots and one HTML page that shows them.

`write_report(study, out_dir)` reads any optuna study the tuner made (in memory, on a journal file, on a
database: `load_study` opens one by storage and name) and writes PNG files: the best time so far against
trials and against seconds (with cuBLAS, where the study knows its time), the distribution of the
candidates' speeds (seeds marked), optuna's parameter importances, the best configs on parallel
coordinates and the failures by reason, plus `index.html` with the problem, the best config and a table
of the best few. `write_roofline(results, out_dir)` adds the roofline of a `python -m autotile.cli.bench` run:
each row's achieved TFLOP/s against its arithmetic intensity, under the compute and bandwidth ceilings
measured in the same run.

matplotlib is optional (the `report` extra) and imported only here, through its object interface (no
pyplot, so no global backend is switched: the figures are drawn on the Agg canvas).
"""

from __future__ import annotations

import dataclasses
import html
import math
from pathlib import Path
from typing import Any

from autotile.codegen import kernels
from autotile.errors import InvalidValueError, MissingDependencyError
from autotile.tuning import study as study_mod
from autotile.tuning.tuner import BASELINE_ATTR, PROBLEM_ATTR

PLOTS = ("best_so_far.png", "speeds.png", "importances.png", "parallel.png", "failures.png")
ROOFLINE = "roofline.png"
INSTALL = 'pip install "autotile[report]"'
TOP = 10  # configs in the parallel-coordinates plot and the table


def require_matplotlib() -> Any:
    """The matplotlib module, or MissingDependencyError saying how to install it."""
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
    except ImportError as exc:
        raise MissingDependencyError(f"reports need matplotlib ({exc}): {INSTALL}") from None
    return matplotlib


def _figure(width: float = 8.0, height: float = 4.5) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: Path) -> None:
    fig.savefig(path, format="png", metadata={"Software": None})


def _note(path: Path, title: str, text: str) -> None:
    """A plot that has nothing to show: its title and why, so the page keeps its layout."""
    fig = _figure(8.0, 2.0)
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.set_title(title)
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, transform=ax.transAxes)
    _save(fig, path)


# -- reading a study ---------------------------------------------------------------------------------------

def load_study(storage: str | None, name: str) -> Any:
    """The study `name` in `storage` (see `autotile.tuning.study.open_storage`), or InvalidValueError in one line.
    A journal file or SQLite database that does not exist is refused, not created."""
    import optuna

    if storage is None:
        raise InvalidValueError("a study in memory cannot be reopened: name its --storage (journal:PATH or a URL)")
    for prefix in (study_mod.JOURNAL, "sqlite:///"):
        if storage.startswith(prefix) and not Path(storage[len(prefix):]).expanduser().is_file():
            raise InvalidValueError(f"no study storage at {storage[len(prefix):]} (from --storage {storage})")
    try:
        opened = study_mod.open_storage(storage)
        names = [s.study_name for s in optuna.get_all_study_summaries(opened, include_best_trial=False)]
    except Exception as exc:  # a URL SQLAlchemy cannot use, a server that does not answer
        raise InvalidValueError(f"cannot open storage {storage}: {' '.join(str(exc).split())[:300]}") from None
    if name not in names:
        known = ", ".join(sorted(names)[:10]) or "none"
        raise InvalidValueError(f"no study named {name!r} in {storage} (studies there: {known})")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=name, storage=opened)


@dataclasses.dataclass(frozen=True)
class Run:
    """One candidate the study timed (or tried to)."""

    number: int
    key: str
    ms: float | None  # None: it failed
    failure: str | None
    seed: str | None  # the seed's or named config's name
    start_s: float | None  # seconds since the study's first trial started
    end_s: float | None


@dataclasses.dataclass(frozen=True)
class StudyData:
    name: str
    problem: dict[str, Any] | None
    baseline_ms: float | None
    runs: tuple[Run, ...]

    @property
    def timed(self) -> list[Run]:
        return [r for r in self.runs if r.ms is not None]

    @property
    def unit(self) -> str | None:
        p = self.problem
        if p is None or not self._knows_metric:
            return None
        return kernels.metric(p["kernel"], tuple(p["shape"]), p["dtype"], 1.0)[1]

    @property
    def _knows_metric(self) -> bool:
        p = self.problem
        return p is not None and p.get("kernel") in kernels.KERNELS and p.get("dtype") in kernels.DTYPE_SIZES

    def metric(self, ms: float) -> float | None:
        if not self._knows_metric:
            return None
        p = self.problem
        assert p is not None
        return kernels.metric(p["kernel"], tuple(p["shape"]), p["dtype"], ms)[0]

    def top(self, n: int = TOP) -> list[Run]:
        return sorted(self.timed, key=lambda r: (r.ms, r.number))[:n]

    @property
    def title(self) -> str:
        p = self.problem
        if not p:
            return f"study {self.name}"
        shape = "x".join(map(str, p.get("shape", [])))
        return f"{p.get('kernel')} {p.get('dtype')} {p.get('layout')} {shape} on {p.get('device')}"


def study_data(study: Any) -> StudyData:
    """What the report needs from `study`: its problem, cuBLAS's time and every run (verdict RUN) that
    finished, in trial order. Studies not made by the tuner (no verdicts) count every finished trial."""
    import optuna

    trials = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
    if any(study_mod.VERDICT in t.user_attrs for t in trials):
        trials = [t for t in trials if t.user_attrs.get(study_mod.VERDICT) == study_mod.RUN]
    else:
        trials = [t for t in trials if t.state != optuna.trial.TrialState.PRUNED]
    starts = [t.datetime_start for t in trials if t.datetime_start is not None]
    first = min(starts) if starts else None

    def since(moment: Any) -> float | None:
        return (moment - first).total_seconds() if moment is not None and first is not None else None

    runs = []
    for t in trials:
        complete = t.state == optuna.trial.TrialState.COMPLETE and t.value is not None
        failure = None if complete else str(t.user_attrs.get(study_mod.FAILURE) or "lost (worker died)")
        key = t.user_attrs.get(study_mod.KEY) or ",".join(f"{k}={v}" for k, v in t.params.items())
        seed = t.user_attrs.get("seed") or t.user_attrs.get("named")
        runs.append(Run(t.number, str(key), float(t.value) if complete else None, failure,
                        str(seed) if seed else None, since(t.datetime_start), since(t.datetime_complete)))
    attrs = study.user_attrs
    problem = attrs.get(PROBLEM_ATTR)
    baseline = attrs.get(BASELINE_ATTR)
    return StudyData(study.study_name, problem if isinstance(problem, dict) else None,
                     float(baseline) if isinstance(baseline, (int, float)) and baseline > 0 else None, tuple(runs))


# -- the plots ---------------------------------------------------------------------------------------------

def plot_best_so_far(data: StudyData, path: Path) -> None:
    timed = data.timed
    if not timed:
        _note(path, "best time so far", "no candidate ran correctly")
        return
    fig = _figure(10.0, 4.0)
    axes = fig.subplots(1, 2, sharey=True)
    best, steps, each = math.inf, [], []
    for i, r in enumerate(data.runs, 1):
        if r.ms is not None:
            best = min(best, r.ms)
            each.append((i, r.end_s or 0.0, r.ms))
        if best < math.inf:
            steps.append((i, r.end_s or 0.0, best))
    for ax, col, label in ((axes[0], 0, "candidates run"), (axes[1], 1, "seconds since the first trial")):
        ax.step([s[col] for s in steps], [s[2] for s in steps], where="post", color="tab:blue",
                label="autotile, best so far")
        ax.scatter([p[col] for p in each], [p[2] for p in each], s=8, color="tab:gray", alpha=0.5,
                   label="each candidate")
        if data.baseline_ms:
            ax.axhline(data.baseline_ms, color="tab:red", linestyle="--", label=f"cuBLAS {data.baseline_ms:.4g} ms")
        ax.set_xlabel(label)
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("median time (ms, log)")
    axes[0].legend(fontsize="small")
    fig.suptitle(f"best time so far: {data.title}", fontsize="medium")
    _save(fig, path)


def plot_speeds(data: StudyData, path: Path) -> None:
    timed = data.timed
    if not timed:
        _note(path, "candidate speeds", "no candidate ran correctly")
        return
    unit = data.unit

    def value(ms: float | None) -> float:
        assert ms is not None
        metric = data.metric(ms) if unit else None
        return ms if metric is None else metric

    values = [value(r.ms) for r in timed]
    fig = _figure()
    ax = fig.add_subplot()
    ax.hist(values, bins=min(40, max(5, len(values) // 2)), color="tab:blue", alpha=0.7,
            label=f"{len(values)} candidates")
    for r in timed:
        if r.seed:
            v = value(r.ms)
            ax.axvline(v, color="tab:green", linestyle=":")
            ax.annotate(r.seed, (v, 1), xycoords=("data", "axes fraction"), rotation=90, va="top", ha="right",
                        fontsize="x-small", color="tab:green")
    if data.baseline_ms:
        ax.axvline(value(data.baseline_ms), color="tab:red", linestyle="--", label="cuBLAS")
    ax.set_xlabel(unit or "median time (ms)")
    ax.set_ylabel("candidates")
    ax.legend(fontsize="small")
    ax.set_title(f"candidate speeds: {data.title}", fontsize="medium")
    _save(fig, path)


def importances(study: Any) -> tuple[dict[str, float] | None, str]:
    """optuna's parameter importances over the study's completed runs, or None and the reason there are
    none (too few runs, or no parameter that took two values)."""
    import optuna

    done = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE
            and t.user_attrs.get(study_mod.VERDICT, study_mod.RUN) == study_mod.RUN]
    if len(done) < 2:
        return None, f"{len(done)} completed run(s): too few for importances"
    common = set.intersection(*(set(t.params) for t in done))
    varied = sorted(p for p in common if len({repr(t.params[p]) for t in done}) > 1)
    if not varied:
        return None, "no parameter took more than one value in the completed runs"
    copy = optuna.create_study(direction="minimize")
    copy.add_trials(done)
    try:
        evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)
        return dict(optuna.importance.get_param_importances(copy, evaluator=evaluator, params=varied)), ""
    except Exception as exc:  # optuna refuses some studies (a value that is the same everywhere...)
        return None, f"optuna could not compute importances: {' '.join(str(exc).split())[:200]}"


def plot_importances(study: Any, data: StudyData, path: Path) -> None:
    found, why = importances(study)
    if not found:
        _note(path, "parameter importances", why)
        return
    names = list(found)[::-1]
    fig = _figure(8.0, max(2.5, 0.35 * len(names) + 1.0))
    ax = fig.add_subplot()
    ax.barh(names, [found[n] for n in names], color="tab:blue")
    ax.set_xlabel("importance (optuna fANOVA, share of the variance of the time)")
    ax.set_title(f"parameter importances: {data.title}", fontsize="medium")
    _save(fig, path)


def _parse_key(key: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in key.split(",") if "=" in item)


def _order(values: set[str]) -> list[str]:
    def rank(v: str) -> tuple[int, float, str]:
        try:
            return (0, float(v), v)
        except ValueError:
            return (1, 0.0, v)

    return sorted(values, key=rank)


def plot_parallel(data: StudyData, path: Path, n: int = TOP) -> None:
    top = data.top(n)
    if len(top) < 2:
        _note(path, "the best configs", f"{len(top)} candidate(s) ran correctly: nothing to compare")
        return
    configs = [_parse_key(r.key) for r in top]
    names = [p for p in configs[0] if all(p in c for c in configs)]
    varied = [p for p in names if len({c[p] for c in configs}) > 1] or names
    axes_values = {p: _order({c[p] for c in configs}) for p in varied}
    fig = _figure(max(8.0, 0.9 * (len(varied) + 1) + 2), 5.0)
    ax = fig.add_subplot()
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    lo, hi = top[0].ms, top[-1].ms
    for rank, (r, c) in reversed(list(enumerate(zip(top, configs, strict=True)))):
        ys = []
        for p in varied:
            vals = axes_values[p]
            ys.append(vals.index(c[p]) / (len(vals) - 1) if len(vals) > 1 else 0.5)
        ys.append((r.ms - lo) / (hi - lo) if hi > lo else 0.5)  # type: ignore[operator]
        share = (r.ms - lo) / (hi - lo) if hi > lo else 0.0  # type: ignore[operator]
        ax.plot(range(len(ys)), ys, color=cmap(share), linewidth=3.0 if rank == 0 else 1.2,
                alpha=0.95 if rank == 0 else 0.7, label=f"best: {r.ms:.4g} ms" if rank == 0 else None)
    for i, p in enumerate(varied):
        ax.axvline(i, color="black", linewidth=0.6)
        vals = axes_values[p]
        for j, v in enumerate(vals):
            ax.text(i, j / (len(vals) - 1) if len(vals) > 1 else 0.5, f" {v}", fontsize="x-small", va="center")
    ax.axvline(len(varied), color="black", linewidth=0.6)
    ax.text(len(varied), 0.0, f" {lo:.4g}", fontsize="x-small", va="center")
    ax.text(len(varied), 1.0, f" {hi:.4g}", fontsize="x-small", va="center")
    ax.set_xticks(range(len(varied) + 1), varied + ["time ms"], rotation=30)
    ax.set_yticks([])
    ax.set_xlim(-0.3, len(varied) + 0.6)
    ax.set_ylim(-0.05, 1.05)
    ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    ax.set_title(f"the {len(top)} fastest configs (parameters that differ among them): {data.title}",
                 fontsize="medium")
    _save(fig, path)


def failure_counts(data: StudyData) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in data.runs:
        if r.failure:
            counts[r.failure] = counts.get(r.failure, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def plot_failures(data: StudyData, path: Path) -> None:
    counts = failure_counts(data)
    if not counts:
        _note(path, "failures by reason", f"none: all {len(data.runs)} candidates ran correctly")
        return
    fig = _figure(8.0, 3.5)
    ax = fig.add_subplot()
    bars = ax.bar(list(counts), list(counts.values()), color="tab:red")
    ax.bar_label(bars)
    ax.set_ylabel("candidates")
    ax.set_title(f"failures by reason ({sum(counts.values())} of {len(data.runs)} candidates): {data.title}",
                 fontsize="medium")
    _save(fig, path)


# -- the roofline ------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Point:
    label: str  # kernel layout shape
    name: str  # cuBLAS, seed-..., autotile ...
    intensity: float  # FLOP per byte of the minimum traffic
    tflops: float
    gbps: float


def read_bench(results: str | Path | dict[str, Any]) -> dict[str, Any]:
    """A `python -m autotile.cli.bench` results.json (path or parsed), checked; InvalidValueError if it is not."""
    from autotile.tuning import bench_results as report

    try:
        loaded = report._load(str(results)) if not isinstance(results, dict) else report._load("results", results)
    except ValueError as exc:
        raise InvalidValueError(" ".join(str(exc).split())) from None
    if report._is_random(loaded):
        raise InvalidValueError(f"{results} is a random-shape run (--random): it measures no ceilings, so it "
                                f"has no roofline; give a results.json")
    return loaded


def roofline_points(results: dict[str, Any]) -> list[Point]:
    points = []
    for row in results["rows"]:
        kernel, shape, dtype = row["kernel"], tuple(row["shape"]), row.get("dtype", "float32")
        if kernel not in kernels.KERNELS or dtype not in kernels.DTYPE_SIZES or not row["time_ms"]:
            continue
        spec = kernels.get(kernel)
        flops, traffic = spec.flops(shape), spec.min_bytes(shape, kernels.DTYPE_SIZES[dtype])
        seconds = row["time_ms"] * 1e-3
        points.append(Point(f"{kernel} {row['layout']} {'x'.join(map(str, shape))}", str(row["name"]),
                            flops / traffic, flops / seconds / 1e12, traffic / seconds / 1e9))
    return points


def write_roofline(results: str | Path | dict[str, Any], out_dir: str | Path) -> Path:
    """roofline.png of a benchmark run in `out_dir`; returns its path."""
    require_matplotlib()
    loaded = read_bench(results)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / ROOFLINE
    points = roofline_points(loaded)
    ceilings = loaded["ceilings"]
    peak, read, copy = ceilings["fp32_peak_tflops"], ceilings["read_gbps"], ceilings["copy_gbps"]
    if not points:
        _note(path, "roofline", "the run holds no row of a known kernel")
        return path
    fig = _figure(9.0, 6.0)
    ax = fig.add_subplot()
    lo = min(p.intensity for p in points) / 4
    hi = max(max(p.intensity for p in points) * 4, peak * 1e3 / read * 4)
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(xs, [min(peak, x * read / 1e3) for x in xs], color="black",
            label=f"measured ceilings: FP32 {peak:.1f} TFLOP/s, read {read:,.0f} GB/s")
    ax.plot(xs, [min(peak, x * copy / 1e3) for x in xs], color="gray", linestyle=":",
            label=f"device-to-device copy {copy:,.0f} GB/s")
    styles = {"cuBLAS": ("tab:red", "s"), "seed": ("tab:green", "^"), "autotile": ("tab:blue", "o")}
    seen: set[str] = set()
    labelled: set[str] = set()
    labelled_at: list[float] = []
    for p in points:
        kind = "cuBLAS" if p.name == "cuBLAS" else "seed" if p.name.startswith("seed") else "autotile"
        color, marker = styles[kind]
        ax.scatter([p.intensity], [p.tflops], color=color, marker=marker, s=36, zorder=3,
                   label=kind if kind not in seen else None)
        seen.add(kind)
        if kind == "autotile" and p.label not in labelled:  # one label per shape, at autotile's point
            labelled.add(p.label)
            # Shapes of one intensity (matvec: always 1/2 FLOP per byte) stack their labels downwards.
            below = sum(1 for q in labelled_at if math.isclose(q, p.intensity, rel_tol=0.05))
            labelled_at.append(p.intensity)
            ax.annotate(f"{p.label}: {p.tflops:.1f} TFLOP/s, {p.gbps:,.0f} GB/s", (p.intensity, p.tflops),
                        textcoords="offset points", xytext=(8, -4 - 14 * below), fontsize="x-small",
                        arrowprops={"arrowstyle": "-", "color": "gray", "linewidth": 0.5} if below else None)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte of the minimum traffic)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small", loc="lower right")
    env = loaded["environment"]
    ax.set_title(f"roofline: {env.get('gpu')}, {env.get('date')} (ceilings measured in the same run)",
                 fontsize="medium")
    _save(fig, path)
    return path


# -- the page ----------------------------------------------------------------------------------------------

def _cell(value: Any) -> str:
    return f"<td>{html.escape(str(value))}</td>"


def _study_html(data: StudyData) -> list[str]:
    e = html.escape
    top = data.top()
    unit = data.unit
    lines = [f"<h1>{e(data.title)}</h1>", "<ul>", f"<li>study: <code>{e(data.name)}</code></li>"]
    if data.problem:
        lines.append(f"<li>device: {e(str(data.problem.get('device')))}; precision: "
                     f"{e(str(data.problem.get('precision', '-')))}</li>")
    failures = failure_counts(data)
    lines.append(f"<li>candidates run: {len(data.runs)} ({len(data.timed)} correct; failures: "
                 f"{e(', '.join(f'{n} {s}' for s, n in failures.items()) or 'none')})</li>")
    if top:
        best = top[0]
        metric = data.metric(best.ms) if best.ms else None
        vs = f", {data.baseline_ms / best.ms:.2f}x cuBLAS" if data.baseline_ms and best.ms else ""
        lines.append(f"<li>best: <code>{e(best.key)}</code>, {best.ms:.4f} ms"
                     + (f", {metric:,.0f} {e(unit or '')}" if metric else "") + f"{e(vs)} (trial {best.number})</li>")
    lines.append(f"<li>cuBLAS: {data.baseline_ms:.4f} ms</li>" if data.baseline_ms else
                 "<li>cuBLAS: not recorded in the study</li>")
    lines += ["</ul>", "<p>Times are the search's single-pass medians; the tuner's winner is chosen by re-timing "
              "the best few interleaved.</p>"]
    if top:
        lines += [f"<h2>The {len(top)} fastest configs</h2>", "<table>",
                  "<tr><th>#</th><th>trial</th><th>time ms</th>" + (f"<th>{e(unit)}</th>" if unit else "")
                  + "<th>x cuBLAS</th><th>seed / named</th><th>config</th></tr>"]
        for i, r in enumerate(top, 1):
            assert r.ms is not None
            metric = data.metric(r.ms)
            lines.append("<tr>" + _cell(i) + _cell(r.number) + _cell(f"{r.ms:.4f}")
                         + (_cell(f"{metric:,.0f}") if unit and metric is not None else "")
                         + _cell(f"{data.baseline_ms / r.ms:.2f}" if data.baseline_ms else "-")
                         + _cell(r.seed or "") + f"<td><code>{e(r.key)}</code></td></tr>")
        lines.append("</table>")
    return lines


def _roofline_html(results: dict[str, Any]) -> list[str]:
    c = results["ceilings"]
    lines = ["<h2>Roofline of the benchmark run</h2>",
             f"<p>Ceilings measured in the same run: FP32 peak {c['fp32_peak_tflops']:.1f} TFLOP/s, read "
             f"{c['read_gbps']:,.0f} GB/s, device-to-device copy {c['copy_gbps']:,.0f} GB/s.</p>",
             f'<img src="{ROOFLINE}" alt="roofline">', "<table>",
             "<tr><th>problem</th><th>kernel</th><th>FLOP/byte</th><th>TFLOP/s</th><th>of peak</th><th>GB/s</th>"
             "<th>of read</th></tr>"]
    for p in roofline_points(results):
        lines.append("<tr>" + _cell(p.label) + _cell(p.name) + _cell(f"{p.intensity:.1f}") + _cell(f"{p.tflops:.2f}")
                     + _cell(f"{p.tflops / c['fp32_peak_tflops']:.0%}") + _cell(f"{p.gbps:,.0f}")
                     + _cell(f"{p.gbps / c['read_gbps']:.0%}") + "</tr>")
    lines.append("</table>")
    return lines


STYLE = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
         "img{max-width:100%;border:1px solid #ddd;margin:0.5em 0}"
         "table{border-collapse:collapse;font-size:90%}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}"
         "code{font-size:90%}")


def write_index(out: Path, data: StudyData | None, bench: dict[str, Any] | None) -> Path:
    lines = ["<!DOCTYPE html>", '<html><head><meta charset="utf-8">',
             f"<title>autotile report: {html.escape(data.title if data else 'benchmark')}</title>",
             f"<style>{STYLE}</style></head><body>"]
    if data is not None:
        lines += _study_html(data)
        lines.append("<h2>Plots</h2>")
        lines += [f'<p><img src="{name}" alt="{name[:-4]}"></p>' for name in PLOTS]
    elif bench is not None:
        env = bench["environment"]
        lines.append(f"<h1>Benchmark: {html.escape(str(env.get('gpu')))}, {html.escape(str(env.get('date')))}</h1>")
    if bench is not None:
        lines += _roofline_html(bench)
    lines.append("<p>Written by <code>autotile report-study</code>.</p></body></html>")
    path = out / "index.html"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_report(study: Any, out_dir: str | Path, *, bench: str | Path | dict[str, Any] | None = None) -> Path:
    """The report folder of `study` (an optuna study; None: the benchmark's roofline alone) in `out_dir`,
    with the roofline of `bench` (a results.json) where given. Returns the path of index.html."""
    require_matplotlib()
    if study is None and bench is None:
        raise InvalidValueError("nothing to report: give a study, a benchmark run, or both")
    loaded = read_bench(bench) if bench is not None else None  # checked before anything is written
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidValueError(f"cannot create the report folder {out}: {exc.strerror or exc}") from None
    data = None
    if study is not None:
        data = study_data(study)
        plot_best_so_far(data, out / "best_so_far.png")
        plot_speeds(data, out / "speeds.png")
        plot_importances(study, data, out / "importances.png")
        plot_parallel(data, out / "parallel.png")
        plot_failures(data, out / "failures.png")
    if loaded is not None:
        write_roofline(loaded, out)
    return write_index(out, data, loaded)
