"""The compiled lookup of repeated calls on torch tensors: a C++ table beside the library's Python one.

A repeated `autotile.matmul` or `matvec` call is found by its operands' signature (sizes, strides, dtype,
device, `out`'s, the precision setting). Read through torch's Python bindings, that signature costs a dozen
attribute reads, 1.4-4.2 us a call on H100 hosts: where cuBLAS is the choice and the library hands the
call to torch's own operator, that is all autotile adds to torch's call. `torch_lookup.cpp` reads the same
signature from the tensors in C++ (about 0.2 us) and holds, per signature, what the Python path memoized
(`autotile.library.calls`): its repeated call, and where torch's operator computes the call (a cuBLAS pick,
`TorchFramework.native_op`), that operator, called through ATen; and what it can make itself
(`CompiledLaunch`): a generated kernel's launch (the output allocated through ATen, three addresses written,
cuLaunchKernel on torch's current stream) or autotile's own cuBLAS call on a handle of the table's. The Python
table stays the reference: every entry here mirrors one there, and a call this table does not know (a first
call, a CuPy array, a tensor autograd must see, a named stream) goes the Python way.

The extension is built once per machine and torch (by the C++ compiler, ``$CXX`` or ``c++``, against the
installed torch's headers and Python's: about 7 s of one core) in a background thread, started by the
first repeated call on torch tensors; calls take the Python path until it is loaded. It is kept in the
compile cache's folder (`autotile.codegen.compile_cache.root`, `host/`), named by a hash of its source,
the command, torch's version and place and Python's. Where it cannot be built (no compiler, no Python
headers) or loaded, the Python path serves every call and `status()` says why.
``AUTOTILE_COMPILED_LOOKUP=off`` turns it off.

Importing this module imports nothing heavy; torch is imported by the build, which only a torch call starts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from autotile.codegen import compile_cache
from autotile.environment import env_flag

if TYPE_CHECKING:
    from autotile.runtime.cublas import PackedCublasCall
    from autotile.runtime.impl import PackedLaunch

ENV_VAR = "AUTOTILE_COMPILED_LOOKUP"
SOURCE = Path(__file__).with_name("torch_lookup.cpp")
MODULE_NAME = "autotile_torch_lookup"  # the extension's PyInit_ name
HOST_DIR = "host"  # under the compile cache's root: what the host's compiler built
BUILD_TIMEOUT_S = 300.0

# The codes `torch_lookup.cpp` reads (its Op and Guard enums, and a call's kernel).
MATMUL, MATVEC = 0, 1
KERNELS = {"matmul": MATMUL, "matvec": MATVEC}
OPS = {"mm": 1, "bmm": 2, "mv": 3, "matmul": 4}  # 0: only the Python path's repeated call
GUARDS = {None: 0, "tf32": 1, "fp16_accumulation": 2}


@dataclasses.dataclass(frozen=True)
class CompiledLaunch:
    """What the compiled table makes of one signature without Python: a generated kernel's launch
    (`PackedLaunch`) or autotile's cuBLAS call (`PackedCublasCall`, on the table's own handle,
    `autotile.runtime.cublas.table_handle`)."""

    packed: PackedLaunch | PackedCublasCall
    swapped: bool  # the call's operands come in the other order (a one-row matmul run as a matvec)
    out_shape: tuple[int, ...]  # the output allocated where the call gives no `out`
    out_dtype: str
    device: int


# The loaded extension, once ready: `autotile.library.api` reads this per call (None: the Python path).
extension: Any = None

_lock = threading.Lock()
_state = "idle"  # idle -> building -> ready | failed; "off" where the environment says so
_reason = ""
# signature -> (call, native, launch), as `register` takes them
_pending: dict[tuple[Any, ...], tuple[Callable[..., Any], tuple[str, str | None] | None, CompiledLaunch | None]] = {}
_settings: tuple[str, ...] = ()
_built = threading.Event()


def enabled() -> bool:
    """Whether ``$AUTOTILE_COMPILED_LOOKUP`` leaves the compiled lookup on (the default; a value that is not a
    boolean raises `InvalidValueError`, as every switch of the package does)."""
    return env_flag(ENV_VAR, default=True)


def accepts() -> bool:
    """Whether `register` keeps entries (the lookup is not off and its build did not fail): callers skip the
    work of describing an entry's launch otherwise."""
    global _state
    with _lock:
        if _state == "idle" and not enabled():
            _state = "off"
        return _state in ("idle", "building", "ready")


