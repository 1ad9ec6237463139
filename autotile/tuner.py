"""The optuna study: sampling, pruning of infeasible points, baselines first, failure records, and a
winner chosen by re-timing the best few candidates interleaved.

The study talks to an `Evaluator`: the GPU one runs candidates in a worker process (`worker.IsolatedRunner`);
`autotile.testing.ReplayEvaluator` answers from a table of recorded timings, so the loop is tested without
a GPU. A study is bound to its problem (kernel, dtype, layout, shape, device) and to the precision it
searches (`autotile.precision`: under "highest" the space holds SIMT configs only, MATH=simt): resuming
it for another one is refused.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from typing import Any, Callable, Protocol

from . import kernels
from . import precision as precision_mod
from .device import DeviceLimits
from .errors import AutotileError, InvalidValueError, UnknownNameError
from .problem import ProblemKey
from .space import Config, Problem, Space
from .timing import Timing
from .worker import OK, Candidate, CandidateResult

SAMPLERS = ("tpe", "random", "grid", "cmaes", "nsga2")
SEED_PREFIX = "seed-"
MAX_SKIPS = 5000  # infeasible or repeated draws in a row before we call the space exhausted
PROBLEM_ATTR = "autotile_problem"  # the study's user attribute that binds it to one problem


class TuningError(AutotileError, RuntimeError):
    """A tuning run that could not name a result: every candidate failed, or none could run."""


class Evaluator(Protocol):
    baseline: Timing | None
    environment: dict[str, Any]

    def evaluate(self, candidates: list[Candidate]) -> list[CandidateResult]: ...

    def retime(self, candidates: dict[int, Candidate], rounds: int) -> tuple[dict[int, list[float]], Timing]: ...


@dataclasses.dataclass(frozen=True)
class TuneOptions:
    trials: int = 100  # candidates compiled and run; infeasible and repeated draws do not count
    timeout_s: float | None = None  # stop drawing new candidates after this many seconds
    sampler: str = "tpe"
    seed: int = 0
    storage: str | None = None  # optuna storage URL; None keeps the study in memory
    study_name: str | None = None
    batch: int = 4  # candidates compiled together while the GPU times the first
    top_k: int = 5  # candidates re-timed before a winner is named
    retime_rounds: int = 5
    candidate_timeout_s: float = 60.0
    # Configs (name -> parameter mapping) run right after the seeds and the space's named configs, for
    # example the config in use when re-tuning, so that the winner is never worse than what it replaces.
    start: tuple[tuple[str, Any], ...] = ()
    # The float32 matmul precision setting the winner must run under: "highest" searches MATH=simt only.
    precision: str = precision_mod.DEFAULT


@dataclasses.dataclass(frozen=True)
class Progress:
    done: int
    total: int
    best_ms: float | None
    best_metric: float | None
    metric_unit: str
    baseline_ms: float | None
    last_status: str


@dataclasses.dataclass(frozen=True)
class Finalist:
    config: Config
    seed_name: str | None
    median_ms: float  # median over the interleaved rounds
    round_ms: tuple[float, ...]

    @property
    def spread(self) -> float:
        """(slowest - fastest round) / median."""
        return (max(self.round_ms) - min(self.round_ms)) / self.median_ms if self.median_ms else 0.0


@dataclasses.dataclass(frozen=True)
class TuneResult:
    kernel: str
    shape: tuple[int, ...]
    dtype: str
    layout: str
    best: Finalist
    finalists: tuple[Finalist, ...]
    best_seed: Finalist | None
    baseline_ms: float | None  # cuBLAS, re-timed together with the finalists
    metric: float
    metric_unit: str
    trials: int  # candidates run in this call
    failures: dict[str, int]
    pruned: int  # infeasible draws, never compiled
    duplicates: int
    seconds: float
    environment: dict[str, Any]
    study_name: str
    # Where the winner was stored, or why it was not (set by `autotile.tune`; None when not asked to save).
    saved_path: str | None = None
    save_error: str | None = None
    save_note: str | None = None  # for example: the cache kept an existing, faster entry
    precision: str = precision_mod.DEFAULT  # the setting the search ran under (the record needs its winner's)

    @property
    def key(self) -> ProblemKey:
        return ProblemKey(self.kernel, self.dtype, self.layout, self.shape)

    @property
    def vs_baseline(self) -> float | None:
        """How many times faster than cuBLAS (above 1: faster)."""
        return self.baseline_ms / self.best.median_ms if self.baseline_ms else None

    @property
    def vs_best_seed(self) -> float | None:
        return self.best_seed.median_ms / self.best.median_ms if self.best_seed else None

    @property
    def trials_per_second(self) -> float:
        return self.trials / self.seconds if self.seconds > 0 else 0.0


def make_sampler(name: str, seed: int) -> Any:
    import warnings

    import optuna

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message=".*independent sampl.*")
    samplers = {
        # multivariate + group: TPE models parameters jointly within the branches of the space;
        # constant_liar keeps the candidates of one batch apart.
        "tpe": lambda: optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, constant_liar=True),
        "random": lambda: optuna.samplers.RandomSampler(seed=seed),
        # Grid order comes from enumerating the feasible space (see Tuner._enqueue_grid); the sampler
        # only serves what was enqueued.
        "grid": lambda: optuna.samplers.RandomSampler(seed=seed),
        # CMA-ES and NSGA-II have no native categorical handling in optuna: CMA-ES samples
        # categorical parameters independently (at random); NSGA-II mutates them.
        "cmaes": lambda: optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False),
        "nsga2": lambda: optuna.samplers.NSGAIISampler(seed=seed),
    }
    if name not in samplers:
        raise InvalidValueError(f"sampler {name!r} is not one of {', '.join(SAMPLERS)}")
    return samplers[name]()


class Tuner:
    """One tuning run of one kernel on one problem (shape, dtype, layout)."""

    def __init__(self, key: ProblemKey, options: TuneOptions = TuneOptions(), *, space: Space | None = None,
                 render_source: Callable[[Config], str] | None = None):
        self.key = key
        self.spec = kernels.get(key.kernel)
        self.space = space or self.spec.space
        if key.layout not in self.space.layouts:
            raise InvalidValueError(f"{key.kernel} supports layout(s) {list(self.space.layouts)}, not {key.layout!r}")
        if options.sampler not in SAMPLERS:
            raise InvalidValueError(f"sampler {options.sampler!r} is not one of {', '.join(SAMPLERS)}")
        if options.trials < 1:
            raise InvalidValueError(f"trials must be at least 1, got {options.trials}")
        precision_mod.check(options.precision)
        # What the setting does not allow is never drawn, nor run as a seed or a start.
        self.space = precision_mod.restricted(self.space, key.dtype, options.precision)
        self.options = options
        self._render = render_source or (lambda c: self.spec.render(c, key.dtype, key.layout))
        self._next_id = 0

    @property
    def shape(self) -> tuple[int, ...]:
        return self.key.shape

    @property
    def dtype(self) -> str:
        return self.key.dtype

    @property
    def layout(self) -> str:
        return self.key.layout

    # -- candidates --------------------------------------------------------------------------------------

    def render(self, config: Config) -> str:
        """The CUDA source this tuner runs for `config`."""
        return self._render(config)

    def candidate(self, config: Config) -> Candidate:
        self._next_id += 1
        shapes = [self.shape] + [s for s in self.spec.check_shapes if s != self.shape]
        launches = {s: self.spec.launch(config, s, self.dtype, self.layout) for s in shapes}
        return Candidate(self._next_id, self._render(config), "autotile_" + self.spec.name, launches,
                         config.key())

    # -- the study ---------------------------------------------------------------------------------------

    def run(self, evaluator: Evaluator, limits: DeviceLimits,
            progress: Callable[[Progress], None] | None = None) -> TuneResult:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        logging.getLogger("optuna").setLevel(logging.WARNING)
        opts = self.options
        problem = Problem(limits, self.dtype, self.layout)
        study_name = opts.study_name or self.default_study_name(limits)
        study = optuna.create_study(direction="minimize", sampler=make_sampler(opts.sampler, opts.seed),
                                    storage=opts.storage, study_name=study_name, load_if_exists=True)
        self._bind(study, limits)
        known: dict[str, tuple[float | None, str | None]] = {}  # config key -> (time or None, seed name)
        for t in study.trials:
            key = t.user_attrs.get("config_key")
            if key and t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL):
                value = t.value if t.state == optuna.trial.TrialState.COMPLETE else None
                known[key] = (value, t.user_attrs.get("seed"))
        counted_before = len(known)

        # The seeds run first: they are the baselines every result is reported against. The space's
        # other named configs (hand-picked starting points) follow, then the sampler's own draws.
        named = sorted(self.space.named_configs.items(), key=lambda item: not item[0].startswith(SEED_PREFIX))
        enqueued: set[str] = set()
        for name, config in named:
            if config.key() not in known and self.space.is_feasible(config, problem):
                attrs = {"seed": name} if name.startswith(SEED_PREFIX) else {"named": name}
                study.enqueue_trial(dict(config), user_attrs=attrs, skip_if_exists=True)
                enqueued.add(config.key())
        for name, values in opts.start:
            try:
                config = self.space.config(values)
            except (InvalidValueError, UnknownNameError):
                continue  # outside a narrowed space: nothing to start from
            if config.key() not in known and config.key() not in enqueued and self.space.is_feasible(config, problem):
                study.enqueue_trial(dict(config), user_attrs={"named": name}, skip_if_exists=True)
                enqueued.add(config.key())
        if opts.sampler == "grid":
            for config in self.space.feasible(problem, limit=opts.trials + counted_before + len(enqueued)):
                # Filtered here: optuna's own skip_if_exists check is quadratic in the number of trials.
                if config.key() not in known and config.key() not in enqueued:
                    study.enqueue_trial(dict(config))
                    enqueued.add(config.key())

        started = time.monotonic()
        ran = pruned = duplicates = skips = 0
        failures: dict[str, int] = {}
        unit = kernels.metric(self.spec.name, self.shape, self.dtype, 1.0)[1]
        best_ms = min((v for v, _ in known.values() if v is not None), default=None)
        baseline_ms = evaluator.baseline.median_ms if evaluator.baseline else None

        def out_of_time() -> bool:
            # The first batch (the seeds) always runs, so that a result can be named.
            return ran > 0 and opts.timeout_s is not None and time.monotonic() - started > opts.timeout_s

        while len(known) < opts.trials and not out_of_time() and skips < MAX_SKIPS:
            batch: list[tuple[Any, Config]] = []
            batch_keys: set[str] = set()
            while len(batch) < opts.batch and len(known) + len(batch) < opts.trials and skips < MAX_SKIPS:
                trial = study.ask()
                config = self.space.suggest(trial)
                key = config.key()
                if not self.space.is_feasible(config, problem):
                    trial.set_user_attr("infeasible", self.space.violations(config, problem)[0])
                    study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                    pruned += 1
                    skips += 1
                    continue
                if key in known or key in batch_keys:
                    # Already measured: tell the sampler the value again without running it.
                    value = known.get(key, (None, None))[0]
                    if value is not None:
                        study.tell(trial, value)
                    else:
                        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                    duplicates += 1
                    skips += 1
                    continue
                skips = 0
                trial.set_user_attr("config_key", key)
                batch.append((trial, config))
                batch_keys.add(key)
            if not batch:
                break
            candidates = [self.candidate(c) for _, c in batch]
            results = evaluator.evaluate(candidates)
            for (trial, config), result in zip(batch, results, strict=True):
                ran += 1
                seed = trial.user_attrs.get("seed")
                if result.status == OK and result.timing is not None:
                    ms = result.timing.median_ms
                    trial.set_user_attr("spread", result.timing.spread)
                    trial.set_user_attr("error", result.error)
                    study.tell(trial, ms)
                    known[config.key()] = (ms, seed)
                    best_ms = ms if best_ms is None else min(best_ms, ms)
                else:
                    failures[result.status] = failures.get(result.status, 0) + 1
                    trial.set_user_attr("failure", result.status)
                    trial.set_user_attr("message", result.message[:1000])
                    study.tell(trial, state=optuna.trial.TrialState.FAIL)
                    known[config.key()] = (None, seed)
                if progress is not None:
                    progress(Progress(len(known), opts.trials, best_ms,
                                      kernels.metric(self.spec.name, self.shape, self.dtype, best_ms)[0]
                                      if best_ms else None, unit, baseline_ms, result.status))

        finalists, baseline = self._retime(evaluator, known)
        if not finalists:
            raise TuningError(f"no candidate of {self.key} ran correctly in study {study_name!r} "
                              f"({', '.join(f'{n} {s}' for s, n in failures.items()) or 'none ran'})")
        best = min(finalists, key=lambda f: f.median_ms)
        seeds = [f for f in finalists if f.seed_name]
        baseline_ms = baseline.median_ms if baseline else baseline_ms
        return TuneResult(
            kernel=self.spec.name, shape=self.shape, dtype=self.dtype, layout=self.layout, best=best,
            finalists=tuple(sorted(finalists, key=lambda f: f.median_ms)),
            best_seed=min(seeds, key=lambda f: f.median_ms) if seeds else None,
            baseline_ms=baseline_ms,
            metric=kernels.metric(self.spec.name, self.shape, self.dtype, best.median_ms)[0], metric_unit=unit,
            trials=ran, failures=failures, pruned=pruned, duplicates=duplicates,
            seconds=time.monotonic() - started, environment=dict(evaluator.environment), study_name=study_name,
            precision=opts.precision)

    def _searched(self) -> str:
        """The precision class the search reaches: two settings with the same one search the same space
        (and every setting the same, for a kernel and dtype the setting cannot narrow: matvec, float64)."""
        if not precision_mod.applies(self.key.kernel, self.key.dtype):
            return precision_mod.DEFAULT
        return precision_mod.loosest(self.options.precision)

    def default_study_name(self, limits: DeviceLimits) -> str:
        """KERNEL-DTYPE-LAYOUT-SHAPE-DEVICE, with the precision class at the end where it is not "high" (a
        "highest" study searches another space, and must not meet a "high" one of the same name)."""
        name = f"{self.spec.name}-{self.dtype}-{self.layout}-{self.key.shape_text}-{limits.fingerprint}"
        searched = self._searched()
        return name if searched == precision_mod.DEFAULT else f"{name}-{searched}"

    def _bind(self, study: Any, limits: DeviceLimits) -> None:
        """Bind a new study to this problem and precision; refuse to resume one made for another problem,
        whose trials (times of another shape, configs infeasible for another dtype) would pass for this
        one's, or for another precision, whose trials hold configs this one may not run (or lack some)."""
        mine = dict(self.key.to_json(), device=limits.fingerprint, precision=self._searched())
        bound = study.user_attrs.get(PROBLEM_ATTR)
        if isinstance(bound, dict) and "precision" not in bound:
            # Bound before studies named a precision: they searched tf32x3 as well, which is "high".
            bound = dict(bound, precision=precision_mod.DEFAULT)
        if bound is None:
            if any(t.user_attrs.get("config_key") for t in study.trials):
                raise InvalidValueError(f"study {study.study_name!r} holds trials of an unknown problem (made "
                                        f"before studies were bound to one); use another --study-name for {self.key}")
            study.set_user_attr(PROBLEM_ATTR, mine)
        elif bound != mine:
            theirs = f"{bound.get('kernel')} {bound.get('dtype')} {bound.get('layout')} " \
                     f"{'x'.join(map(str, bound.get('shape', [])))} on {bound.get('device')} " \
                     f"at precision {bound.get('precision')}"
            raise InvalidValueError(f"study {study.study_name!r} tunes {theirs}, not {self.key} on "
                                    f"{limits.fingerprint} at precision {self._searched()}; use another --study-name")

    def _retime(self, evaluator: Evaluator, known: dict[str, tuple[float | None, str | None]]
                ) -> tuple[list[Finalist], Timing | None]:
        """Re-time the best few, and the best seed, interleaved; noise in one pass cannot pick the winner."""
        ranked = sorted(((v, k, s) for k, (v, s) in known.items() if v is not None))
        chosen = ranked[: self.options.top_k]
        seeds = [r for r in ranked if r[2]]
        if seeds and seeds[0] not in chosen:
            chosen.append(seeds[0])
        if not chosen:
            return [], None
        configs = {key: self._config_from_key(key) for _, key, _ in chosen}
        cands = {c.id: c for c in (self.candidate(configs[key]) for _, key, _ in chosen)}
        by_key = {c.config_key: i for i, c in cands.items()}
        rounds, baseline = evaluator.retime(cands, self.options.retime_rounds)
        finalists = []
        for _, key, seed in chosen:
            samples = rounds.get(by_key[key]) or []
            if samples:
                finalists.append(Finalist(configs[key], seed, statistics.median(samples), tuple(samples)))
        return finalists, baseline

    def _config_from_key(self, key: str) -> Config:
        values = dict(item.split("=", 1) for item in key.split(","))
        return self.space.config(values)
