"""The GPU probes in tools/: what they compute before touching a GPU (the shapes they time, the configs they build)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from autotile.codegen import kernels
from autotile.errors import ArgumentError, UnknownNameError


def _tool(name: str) -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_unaligned_probe_pairs_each_unaligned_batch_with_its_aligned_twin():
    probe = _tool("unaligned_probe")
    assert probe.aligned_twin((111, 1470, 51, 1149)) == (111, 1470, 52, 1152)
    assert probe.aligned_twin((3, 7, 8, 12)) == (3, 7, 8, 12)  # M's rows are C's count, not a row length
    cases = [("random", (5, 33, 64, 128)), ("random", (5, 33, 65, 127))]
    assert probe.with_twins(cases) == [("random", (5, 33, 64, 128)), ("random", (5, 33, 65, 127)),
                                       ("twin", (5, 33, 68, 128))]


def test_unaligned_probe_builds_named_configs_with_changes():
    probe = _tool("unaligned_probe")
    space = kernels.get("bmm").space
    assert probe.config_of(space, "wgmma-128x64-persistent-p4") == space.named("wgmma-128x64-persistent-p4")
    config = probe.config_of(space, "wgmma-128x64+PRODUCERS=4+PERSISTENT=true")
    assert (config["PRODUCERS"], config["PERSISTENT"], config["BN"]) == (4, True, 64)
    assert probe.config_of(space, "wgmma-128x64-persistent-p4+STORE=staged")["STORE"] == "staged"
    with pytest.raises(ArgumentError, match="'PRODUCERS' in 'wgmma-128x64\\+PRODUCERS' is not PARAM=VALUE"):
        probe.config_of(space, "wgmma-128x64+PRODUCERS")
    with pytest.raises(UnknownNameError, match="unknown parameter 'PRODUCER'"):
        probe.config_of(space, "wgmma-128x64+PRODUCER=4")
    with pytest.raises(UnknownNameError, match="unknown config 'wgmma-12'"):
        probe.config_of(space, "wgmma-12")