def status() -> tuple[str, str]:
    """(state, why): "idle" (no repeated torch call yet), "building", "ready", "failed" (why: the
    compiler's or loader's one line) or "off"."""
    return _state, _reason


def register(signature: tuple[Any, ...], call: Callable[..., Any], native: tuple[str, str | None] | None,
             settings: tuple[str, ...], launch: CompiledLaunch | None = None) -> None:
    """Mirror one entry of the library's Python table: `signature` is its key (kernel, the operands'
    `TorchFramework.read_pair`, out's signature or None, the setting), `call` its repeated call, `native`
    torch's operator and the switch that guards it (`TorchFramework.native_op`) where that computes the call,
    `launch` the generated kernel's launch or cuBLAS call where the table can make it. `settings`: every
    setting's name (a key holds the setting's index). The first registration starts the build; until the
    extension is loaded, entries wait here."""
    global _state, _settings
    with _lock:
        if extension is not None:
            _insert(extension, signature, call, native, launch)
            return
        if _state == "idle":
            if not enabled():
                _state = "off"
                return
            _state, _settings = "building", settings
            start = True
        elif _state == "building":
            start = False
        else:  # off, or failed: the Python path serves every call
            return
        _pending[signature] = (call, native, launch)
    if not start:
        return
    threading.Thread(target=_build_and_load, name="autotile-torch-lookup", daemon=True).start()


def clear() -> None:
    """Drop every entry (the library forgot its memoized calls)."""
    with _lock:
        _pending.clear()
        if extension is not None:
            extension.clear()


def wait(timeout: float | None = None) -> bool:
    """Wait for a started build to end (benchmarks and tests: so that they time the steady state); returns
    whether the extension is loaded."""
    if _state in ("building", "ready", "failed"):
        _built.wait(timeout)
    return extension is not None


def _insert(ext: Any, signature: tuple[Any, ...], call: Callable[..., Any], native: tuple[str, str | None] | None,
            launch: CompiledLaunch | None) -> None:
    kernel, pair, out_signature, setting = signature
    op, guard = native if native is not None else (None, None)
    ext.register(KERNELS[kernel], pair, out_signature, setting, call, OPS.get(op or "", 0), GUARDS[guard],
                 None if launch is None else _launch_tuple(launch))


def _launch_tuple(launch: CompiledLaunch) -> tuple[str, tuple[Any, ...]]:
    """`launch` as `torch_lookup.cpp`'s `register` reads it: ("kernel", what `packed_launch` reads) or
    ("cublas", what `packed_blas` reads)."""
    import torch

    from autotile.runtime.cublas import PackedCublasCall

    dtype = getattr(torch, launch.out_dtype)
    if isinstance(launch.packed, PackedCublasCall):
        c = launch.packed
        a_first = (c.first_operand == 0) != launch.swapped  # the call's A is the pointers' first unless swapped
        return ("cublas", (c.routine, c.kinds, c.words, c.first, c.second, c.out, a_first, c.set_stream,
                           c.set_workspace, launch.out_shape, dtype, launch.device))
    p = launch.packed
    assert not isinstance(p, PackedCublasCall)
    return ("kernel", (p.function, p.grid, p.block, p.shared_bytes, p.image, p.offsets, launch.swapped, p.zero_bytes,
                       launch.out_shape, dtype, launch.device))


def build_ahead() -> str:
    """Build the extension now for the installed torch (`autotile cache compile`), so that no process builds it
    at its first repeated call: one line saying what was done, or why not."""
    if not enabled():
        return f"the compiled lookup of torch calls is off (${ENV_VAR})"
    if importlib.util.find_spec("torch") is None:
        return "the compiled lookup of torch calls: not built (torch is not installed)"
    import torch

    start = time.perf_counter()
    try:
        path = build(torch)
    except Exception as exc:  # the library still serves every call, through the Python lookup
        return f"the compiled lookup of torch calls could not be built: {_one_line(exc)}"
    return f"the compiled lookup of torch calls: {path} ({time.perf_counter() - start:.1f} s)"


def _build_and_load() -> None:
    global extension, _state, _reason
    try:
        import torch

        from autotile.runtime import cublas

        path = build(torch)
        ext = _load(path)
        ext.init((torch.Tensor, torch.nn.Parameter), _settings, cublas.table_workspace)
    except Exception as exc:  # any failure leaves the Python path serving every call
        with _lock:
            _state, _reason = "failed", _one_line(exc)
            _pending.clear()
        _built.set()
        return
    with _lock:
        for signature, (call, native, launch) in _pending.items():
            _insert(ext, signature, call, native, launch)
        _pending.clear()
        extension, _state = ext, "ready"
    _built.set()


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"


