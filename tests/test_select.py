"""The library's config lookup without a GPU: exact, nearest, stale (source changed), built-in default."""

from __future__ import annotations

import pytest

from autotile.codegen import build, kernels
from autotile.codegen.limits import PROFILES
from autotile.codegen.problem import ProblemKey
from autotile.codegen.space import Problem
from autotile.dispatch import select
from autotile.dispatch.cache import TuningCache
from autotile.dispatch.record import Record

H100 = PROFILES["h100"]


def _record(config, shape, source_sha, time_ms=1.0, compiler="nvrtc-13.0", options=build.COMPILE_OPTIONS):
    """A record as the tuner writes it today: it names its compiler and compile options (`options` None: a
    record from before records kept them, which was built with `select.LEGACY_COMPILE_OPTIONS`)."""
    env = {"gpu": H100.name, "source_sha": source_sha, "compiler": compiler}
    if options is not None:
        env["compile_options"] = list(options)
    return Record(kernel="matmul", dtype="float32", layout="row", shape=shape,
                  compat=kernels.compat_hash("matmul"), config=dict(config), time_ms=time_ms,
                  spread=0.01, metric=1.0, metric_unit="GFLOP/s", baseline_ms=1.0, device=H100.fingerprint,
                  environment=env)


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


def test_records_with_other_compile_options_are_a_fallback(tmp_path, monkeypatch):
    """The library's compiler with other options (a record from before records named them: built with
    -ftz=true) is a fallback, as another compiler is; its source says so rather than name the compiler alone."""
    spec = kernels.get("matmul")
    space = spec.space
    cache = TuningCache(root=tmp_path, shipped_root=None)
    a, b = space.named("regtile-128"), space.named("regtile-256x128")
    sha = lambda c: kernels.source_hash(spec.render(c, "float32", "row"))  # noqa: E731
    legacy = _record(a, (4096, 4096, 4096), sha(a), options=None)
    assert select.record_options(legacy) == select.LEGACY_COMPILE_OPTIONS != build.COMPILE_OPTIONS
    monkeypatch.setattr(select.build, "compiler_version", lambda: "nvrtc-13.0")
    assert not select.same_compiler(legacy) and select.same_compiler(_record(a, (1, 1, 1), sha(a)))
    assert not select.same_compiler(_record(a, (1, 1, 1), sha(a), options=(*build.COMPILE_OPTIONS, "-DX=1")))
    cache.put(legacy)
    other = _select(cache, (4096, 4096, 4096), monkeypatch)
    assert other.config == a and other.source == "exact, tuned with nvrtc-13.0 and other compile options"
    cache.put(_record(b, (2048, 2048, 2048), sha(b)))  # today's options
    same = _select(cache, (4096, 4096, 4096), monkeypatch)
    assert same.config == b and same.source == "nearest"


def test_compat_hash_depends_on_parameter_names_only():
    space = kernels.get("matmul").space
    assert kernels.compat_hash("matmul") != kernels.compat_hash("matvec")
    assert list(space.restricted({"BM": 128}).params) == list(space.params)
    assert kernels.compiler_major("nvrtc-13.0") == kernels.compiler_major("nvrtc-13.4") == "nvrtc-13"


RETIME_PENDING = "shipped tf32x3 records are re-timed on the GPU after the numerics change"


