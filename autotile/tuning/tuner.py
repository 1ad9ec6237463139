"""The optuna study: sampling, pruning of infeasible points, baselines first, failure records, and a
winner chosen by re-timing the best few candidates interleaved.

The study talks to an `Evaluator`: the GPU one runs candidates in a worker process (`worker.IsolatedRunner`);
`autotile.tuning.testing.ReplayEvaluator` answers from a table of recorded timings, so the loop is tested without
a GPU. A study is bound to its problem (kernel, dtype, layout, shape, device) and to the precision it
searches (`autotile.dispatch.precision`: under "highest" the space holds SIMT configs only, MATH=simt): resuming
it for another one is refused.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import hashlib
import itertools
import logging
import random
import statistics
import time
from typing import Any, Callable, Protocol

from autotile.codegen import kernels
from autotile.codegen.kernels import SKINNY_MAX_ROWS
from autotile.codegen.limits import DeviceLimits
from autotile.codegen.problem import ProblemKey
from autotile.codegen.space import Config, Problem, Space
from autotile.dispatch import precision as precision_mod
from autotile.errors import AutotileError, InvalidValueError, UnknownNameError
from autotile.runtime.timing import Timing
from autotile.runtime.worker import LATE, OK, Candidate, CandidateResult
from autotile.tuning.transfer import WARM_STARTS

SAMPLERS = ("tpe", "random", "grid")
# optuna samplers that draw categorical parameters as the random sampler does: refused, with the reason.
NO_CATEGORICAL = {"cmaes": "optuna's CMA-ES has no categorical handling and draws them at random",
                  "nsga2": "optuna's NSGA-II draws at random until its first generation fills"}
STARTUP = 10  # tpe: configs drawn uniformly over the feasible ones before TPE's model proposes
# tpe, after STARTUP: of every IMPROVE_EVERY proposals, one is a neighbour of the fastest configs so far
# (propose.improvement), the others TPE's. Measured with `autotile search-bench` over the recorded sweeps.
IMPROVE_EVERY = 3
# The last ENDGAME share of the trials all go to that local step: a search then ends on the best it can
# reach from its leaders rather than on a new region it has no trials left to follow (over the 20 recorded
# sweeps, 20 seeds: 10 default cells better, none worse; re-tunes agree more often; 0.15 and 0.25 lost the
# 10th percentile of the tall-K sweeps without named configs).
ENDGAME = 0.1
# Those neighbours are taken in turn around the fastest config and the fastest of each other kernel family
# whose best is within this factor of it (a family's first configs may be poorly fitted to the shape, and
# its optimum a few parameters away: wgmma at a skinny M behind a tf32x3 basin, measured on the H200 sweeps).
RIVAL = 1.25
# The space's named configs other than the seeds take at most this share of a search's trials (each kernel
# family's in turn): on the whole matmul space there are 60 of them, and a 40-trial search that ran them all
# would be nothing but its starting points.
NAMED_SHARE = 0.25
# A batch whose evaluation spent at least this share of its time waiting for compiles is compile-bound: the
# next batch is then compiled ahead (`TuneOptions.compile_ahead`).
COMPILE_BOUND = 0.25
RENDERED = 256  # sources a tuner keeps (`Tuner._render`)
# At most this many queued configs start compiling before the first is timed: two rounds of a 16-core host's
# compiles (the seeds, named configs and warm starts of a tune; not a whole grid of thousands).
QUEUED_AHEAD = 32
# Where a tune's wall time goes, in the order `autotile tune` prints it: (key of TuneResult.phases, words).
PHASES = (("start", "starting: checks, the worker (inputs, reference, cuBLAS)"), ("compile", "waiting for compiles"),
          ("check", "checking results"), ("timing", "timing candidates"), ("retime", "re-timing the finalists"),
          ("search", "the search itself (sampler, proposals, rendering)"),
          ("other", "the rest (messages, restarts, saving)"))
PROPOSED = "proposed"  # user attribute of a trial the tuner proposed itself: UNIFORM, NEIGHBOUR or IMPROVE
UNIFORM, NEIGHBOUR, IMPROVE, TRANSFER = "uniform", "neighbour", "improve", "transfer"
SEED_PREFIX = "seed-"
MAX_SKIPS = 5000  # infeasible or repeated draws in a row before we call the space exhausted
PROBLEM_ATTR = "autotile_problem"  # the study's user attribute that binds it to one problem
BASELINE_ATTR = "autotile_baseline_ms"  # the study's user attribute: cuBLAS's median time (ms), for reports


log = logging.getLogger(__name__)


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
    # Configs (name -> parameter mapping) run first, before the seeds and the space's named configs, for
    # example the config in use when re-tuning, so that the winner is never worse than what it replaces.
    start: tuple[tuple[str, Any], ...] = ()
    # The float32 matmul precision setting the winner must run under: "highest" searches MATH=simt only.
    precision: str = precision_mod.DEFAULT
    # This worker's index among several on one study: it reseeds the sampler, so that workers do not all
    # draw the same sequence (None: the seed as it is, for one worker).
    worker: int | None = None
    grace_s: float = 60.0  # a running trial whose worker's heartbeat stopped this long is failed and retried
    # tpe: configs of other shapes and GPUs from the cache (autotile.tuning.transfer) run after the named configs
    # (0: none). `cache`: the TuningCache to read them from (None: the default one, shipped records too).
    warm_starts: int = WARM_STARTS
    cache: Any = None
    # Run the space's named configs (the seeds, the baselines, and the hand-picked starting points) first.
    # False: the sampler alone from the first trial, as the search benchmark's --no-seeds replays it (a
    # space's named configs are a head start only for the shapes they were picked for).
    named_first: bool = True
    # A candidate whose first few runs are all slower than this many times the best median so far stops
    # being timed (`timing.clearly_slower`): its time only needs to say that it loses. None: every
    # candidate timed in full. The finalists are re-timed in full whatever this is.
    give_up: float | None = 1.25
    # Ask for each batch while the one before is timed, and have the evaluator compile it meanwhile (where it
    # can: `prepare`). False: each batch is asked for once the one before has been told.
    compile_ahead: bool = True
    # While compile-bound, this many batches are asked for and compiling beyond the one being timed. More
    # keep more of the host's compile threads busy, but each is asked for before one more batch's results
    # are in: replayed compile-bound over the 20 recorded sweeps without named configs (`autotile
    # search-bench --compile-bound --ahead N`, 2026-11-27), 3 took the x@W.T sweeps' median at 40 trials
    # from 1.000 to 0.911-0.917 and the tall-K 10th percentiles to 0.71-0.73.
    ahead: int = 1


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
    # The report folder's index.html, or why it was not written (set by `autotile.tune(report=...)`).
    report_path: str | None = None
    report_error: str | None = None
    # Seconds per phase of the tune (keys from `PHASES`); `autotile.tune` adds "start" and "other" so that
    # they add up to its wall time. Empty where unknown (several GPUs: each worker's are its own).
    phases: dict[str, float] = dataclasses.field(default_factory=dict)

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


@dataclasses.dataclass(frozen=True)
class Search:
    """What one worker's search did: the study, and its own counts (the study holds everyone's)."""

    study: Any
    ran: int  # candidates this worker timed
    pruned: int
    duplicates: int
    failures: dict[str, int]
    seconds: float
    asks: int = 0  # trials this worker asked optuna for (runs, infeasible draws, repeats)
    # Seconds per phase (`PHASES`) of this worker's search: "compile", "check" and "timing" as the evaluator
    # reported them, "search" the tuner's own (sampler, proposals, rendering, the study), "other" the rest
    # of the time spent in the evaluator (messages, worker restarts).
    phases: dict[str, float] = dataclasses.field(default_factory=dict)


def _worker_seed(seed: int, worker: int) -> int:
    """A sampler seed of its own for worker `worker` (0 keeps `seed`), reproducible from both."""
    if worker == 0:
        return seed
    digest = hashlib.sha256(f"{seed}/{worker}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def _attrs(trial: Any, **values: Any) -> None:
    import optuna

    for name, value in values.items():
        with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
            trial.set_user_attr(name, value)


def _tell(study: Any, trial: Any, value_ms: float | None) -> bool:
    """Tell a run's result (None: a failure); False where the trial was failed meanwhile as dead."""
    import optuna

    try:
        if value_ms is None:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(trial, value_ms)
    except (optuna.exceptions.UpdateFinishedTrialError, RuntimeError, ValueError) as exc:
        if "finished" not in str(exc).lower() and not isinstance(exc, optuna.exceptions.UpdateFinishedTrialError):
            raise
        return False
    return True