def _torch_version(torch: Any) -> int:
    """major * 100 + minor of `torch` (2.11.0+cu130 -> 211): the source's version tests read it."""
    parts = str(torch.__version__).split("+")[0].split(".")
    return int(parts[0]) * 100 + int("".join(c for c in parts[1] if c.isdigit()) or 0)


def standards(torch: Any) -> tuple[str, ...]:
    """The C++ standards to try, in order: torch's headers need C++20 from 2.12 on (2.14's fail under C++17)
    and built under C++17 before (2.11's, measured)."""
    return ("c++20", "c++17") if _torch_version(torch) >= 212 else ("c++17", "c++20")


def build_command(torch: Any, source: Path, target: Path, standard: str) -> list[str]:
    """The compiler's command line: a shared object against `torch`'s headers and libraries and this
    Python's headers, with torch's C++ ABI, under the C++ `standard`."""
    torch_dir = Path(torch.__file__).parent
    include = torch_dir / "include"
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    return [os.environ.get("CXX", "c++"), "-O2", f"-std={standard}", "-shared", "-fPIC", "-w",
            f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-DTORCH_ASSERT_ONLY_METHOD_OPERATORS",
            f"-DAUTOTILE_TORCH_VERSION={_torch_version(torch)}",
            f"-I{sysconfig.get_paths()['include']}", f"-I{include}",
            f"-I{include / 'torch' / 'csrc' / 'api' / 'include'}",
            str(source), "-o", str(target), f"-L{torch_dir / 'lib'}",
            "-ltorch_python", "-ltorch", "-ltorch_cpu", "-lc10", f"-Wl,-rpath,{torch_dir / 'lib'}"]


def build(torch: Any) -> Path:
    """The extension for `torch` and this Python: the one built before, or built now (atomically: a
    temporary file renamed into place), by one process at a time (a file lock: the ranks of a job started
    together build it once, not once each, at about a gigabyte of the compiler's memory apiece). Raises
    RuntimeError with the compiler's error lines."""
    python_headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not python_headers.is_file():
        raise RuntimeError(f"no Python headers ({python_headers} is missing: install python3-dev)")
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    source = SOURCE.read_bytes()
    folder_root = compile_cache.root()
    folder = (folder_root / HOST_DIR) if folder_root is not None else Path(tempfile.mkdtemp(prefix="autotile-"))
    digest = hashlib.sha256()
    command = " ".join(build_command(torch, SOURCE, Path("x"), standards(torch)[0]))
    for part in (source, str(torch.__version__).encode(), str(Path(torch.__file__).parent).encode(),
                 sys.version.encode(), suffix.encode(), command.encode()):
        digest.update(part)
        digest.update(b"\0")
    target = folder / f"torch_lookup-{digest.hexdigest()[:32]}{suffix}"
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock

    with FileLock(str(target) + ".lock", timeout=BUILD_TIMEOUT_S):
        if not target.is_file():  # another process may have built it while this one waited
            _compile(torch, folder, target)
    return target


def _compile(torch: Any, folder: Path, target: Path) -> None:
    """The compiler's run into a temporary file of `folder`, renamed to `target` once whole."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        for standard in standards(torch):
            done = subprocess.run(build_command(torch, SOURCE, Path(tmp), standard), capture_output=True, text=True,
                                  timeout=BUILD_TIMEOUT_S)
            if done.returncode == 0:
                break
        else:
            errors = [line for line in (done.stderr or done.stdout).splitlines() if "error" in line]
            raise RuntimeError(f"the C++ compiler failed ({done.returncode}): {' '.join(errors[:2])[:300]}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"{path} is not an extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _reset_for_tests() -> None:
    """Back to the state of a fresh process (tests)."""
    global extension, _state, _reason
    with _lock:
        if extension is not None:
            extension.clear()
        extension, _state, _reason = None, "idle", ""
        _pending.clear()
        _built.clear()


__all__ = ["ENV_VAR", "GUARDS", "KERNELS", "MATMUL", "MATVEC", "OPS", "CompiledLaunch", "accepts", "build",
           "build_ahead", "build_command", "clear", "enabled", "extension", "register", "status", "wait"]
