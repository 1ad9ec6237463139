"""NARROW_COPIES on the mma.sync kernels (tf32x3, mma): copies of VEC / 2 elements where an operand's rows start
aligned to that but not to VEC; on the wgmma kernels' register loads: 8-byte (or single, unguarded) loads inside
the matrix where rows are not 16-byte aligned. Without a GPU: the source it adds, that nothing else changes, that
it compiles without spills; with one (`gpu`): results against float64 where leading dimensions are 2 mod 4."""

from __future__ import annotations

import pytest

from autotile.codegen import build, kernels
from autotile.codegen.limits import PROFILES
from autotile.codegen.space import Problem
from autotile.errors import AutotileError

# tf32x3 (float32: 8-byte copies) and mma (16-bit: 4-byte copies), small and large tiles
NAMES = {"float32": ("tf32x3-32", "tf32x3-64", "tf32x3-128x64"), "bfloat16": ("mma-32", "mma-64")}
# wgmma (sm_90a): a block per tile through the TMA's register fallback, and persistent blocks, two and four producers
WGMMA = ("wgmma-64-tma", "wgmma-128-persistent-p2", "wgmma-128x64-persistent-p4")


def _narrow(name: str, **overrides):
    space = kernels.get("matmul").space
    return space.with_overrides(space.named(name), {"NARROW_COPIES": True, **overrides})


@pytest.mark.parametrize("dtype", sorted(NAMES))
def test_narrow_copies_add_one_path_and_change_nothing_else(dtype):
    """The narrow configs render the plain source plus the half-aligned checks and one copy path per operand;
    the plain configs do not mention it (their source, and so the shipped databases' columns, stay as timed)."""
    spec = kernels.get("matmul")
    for name in NAMES[dtype]:
        plain = spec.render(spec.space.named(name), dtype, "nn")
        narrow = spec.render(_narrow(name), dtype, "nn")
        assert "narrow_ok" not in plain and narrow.count("_narrow_ok = (") == 2
        assert narrow.count("_narrow_ok &&") == 2  # A's path and B's
        width = 8 if dtype == "float32" else 4  # bytes per narrow copy: two elements
        assert f"copy_async<{width}>" in narrow
        # every line of the plain source but the config's own comment
        assert {line for line in plain.splitlines() if not line.startswith("// config:")} <= set(narrow.splitlines())


def test_narrow_copies_need_four_element_vectors():
    space = kernels.get("matmul").space
    problem = Problem(PROFILES["h100"], "float32", "nn")
    assert space.is_feasible(_narrow("tf32x3-64"), problem)
    two = _narrow("tf32x3-64", VEC=2)
    assert not space.is_feasible(two, problem)
    assert any("narrow copies" in v for v in map(str, space.violations(two, problem)))
    with pytest.raises(AutotileError):  # the presplit loader's workspace rows are always aligned
        space.check(space.with_overrides(space.named("wgmma-128-presplit"), {"NARROW_COPIES": True}), problem)


LAYOUTS = ("nn", "nt", "tn", "tt")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_narrow_copies_compile_without_spills(layout):
    """Every layout (the narrow copies follow each operand's contiguous dimension), batched too, for sm_90; a
    different tile in each layout (a compile is about a second: the suite stays fast)."""
    for dtype, names in NAMES.items():
        name = names[LAYOUTS.index(layout) % len(names)]
        for kernel in ("matmul", "bmm"):
            spec = kernels.get(kernel)
            usage = build.compile(spec.render(_narrow(name), dtype, layout), "sm_90").usage(f"autotile_{kernel}")
            assert usage is not None and usage.spill_stores == 0, (kernel, name, dtype, layout, usage)


def test_narrow_wgmma_loads_add_one_path_and_compile_without_spills():
    """wgmma: the narrow configs render the plain source plus a guard-free path per operand; every layout,
    batched too, compiles for sm_90a without spills."""
    for kernel in ("matmul", "bmm"):
        spec = kernels.get(kernel)
        for name in WGMMA:
            for i, layout in enumerate(LAYOUTS):
                plain = spec.render(spec.space.named(name), "float32", layout)
                narrow = spec.render(_narrow(name), "float32", layout)
                assert "narrow_ok" not in plain and narrow.count("_narrow_ok = (") == 2
                assert {line for line in plain.splitlines() if not line.startswith("// config:")} <= set(
                    narrow.splitlines())
                if WGMMA[i % len(WGMMA)] == name:  # one compile per layout and kernel
                    usage = build.compile(narrow, "sm_90a").usage(f"autotile_{kernel}")
                    assert usage is not None and usage.spill_stores == 0, (kernel, name, layout, usage)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
def test_narrow_copies_match_reference(layout):
    """Leading dimensions 2 mod 4 (the narrow copies inside the matrix, single elements at its edges), odd ones
    (single elements throughout) and multiples of 4 (whole vectors), single and batched, output poisoned."""
    from test_gpu import _check_configs

    shapes = [(130, 134, 258), (67, 258, 130), (256, 262, 1026), (1, 2, 2), (33, 66, 98), (64, 65, 100)]
    failures = []
    for dtype, names in NAMES.items():
        configs = [_narrow(name) for name in names]
        failures += _check_configs("matmul", dtype, layout, configs, shapes)
        failures += _check_configs("bmm", dtype, layout, configs[:2], [(3, 66, 130, 258), (2, 33, 62, 94)])
    from autotile.runtime.device import live_device

    if live_device().compute_capability == (9, 0):  # wgmma
        wgmma = [_narrow(name) for name in WGMMA]
        failures += _check_configs("matmul", "float32", layout, wgmma, shapes + [(200, 390, 514)])
        failures += _check_configs("bmm", "float32", layout, wgmma, [(3, 66, 130, 258), (2, 130, 262, 98)])
    assert not failures
