"""The library's config lookup without a GPU: exact, nearest, stale (source changed), built-in default."""

from __future__ import annotations

import pytest

from autotile import kernels, select
from autotile.cache import Record, TuningCache
from autotile.device import PROFILES
from autotile.problem import ProblemKey
from autotile.space import Problem

H100 = PROFILES["h100"]


def _record(config, shape, source_sha, time_ms=1.0, compiler="nvrtc-13.0"):
    return Record(kernel="matmul", dtype="float32", layout="row", shape=shape,
                  compat=kernels.compat_hash("matmul"), config=dict(config), time_ms=time_ms,
                  spread=0.01, metric=1.0, metric_unit="GFLOP/s", baseline_ms=1.0, device=H100.fingerprint,
                  environment={"gpu": H100.name, "source_sha": source_sha, "compiler": compiler})


def _select(cache, shape, monkeypatch):
    monkeypatch.setattr(select.build, "compiler_version", lambda: "nvrtc-13.0")
    return select.select(ProblemKey("matmul", "float32", "row", shape), H100, cache)


def test_exact_nearest_stale_and_default(tmp_path, monkeypatch):
    spec = kernels.get("matmul")
    space = spec.space
    cache = TuningCache(root=tmp_path, shipped_root=None)
    good = space.named("regtile-128")
    sha = kernels.source_hash(spec.render(good, "float32", "row"))
    cache.put(_record(good, (4096, 4096, 4096), sha))

    exact = _select(cache, (4096, 4096, 4096), monkeypatch)
    assert (exact.source, exact.config, exact.tuned_shape) == ("exact", good, (4096, 4096, 4096))
    near = _select(cache, (3000, 5000, 4000), monkeypatch)
    assert (near.source, near.config) == ("nearest", good)

    # A record whose kernel source no longer matches what the template renders is stale: skipped.
    stale_config = space.named("safe-default")
    cache.put(_record(stale_config, (1024, 1024, 1024), "0" * 16))
    fallback = _select(cache, (1024, 1024, 1024), monkeypatch)  # falls to the nearest good one
    assert fallback.tuned_shape == (4096, 4096, 4096) and fallback.source.startswith("nearest")
    assert dict(fallback.config, SPLIT_K=1) == dict(good)  # (its K splits raised for the smaller grid)

    empty = TuningCache(root=tmp_path / "empty", shipped_root=None)
    default = _select(empty, (64, 64, 64), monkeypatch)
    assert default.source == "built-in default"
    assert default.config == space.default_config("row", Problem(H100))


def test_same_compiler_preferred_other_compiler_as_fallback(tmp_path, monkeypatch):
    spec = kernels.get("matmul")
    space = spec.space
    cache = TuningCache(root=tmp_path, shipped_root=None)
    a, b = space.named("regtile-128"), space.named("regtile-256x128")
    sha = lambda c: kernels.source_hash(spec.render(c, "float32", "row"))  # noqa: E731
    cache.put(_record(a, (4096, 4096, 4096), sha(a), compiler="nvrtc-12.8"))
    other = _select(cache, (4096, 4096, 4096), monkeypatch)  # runs with nvrtc-13.0
    assert other.config == a and other.source == "exact, tuned with nvrtc-12.8"
    cache.put(_record(b, (2048, 2048, 2048), sha(b), compiler="nvrtc-13.2"))
    same = _select(cache, (4096, 4096, 4096), monkeypatch)
    assert same.config == b and same.source == "nearest"  # same compiler beats the exact shape of another


def test_compat_hash_depends_on_parameter_names_only():
    space = kernels.get("matmul").space
    assert kernels.compat_hash("matmul") != kernels.compat_hash("matvec")
    assert list(space.restricted({"BM": 128}).params) == list(space.params)
    assert kernels.compiler_major("nvrtc-13.0") == kernels.compiler_major("nvrtc-13.4") == "nvrtc-13"


def test_shipped_configs_are_current_and_feasible():
    """Every shipped record renders the kernel that was timed (else the library would skip it), is
    feasible on its GPU's profile, and beats nothing it should not: its time and cuBLAS's are recorded."""
    from autotile.resources import shipped_cache_dir

    cache = TuningCache(root=shipped_cache_dir(), shipped_root=None)
    entries = cache.entries()
    assert not cache.problems
    assert len(entries) >= 25
    profiles = {p.fingerprint: p for p in PROFILES.values()}
    for path, record in entries:
        spec = kernels.get(record.kernel)
        config = spec.space.config(record.config)
        source = spec.render(config, record.dtype, record.layout)
        assert record.environment["source_sha"] == kernels.source_hash(source), f"{path.name} is stale: re-tune"
        assert select.is_current(record), path.name  # what the library asks: a knob added since changes nothing
        assert record.compat == kernels.compat_hash(record.kernel)
        limits = profiles.get(record.device)
        assert limits is not None, f"{record.device} has no offline profile"
        assert spec.space.is_feasible(config, Problem(limits, record.dtype, record.layout)), path.name
        assert record.baseline_ms and record.time_ms > 0


