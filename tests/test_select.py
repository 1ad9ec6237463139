"""The library's config lookup without a GPU: exact, nearest, stale (source changed), built-in default."""

from __future__ import annotations

from autotile import kernels, ops
from autotile.cache import Record, TuningCache
from autotile.device import PROFILES
from autotile.space import Problem

H100 = PROFILES["h100"]


def _record(config, shape, source_sha, time_ms=1.0):
    return Record(kernel="matmul", dtype="float32", layout="row", shape=shape,
                  compat=kernels.compat_hash("matmul", "nvrtc-13.0"), config=dict(config), time_ms=time_ms,
                  spread=0.01, metric=1.0, metric_unit="GFLOP/s", baseline_ms=1.0, device=H100.fingerprint,
                  environment={"gpu": H100.name, "source_sha": source_sha})


def _select(cache, shape, monkeypatch):
    monkeypatch.setattr(ops.build, "compiler_version", lambda: "nvrtc-13.0")
    return ops.select_config("matmul", "float32", "row", shape, H100.fingerprint, cache=cache, limits=H100)


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
    assert _select(cache, (1024, 1024, 1024), monkeypatch).config == good  # falls to the nearest good one

    empty = TuningCache(root=tmp_path / "empty", shipped_root=None)
    default = _select(empty, (64, 64, 64), monkeypatch)
    assert default.source == "built-in default"
    assert default.config == space.default_config("row", Problem(H100))


def test_compat_hash_ignores_template_and_named_config_edits_but_not_parameters(monkeypatch):
    before = kernels.compat_hash("matmul", "nvrtc-13.0")
    assert kernels.compat_hash("matmul", "nvrtc-13.4") == before  # same major version
    assert kernels.compat_hash("matmul", "nvrtc-12.8") != before
    assert kernels.compat_hash("matvec", "nvrtc-13.0") != before
    space = kernels.get("matmul").space
    assert list(space.restricted({"BM": 128}).params) == list(space.params)
