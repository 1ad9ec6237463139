"""The float32 matmul precision setting (`autotile.dispatch.precision`): its values, the process-wide default and
its environment variable, what each class allows, the space it leaves the tuner, and the library's
`precision=` argument and memo. No GPU."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

import autotile
from autotile.codegen import kernels
from autotile.codegen.limits import PROFILES
from autotile.dispatch import precision
from autotile.errors import AutotileError, InvalidValueError
from autotile.library import calls as ops

REPO = Path(__file__).resolve().parents[1]
H100 = PROFILES["h100"]


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text, text
    return text


# -- the setting ------------------------------------------------------------------------------------------

def test_default_is_high_and_set_get_round_trip():
    assert autotile.get_float32_matmul_precision() == "high"
    for setting in ("highest", "medium", "high"):
        autotile.set_float32_matmul_precision(setting)
        assert autotile.get_float32_matmul_precision() == setting
        assert precision.resolve(None) == setting


@pytest.mark.parametrize("bad", ["bogus", "HIGHEST", " high", "", None, 1, True])
def test_a_bad_setting_is_a_typed_one_line_error_naming_the_value_and_the_choices(bad):
    with pytest.raises(InvalidValueError) as info:
        autotile.set_float32_matmul_precision(bad)
    text = one_line(info.value)
    assert repr(bad) in text and "highest, high, medium, emulated" in text
    assert isinstance(info.value, AutotileError) and isinstance(info.value, ValueError)
    assert autotile.get_float32_matmul_precision() == "high"  # unchanged


def test_resolve_checks_and_names_the_option():
    assert precision.resolve("highest") == "highest"
    with pytest.raises(InvalidValueError,
                       match=r"^--precision 'fast' is not one of highest, high, medium, emulated$"):
        precision.resolve("fast", name="--precision")


def test_the_environment_variable_is_the_initial_default_read_once(monkeypatch):
    monkeypatch.setenv(precision.ENV_VAR, " Highest ")  # typed in a shell: case and blanks do not matter
    precision._reset()
    assert autotile.get_float32_matmul_precision() == "highest"
    monkeypatch.setenv(precision.ENV_VAR, "medium")  # read once: a later change is not seen
    assert autotile.get_float32_matmul_precision() == "highest"
    autotile.set_float32_matmul_precision("high")  # the function wins over the variable
    assert autotile.get_float32_matmul_precision() == "high"


def test_a_bad_environment_variable_is_a_one_line_error_naming_it(monkeypatch):
    monkeypatch.setenv(precision.ENV_VAR, "fp16")
    precision._reset()
    with pytest.raises(InvalidValueError) as info:
        autotile.get_float32_matmul_precision()
    assert one_line(info.value) == f"{precision.ENV_VAR}='fp16' is not one of highest, high, medium, emulated"
    with pytest.raises(InvalidValueError, match=precision.ENV_VAR):
        precision.resolve(None)
    assert precision.resolve("high") == "high"  # a call's own setting does not need the variable
    autotile.set_float32_matmul_precision("highest")  # and setting it mends the process
    assert autotile.get_float32_matmul_precision() == "highest"


def test_setting_from_many_threads_leaves_one_of_the_values():
    barrier = threading.Barrier(8)

    def worker(i: int) -> None:
        barrier.wait()
        for _ in range(200):
            autotile.set_float32_matmul_precision(precision.SETTINGS[i % 3])
            assert autotile.get_float32_matmul_precision() in precision.SETTINGS

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert autotile.get_float32_matmul_precision() in precision.SETTINGS


# -- classes --------------------------------------------------------------------------------------------

def test_what_each_setting_allows():
    table = {(s, c): precision.allows(s, c) for s in precision.SETTINGS for c in precision.CLASSES}
    assert table == {("highest", "highest"): True, ("highest", "high"): False,
                     ("high", "highest"): True, ("high", "high"): True,
                     ("medium", "highest"): True, ("medium", "high"): True,
                     ("emulated", "highest"): True, ("emulated", "high"): True}
    with pytest.raises(InvalidValueError, match="'medium'"):  # a setting, never what a kernel needs
        precision.allows("high", "medium")
    assert [precision.loosest(s) for s in precision.SETTINGS] == ["highest", "high", "high", "high"]


def test_what_a_config_needs():
    space = kernels.get("matmul").space
    tf32x3, simt = dict(space.named("tf32x3-128")), dict(space.named("safe-default"))
    assert precision.needed("matmul", "float32", tf32x3) == "high"
    assert precision.needed("matmul", "float32", simt) == "highest"
    assert precision.needed("matmul", "float32", tf32x3, "cublas") == "highest"  # cuBLAS runs, not the config
    assert precision.needed("matmul", "float64", tf32x3) == "highest"
    assert precision.needed("matmul", "float32", {"BM": 64}) == "highest"  # made before MATH existed: SIMT
    assert precision.needed("matvec", "float32", dict(kernels.get("matvec").space.named("warp-per-row"))) == "highest"
    assert precision.needed("matmul", "float32", None) == "highest"
    with pytest.raises(InvalidValueError) as info:
        precision.needed("matmul", "float32", {"MATH": "bf16x1"})
    assert "'bf16x1'" in one_line(info.value) and "simt, tf32x3" in str(info.value)
    # Every MATH value of the space has a class.
    assert set(space.params["MATH"].choices) == set(precision.MATH_CLASS)


def test_highest_narrows_the_space_to_ieee_math_through_restricted():
    space = kernels.get("matmul").space
    narrow = precision.restricted(space, "float32", "highest")
    # dmma: IEEE float64, infeasible on float32; skinny: FP32 FMAs
    assert narrow.params["MATH"].choices == ("simt", "dmma", "skinny")
    assert narrow.named_configs and not any(c["MATH"] == "tf32x3" for c in narrow.named_configs.values())
    assert "safe-default" in narrow.named_configs
    for setting in ("high", "medium"):
        assert precision.restricted(space, "float32", setting) is space
    assert precision.restricted(space, "float64", "highest") is space  # tf32x3 is float32 only anyway
    matvec = kernels.get("matvec").space
    assert precision.restricted(matvec, "float32", "highest") is matvec  # no MATH: nothing to narrow
    only_tf32x3 = space.restricted({"MATH": "tf32x3"})
    with pytest.raises(InvalidValueError) as info:
        precision.restricted(only_tf32x3, "float32", "highest")
    assert "'highest' allows MATH simt, dmma, skinny only" in one_line(info.value) and "tf32x3" in str(info.value)


def test_applies_to_float32_matmul_only():
    assert precision.applies("matmul", "float32")
    assert not precision.applies("matmul", "float64")
    assert not precision.applies("matvec", "float32")


def test_importing_autotile_imports_neither_cupy_nor_torch(tmp_path):
    code = ("import sys, autotile\n"
            "autotile.set_float32_matmul_precision('highest')\n"
            "assert autotile.get_float32_matmul_precision() == 'highest'\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('cupy', 'torch', 'optuna')))\n")
    env = dict(os.environ, PYTHONPATH=str(REPO), AUTOTILE_CACHE_DIR=str(tmp_path / "cache"))
    env.pop(precision.ENV_VAR, None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                          check=True, timeout=120)
    assert done.stdout.strip() == "[]"


# -- the library ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("call", ["matmul", "matvec"])
def test_library_bad_precision_is_a_one_line_error_before_anything_else(monkeypatch, call):
    def no_cupy():
        raise AssertionError("CuPy was asked for before the precision was checked")

    monkeypatch.setattr(ops, "_cupy", no_cupy)
    with pytest.raises(InvalidValueError) as info:
        getattr(autotile, call)(object(), object(), precision="bogus")
    assert one_line(info.value) == "precision 'bogus' is not one of highest, high, medium, emulated"


@pytest.fixture
def fake_library(monkeypatch):
    """`ops._prepare` with a stand-in GPU: records what `select` was asked, prepares nothing real."""
    import autotile.dispatch.select as select_mod

    asked: list[tuple[str, str | None]] = []
    runtime = types.SimpleNamespace(getDevice=lambda: 0)
    monkeypatch.setattr(ops, "_cupy", lambda: types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime)))
    monkeypatch.setattr(ops, "_device", lambda device_id: H100)
    monkeypatch.setattr(autotile.dispatch.first_call, "_enabled", False)

    def select(key, device, cache=None, precision=None):
        asked.append((key.kernel, precision))
        impl = types.SimpleNamespace(prepare=lambda key: types.SimpleNamespace(run=lambda arrays, out: None))
        return types.SimpleNamespace(source="exact", tuned_here=True, implementation_object=lambda: impl,
                                     precision=precision)

    monkeypatch.setattr(select_mod, "select", select)
    ops.forget()
    yield asked
    ops.forget()


def test_the_memo_is_keyed_by_the_setting(fake_library):
    shape = (64, 64, 64)
    first = ops._prepare("matmul", "float32", "nn", shape, "highest")
    assert ops._prepare("matmul", "float32", "nn", shape, "highest") is first  # memoized
    other = ops._prepare("matmul", "float32", "nn", shape, "high")
    assert other is not first
    assert fake_library == [("matmul", "highest"), ("matmul", "high")]
    # None is the process-wide setting, read when the call is made, not when the module was imported.
    autotile.set_float32_matmul_precision("highest")
    assert ops._prepare("matmul", "float32", "nn", shape) is first
    autotile.set_float32_matmul_precision("high")
    assert ops._prepare("matmul", "float32", "nn", shape) is other
    assert len(fake_library) == 2
    assert ops.selection_for("matmul", "float32", "row", shape, precision="highest") is first.selection
    with pytest.raises(InvalidValueError, match="'low'"):
        ops.selection_for("matmul", "float32", "row", shape, precision="low")