def test_shipped_configs_are_current_and_feasible():
    """Every shipped record renders the kernel that was timed and names today's compile options (else the
    library would skip it, or serve it only as a fallback), is feasible on its GPU's profile, and beats
    nothing it should not: its time and cuBLAS's are recorded.

    Records made before the numerics change (no compile options named: -ftz=true) await tools/retime.py on
    their GPU: that change altered the tf32x3 template only, so such a record may be stale only if it is a
    tf32x3 one. While any awaits it, the test ends as an expected failure after every other check."""
    from autotile.codegen.resources import shipped_cache_dir

    cache = TuningCache(root=shipped_cache_dir(), shipped_root=None)
    entries = cache.entries()
    assert not cache.problems
    assert len(entries) >= 25
    profiles = {p.fingerprint: p for p in PROFILES.values()}
    pending = []
    for path, record in entries:
        spec = kernels.get(record.kernel)
        config = spec.space.config(record.config)
        source = spec.render(config, record.dtype, record.layout)
        fresh = record.environment["source_sha"] == kernels.source_hash(source)
        assert record.compat == kernels.compat_hash(record.kernel)
        limits = profiles.get(record.device)
        assert limits is not None, f"{record.device} has no offline profile"
        assert spec.space.is_feasible(config, Problem(limits, record.dtype, record.layout)), path.name
        assert record.baseline_ms and record.time_ms > 0
        if not record.environment.get("compile_options"):  # built with LEGACY_COMPILE_OPTIONS
            assert fresh or config.get("MATH") == "tf32x3", f"{path.name} is stale: re-tune"
            pending.append(f"{path.parent.name}/{path.name}")
            continue
        assert fresh, (f"{path.name} is stale: a template change altered its source; `python tools/restamp.py REV` "
                       "re-stamps it if its cubin is unchanged, else re-tune")
        assert select.is_current(record), path.name  # what the library asks: a knob added since changes nothing
        assert select.record_options(record) == build.COMPILE_OPTIONS, f"{path.name}: other compile options"
    if pending:
        stale = sum(1 for _, r in entries if not select.is_current(r))
        pytest.xfail(f"{RETIME_PENDING} ({len(pending)} records from before it, {stale} of them stale)")


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

    from autotile.codegen.resources import search_space_path, shipped_cache_dir
    from autotile.codegen.space import Space
    from autotile.errors import SpaceDefinitionError
    from autotile.tuning.testing import ReplayEvaluator
    from autotile.tuning.tuner import TuneOptions, Tuner

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
    from autotile.codegen.limits import DeviceLimits

    raw = table["environment"]["limits"]
    return DeviceLimits(**{k: tuple(v) if k == "compute_capability" else v for k, v in raw.items()})


def test_nearest_config_gets_more_k_splits_where_the_grid_would_shrink(tmp_path, monkeypatch):
    """A nearest-shape config keeps its tiles, but where the new shape would launch under half the blocks
    it was tuned with, SPLIT_K rises until the count is back (never below MIN_K_PER_RAISED_SPLIT of K each)."""
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
                                  "compiler": "nvrtc-13.0", "compile_options": list(build.COMPILE_OPTIONS)}))

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


# -- the precision setting ------------------------------------------------------------------------------

def _current(config, shape, time_ms=1.0, implementation="generated", baseline_ms=1.0):
    """A record of `config` on `shape`, current (its source hash is today's) and of the library's compiler
    and compile options."""
    spec = kernels.get("matmul")
    sha = kernels.source_hash(spec.render(config, "float32", "row"))
    return Record(kernel="matmul", dtype="float32", layout="row", shape=shape, compat=kernels.compat_hash("matmul"),
                  config=dict(config), time_ms=time_ms, spread=0.01, metric=1.0, metric_unit="GFLOP/s",
                  baseline_ms=baseline_ms, device=H100.fingerprint, implementation=implementation,
                  environment={"gpu": H100.name, "source_sha": sha, "compiler": "nvrtc-13.0",
                               "compile_options": list(build.COMPILE_OPTIONS)})


def _under(cache, shape, monkeypatch, precision=None):
    monkeypatch.setattr(select.build, "compiler_version", lambda: "nvrtc-13.0")
    return select.select(ProblemKey("matmul", "float32", "row", shape), H100, cache, precision=precision)


def _math(sel) -> str:
    return "cuBLAS" if sel.config is None else sel.config["MATH"]


