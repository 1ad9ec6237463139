"""The selection model: which candidate of a shape database (`autotile.dispatch.database`) to run on a shape the
database does not hold, and why.

Nearest neighbours in log-shape, per candidate: for a new shape, the `neighbours` database shapes
nearest to it (sum over dimensions of |log2| ratios) vote with their measured speed-ups over cuBLAS,
each weighted by its closeness. A candidate's closeness also counts how differently it fills the GPU
there (blocks per wave, in log2): a config that launches 40 blocks on the new shape learns more from a
neighbour where it launched 50 than from one where it launched 400. A generated candidate is chosen
only where its predicted speed-up is at least `1 + margin` and it was no slower than `floor` x cuBLAS at
any neighbour that timed it; otherwise cuBLAS runs. The speed-up counts the host's time per call
(`host_ms`: back to back, a call takes the longer of that and its GPU time; cuBLAS's call costs the host
more than a generated kernel's), so that on a problem of a few microseconds a generated kernel predicted
no slower than `floor` x cuBLAS on the GPU runs rather than cuBLAS, and one launch rather than two; where a
candidate's GPU time stays under its own host time even at its worst neighbour's speed-up, the host hides
it back to back and a lower floor (`host_bound_floor`), which every neighbour must clear, bounds what a CUDA
graph, which has no host time, would lose; and a candidate predicted no slower than cuBLAS is forgiven a
neighbour down to that floor where even at that neighbour's speed-up it stays `margin` faster back to back.
Only candidates the float32 matmul precision setting allows compete (`autotile.dispatch.precision`: under
"highest", no tf32x3 config); cuBLAS is allowed under every one. The parameters are fitted by
leave-one-out on the database itself (`fit`), and `cross_validate` reports what that held-out check
measured.

Pure NumPy on the host; no GPU needed.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from autotile.codegen import dtypes, kernels
from autotile.codegen.kernels import SKINNY_MAX_ROWS
from autotile.codegen.limits import DeviceLimits
from autotile.codegen.space import Config, Problem
from autotile.dispatch import precision as precision_mod
from autotile.dispatch.database import Candidate, ShapeDatabase

MIN_K_PER_SPLIT = 32  # elements of K per split below which a K split is not worth timing or running
MAX_SPLIT_WORKSPACE = 1 << 25  # elements of a last_block workspace (SPLIT_K x the output): 128 MiB of float32
FOCUS_MIN_ROWS = 30  # focus shapes below which a fit's mean is taken over every shape (too few to judge by)
FILL_WEIGHT = 1.0  # how much a difference of one octave in blocks per wave counts against closeness
# The floor (no neighbour's measured speed-up under `ModelParams.floor`) counts, on large matmuls whose output
# is at least FLOOR_NEAR_MIN_SIDE on both sides, only the neighbours within FLOOR_NEAR_OCTAVES (summed |log2|
# of the sides) of the nearest one: the surveyed grid's sides are 2.8x apart and stop at 8192, so a large
# query's eight nearest rows include far ones (128x8192x8192 for 1107x14351x14021, where the presplit kernels
# ran 0.73x cuBLAS) that vetoed a candidate its near rows all measured 1.9-2.5x faster. Checked on the H200
# (2026-11-28, float32, held out: random shapes whose choice the rule changes, timed against cuBLAS): seed 12,
# 30 such shapes (before the side limit) 0.99 -> 1.67x geomean, two under 0.97x, both with a side under 20;
# seed 13, 25 shapes 1.02 -> 1.78x, none under 0.97x (min 1.19). Batches keep the whole floor: on 25 random
# batches it changed (seed 13) 1.00 -> 1.12x with three under 0.97x (min 0.86). Leave-one-out on every shipped
# database: no choice changes (the grid's rows have near neighbours).
FLOOR_NEAR_OCTAVES = 2.0
FLOOR_NEAR_MIN_WORK = 2**29  # M N K
FLOOR_NEAR_MIN_SIDE = 64  # M and N
# The host's time per repeated call, in ms, by what runs, the output allocated (`python -m
# autotile.cli.overhead --random`, H100, 2026-11-27: a generated kernel's call 10-18 us; cuBLAS's 16-18 us for
# a GEMV and 22-40 us for a GEMM or a batched GEMM, of which about 10 us are cuBLAS's own), and each extra
# launch (the zeroing before a split-K kernel whose splits add atomically into C). Back to back, a call takes
# the longer of this and its GPU time: `host_ms`. Measured again on 64-sided problems (2026-11-28, through
# torch's own call) cuBLAS's calls took 13-16 us (GEMV) and 15-21 us (GEMM), but on larger ones 21-36 us (a
# column-major GEMV of 3000 x 3000, `x @ W.T` 16x4096x4096); constants lowered to the small problems' figures
# sent the overhead benchmark's bfloat16 GEMV to cuBLAS, 0.90x torch's call back to back where the generated
# kernel ran 1.66x: they stay. Measured a third time (H100, 2026-12-06): the 25 random benchmark problems whose
# choice changes with "cublas" at 0.018 ran back to back 1.12x torch's call as chosen with 0.027 (5 under 0.97x)
# and 0.94x with 0.018 (18 under), on the GPU 1.08x either way: 0.027 stays.
HOST_MS = {"generated": 0.012, "cublas": 0.027, "cublas matvec": 0.018}
EXTRA_LAUNCH_MS = 0.005
# A LOADER=presplit call's host time beyond a generated kernel's: its workspace's allocation and the two split
# launches (`python -m autotile.cli.overhead`, H200, 2026-11-28: a 1024³ presplit call enqueued in 31-33 us
# where a 64³ generated call without `out=` took 16-20 us on the same host, in the same run).
PRESPLIT_EXTRA_MS = 0.015
# cuBLAS's time on a large problem of a type whose unaligned rows it runs several times slower
# (`Dtype.cublas_aligned_rows`) is learned from neighbours whose rows are aligned as the problem's are (or are
# not): a neighbour of the other kind counts as this much farther (log2 units of `_distances`). Each shape of the
# H100's and H200's databases held out (`python tools/reference_loo.py`, 2026-11-28), the mean |log2| error of
# cuBLAS's predicted time: bfloat16 and float16 batches of at least 2^26 multiply-adds 0.25-0.62 on unaligned
# rows (0.55-1.02 without the split: it had predicted unaligned batches 2-3x faster than measured, and their
# padded, aligned shapes 2x slower) and 0.29-0.39 on aligned ones (0.36-0.62); single matrices of at least 2^30
# 0.29-0.56 (0.65-1.03). Single matrices under 2^30 lost with it (0.31-0.36 -> 0.40-0.42: the same kind's
# neighbours lie farther, and a small problem's time is its launch's more than its rows'), and batches under
# 2^26. int8's database has no cuBLAS times on large unaligned problems (torch._int_mm takes no sides that are
# not multiples of 8), and the split only made its predictions worse (0.26-0.30 -> 0.30-0.40): the 16-bit types
# only.
REFERENCE_KIND_DISTANCE = 2.0
REFERENCE_KIND_MIN_WORK = {"matmul": 2**30, "bmm": 2**26}
REFERENCE_BY_ALIGNMENT = ("bfloat16", "float16")
# A neighbour's cuBLAS time is carried over to the query scaled by (the query's multiply-adds / the neighbour's)
# to this power. Held out on every shipped database (`python tools/reference_loo.py --work-exponent E`,
# 2026-11-28), 1 (throughput carried over) was the worst of 0.6-1.0 on every one: 0.8 cut the mean |log2|
# error of problems of at least 2^28 multiply-adds by 9-29% (the H200's bfloat16 batches 0.39 -> 0.33), 0.6
# of smaller ones by 17-37% (a larger problem runs at a higher throughput, a small one near its launch's
# time). It stays 1 until a GPU run measures what the changed predictions choose: they also weigh the host's
# time per call on small problems (`choose`) and the padded plan (`padding.pays`). On 2040 problems of the
# benchmarks' random draws (seeds 1-5, H200 profile) 0.8 changed 23 choices, 22 of them a 16-bit batch's padded
# plan, 17 of those to off, 26x829x1995x164 among them (measured 1.62x through the plan).
REFERENCE_WORK_EXPONENT = 1.0


@dataclasses.dataclass(frozen=True)
class ModelParams:
    neighbours: int = 6
    margin: float = 0.1  # a generated candidate must be predicted this much faster than cuBLAS
    floor: float = 1.0  # and no slower than this x cuBLAS at any neighbour that timed it
    # whether every candidate that copies several elements at a time learns only from shapes of the query's
    # kind (`rows_allow`); tensor-map candidates always do
    by_copy_width: bool = False
    # whether a candidate's predicted time counts the host's time per call (`host_ms`): back to back, a call
    # takes the longer of its GPU time and its host time, so on a problem of a few microseconds the
    # cheapest launch wins among candidates predicted no slower than `floor` x cuBLAS on the GPU
    count_host: bool = True
    # counting the host, a candidate whose GPU time stays under its own host time even at its worst
    # neighbour's speed-up is hidden behind the host back to back: the GPU floor gives way to this one,
    # which bounds its worst neighbour (what a CUDA graph, without the host's time, would lose)
    host_bound_floor: float = 0.85


@dataclasses.dataclass(frozen=True)
class RunnerUp:
    """The best eligible candidate where the model keeps the reference: it, its config and its predicted
    speed-up over the reference."""

    candidate: Candidate
    config: Config
    predicted: float


@dataclasses.dataclass(frozen=True)
class Choice:
    """What the model runs on a shape: the candidate, its config (None for cuBLAS), the predicted speed-up
    over cuBLAS, and the neighbours it learned from: (shape, distance, that candidate's measured speed-up)."""

    candidate: Candidate
    config: Config | None
    predicted: float
    neighbours: tuple[tuple[tuple[int, ...], float, float | None], ...]
    # where the reference was chosen: the best eligible candidate, for `explain` and for callers whose work
    # runs differently from the database's timings (`select.runner_up`)
    runner_up: RunnerUp | None = None
    reference: str = "cuBLAS"  # what the speed-ups are over (`Model.reference`)
    predicted_ms: float | None = None  # the predicted time on the shape (`Model.reference_ms` / `predicted`)
    # the predicted speed-up counting the host's time per call (`host_ms`), where that is what chose it
    with_host: float | None = None

    def explain(self) -> str:
        near = ", ".join(f"{'x'.join(map(str, s))} {'-' if r is None else format(r, '.2f') + 'x'}"
                         for s, _, r in self.neighbours)
        fallback = self.candidate.implementation == "cublas" or self.candidate.name == self.reference
        why = (f"predicted {self.predicted:.2f}x {self.reference}" if not fallback
               else f"no candidate predicted safely faster (best: {self._runner_up_text()})")
        if self.with_host is not None and not fallback:
            why += f" on the GPU, {self.with_host:.2f}x back to back (the host's time per call counted)"
        return f"{self.candidate.name}, {why}; at the nearest surveyed shapes: {near}"

    def _runner_up_text(self) -> str:
        if self.runner_up is None:
            return "-"
        return f"{self.runner_up.candidate.name} {self.runner_up.predicted:.2f}x"


def host_ms(kernel: str, implementation: str, config: Config | None) -> float:
    """The host's time per repeated call of a candidate for `kernel`, in ms: `HOST_MS` by implementation
    (cuBLAS's GEMV apart), EXTRA_LAUNCH_MS for a split-K kernel that needs C zeroed first, and
    PRESPLIT_EXTRA_MS for a tf32x3 kernel that splits its operands first."""
    if implementation == "cublas":
        return HOST_MS["cublas matvec" if kernel == "matvec" else "cublas"]
    if config is None:
        return HOST_MS["generated"]
    zeroes = config.get("SPLIT_K", 1) > 1 and config.get("SPLIT_REDUCE", "atomic") == "atomic"
    presplit = config.get("LOADER") == "presplit"
    return HOST_MS["generated"] + (EXTRA_LAUNCH_MS if zeroes else 0.0) + (PRESPLIT_EXTRA_MS if presplit else 0.0)


def worth_timing(kernel: str, config: Config, shape: tuple[int, ...], sm_count: int) -> bool:
    """Whether a config makes sense on `shape`: a skinny one only for M up to SKINNY_MAX_ROWS; one with K
    splits only where the shape leaves the GPU under-filled without them (under two blocks per SM), each
    split gets at least MIN_K_PER_SPLIT of K and at least one K step (BK), and a last_block workspace stays
    under MAX_SPLIT_WORKSPACE elements. Other configs always do."""
    if config.get("MATH") == "skinny" and shape[-3] > SKINNY_MAX_ROWS:
        return False
    split = int(config.get("SPLIT_K", 1))
    if split <= 1:
        return True
    spec = kernels.get(kernel)
    unsplit = math.prod(spec.grid(config, shape)) // split
    workspace = split * math.prod(spec.output_shape(shape)) if config.get("SPLIT_REDUCE") == "last_block" else 0
    # a split shorter than one K step (BK) still runs a whole step, mostly on zeros (measured on an H100,
    # 2026-11-25: float8 32x5408x368 with the 8-bit K step of 128 split 8 ways, 0.24x torch._scaled_mm)
    k_per_split = max(MIN_K_PER_SPLIT, int(config.get("BK", 1)))
    return unsplit < 2 * sm_count and shape[-1] >= split * k_per_split and workspace <= MAX_SPLIT_WORKSPACE


class Model:
    """A database prepared for one device: usable candidates, log shapes, log speed-ups over the reference
    (cuBLAS; where cuBLAS cannot run the database's problems at all, int8 outside layout nt, or cannot run the
    problem the model is asked about, `cublas_runs` False: an int8 shape cuBLAS refuses, an 8-bit float
    problem torch._scaled_mm refuses (one it takes borrows int8's database, whose cuBLAS column stands for
    it), the generated candidate timed on the most shapes, which is then also what runs where no other is
    predicted faster)."""

    def __init__(self, db: ShapeDatabase, device: DeviceLimits, cublas_runs: bool = True):
        self.db, self.device = db, device
        problem = Problem(device, db.dtype, db.layout)
        self.configs: list[Config | None] = []
        usable: list[int] = []
        for j, cand in enumerate(db.candidates):
            config = usable_config(db, cand, problem)
            self.configs.append(config)
            if cand.implementation == "cublas" or config is not None:
                usable.append(j)
        times = np.array([[np.nan if t is None else t for t in row] for row in db.times_ms], dtype=np.float64)
        self.times = times
        self.cublas = self.reference = db.cublas_index
        never_timed = self.cublas is not None and not np.isfinite(times[:, self.cublas]).any()
        if (never_timed or not cublas_runs) and len(usable) > 1:
            timed = [(int(np.isfinite(times[:, j]).sum()), -j) for j in usable if j != self.cublas]
            self.reference = -max(timed)[1]
        self.usable = [j for j in usable if j not in (self.cublas, self.reference)]
        self.usable_columns = np.asarray(self.usable, dtype=np.intp)
        self.log_shapes = np.log2(np.array(db.shapes, dtype=np.float64))
        # log2 speed-up over the reference; NaN where either was not timed.
        self.gain = (np.log2(times[:, [self.reference]]) - np.log2(times)) if self.reference is not None else None
        # Each database row's `_features`, computed when first read: a query reads its nearest rows' only,
        # and computing every row's (hundreds of rows x candidates) took seconds of a process's first call.
        self._row_features: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        # A candidate copies `width` elements at a time where every operand's rows start aligned to that
        # and one at a time elsewhere (several times the copy instructions: measured 0.76x cuBLAS on a
        # batch where aligned neighbours predicted 1.2x): two kernels in one, so a candidate of width over
        # one learns only from shapes of the query's kind (`aligned[width]`), not from the nearest of either.
        element_bytes = dtypes.DTYPE_SIZES[db.dtype]  # NumPy has no bfloat16
        self.widths = np.array([copy_width(self.configs[j], element_bytes) for j in self.usable], dtype=np.int64)
        self.tensor_maps = np.array([_copies_with_tensor_maps(self.configs[j]) for j in self.usable], dtype=np.bool_)
        self.aligned = {w: np.array([rows_allow(db.kernel, tuple(s), db.layout, w) for s in db.shapes], dtype=np.bool_)
                        for w in sorted(set(self.widths.tolist())) if w > 1}
        self._allowed: dict[str, np.ndarray] = {}
        # each row's rows aligned as cuBLAS wants them (`cublas_rows_aligned`), where that sets its time
        self.cublas_aligned = None if db.dtype not in REFERENCE_BY_ALIGNMENT else np.array(
            [cublas_rows_aligned(db.kernel, db.dtype, db.layout, tuple(s)) for s in db.shapes], dtype=np.bool_)
        # the usable candidates' host time per call (`host_ms`)
        self._host_usable = np.array([host_ms(db.kernel, db.candidates[j].implementation, self.configs[j])
                                      for j in self.usable], dtype=np.float64)

    @property
    def reference_name(self) -> str:
        """What the speed-ups are over: "cuBLAS", or the reference candidate's name."""
        if self.reference is None or self.reference == self.cublas:
            return "cuBLAS"
        return self.db.candidates[self.reference].name

    def allowed(self, setting: str | None) -> np.ndarray:
        """For each usable candidate, whether the precision `setting` allows it (None: every one)."""
        if setting is None:
            return np.ones(len(self.usable), dtype=np.bool_)
        mask = self._allowed.get(setting)
        if mask is None:
            db = self.db
            mask = self._allowed[setting] = np.array(
                [precision_mod.allows(setting, precision_mod.needed(db.kernel, db.dtype, self.configs[j]))
                 for j in self.usable], dtype=np.bool_)
        return mask

    def _features_of_row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """`_features` of the database's row `i` (computed once)."""
        found = self._row_features.get(i)
        if found is None:
            found = self._row_features[i] = self._features(tuple(int(d) for d in self.db.shapes[i]))
        return found

    def _features(self, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """For each usable candidate on `shape`: log2 blocks per SM, and whether it is worth running."""
        configs = [c for c in (self.configs[j] for j in self.usable) if c is not None]
        fill = np.array([_log_fill(self.db.kernel, c, shape, self.device) for c in configs], dtype=np.float64)
        worth = np.array([worth_timing(self.db.kernel, c, shape, self.device.sm_count) for c in configs])
        return fill, worth.astype(np.bool_)

    def choose(self, shape: Sequence[int], params: ModelParams = ModelParams(),
               exclude: int | None = None, setting: str | None = None, reference_runs: bool = True) -> Choice | None:
        """The candidate to run on `shape` (None where the database has no cuBLAS column); `exclude` leaves
        one database row out (for cross-validation); `setting`, a precision setting, leaves out the
        candidates it does not allow (None: none left out). `reference_runs` False: the reference cannot run
        `shape` (cuBLAS on an int8 shape it refuses), so the best predicted candidate is taken whatever
        its margin over the reference."""
        if self.gain is None or self.reference is None:
            return None
        shape_t = tuple(int(d) for d in shape)
        dist = self._distances(shape_t)
        if exclude is not None:
            dist[exclude] = np.inf
            fill_q, worth = self._features_of_row(exclude)
        else:
            fill_q, worth = self._features(shape_t)
        order = self._nearest(dist, params)
        if len(order) == 0 or not self.usable:
            return None
        floor_octaves = FLOOR_NEAR_OCTAVES if _floor_from_near_rows(self.db.kernel, shape_t) else math.inf
        predicted, worst, enough, gain, ok = self._predict(order, dist, fill_q, floor_octaves)
        by_kind = self.tensor_maps | params.by_copy_width  # candidates that learn from the query's kind only
        learned_from: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # width: order, gain, ok
        for width, aligned in self.aligned.items():
            group = (self.widths == width) & by_kind
            if not group.any():
                continue
            same_kind = aligned == rows_allow(self.db.kernel, shape_t, self.db.layout, width)
            kind_order = self._nearest(np.where(same_kind, dist, np.inf), params)
            if len(kind_order):
                kind_predicted, kind_worst, kind_enough, kind_gain, kind_ok = self._predict(kind_order, dist, fill_q,
                                                                                            floor_octaves)
                predicted = np.where(group, kind_predicted, predicted)
                worst = np.where(group, kind_worst, worst)
                enough = np.where(group, kind_enough, enough)
                learned_from[width] = (kind_order, kind_gain, kind_ok)
            else:
                enough = enough & np.logical_not(group)
        eligible = worth & enough & np.isfinite(predicted) & self.allowed(setting)
        score = predicted  # log2 speed-up over the reference: on the GPU, or back to back counting the host
        on_the_gpu = worst >= math.log2(params.floor)  # no neighbour slower than `floor`
        reference_ms = self.reference_ms(shape_t, order, dist)
        counted = params.count_host and reference_ms is not None and reference_runs
        if counted:
            assert reference_ms is not None
            cublas_ms = reference_ms
            reference_host = host_ms(self.db.kernel, self.db.candidates[self.reference].implementation,
                                     self.configs[self.reference])
            reference_back_to_back = max(cublas_ms, reference_host)

            def back_to_back(log_speedup: np.ndarray) -> np.ndarray:
                """The log2 speed-ups back to back of candidates `log_speedup` faster on the GPU, each taking
                the longer of its GPU time and its host time (-inf where the GPU speed-up is -inf)."""
                with np.errstate(divide="ignore", over="ignore"):
                    gpu_ms = cublas_ms * np.exp2(-log_speedup)
                    return np.asarray(np.log2(reference_back_to_back / np.maximum(gpu_ms, self._host_usable)))

            score = back_to_back(predicted)
            # no slower than `floor` on the GPU either; or, where even the worst neighbour's speed-up leaves
            # the GPU time under the candidate's own host time (hidden behind the host back to back), no
            # neighbour slower than `host_bound_floor` (a bound on the mean let predictions of 0.95x run
            # 0.55x on the GPU: H100, float16 84x218x193, 2026-11-28); or, predicted no slower than cuBLAS
            # and no neighbour under `host_bound_floor`, still `margin` faster back to back at the worst
            # neighbour's speed-up
            with np.errstate(over="ignore"):
                hidden = cublas_ms * np.exp2(-worst) <= self._host_usable
            on_the_gpu = ((on_the_gpu & (predicted >= math.log2(params.floor)))
                          | (hidden & (worst >= math.log2(params.host_bound_floor)))
                          | ((predicted >= 0.0) & (worst >= math.log2(params.host_bound_floor))
                             & (back_to_back(worst) >= math.log2(1 + params.margin))))
        safe = eligible & (score >= math.log2(1 + params.margin)) & on_the_gpu
        if not reference_runs:
            safe = eligible
        if not safe.any():
            runner_up = None
            if eligible.any():
                k = int(np.argmax(np.where(eligible, predicted, -np.inf)))
                j = self.usable[k]
                config = self.configs[j]
                assert config is not None  # a usable candidate other than the reference is generated
                runner_up = RunnerUp(self.db.candidates[j], config, float(2 ** predicted[k]))
            near: tuple[tuple[tuple[int, ...], float, float | None], ...] = tuple(
                (tuple(int(d) for d in self.db.shapes[i]), float(dist[i]), None) for i in order)
            return Choice(self.db.candidates[self.reference], self.configs[self.reference], 1.0, near, runner_up,
                          self.reference_name, reference_ms)
        # the best score; among equal scores (launches that all wait on the host) the best on the GPU
        k = int(np.lexsort((np.where(safe, predicted, -np.inf), np.where(safe, score, -np.inf)))[-1])
        j = self.usable[k]
        if by_kind[k] and int(self.widths[k]) in learned_from:  # the neighbours it learned from
            order, gain, ok = learned_from[int(self.widths[k])]
        near = tuple((tuple(int(d) for d in self.db.shapes[i]), float(dist[i]),
                      None if not ok[n, k] else float(2 ** gain[n, k])) for n, i in enumerate(order))
        with_host = float(2 ** score[k]) if counted and score[k] > predicted[k] + 1e-9 else None
        return Choice(self.db.candidates[j], self.configs[j], float(2 ** predicted[k]), near,
                      reference=self.reference_name,
                      predicted_ms=None if reference_ms is None else reference_ms / float(2 ** predicted[k]),
                      with_host=with_host)

    def reference_ms(self, shape: tuple[int, ...], order: np.ndarray, dist: np.ndarray) -> float | None:
        """The reference's (cuBLAS's) predicted time on `shape` in milliseconds, from the neighbour rows
        `order` (distances `dist`) that timed it: each neighbour's time scaled by the ratio of multiply-adds
        (its throughput carried over), averaged in log space with the weights the speed-ups get; None where
        no neighbour timed it. For cuBLAS on a large problem of a type whose unaligned rows it runs slowly
        (REFERENCE_BY_ALIGNMENT), the same number of neighbours chosen again, a row whose rows are aligned
        otherwise than the problem's counted REFERENCE_KIND_DISTANCE farther."""
        if self.reference is None:
            return None
        if (self.cublas_aligned is not None and self.reference == self.cublas and len(order)
                and math.prod(shape) >= REFERENCE_KIND_MIN_WORK.get(self.db.kernel, math.inf)):
            aligned = cublas_rows_aligned(self.db.kernel, self.db.dtype, self.db.layout, shape)
            dist = dist + REFERENCE_KIND_DISTANCE * (self.cublas_aligned != aligned)
            order = np.argsort(dist, kind="stable")[:len(order)]
            order = order[np.isfinite(dist[order])]
        times = self.times[order, self.reference]
        ok = np.isfinite(times) & (times > 0)
        if not ok.any():
            return None
        if dist[order[0]] == 0 and ok[0]:  # a surveyed shape: its own measurement
            return float(times[0])
        work = math.prod(shape)
        exponent = REFERENCE_WORK_EXPONENT  # at 1, the sums below are the ones before it was named, bit for bit
        scaled = np.log2(times[ok]) + exponent * np.log2(work) - exponent * self.log_shapes[order[ok]].sum(axis=1)
        w = 1.0 / (0.25 + dist[order[ok]])
        return float(2 ** ((w * scaled).sum() / w.sum()))

    def _distances(self, shape: tuple[int, ...]) -> np.ndarray:
        """Each database shape's distance to `shape`: the sum over dimensions of |log2| ratios."""
        q = np.log2(np.asarray(shape, dtype=np.float64))
        return np.asarray(np.abs(self.log_shapes - q).sum(axis=1))

    @staticmethod
    def _nearest(dist: np.ndarray, params: ModelParams) -> np.ndarray:
        """The rows of the `params.neighbours` nearest shapes at a finite distance, nearest first."""
        order = np.argsort(dist, kind="stable")[:params.neighbours]
        return np.asarray(order[np.isfinite(dist[order])])

    def _predict(self, order: np.ndarray, dist: np.ndarray, fill_q: np.ndarray, floor_octaves: float = math.inf
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """For every usable candidate, from the neighbour rows `order`: the predicted log2 speed-up, the
        worst measured one (among the rows within `floor_octaves` of the nearest, where a candidate was timed
        on any of those, else among all), whether enough neighbours timed it; and the neighbours' gains and
        timed mask."""
        assert self.gain is not None
        gain = self.gain[np.ix_(order, self.usable_columns)]  # neighbours x usable candidates, log2 speed-ups
        ok = np.isfinite(gain)
        if dist[order[0]] == 0:  # a surveyed shape: its own measurement is the answer
            predicted = np.where(ok[0], gain[0], -np.inf)
            return predicted, predicted, ok[0], gain, ok
        fill = np.array([self._features_of_row(int(i))[0] for i in order]).reshape(len(order), len(fill_q))
        w = 1.0 / (0.25 + dist[order][:, None] + FILL_WEIGHT * np.abs(fill - fill_q[None, :]))
        w = np.where(ok, w, 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            predicted = np.where(ok, w * gain, 0.0).sum(axis=0) / w.sum(axis=0)
        worst = np.where(ok, gain, np.inf).min(axis=0)
        if math.isfinite(floor_octaves):
            near = (dist[order] <= dist[order[0]] + floor_octaves)[:, None] & ok
            worst = np.where(near.any(axis=0), np.where(near, gain, np.inf).min(axis=0), worst)
        enough = 2 * ok.sum(axis=0) >= len(order)  # timed at under half the neighbours: too little
        return predicted, worst, enough, gain, ok

    def rank(self, shape: Sequence[int], params: ModelParams = ModelParams(), setting: str | None = None,
             held_out: bool = False) -> list[int]:
        """Usable generated candidates worth timing on `shape` that the precision `setting` allows (None:
        all), best predicted first (those with too few timed neighbours last): the short list that tuning
        at first call times, and the tuner's first warm starts. `held_out`: the database's own rows of
        `shape` are left out (a search of a surveyed shape must not start from its answer)."""
        shape_t = tuple(int(d) for d in shape)
        q = np.log2(np.asarray(shape_t, dtype=np.float64))
        dist = np.abs(self.log_shapes - q).sum(axis=1)
        if held_out:
            dist = np.where(dist == 0, np.inf, dist)
        order = np.argsort(dist, kind="stable")[:params.neighbours]
        order = order[np.isfinite(dist[order])]
        keyed: list[tuple[float, int]] = []
        for j, ok_here in zip(self.usable, self.allowed(setting), strict=True):
            config = self.configs[j]
            assert config is not None and self.gain is not None
            if not ok_here or not worth_timing(self.db.kernel, config, shape_t, self.device.sm_count):
                continue
            g = self.gain[order, j]
            ok = np.isfinite(g)
            keyed.append((float(g[ok].mean()) if ok.any() else -np.inf, j))
        return [j for _, j in sorted(keyed, key=lambda t: -t[0])]

    def cross_validate(self, params: ModelParams = ModelParams()) -> list[tuple[tuple[int, ...], str, float, float]]:
        """Leave-one-out: for each database shape, the model built from the others chooses, and the
        choice's measured speed-up over cuBLAS on that shape is looked up. Returns (shape, chosen, measured
        speed-up, best speed-up any usable candidate had there) per shape where the choice was timed."""
        assert self.gain is not None
        out = []
        for i, shape in enumerate(self.db.shapes):
            if not np.isfinite(self.times[i, self.reference]):
                continue
            choice = self.choose(shape, params, exclude=i)
            if choice is None:
                continue
            j = self.db.candidates.index(choice.candidate)
            g = 0.0 if j == self.reference else self.gain[i, j]
            if not np.isfinite(g):
                continue
            best = max(0.0, float(np.nanmax(self.gain[i, self.usable]))) if self.usable else 0.0
            out.append((tuple(shape), choice.candidate.name, float(2 ** g), float(2 ** best)))
        return out

    def fit(self, focus: Collection[tuple[int, ...]] = ()) -> tuple[ModelParams, dict[str, float]]:
        """The parameters that do best in leave-one-out over the database: the highest geometric mean of
        the measured speed-ups among those that leave at most 1 % of the held-out shapes below 0.97x
        cuBLAS (where none does, the fewest such shapes). Checked on random shapes held out of an H200's
        survey, leave-one-out proved optimistic, hence the guard on losses rather than on the mean.
        `focus`: shapes whose speed-ups alone make the mean, where at least `FOCUS_MIN_ROWS` of them are in
        the database (the survey's randomly drawn rows: the grid's mostly aligned powers of two favour
        parameters that random shapes do not; H100 bmm, 2026-12-06: 1.067x on the random rows as fitted
        over all, 1.087x as fitted over them); the losses are counted over every shape."""
        wanted = {tuple(shape) for shape in focus}
        focused = sum(tuple(shape) in wanted for shape in self.db.shapes) >= FOCUS_MIN_ROWS
        best: tuple[tuple[float, float], ModelParams, dict[str, float]] | None = None
        for k, margin, floor, by_width in itertools.product((3, 4, 6, 8), (0.05, 0.1, 0.2), (0.97, 1.0),
                                                            (False, True)):
            params = ModelParams(k, margin, floor, by_width)
            held_out = self.cross_validate(params)
            ratios = [r for _, _, r, _ in held_out]
            if not ratios:
                continue
            in_focus = [r for shape, _, r, _ in held_out if shape in wanted]
            logs = np.log2(in_focus if focused and in_focus else ratios)
            losses = float((np.asarray(ratios) < 0.97).mean())
            score = (-max(0.0, losses - 0.01), float(logs.mean()))
            if best is None or score > best[0]:
                best = (score, params, summary(ratios))
        if best is None:
            return ModelParams(), {}
        return best[1], best[2]


def summary(ratios: Sequence[float]) -> dict[str, float]:
    """min, 10th percentile, median, geometric mean, and fractions >= 1.0x and >= 0.97x of speed-ups."""
    if not ratios:
        return {"n": 0}
    r = np.asarray(ratios, dtype=np.float64)
    return {"n": len(r), "min": float(r.min()), "p10": float(np.percentile(r, 10)), "median": float(np.median(r)),
            "geomean": float(np.exp(np.log(r).mean())), "at_least_1": float((r >= 1.0).mean()),
            "at_least_097": float((r >= 0.97).mean())}


def usable_config(db: ShapeDatabase, cand: Candidate, problem: Problem) -> Config | None:
    """The candidate's config where it is current (renders the kernel that was timed) and feasible: what the
    model may run (and `autotile cache compile` builds ahead)."""
    if cand.implementation != "generated" or cand.config is None:
        return None
    spec = kernels.get(db.kernel)
    try:
        config = spec.space.config(cand.config)
    except Exception:  # a parameter this version of the space lacks: a database from another version
        return None
    if cand.source_sha != _source_sha(db.kernel, config, db.dtype, db.layout):
        return None
    return config if spec.space.is_feasible(config, problem) else None


@functools.lru_cache(maxsize=4096)
def _source_sha(kernel: str, config: Config, dtype: str, layout: str) -> str:
    return kernels.source_hash(kernels.get(kernel).render(config, dtype, layout))


def copy_width(config: Config | None, element_bytes: int) -> int:
    """Elements a candidate copies at a time from an operand's rows where they start aligned to that (and
    fewer at a time where they do not): 16 bytes for a config that copies with tensor maps (wgmma
    LOADER=tma, wgmma_direct; registers elsewhere), else its VEC; 1 for cuBLAS and for wgmma LOADER=presplit,
    whose split kernels read any rows at one speed and whose copies read their aligned workspace (H200,
    2026-11-28: 4095³ 2.37x cuBLAS, 4096³ 2.39x)."""
    if config is None or config.get("LOADER") == "presplit":
        return 1
    if _copies_with_tensor_maps(config):
        return 16 // element_bytes
    return int(config.get("VEC", 1))


def _copies_with_tensor_maps(config: Config | None) -> bool:
    """A config whose copies use tensor maps where the rows allow them (16-byte aligned) and registers
    elsewhere: wgmma LOADER=tma, and every wgmma_direct config (whose register path ran int8 24x696x920 at
    0.13x torch._int_mm on an H100, 2026-11-28, where neighbours of aligned rows had predicted it fast)."""
    return config is not None and (config.get("LOADER") == "tma" or config.get("MATH") == "wgmma_direct")


def rows_allow(kernel: str, shape: tuple[int, ...], layout: str, width: int) -> bool:
    """Whether every operand's rows on `shape` in `layout` start aligned to `width` elements (their
    contiguous dimension a multiple of it), the operands taken to be aligned as allocators give them: a
    matvec's A has rows of K elements (row) or columns of M (col); x is one aligned vector."""
    if width <= 1:
        return True
    if kernel == "matvec":
        return shape[1 if layout == "row" else 0] % width == 0
    M, N, K = shape[-3:]
    a_inner = M if layout in ("tn", "tt") else K
    b_inner = K if layout in ("nt", "tt") else N
    return a_inner % width == 0 and b_inner % width == 0


def cublas_rows_aligned(kernel: str, dtype: str, layout: str, shape: tuple[int, ...]) -> bool:
    """Whether A's and B's rows, and C's where cuBLAS wants those aligned too for `dtype` (`"c"` in
    `Dtype.cublas_aligned_rows`), start 16-byte aligned on `shape` in `layout`, the arrays taken to start
    aligned: the rows the padded plan aligns (`autotile.library.padding.misaligned`)."""
    width = 16 // dtypes.DTYPE_SIZES[dtype]
    wanted = dtypes.get(dtype).cublas_aligned_rows
    c_aligned = "c" not in wanted or kernel == "matvec" or shape[-2] % width == 0
    return rows_allow(kernel, shape, layout, width) and c_aligned


def _floor_from_near_rows(kernel: str, shape: tuple[int, ...]) -> bool:
    """Whether the floor counts only the neighbours near the nearest (`FLOOR_NEAR_OCTAVES`): a matmul of at
    least FLOOR_NEAR_MIN_WORK multiply-adds whose M and N are at least FLOOR_NEAR_MIN_SIDE."""
    return (kernel == "matmul" and math.prod(shape) >= FLOOR_NEAR_MIN_WORK
            and min(shape[0], shape[1]) >= FLOOR_NEAR_MIN_SIDE)


def _log_fill(kernel: str, config: Config, shape: tuple[int, ...], device: DeviceLimits) -> float:
    """log2 of the blocks a launch has per SM (its waves, before rounding up)."""
    blocks = math.prod(kernels.get(kernel).grid(config, tuple(shape)))
    return math.log2(max(blocks, 1) / device.sm_count)


_models: dict[tuple[int, DeviceLimits, bool], tuple[ShapeDatabase, Model]] = {}


def model_for(db: ShapeDatabase, device: DeviceLimits, cublas_runs: bool = True) -> Model:
    """The prepared model of a database on a device (prepared once per process: `database.load` returns
    the same object until the file changes); `cublas_runs` False: measured against a generated reference
    (`Model`)."""
    key = (id(db), device, cublas_runs)
    found = _models.get(key)
    if found is None or found[0] is not db:
        found = _models[key] = (db, Model(db, device, cublas_runs))
    return found[1]


def fitted_environment(params: ModelParams, held_out: dict[str, float]) -> dict[str, Any]:
    """What a database keeps of its fit (its environment's "model"), which `params_of` reads back."""
    return {"neighbours": params.neighbours, "margin": params.margin, "floor": params.floor,
            "by_copy_width": params.by_copy_width, "leave_one_out": held_out}


def params_of(db: ShapeDatabase) -> ModelParams:
    """The parameters fitted when the database was built (kept in its environment), else the defaults."""
    fitted: Any = db.environment.get("model")
    if isinstance(fitted, dict):
        try:
            return ModelParams(int(fitted["neighbours"]), float(fitted["margin"]), float(fitted["floor"]),
                               bool(fitted.get("by_copy_width", False)))
        except (KeyError, TypeError, ValueError):
            pass
    return ModelParams()


__all__ = ["Choice", "Model", "ModelParams", "RunnerUp", "copy_width", "fitted_environment", "model_for", "params_of",
           "rows_allow", "summary", "worth_timing"]