def _baseline_attr(study: Any, baseline_ms: float) -> None:
    """Keep cuBLAS's time in the study (reports draw it); a storage hiccup here costs the run nothing."""
    with contextlib.suppress(Exception):
        study.set_user_attr(BASELINE_ATTR, float(baseline_ms))


def _readable(tuner: "Tuner", ms: float, baseline_ms: float | None) -> dict[str, Any]:
    """User attributes that optuna-dashboard shows beside a trial's value (milliseconds)."""
    metric, unit = kernels.metric(tuner.spec.name, tuner.shape, tuner.dtype, ms)
    out: dict[str, Any] = {unit.replace("/", "_per_"): round(metric, 1)}
    if baseline_ms:
        out["x_cublas"] = round(baseline_ms / ms, 3)
    return out


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
    }
    check_sampler(name)
    return samplers[name]()


def check_sampler(name: str) -> None:
    """Refuse a sampler that autotile does not offer, saying why where it is one of optuna's."""
    if name in NO_CATEGORICAL:
        raise InvalidValueError(f"sampler {name!r} is not offered: on autotile's all-categorical spaces "
                                f"{NO_CATEGORICAL[name]}; use one of {', '.join(SAMPLERS)}")
    if name not in SAMPLERS:
        raise InvalidValueError(f"sampler {name!r} is not one of {', '.join(SAMPLERS)}")