def test_highest_never_serves_a_tf32x3_exact_or_nearest_record(tmp_path, monkeypatch):
    space = kernels.get("matmul").space
    cache = TuningCache(root=tmp_path, shipped_root=None)
    cache.put(_current(space.named("tf32x3-128"), (4096, 4096, 4096), time_ms=1.0))
    high = _under(cache, (4096, 4096, 4096), monkeypatch)
    assert (high.source, _math(high)) == ("exact", "tf32x3") and "precision" not in high.explain()
    # Under "highest" the exact record is skipped, and so is the same record as the nearest shape's.
    only_ieee = _under(cache, (4096, 4096, 4096), monkeypatch, "highest")
    assert only_ieee.source == "built-in default" and _math(only_ieee) == "simt"
    assert only_ieee.config == space.default_config("row", Problem(H100))
    assert only_ieee.explain().endswith("[precision highest]")
    assert _math(_under(cache, (3000, 3000, 3000), monkeypatch, "highest")) == "simt"
    # A SIMT record of another shape is then the nearest, and one of this shape the exact: each in its slot.
    cache.put(_current(space.named("regtile-128"), (2048, 2048, 2048), time_ms=3.0))
    near = _under(cache, (4096, 4096, 4096), monkeypatch, "highest")
    assert near.source.startswith("nearest") and near.tuned_shape == (2048, 2048, 2048) and _math(near) == "simt"
    cache.put(_current(space.named("regtile-256x128"), (4096, 4096, 4096), time_ms=2.0))
    exact = _under(cache, (4096, 4096, 4096), monkeypatch, "highest")
    assert exact.source == "exact" and exact.config == space.named("regtile-256x128")
    # "high" and "medium" take the fastest record of the shape, the tf32x3 one.
    for setting in ("high", "medium", None):
        assert _under(cache, (4096, 4096, 4096), monkeypatch, setting).config == space.named("tf32x3-128")
    import autotile

    autotile.set_float32_matmul_precision("highest")  # the process-wide setting counts where None
    assert _under(cache, (4096, 4096, 4096), monkeypatch).config == space.named("regtile-256x128")


def test_a_cublas_record_is_allowed_under_highest_only_where_cublas_runs(tmp_path, monkeypatch):
    space = kernels.get("matmul").space
    cache = TuningCache(root=tmp_path, shipped_root=None)
    # cuBLAS beat a tf32x3 config on this shape: the record runs cuBLAS there, its config elsewhere.
    cache.put(_current(space.named("tf32x3-128"), (4096, 4096, 4096), time_ms=2.0, implementation="cublas"))
    exact = _under(cache, (4096, 4096, 4096), monkeypatch, "highest")
    assert exact.source == "exact" and exact.implementation == "cublas"
    near = _under(cache, (3000, 3000, 3000), monkeypatch, "highest")  # would run the tf32x3 config
    assert near.source == "built-in default" and _math(near) == "simt"
    assert _math(_under(cache, (3000, 3000, 3000), monkeypatch, "high")) == "tf32x3"


def _shipped_made_current(root, device) -> TuningCache:
    """A copy under `root` of the shipped records and shape databases of `device`, each stamped as timed on
    today's kernel sources with today's compile options: the shipped data as the selection sees it once it
    is re-timed and re-surveyed after a template or options change. The times are the shipped ones. (Whether
    the shipped files are current is test_shipped_configs_are_current_and_feasible's question, and
    test_dispatch.py's test_shipped_databases_are_valid_and_current's.)"""
    import json

    from autotile.codegen.resources import shipped_cache_dir

    def sha(kernel, config, dtype, layout):
        spec = kernels.get(kernel)
        return kernels.source_hash(spec.render(spec.space.config(config), dtype, layout))

    source = shipped_cache_dir() / device.fingerprint
    target = root / device.fingerprint
    (target / "database").mkdir(parents=True)
    for path in sorted(source.glob("*.json")):
        data = json.loads(path.read_text())
        data["environment"].update(source_sha=sha(data["kernel"], data["config"], data["dtype"], data["layout"]),
                                   compile_options=list(build.COMPILE_OPTIONS))
        (target / path.name).write_text(json.dumps(data))
    for path in sorted((source / "database").glob("*.json")):
        data = json.loads(path.read_text())
        for cand in data["candidates"]:
            if cand["config"] is not None:
                cand["source_sha"] = sha(data["kernel"], cand["config"], data["dtype"], data["layout"])
        data["environment"]["compile_options"] = list(build.COMPILE_OPTIONS)
        (target / "database" / path.name).write_text(json.dumps(data))
    return TuningCache(root=root, shipped_root=None)