def _with_new_knob(data: dict, default="0") -> dict:
    data = dict(data)
    data["params"] = dict(data["params"], NEW_KNOB={"choices": [0, 1], "default": default,
                                                    "doc": "added after tuning; 0 renders the old kernel"})
    return data


def test_a_parameter_added_with_a_default_keeps_old_records_and_tables_readable(tmp_path):
    """Adding a knob with a default must not orphan the shipped configs or the recorded timings."""
    import json

    import yaml
    from replay_space import DATA, replay_space

    from autotile.errors import SpaceDefinitionError
    from autotile.resources import search_space_path, shipped_cache_dir
    from autotile.space import Space
    from autotile.testing import ReplayEvaluator
    from autotile.tuner import TuneOptions, Tuner

    base = yaml.safe_load(search_space_path("matmul").read_text())
    extended = Space(_with_new_knob(base))
    assert extended.params["NEW_KNOB"].default == 0
    assert kernels.compat_hash("matmul", extended) == kernels.compat_hash("matmul")  # same cache key
    with pytest.raises(SpaceDefinitionError, match="not among its choices"):
        Space(_with_new_knob(base, default="7"))

    # A shipped record, written before the knob existed, reads as a config with the default filled in.
    shipped = TuningCache(root=shipped_cache_dir(), shipped_root=None).entries()
    record = next(r for _, r in shipped if r.kernel == "matmul")
    config = extended.config(record.config)
    assert config["NEW_KNOB"] == 0 and all(config[k] == v for k, v in kernels.get("matmul").space.config(
        record.config).items())

    # A table recorded before the knob replays through a space that has it.
    narrow = replay_space()
    narrowed = Space(_with_new_knob(narrow._data))
    table = json.loads((DATA / "matmul_replay_h200.json").read_text())
    evaluator = ReplayEvaluator(table, space=narrowed)
    assert all(key.endswith(",NEW_KNOB=0") for key in evaluator.table["results"])
    limits = DeviceLimitsFromTable(table)
    key = ProblemKey("matmul", "float32", "row", (1024, 1024, 1024))
    result = Tuner(key, options=TuneOptions(trials=12, sampler="grid"),
                   space=narrowed.restricted({"NEW_KNOB": 0})).run(evaluator, limits)
    assert result.trials == 12 and result.best.config["NEW_KNOB"] == 0


def DeviceLimitsFromTable(table: dict):  # noqa: N802 (reads like the constructor it stands for)
    """The recorded GPU's limits."""
    from autotile.device import DeviceLimits

    raw = table["environment"]["limits"]
    return DeviceLimits(**{k: tuple(v) if k == "compute_capability" else v for k, v in raw.items()})


def test_nearest_config_gets_more_k_splits_where_the_grid_would_shrink(tmp_path, monkeypatch):
    """A nearest-shape config keeps its tiles, but where the new shape would launch under half the blocks
    it was tuned with, SPLIT_K rises until the count is back (never below MIN_K_PER_SPLIT of K each)."""
    import math

    monkeypatch.setattr(select.build, "compiler_version", lambda: "nvrtc-13.0")
    mv = kernels.get("matvec")
    config = mv.space.config({"smem": "static", "ROWS": 64, "THREADS_K": 16, "VEC": 4, "X_SHARED": False,
                              "STAGE_A": False, "TILE_K": 16, "SPLIT_K": 1, "UNROLL": 4})
    cache = TuningCache(root=tmp_path, shipped_root=None)
    cache.put(Record(kernel="matvec", dtype="float32", layout="col", shape=(65536, 4096),
                     compat=kernels.compat_hash("matvec"), config=dict(config), time_ms=1.0, spread=0.01,
                     metric=1.0, metric_unit="GB/s", baseline_ms=1.0, device=H100.fingerprint,
                     environment={"source_sha": kernels.source_hash(mv.render(config, "float32", "col")),
                                  "compiler": "nvrtc-13.0"}))

    def served(shape):
        return select.select(ProblemKey("matvec", "float32", "col", shape), H100, cache)

    def blocks(c, shape):
        return math.prod(mv.launch(c, shape, "float32", "col").grid)

    short = served((20000, 3000))  # 313 blocks at SPLIT_K 1 against 1024 on the tuned shape
    assert short.config == mv.space.with_overrides(config, {"SPLIT_K": 4})
    assert short.source == "nearest, SPLIT_K raised 1->4" and short.tuned_shape == (65536, 4096)
    assert blocks(short.config, (20000, 3000)) >= blocks(config, (65536, 4096))
    assert served((40000, 4096)).config == config  # 625 blocks: more than half, kept as tuned
    assert served((2000, 300)).config["SPLIT_K"] == 2  # K = 300 allows two splits of 128 or more
    assert served((2000, 200)).config == config  # no room to split

    # matmul: the z dimension of the grid; 64 tiles of 128 x 128 against 1024 on the tuned shape.
    spec = kernels.get("matmul")
    tiles = spec.space.named("regtile-128")
    cache.put(_record(tiles, (4096, 4096, 4096), kernels.source_hash(spec.render(tiles, "float32", "row"))))
    tall_k = _select(cache, (1024, 1024, 4096), monkeypatch)
    assert tall_k.config["SPLIT_K"] == 16 and "raised 1->16" in tall_k.source