class Tuner:
    """One tuning run of one kernel on one problem (shape, dtype, layout)."""

    def __init__(self, key: ProblemKey, options: TuneOptions = TuneOptions(), *, space: Space | None = None,
                 render_source: Callable[[Config], str] | None = None):
        self.key = key
        self.spec = kernels.get(key.kernel)
        self.space = space or self.spec.space
        if key.layout not in self.space.layouts:
            raise InvalidValueError(f"{key.kernel} supports layout(s) {list(self.space.layouts)}, not {key.layout!r}")
        check_sampler(options.sampler)
        if options.trials < 1:
            raise InvalidValueError(f"trials must be at least 1, got {options.trials}")
        if options.give_up is not None and not options.give_up > 1:  # NaN too
            raise InvalidValueError(f"give_up must be above 1 (times the best so far) or None, got {options.give_up}")
        precision_mod.check(options.precision)
        # What the setting does not allow is never drawn, nor run as a seed or a start.
        self.space = precision_mod.restricted(self.space, key.dtype, options.precision)
        # Nor a kernel family that cannot serve the shape: the skinny kernels past SKINNY_MAX_ROWS rows of A
        # (each of their trials would take seconds there, to lose).
        math_param = self.space.params.get("MATH")
        if math_param is not None and "skinny" in math_param.choices and key.kernel in ("matmul", "bmm") \
                and key.shape[-3] > SKINNY_MAX_ROWS and len(math_param.choices) > 1:
            self.space = self.space.restricted({"MATH": [m for m in math_param.choices if m != "skinny"]})
        self.options = options
        # The last RENDERED sources kept: a batch asked ahead is rendered for its compile and again for its run
        # (a few milliseconds each).
        self._render: Callable[[Config], str] = functools.lru_cache(maxsize=RENDERED)(
            render_source or (lambda c: self.spec.render(c, key.dtype, key.layout)))
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

    def candidate(self, config: Config, give_up_ms: float | None = None,
                  wait_until: float | None = None) -> Candidate:
        """What the evaluator runs for `config`; its timing stops early where it is clearly slower than
        `give_up_ms` (`timing.clearly_slower`), and its compile is not waited for past `wait_until`
        (`time.time()`: it comes back LATE)."""
        self._next_id += 1
        shapes = [self.shape] + [s for s in self.spec.check_shapes if s != self.shape]
        launches = {s: self.spec.launch(config, s, self.dtype, self.layout) for s in shapes}
        return Candidate(self._next_id, self._render(config), self.spec.function_name, launches,
                         config.key(), give_up_ms, wait_until)

    # -- the study ---------------------------------------------------------------------------------------

    def run(self, evaluator: Evaluator, limits: DeviceLimits,
            progress: Callable[[Progress], None] | None = None) -> TuneResult:
        """Search until the study's budget is spent, then name the winner: one worker's whole run."""
        search = self.search(evaluator, limits, progress)
        return self.finish(evaluator, limits, search)

    def open_study(self, limits: DeviceLimits) -> Any:
        """The study of this problem in the options' storage (created, or resumed), bound to the problem."""
        import optuna

        from autotile.tuning import study as study_mod

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        logging.getLogger("optuna").setLevel(logging.WARNING)
        opts = self.options
        study_name = opts.study_name or self.default_study_name(limits)
        seed = opts.seed if opts.worker is None else _worker_seed(opts.seed, opts.worker)
        study = optuna.create_study(direction="minimize", sampler=make_sampler(opts.sampler, seed),
                                    storage=study_mod.open_storage(opts.storage), study_name=study_name,
                                    load_if_exists=True)
        self._bind(study, limits)
        self._keep_the_studys_choices(study)
        return study

    def _keep_the_studys_choices(self, study: Any) -> None:
        """Narrow this search to the choices a resumed study was made with, where the space has gained choices
        since (a new MATH, a wider VEC) or the study was made under other --fix values: optuna refuses to
        draw a parameter from other choices than its earlier trials did ("CategoricalDistribution does not
        support dynamic value space"), and a named config with a value outside them cannot be queued. A
        new study (another --study-name) searches the whole space."""
        import optuna

        stored: dict[str, tuple[Any, ...]] = {}
        for trial in study.get_trials(deepcopy=False):
            for name, distribution in trial.distributions.items():
                if name not in stored and isinstance(distribution, optuna.distributions.CategoricalDistribution):
                    stored[name] = tuple(distribution.choices)
            if len(stored) == len(self.space.params):
                break
        changed = {name: choices for name, choices in stored.items()
                   if name in self.space.params and choices != self.space.searchable(name)}
        for name, choices in changed.items():
            gone = [c for c in choices if c not in self.space.params[name].choices]
            if gone:
                raise InvalidValueError(f"study {study.study_name!r} drew {name} from {list(choices)}, and "
                                        f"{gone[0]!r} is not a choice of this search; use another --study-name")
        if changed:
            self.space = self.space.restricted({name: list(choices) for name, choices in changed.items()})

    def search(self, evaluator: Evaluator, limits: DeviceLimits,
               progress: Callable[[Progress], None] | None = None, study: Any = None) -> Search:
        """Draw, judge and time candidates until the study holds `trials` finished runs (counted across every
        worker on the study), the timeout passes, or the space runs out. Any number of processes may
        search one study at once (`autotile.tuning.study` says how they stay out of each other's way)."""
        import optuna

        from autotile.tuning import study as study_mod
        from autotile.tuning.study import INFEASIBLE, OVER, REPEAT, Heartbeat, Ledger, judge, recover_dead

        started = time.monotonic()  # opening the study and queueing its starting points count as search
        opts = self.options
        study = study if study is not None else self.open_study(limits)
        problem = Problem(limits, self.dtype, self.layout)
        self.enqueue_fixed(study, problem)

        ran = pruned = duplicates = skips = asks = 0
        spent = {"compile": 0.0, "check": 0.0, "timing": 0.0}  # as the evaluator reports them
        in_evaluator = 0.0  # wall seconds inside evaluator.evaluate
        seed = opts.seed if opts.worker is None else _worker_seed(opts.seed, opts.worker)
        rng = random.Random(seed)
        missed: Config | None = None  # the last draw that was infeasible or a repeat
        failures: dict[str, int] = {}
        unit = kernels.metric(self.spec.name, self.shape, self.dtype, 1.0)[1]
        baseline_ms = evaluator.baseline.median_ms if evaluator.baseline else None
        if baseline_ms:
            _baseline_attr(study, baseline_ms)
        last_recovery = 0.0
        shared = opts.storage is not None  # in memory, no other worker can be there

        def out_of_time() -> bool:
            # The first batch (the seeds) always runs, so that a result can be named.
            return ran > 0 and opts.timeout_s is not None and time.monotonic() - started > opts.timeout_s

        # After the timeout, no compile is waited for (on the worker's clock: seconds since the epoch), once
        # a result can be named: a batch waiting on its compiles would otherwise overrun it by their length
        # (measured: a 40-trial tune with --timeout 6 that took 25.8 s, 18.9 of them waiting for compiles).
        time_up_at = time.time() + opts.timeout_s if opts.timeout_s is not None else None

        # Compile one batch ahead where the evaluator can (`prepare`) and compiles keep the GPU waiting
        # (`compile_bound`, from the last batch; a new study's first compiles are taken to): the GPU then times
        # a batch while the next one compiles. The next batch is asked for before the last one's results are
        # in, which costs the search (measured: `autotile search-bench` lost 2 targets of 27 asking
        # so throughout), so where compiles come from the cache each batch waits for the one before.
        prepare: Callable[[list[Candidate]], None] | None = \
            getattr(evaluator, "prepare", None) if opts.compile_ahead else None
        pending: collections.deque[list[tuple[Any, Config]]] = collections.deque()  # asked, compiling, in order
        depth = max(1, opts.ahead)
        compile_bound = True
        if prepare is not None:
            # The queued configs (seeds, named configs, warm starts) are known before the first ask: their
            # compiles all start now, on the host's cores (`Setup.compile_threads`), not a batch at a time.
            queued = self._queued(study, problem)[:min(opts.trials, QUEUED_AHEAD)]
            if queued:
                prepare([self.candidate(c) for c in queued])

        def give_back(trial: Any) -> None:
            """A trial asked for and not run: failed without a failure status, not a result (`Ledger`)."""
            _tell(study, trial, None)
            if heart is not None:
                heart.remove(trial._trial_id)

        def run(batch: list[tuple[Any, Config]]) -> None:
            """Evaluate one batch of asked trials and tell the study their results."""
            nonlocal ran, in_evaluator, compile_bound
            done = Ledger.of(study.get_trials(deepcopy=False))
            best_ms = min((v for v, _ in done.results().values() if v is not None), default=None)
            give_up_ms = best_ms * opts.give_up if best_ms is not None and opts.give_up else None
            # Compiles are waited for until a result can be named (a correct run), whatever the time.
            wait_until = time_up_at if best_ms is not None else None
            candidates = [self.candidate(c, give_up_ms, wait_until) for _, c in batch]
            evaluating = time.monotonic()
            results = evaluator.evaluate(candidates)
            took = time.monotonic() - evaluating
            in_evaluator += took
            compile_bound = sum(r.compile_wait_s for r in results) >= COMPILE_BOUND * took
            for (trial, _config), result in zip(batch, results, strict=True):
                spent["compile"] += result.compile_wait_s
                if result.status == LATE:  # not run: given back, as the batches still compiling are
                    give_back(trial)
                    continue
                ran += 1
                spent["check"] += result.check_s
                spent["timing"] += result.timing_s
                if result.status == OK and result.timing is not None:
                    _attrs(trial, spread=result.timing.spread, error=result.error,
                           **_readable(self, result.timing.median_ms, baseline_ms))
                    told = _tell(study, trial, result.timing.median_ms)
                else:
                    failures[result.status] = failures.get(result.status, 0) + 1
                    _attrs(trial, failure=result.status, message=result.message[:1000])
                    told = _tell(study, trial, None)
                if heart is not None:
                    heart.remove(trial._trial_id)
                if not told:
                    log.warning("trial %d was failed by another worker (it took its heartbeat for dead); "
                                "its config is retried", trial.number)
                if progress is not None:
                    done = Ledger.of(study.get_trials(deepcopy=False))
                    best_ms = min((v for v, _ in done.results().values() if v is not None), default=None)
                    progress(Progress(done.finished, opts.trials, best_ms,
                                      kernels.metric(self.spec.name, self.shape, self.dtype, best_ms)[0]
                                      if best_ms else None, unit, baseline_ms, result.status))

        with Heartbeat(study) if shared else contextlib.nullcontext() as heart:
            while not out_of_time() and skips < MAX_SKIPS:
                if shared and time.monotonic() - last_recovery > 1.0:
                    recover_dead(study, opts.grace_s)
                    last_recovery = time.monotonic()
                ledger = Ledger.of(study.get_trials(deepcopy=False))
                if ledger.finished >= opts.trials:
                    break
                if pending and (ledger.runs >= opts.trials or not compile_bound):
                    # Run what was asked for: the budget is spent, or the next batch may wait for its results.
                    run(pending.popleft())
                    continue
                if ledger.runs >= opts.trials:
                    # The last places are taken by other workers' running trials; one of them may die, and
                    # its config come back to be run: wait until they finish.
                    time.sleep(study_mod.POLL_S)
                    continue
                batch: list[tuple[Any, Config]] = []
                taken = set(ledger.owned)
                counts = self._proposal_counts(study)
                ranked, leaders = self._ranked(ledger)
                while len(batch) < opts.batch and ledger.runs + len(batch) < opts.trials and skips < MAX_SKIPS:
                    proposal = self._propose(study, problem, rng, taken, missed, counts, ranked, leaders,
                                             opts.trials - ledger.runs - len(batch))
                    if proposal is not None:
                        kind, proposed = proposal
                        if proposed is None:  # nothing left to propose: the space is exhausted
                            skips = MAX_SKIPS
                            break
                        counts[kind] = counts.get(kind, 0) + 1
                        study_mod.enqueue(study, dict(proposed), proposed.key(), {PROPOSED: kind})
                    else:
                        counts["model"] = counts.get("model", 0) + 1
                    missed = None
                    trial = study.ask()
                    asks += 1
                    if heart is not None:
                        heart.add(trial._trial_id)
                    config = self.space.suggest(trial)
                    if not self.space.is_feasible(config, problem):
                        trial.set_user_attr("infeasible", self.space.violations(config, problem)[0])
                        trial.set_user_attr(study_mod.VERDICT, INFEASIBLE)
                        # PRUNED: TPE counts it among the bad trials, and learns to avoid the region.
                        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                        pruned += 1
                        skips += 1
                        missed = config  # the next proposal: its nearest feasible neighbour
                        continue
                    verdict, value = judge(study, trial, config.key(), opts.trials, grace_s=opts.grace_s)
                    if verdict == REPEAT:
                        # Already measured (or being measured): not run again, and not told to the sampler as a
                        # new result (a copy would sharpen its model around what is known, and draw more
                        # repeats). The next proposal is the nearest config not measured yet.
                        study.tell(trial, state=optuna.trial.TrialState.FAIL)
                        duplicates += 1
                        skips += 1
                        missed = config
                        continue
                    if verdict == OVER:
                        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                        break
                    skips = 0
                    taken.add(config.key())
                    batch.append((trial, config))
                if prepare is not None and compile_bound:
                    # Compiled in the worker while it times the batches before (asked for `depth` batches
                    # earlier than the sampler would otherwise be: constant_liar keeps them apart).
                    if batch:
                        prepare([self.candidate(c) for _, c in batch])
                        pending.append(batch)
                    if pending and (len(pending) > depth or not batch):
                        run(pending.popleft())
                elif batch:
                    run(batch)
            while pending:
                if out_of_time():  # asked and compiling, but the time is up: given back, not run
                    for trial, _config in pending.popleft():
                        give_back(trial)
                else:  # asked and compiling: run, or its trials would stay running
                    run(pending.popleft())
        seconds = time.monotonic() - started
        reported = sum(spent.values())
        spent["search"] = max(0.0, seconds - in_evaluator)
        spent["other"] = max(0.0, in_evaluator - reported)
        return Search(study, ran, pruned, duplicates, failures, seconds, asks, spent)

    def _proposal_counts(self, study: Any) -> dict[str, int]:
        """Runs (trials timed or being timed) per kind of proposal: UNIFORM, NEIGHBOUR, IMPROVE, and "model"
        for the sampler's own draws after the startup (the queued seeds and named configs not counted)."""
        from autotile.tuning.study import RUN, VERDICT

        counts: dict[str, int] = {}
        for t in study.get_trials(deepcopy=False):
            if t.user_attrs.get(VERDICT) != RUN or "seed" in t.user_attrs or "named" in t.user_attrs:
                continue
            kind = t.user_attrs.get(PROPOSED, "model")
            counts[kind] = counts.get(kind, 0) + 1
        return counts

    def _ranked(self, ledger: Any) -> tuple[list[Config], int]:
        """The measured configs of this space to improve on, and how many of them lead their kernel family:
        the fastest, then the fastest of each other family within RIVAL of it (fastest first), then the
        next fastest (ten in all, besides those leaders)."""
        timed = sorted((value, key) for key, (value, _) in ledger.results().items() if value is not None)
        configs: list[tuple[float, Config]] = []
        for value, key in timed:
            if len(configs) >= 10 and value > RIVAL * configs[0][0]:
                break  # the ten fastest are in, and no slower config can lead a family
            with contextlib.suppress(InvalidValueError, UnknownNameError):
                configs.append((value, self._config_from_key(key)))
        leaders: dict[Any, Config] = {}
        for value, config in configs:
            family = config.get(precision_mod.MATH_PARAM)
            if family not in leaders and value <= RIVAL * configs[0][0]:
                leaders[family] = config
        heads = list(leaders.values())
        return heads + [c for _, c in configs[:10] if c not in heads], len(heads)

    def _propose(self, study: Any, problem: Problem, rng: random.Random, taken: set[str], missed: Config | None,
                 counts: dict[str, int], ranked: list[Config], leaders: int,
                 left: int) -> tuple[str, Config | None] | None:
        """The config the tuner proposes itself for the next trial, as (UNIFORM, NEIGHBOUR or IMPROVE,
        config; None where the space has nothing left), or None to let the sampler draw. Configs queued in
        the study (seeds, starting points, retries, the grid) go first: nothing is proposed while any wait.
        `counts`: runs per kind of proposal so far (`_proposal_counts`); `left`: trials not yet asked for."""
        import optuna

        from autotile.tuning import propose

        sampler = self.options.sampler
        if sampler == "grid":
            return None
        if study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
            return None
        if missed is not None:
            near = propose.neighbour(self.space, problem, rng, missed, taken)
            if near is not None:
                return NEIGHBOUR, near
            # Nothing unmeasured near what the sampler keeps drawing: asking it again would draw the same.
            return UNIFORM, propose.uniform(self.space, problem, rng, taken)
        if sampler == "random" or counts.get(UNIFORM, 0) < STARTUP:
            return UNIFORM, propose.uniform(self.space, problem, rng, taken)
        # tpe: one proposal in IMPROVE_EVERY goes to the neighbourhood of the fastest configs so far.
        guided = counts.get(IMPROVE, 0) + counts.get("model", 0) + counts.get(NEIGHBOUR, 0)
        endgame = left <= ENDGAME * self.options.trials
        if endgame or (IMPROVE_EVERY and counts.get(IMPROVE, 0) * IMPROVE_EVERY <= guided):
            # around each family's leader in turn (`_ranked`): the fastest config, then its rivals
            turn = counts.get(IMPROVE, 0) % max(1, leaders)
            ranked = ranked[turn:leaders] + ranked[:turn] + ranked[leaders:]
            better = propose.improvement(self.space, problem, rng, ranked, taken,
                                         moves=lambda c: propose.shape_moves(self.space, problem,
                                                                             self.key.kernel, self.shape, c))
            if better is not None:
                return IMPROVE, better
        return None

    def finish(self, evaluator: Evaluator, limits: DeviceLimits, search: Search | None = None) -> TuneResult:
        """Name the winner from every finished run of the study (all workers'): re-time the best few on this
        worker's GPU. Called once per run of `autotile tune`, after the search."""
        from autotile.tuning.study import Ledger

        started = time.monotonic()
        study = search.study if search is not None else self.open_study(limits)
        known = Ledger.of(study.get_trials(deepcopy=False)).results()
        failures = dict(search.failures) if search else {}
        finalists, baseline = self._retime(evaluator, known)
        phases = dict(search.phases) if search is not None else {}
        if phases:  # unknown where the search ran in other processes (several GPUs): none then
            phases["retime"] = time.monotonic() - started
        if not finalists:
            raise TuningError(f"no candidate of {self.key} ran correctly in study {study.study_name!r} "
                              f"({', '.join(f'{n} {s}' for s, n in failures.items()) or 'none ran'})")
        best = min(finalists, key=lambda f: f.median_ms)
        seeds = [f for f in finalists if f.seed_name]
        baseline_ms = baseline.median_ms if baseline else (evaluator.baseline.median_ms if evaluator.baseline
                                                           else None)
        if baseline is not None and baseline.median_ms:
            _baseline_attr(study, baseline.median_ms)  # re-timed with the finalists: the better measure
        unit = kernels.metric(self.spec.name, self.shape, self.dtype, 1.0)[1]
        return TuneResult(
            kernel=self.spec.name, shape=self.shape, dtype=self.dtype, layout=self.layout, best=best,
            finalists=tuple(sorted(finalists, key=lambda f: f.median_ms)),
            best_seed=min(seeds, key=lambda f: f.median_ms) if seeds else None,
            baseline_ms=baseline_ms,
            metric=kernels.metric(self.spec.name, self.shape, self.dtype, best.median_ms)[0], metric_unit=unit,
            trials=search.ran if search else 0, failures=failures, pruned=search.pruned if search else 0,
            duplicates=search.duplicates if search else 0,
            seconds=(search.seconds if search else 0.0) + time.monotonic() - started,
            environment=dict(evaluator.environment), study_name=study.study_name, precision=self.options.precision,
            phases=phases)

    def enqueue_fixed(self, study: Any, problem: Problem) -> None:
        """Enqueue the seeds, the space's named configs and the starting points (and, for the grid sampler,
        the grid) that the study has not run, is not running and has not queued. Two workers starting at
        the same moment may both enqueue one: the second copy is judged a repeat and never timed."""

        from autotile.tuning import study as study_mod
        from autotile.tuning.study import Ledger

        opts = self.options
        trials = study.get_trials(deepcopy=False)
        ledger = Ledger.of(trials)
        taken = set(ledger.owned)
        taken.update(c.key() for c in self._waiting(trials))
        # The caller's starting points run first (the config in use, when re-tuning): a run cut short by
        # --timeout still measures what it would replace, so its winner is never worse.
        seeds = {c.key(): n for n, c in self.space.named_configs.items() if n.startswith(SEED_PREFIX)}
        for name, values in opts.start:
            try:
                config = self.space.config(values)
            except (InvalidValueError, UnknownNameError):
                continue  # outside a narrowed space: nothing to start from
            if config.key() not in taken and self.space.is_feasible(config, problem):
                seed = seeds.get(config.key())  # a seed stays a seed, the baseline it is reported as
                study_mod.enqueue(study, dict(config), config.key(), {"seed": seed} if seed else {"named": name})
                taken.add(config.key())
        # The seeds run next: they are the baselines every result is reported against. The space's
        # other named configs (hand-picked starting points) follow, then the sampler's own draws.
        for name, config in self._named_starts(problem) if opts.named_first else ():
            if config.key() not in taken and self.space.is_feasible(config, problem):
                attrs = {"seed": name} if name.startswith(SEED_PREFIX) else {"named": name}
                study_mod.enqueue(study, dict(config), config.key(), attrs)
                taken.add(config.key())
        if opts.sampler == "tpe" and opts.warm_starts > 0:
            self._enqueue_warm_starts(study, problem, taken)
        if opts.sampler == "grid":
            for config in self.space.feasible(problem, limit=opts.trials + len(taken)):
                # Filtered here: optuna's own skip_if_exists check is quadratic in the number of trials.
                if config.key() not in taken:
                    study_mod.enqueue(study, dict(config), config.key())
                    taken.add(config.key())

    def _waiting(self, trials: list[Any]) -> list[Config]:
        """The configs of the queued (waiting) trials among `trials`, in the order they will run; a queued
        config outside today's space is left out."""
        import optuna

        configs = []
        for t in trials:
            if t.state == optuna.trial.TrialState.WAITING:
                with contextlib.suppress(Exception):
                    configs.append(self.space.from_drawn(dict(t.system_attrs.get("fixed_params", t.params))))
        return configs

    def _queued(self, study: Any, problem: Problem) -> list[Config]:
        """The feasible configs of the study's queued trials, in the order they will run."""
        return [c for c in self._waiting(study.get_trials(deepcopy=False)) if self.space.is_feasible(c, problem)]

    def _fitted(self, problem: Problem, config: Config) -> Config:
        """`config` with its K split to fill the GPU where its tiles leave SMs idle (`propose.filled`)."""
        from autotile.tuning import propose

        return propose.filled(self.space, problem, self.key.kernel, self.shape, config) or config

    def _named_starts(self, problem: Problem) -> list[tuple[str, Config]]:
        """The space's named configs a search starts with, as (name, config): every seed (the baselines),
        then the others taken from each kernel family in turn (MATH: SIMT, tf32x3, wgmma...; each family's
        in the space's order), at most NAMED_SHARE of the trials, so that a small budget tries every family
        and leaves most of itself to the search. Each is fitted to the shape (`propose.filled`): where its
        tiles leave SMs idle, its K is split to fill them (a skinny M, a tall K)."""

        feasible = [(n, c) for n, c in self.space.named_configs.items() if self.space.is_feasible(c, problem)]
        seeds = [(n, c) for n, c in feasible if n.startswith(SEED_PREFIX)]
        families: dict[Any, list[tuple[str, Config]]] = {}
        for name, config in feasible:
            if not name.startswith(SEED_PREFIX):
                families.setdefault(config.get(precision_mod.MATH_PARAM), []).append((name, config))
        interleaved = [pair for turn in itertools.zip_longest(*families.values()) for pair in turn if pair]
        out = list(seeds)
        seen = {c.key() for _, c in seeds}
        for name, config in interleaved[:max(1, int(NAMED_SHARE * self.options.trials))]:
            fitted = self._fitted(problem, config)
            if fitted.key() not in seen:
                seen.add(fitted.key())
                out.append((name if fitted is config else f"{name}+split{fitted['SPLIT_K']}", fitted))
        return out

    def _enqueue_warm_starts(self, study: Any, problem: Problem, taken: set[str]) -> None:
        """Queue the cache's winners of other shapes and GPUs (`autotile.tuning.transfer`), each fitted to the
        shape (`propose.filled`), once per study: a resumed study has them already, run or queued."""
        from autotile.dispatch.cache import TuningCache
        from autotile.tuning import study as study_mod
        from autotile.tuning import transfer

        if any(t.user_attrs.get(PROPOSED) == TRANSFER for t in study.get_trials(deepcopy=False)):
            return
        cache = self.options.cache if self.options.cache is not None else TuningCache()
        for where, found in transfer.warm_starts(self.key, problem.device.fingerprint, self.space, problem,
                                                 cache, self.options.warm_starts):
            # Fitted to the shape as the named configs are: a config of another shape that leaves this
            # one's SMs idle has its K split to fill them.
            config = self._fitted(problem, found)
            if config.key() not in taken:
                study_mod.enqueue(study, dict(config), config.key(), {PROPOSED: TRANSFER, "transfer": where})
                taken.add(config.key())

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
        if bound is None and study.trials:
            # Another worker may have bound it and drawn a trial since the attributes were read.
            bound = study.user_attrs.get(PROBLEM_ATTR)
            if isinstance(bound, dict) and "precision" not in bound:
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