def test_highest_never_serves_tf32x3_from_the_shipped_cache_and_databases(tmp_path, monkeypatch):
    """The shipped H100 records are tf32x3 (most under names from before slots) or, on four squares, wgmma
    (3xTF32 on Hopper, the same "high" class), and its database's model picks
    tf32x3 on most shapes: under "high" they are served, under "highest" never. Checked on the shipped
    files as they are, and on a copy made current (as after a re-time and a re-survey), where "high" is
    sure to serve the tf32x3 records and the model's tf32x3 picks that "highest" must not."""
    import numpy as np

    from autotile.codegen.resources import shipped_cache_dir

    shipped = TuningCache(root=shipped_cache_dir(), shipped_root=None)
    current = _shipped_made_current(tmp_path / "current", H100)
    monkeypatch.setattr(select.build, "compiler_version", lambda: "nvrtc-13.0")
    tuned = sorted({r.shape for _, r in shipped.entries(H100.fingerprint)
                    if r.kernel == "matmul" and r.dtype == "float32"})
    assert tuned and all(r.precision == "high" for _, r in shipped.entries(H100.fingerprint)
                         if r.kernel == "matmul" and r.dtype == "float32")
    assert all(select.is_current(r) and select.same_compiler(r) for _, r in current.entries(H100.fingerprint))
    rng = np.random.default_rng(3)
    others = [tuple(int(2 ** e) for e in rng.uniform(5, 13, 3)) for _ in range(30)]
    seen_high = set()
    for shape in tuned + others:
        key = ProblemKey("matmul", "float32", "row", shape)
        for cache in (shipped, current):
            strict = select.select(key, H100, cache, precision="highest")
            assert _math(strict) in ("simt", "cuBLAS"), (shape, strict.explain())
        high = select.select(key, H100, current)
        seen_high.add((high.source.split(" ")[0], _math(high)))
        if shape in tuned:
            assert high.source == "exact" and _math(high) in ("tf32x3", "wgmma")  # both "high" class
    assert ("model", "tf32x3") in seen_high  # the model would have served tf32x3 there


def test_builtin_default_under_highest_is_simt_whatever_the_space_default(monkeypatch):
    """A space whose default is a tf32x3 config still gives a SIMT config under "highest": the first
    feasible named config that the setting allows."""
    import types

    import yaml

    from autotile.codegen.resources import search_space_path
    from autotile.codegen.space import Space

    data = yaml.safe_load(search_space_path("matmul").read_text())
    data["default"] = ["tf32x3-128"]
    space = Space(data, "tf32x3 default")
    monkeypatch.setattr(select.kernels, "get", lambda name: types.SimpleNamespace(space=space))
    ctx = select.Context(ProblemKey("matmul", "float32", "row", (64, 64, 64)), H100,
                         TuningCache(root="/nonexistent-autotile", shipped_root=None), lambda r: True, "highest")
    strict = select.builtin_default(ctx)
    assert strict.config is not None and strict.config["MATH"] == "simt" and strict.precision == "highest"
    loose = select.builtin_default(select.Context(ctx.key, H100, ctx.cache, ctx.accept, "high"))
    assert loose.config == space.named("tf32x3-128")


def test_select_checks_the_setting(tmp_path):
    from autotile.errors import InvalidValueError

    with pytest.raises(InvalidValueError, match="precision 'fast' is not one of highest, high, medium, emulated"):
        select.select(ProblemKey("matmul", "float32", "row", (8, 8, 8)), H100,
                      TuningCache(root=tmp_path, shipped_root=None), precision="fast")


def test_matvec_and_float64_selection_is_the_same_under_every_setting(tmp_path, monkeypatch):
    monkeypatch.setattr(select.build, "compiler_version", lambda: "nvrtc-13.0")
    from autotile.codegen.resources import shipped_cache_dir

    cache = TuningCache(root=tmp_path, shipped_root=shipped_cache_dir())
    for key in (ProblemKey("matvec", "float32", "col", (16384, 16384)),
                ProblemKey("matvec", "float32", "row", (3000, 5000)),
                ProblemKey("matmul", "float64", "row", (512, 512, 512))):
        chosen = {s: select.select(key, H100, cache, precision=s) for s in ("highest", "high", "medium")}
        assert len({(c.config, c.implementation, c.source) for c in chosen.values()}) == 1, key
