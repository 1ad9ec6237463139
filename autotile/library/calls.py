"""The tuned-kernel library: `matmul(A, B)` and `matvec(A, x)` on CuPy arrays and PyTorch CUDA tensors.

What a call runs (a generated config, or cuBLAS) is chosen by the selection chain (`autotile.dispatch.select`:
exact tuned shape, the shape database's model, nearest tuned shape, the device's default, the built-in
default) and prepared through the one implementation interface (`autotile.runtime.impl`). Everything a call needs
after the first (the selection, the compiled kernel, its launch geometry) is memoized per device and
problem, so the host work per call is reading the operands, a dictionary lookup and one launch.

Same type in and out: torch tensors give a torch tensor, CuPy arrays a CuPy array (`autotile.runtime.operands`
reads both without conversion; other CUDA arrays go through CuPy). A call runs on the current stream of its
inputs' framework (torch's for tensors, CuPy's for arrays) or on `stream=`. With `out=` given, a call
neither allocates nor synchronises (a SPLIT_REDUCE=last_block kernel allocates its workspace on its first
call on a stream: warm up before a CUDA-graph capture, as for any library), so it can be captured in a CUDA
graph; split-K's zeroing runs on the same stream. Under torch.compile, use `autotile.torch`'s custom
operators.

Operands are read where they lie when each matrix is packed row-major or column-major (`autotile.library.plan`:
`x @ W.T` is layout nt, no copy); batches (3-D and more) run as one batched launch, a 2-D operand broadcast;
a 2-D matmul of one row or one column runs as the matvec it is (`as_matvec`). Other strided views are
copied to row-major first (one extra pass over the data); `out` must be C-contiguous, as the kernel writes it
directly.

Float32 matmul runs under a precision setting, in PyTorch's words (`autotile.dispatch.precision`): a call's
``precision=`` ("highest", "high" or "medium"), else the process-wide setting
(`autotile.set_float32_matmul_precision`, ``$AUTOTILE_FLOAT32_MATMUL_PRECISION``, else "high"). Under
"highest" only IEEE FP32 arithmetic runs (SIMT kernels, cuBLAS SGEMM); "high" and "medium" also allow the
FP32-level tf32x3 tensor-core kernels. For float64 and matvec every kernel is IEEE: the setting is checked
and changes nothing. cuBLAS runs without TF32 whatever PyTorch's `allow_tf32` says.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from autotile.codegen import dtypes as dtypes_mod
from autotile.codegen.dtypes import DTYPE_NAMES
from autotile.codegen.problem import MATVEC_DTYPES, MAX_DIM, ProblemKey, as_matvec, canonical_layout
from autotile.dispatch import events, first_call, shape_log
from autotile.dispatch import precision as precision_mod
from autotile.errors import ArgumentError, DeviceUnavailableError
from autotile.library import padding
from autotile.library.plan import matrix_order, plan_matmul
from autotile.runtime import torch_lookup
from autotile.runtime.cublas import CublasCall
from autotile.runtime.impl import CublasRunner, Runner
from autotile.runtime.operands import (
    OWN_TYPES,
    Framework,
    Operand,
    Repeat,
    as_framework,
    framework_by_type,
    is_capturing,
    stream_pointer,
)

if TYPE_CHECKING:  # the selection chain reads the cache (filelock, platformdirs): imported on first call
    from autotile.dispatch.select import Selection

_SUPPORTED = DTYPE_NAMES
# CuPy (like NumPy) has no bfloat16: bfloat16 comes as torch tensors.
_SUPPORTED_TEXT = ", ".join(n for n in _SUPPORTED if n != "bfloat16") + " and (torch tensors) bfloat16"
_SCALED_CALL = "autotile.scaled_matmul(A, B, scale_a, scale_b)"
MAX_GRID_Z = 65535  # CUDA's limit on gridDim.z, where a batch's matrices (times their K splits) go


@dataclasses.dataclass
class _Prepared:
    runner: Runner
    selection: Selection
    # where cuBLAS won: its routine called on pointers (`autotile.runtime.cublas`), capturable in a CUDA graph
    direct: CublasCall | None = None
    # the selection chain's choice run instead of tuning at first call, because the call came inside a CUDA-graph
    # capture: not memoized, so that the first call outside a capture tunes the problem
    provisional: bool = False

    def call(self, framework: Framework, inputs: tuple[Any, ...], out: Any, out_nbytes: int, dtype: str,
             stream_ptr: int, batch_strides: tuple[int, ...] = ()) -> None:
        """Compute `out` (`out_nbytes` bytes of `dtype`) from `inputs`, arrays of `framework`, on the stream
        `stream_ptr` (the arrays' device current)."""
        pointer = framework.pointer
        self.call_pointers(tuple(map(pointer, inputs)), pointer(out), out_nbytes, dtype, stream_ptr,
                           framework.allocate, batch_strides)

    def call_pointers(self, pointers: tuple[int, ...], out_ptr: int, out_nbytes: int, dtype: str, stream_ptr: int,
                      allocate: Any, batch_strides: tuple[int, ...] = ()) -> None:
        """`call` on device pointers; `allocate` as `Framework.allocate` (a split-K workspace)."""
        if self.direct is not None:  # cuBLAS on the pointers, no second framework's dispatch
            self.direct(pointers, out_ptr, stream_ptr, batch_strides)
            return
        runner: Any = self.runner  # a KernelRunner (the Runner protocol names only `run`)
        runner.launch(pointers, out_ptr, out_nbytes, dtype, stream_ptr, batch_strides, allocate)


_lock = threading.Lock()
_prepared: dict[tuple[Any, ...], _Prepared] = {}
_padded_plans: dict[tuple[Any, ...], _Prepared | None] = {}  # `padded_plan`'s decisions
_matvec_plans: dict[tuple[Any, ...], tuple[str, tuple[int, int], bool] | None] = {}  # `_matvec_plan`'s
# Calls by signature (each array's `Framework.signature`, out's, the setting) that needed no copy: what
# they run and how, so that a repeated call only reads pointers and launches.
_calls: dict[tuple[Any, ...], Repeat] = {}
_device_limits: dict[int, Any] = {}


def _nbytes(op: Operand) -> int:
    return math.prod(op.shape) * dtypes_mod.itemsize(op.dtype)


def _device(device_id: int) -> Any:
    limits = _device_limits.get(device_id)
    if limits is None:
        from autotile.runtime.device import live_device

        limits = _device_limits[device_id] = live_device(device_id)
    return limits


def _prepare(kernel: str, dtype: str, layout: str, shape: tuple[int, ...], setting: str | None = None,
             device_id: int | None = None, stream_ptr: int | None = None) -> _Prepared:
    """What runs `kernel` on this problem under the precision `setting` (resolved by the caller; None: the
    process-wide one) on `device_id` (None: CuPy's current device), prepared once. `stream_ptr`: the stream
    the call runs on, where known; while it is capturing a CUDA graph, tuning at first call waits for a call
    outside the capture (its timing synchronises the GPU, which would invalidate the caller's capture)."""
    # The per-call path: a dictionary lookup on plain values (a ProblemKey, which validates, is made only on
    # the first call of a problem).
    if setting is None:
        setting = precision_mod.get_float32_matmul_precision()
    if device_id is None:
        device_id = _device_id(_cupy().cuda.runtime)
    memo_key = (device_id, kernel, dtype, layout, shape, setting)
    prepared = _prepared.get(memo_key)
    if prepared is not None:
        return prepared
    if max(shape) > MAX_DIM:
        raise ArgumentError(f"size {max(shape)} exceeds the 32-bit index range of the generated kernels "
                            f"({MAX_DIM})")
    from autotile.dispatch.select import select

    key = ProblemKey(kernel, dtype, layout, shape)
    device = _device(device_id)
    selection = select(key, device, precision=setting)
    if not selection.tuned_here:  # listed for `autotile batch` where the program records its problems
        shape_log.note(key)
    tune_here = first_call.tuner() if first_call.enabled() and not selection.tuned_here else None
    provisional = tune_here is not None and stream_ptr is not None and is_capturing(stream_ptr)
    if tune_here is not None and not provisional:  # plugged in by the tuning layer (autotile/__init__.py)
        from autotile.dispatch.cache import TuningCache

        selection = tune_here(key, device, TuningCache(), selection, setting)
    runner = selection.implementation_object().prepare(key)  # cuBLAS takes the operands as the caller gave them
    launch = getattr(runner, "geometry", None)
    if launch is not None and launch.grid[2] > MAX_GRID_Z:
        raise ArgumentError(f"a batch of {shape[0]} matrices times {launch.grid[2] // shape[0]} K split(s) exceeds "
                            f"CUDA's {MAX_GRID_Z} blocks along grid z; split the batch")
    # the 8-bit floats' vendor call is torch._scaled_mm, which `scaled_matmul` makes itself
    vendor = isinstance(runner, CublasRunner) and not dtypes_mod.get(dtype).scaled
    prepared = _Prepared(runner, selection, direct=CublasCall(key, device_id) if vendor else None,
                         provisional=provisional)
    if not provisional:
        with _lock:
            _prepared[memo_key] = prepared
    return prepared


def _cupy() -> Any:
    from autotile.runtime.operands import _cupy as import_cupy

    return import_cupy()


def _check_dtypes(names: str, *ops: Operand) -> str:
    for name, op in zip(names, ops, strict=True):
        if op.dtype not in _SUPPORTED:
            raise ArgumentError(f"{name} has dtype {op.dtype}; autotile supports {_SUPPORTED_TEXT}")
    if len({op.dtype for op in ops}) > 1:
        raise ArgumentError(" and ".join(f"{name} is {op.dtype}" for name, op in zip(names, ops, strict=True))
                            + "; all must have the same dtype")
    if len({op.device for op in ops}) > 1:
        raise ArgumentError(" and ".join(f"{name} is on GPU {op.device}" for name, op in zip(names, ops, strict=True))
                            + "; all must be on the same GPU")
    return ops[0].dtype


def _output(framework: Framework, out: Any, shape: tuple[int, ...], dtype: str, device: int) -> Operand:
    """The caller's `out`, checked, or a new array of the inputs' framework."""
    if out is None:
        return framework.operand(framework.empty(shape, dtype, device), "out")
    op = as_framework(framework, out, "out")
    if op.shape != shape or op.dtype != dtype:
        raise ArgumentError(f"out has shape {op.shape} and dtype {op.dtype}; expected {shape} {dtype}")
    if op.device != device:
        raise ArgumentError(f"out is on GPU {op.device} and the inputs on GPU {device}")
    expected = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
    if any(n > 1 and s != e for n, s, e in zip(shape, op.strides, expected, strict=True)):
        raise ArgumentError("out must be C-contiguous: the kernel writes it in place")
    return op


def _zeros(framework: Framework, out: Any, shape: tuple[int, ...], dtype: str, device: int) -> Any:
    if out is None:
        return framework.zeros(shape, dtype, device)
    op = _output(framework, out, shape, dtype, device)
    framework.fill_zero(op.obj)
    return op.obj


def _stream(framework: Framework, stream: Any, device: int) -> int:
    return framework.current_stream(device) if stream is None else stream_pointer(stream)


_runtime: Any = None  # CuPy's CUDA runtime module, imported by the first call


def _current_device() -> int:
    """CuPy's current device, through the runtime module found once (the per-call path asks every call)."""
    global _runtime
    if _runtime is None:
        _runtime = _cupy().cuda.runtime
    return _device_id(_runtime)


def _device_id(runtime: Any) -> int:
    """`runtime.getDevice()`; `DeviceUnavailableError` in one line where there is no usable GPU."""
    try:
        return int(runtime.getDevice())
    except Exception as exc:  # CuPy's CUDARuntimeError: no GPU, or a driver too old for the runtime
        raise DeviceUnavailableError(f"no usable CUDA GPU: {' '.join(str(exc).split())}") from None


def _device_of(device: int) -> Any:
    """A context in which the CUDA runtime's current device is `device` (a kernel compiled and loaded there
    belongs to it)."""
    return contextlib.nullcontext() if _current_device() == device else _cupy().cuda.Device(device)


def _launch_on(device: int, prepared: _Prepared, *args: Any) -> None:
    """`prepared.call(*args)` with the CUDA runtime's current device set to `device` (the compiled kernel
    belongs to it), where it is not already: the common case costs one runtime query."""
    if _current_device() == device:
        prepared.call(*args)
    else:
        with _cupy().cuda.Device(device):
            prepared.call(*args)


@dataclasses.dataclass(frozen=True)
class _Call:
    """A call signature that needed no copy, checked, planned and prepared once: what a repeated call runs
    (everything but the arrays' pointers and the stream)."""

    prepared: _Prepared
    out_shape: tuple[int, ...]
    out_nbytes: int
    dtype: str  # the output's
    device: int
    batch_strides: tuple[int, ...]

    def run(self, framework: Framework, inputs: tuple[Any, ...], out: Any, stream: Any) -> Any:
        """The call on any device and stream, by the general path (`_repeat` makes the short one)."""
        c = out if out is not None else framework.empty(self.out_shape, self.dtype, self.device)
        stream_ptr = framework.current_stream(self.device) if stream is None else stream_pointer(stream)
        _launch_on(self.device, self.prepared, framework, inputs, c, self.out_nbytes, self.dtype, stream_ptr,
                   self.batch_strides)
        return c


def _repeat(framework: Framework, call: _Call) -> Repeat:
    """A signature's repeated call as one function with everything but the arrays and the stream bound:
    the output allocated (where no `out` is given), three pointers read, one launch. Where the current
    device is not the arrays', `call.run`."""
    device, strides, slow = call.device, call.batch_strides, call.run
    empty = framework.allocator(call.out_shape, call.dtype, device)
    current_stream = framework.stream_getter(device)
    pointer = framework.pointer_function()
    runner, direct = call.prepared.runner, call.prepared.direct
    if direct is None and hasattr(runner, "bound_launch"):  # a generated kernel (not a test's stand-in)
        go = runner.bound_launch(strides, call.out_nbytes, call.dtype, framework.allocate)

        def run_kernel(a: Any, b: Any, out: Any, stream: Any) -> Any:
            if _current_device() != device:
                return slow(framework, (a, b), out, stream)
            c = empty() if out is None else out
            go(pointer(a), pointer(b), pointer(c), current_stream() if stream is None else stream_pointer(stream))
            return c

        return run_kernel
    if direct is not None:

        def run_cublas(a: Any, b: Any, out: Any, stream: Any) -> Any:
            if _current_device() != device:
                return slow(framework, (a, b), out, stream)
            c = empty() if out is None else out
            direct((pointer(a), pointer(b)), pointer(c), current_stream() if stream is None else stream_pointer(stream),
                   strides)
            return c

        return run_cublas
    return lambda a, b, out, stream: slow(framework, (a, b), out, stream)


def _native_first(framework: Framework, call: _Call, kernel: str, dims: tuple[int, int],
                  run: Repeat) -> tuple[Repeat, tuple[str, str | None] | None]:
    """`run`, preceded where cuBLAS won by the framework's own call of the same product
    (`Framework.native_first`: torch.mm and friends, cuBLAS enqueued from C++ at less host cost than
    autotile's own call), which computes what `run` would; and that operator with its guarding switch
    (`Framework.native_op`), or None where `run` runs alone. `kernel` and `dims` are the user's call's
    ("matmul" or "matvec", its operands' dimensions): a one-row matmul that runs as a matvec (`as_matvec`)
    is still the user's matmul to torch."""
    if call.prepared.direct is None:
        return run, None
    first = framework.native_first(kernel, call.dtype, dims, run)
    return first, (framework.native_op(kernel, call.dtype, dims) if first is not run else None)


def _memoize(framework: Framework, signature: tuple[Any, ...], run: Repeat,
             native: tuple[str, str | None] | None = None, call: _Call | None = None, swapped: bool = False) -> None:
    """Keep `run` as the repeated call of `signature`; torch's signatures also go to the compiled lookup
    (`autotile.runtime.torch_lookup`), which `api.matmul` and `api.matvec` ask first, with `call`'s launch
    where the table can make it (`_compiled_launch`; `swapped`: the operands come in the other order)."""
    with _lock:
        _calls[signature] = run
    if framework.name == "torch" and torch_lookup.accepts():  # (off: no launch described for nothing)
        torch_lookup.register(signature, run, native, precision_mod.SETTINGS,
                              None if call is None else _compiled_launch(call, swapped))


def _compiled_launch(call: _Call, swapped: bool) -> torch_lookup.CompiledLaunch | None:
    """What the compiled lookup makes of `call` without Python: its generated kernel's launch as data
    (`KernelRunner.packed_launch`), or its cuBLAS call as data (`CublasCall.packed`); None where the launch needs
    Python (a workspace per stream, tensor maps, split kernels) or the runner is a test's stand-in."""
    runner: Any = call.prepared.runner
    direct: Any = call.prepared.direct
    if direct is not None:
        if not hasattr(direct, "packed"):  # a test's stand-in
            return None
        with _device_of(call.device):  # the compiled lookup's cuBLAS handle is made on the call's device
            packed = direct.packed(call.batch_strides)
    elif hasattr(runner, "packed_launch"):
        packed = runner.packed_launch(call.batch_strides, call.out_nbytes)
    else:
        return None
    return None if packed is None else torch_lookup.CompiledLaunch(packed, swapped, call.out_shape, call.dtype,
                                                                   call.device)


def _repeat_padded(framework: Framework, run: Callable[[int, int, int, int], None], out_shape: tuple[int, ...],
                   dtype: str, device: int) -> Repeat:
    """A signature's repeated call through the padded plan (`autotile.library.padding.PaddedCall`): the output
    allocated (where no `out` is given), three pointers read, the plan's launches."""
    empty = framework.allocator(out_shape, dtype, device)
    current_stream = framework.stream_getter(device)
    pointer = framework.pointer_function()

    def run_padded(a: Any, b: Any, out: Any, stream: Any) -> Any:
        with contextlib.nullcontext() if _current_device() == device else _device_of(device):
            c = empty() if out is None else out
            run(pointer(a), pointer(b), pointer(c), current_stream() if stream is None else stream_pointer(stream))
        return c

    return run_padded


def _planned(framework: Framework, a: Operand, b: Operand) -> tuple[Operand, Operand, Any, bool]:
    """(A, B, the plan, whether an operand was copied): A and B as the kernels read them, an operand whose
    strides no layout describes copied row-major first (`plan_matmul`)."""
    plan = plan_matmul(a.shape, a.strides, b.shape, b.strides)
    copied = plan.copy_a or plan.copy_b
    if copied:
        if plan.copy_a:
            a = framework.operand(framework.row_major(a.obj), "A")
        if plan.copy_b:
            b = framework.operand(framework.row_major(b.obj), "B")
        plan = plan_matmul(a.shape, a.strides, b.shape, b.strides)
    return a, b, plan, copied


def _matvec_plan(kernel: str, dtype: str, layout: str, shape: tuple[int, ...], setting: str,
                 device_id: int) -> tuple[str, tuple[int, int], bool] | None:
    """`as_matvec`, unless the matmul itself was tuned on this very shape (a record the user asked for
    wins); decided once per problem."""
    vector = as_matvec(kernel, dtype, layout, shape)
    if vector is None:
        return None
    memo_key = (device_id, kernel, dtype, layout, shape, setting)
    if memo_key not in _matvec_plans:
        from autotile.dispatch.select import select

        tuned = select(ProblemKey(kernel, dtype, layout, shape), _device(device_id), precision=setting).step == "exact"
        with _lock:
            _matvec_plans[memo_key] = None if tuned else vector
    return _matvec_plans[memo_key]


def _swapped(run: Repeat) -> Repeat:
    """A repeated call whose kernel takes the operands in the other order (`as_matvec`)."""
    return lambda a, b, out, stream: run(b, a, out, stream)


def repeated_call(A: Any, B: Any, out: Any, precision: str | None, kernel: str = "matmul") -> Repeat | None:
    """The per-call path of `autotile.matmul` (and, with `kernel` "matvec", of `matvec`): the call memoized
    for these arrays' signature (one read of both arrays, one lookup), or None where the general path must
    run (a first call, an array of a type not seen yet, a tensor that needs a gradient, a precision
    that is not a setting's name)."""
    framework = OWN_TYPES.get(type(A))
    if framework is None or OWN_TYPES.get(type(B)) is not framework:
        return None
    pair = framework.read_pair(A, B)
    if pair[-1]:  # autograd must see the call: the differentiable operator's
        return None
    setting = precision_mod.get_float32_matmul_precision() if precision is None else precision
    return _calls.get((kernel, pair, None if out is None else framework.signature(out), setting))


def matmul_no_autograd(A: Any, B: Any, out: Any = None, precision: str | None = None, stream: Any = None) -> Any:
    """`autotile.matmul` without the autograd check (`autotile.library.api.matmul` says what it takes): what
    the PyTorch operator runs."""
    setting = precision_mod.resolve(precision)  # checked first: a bad value is an error whatever the arrays
    framework = framework_by_type(A, B)
    # A repeated call of a known signature reads its arrays' signatures and pointers and launches;
    # everything else was checked and prepared by its first call (`repeated_call` is the same lookup).
    signature = ("matmul", framework.pair_signature(A, B), None if out is None else framework.signature(out),
                 setting)
    known = _calls.get(signature)
    if known is not None:
        return known(A, B, out, stream)
    a, b = as_framework(framework, A, "A"), as_framework(framework, B, "B")
    dtype = _check_dtypes("AB", a, b)
    if dtypes_mod.get(dtype).scaled:
        raise ArgumentError(f"{dtype} operands come with scales: call {_SCALED_CALL} (torch._scaled_mm's contract)")
    out_dtype = dtypes_mod.get(dtype).output_name  # int8's products are int32
    a, b, plan, copied = _planned(framework, a, b)
    if not plan.kernel:
        return _zeros(framework, out, plan.out_shape, out_dtype, a.device)
    c = _output(framework, out, plan.out_shape, out_dtype, a.device)
    stream_ptr = _stream(framework, stream, a.device)
    if setting == precision_mod.EMULATED and plan.kernel in ("matmul", "bmm"):
        from autotile.library import emulation

        if emulation_pays(plan.kernel, dtype, plan.layout, plan.shape, a.device):  # large: not memoized
            with _device_of(a.device):
                emulation.run_batch(framework, a, b, c, plan.layout, plan.shape, plan.batch_strides, stream_ptr,
                                    _int8_gemm(framework, a.device, stream_ptr))
            return c.obj
    memoize = not copied and signature[1] is not None and (out is None or signature[2] is not None)
    vector = _matvec_plan(plan.kernel, dtype, plan.layout, plan.shape, setting, a.device)
    if vector is not None:
        layout, shape, swapped = vector
        with _device_of(a.device):
            prepared = _prepare("matvec", dtype, layout, shape, setting, a.device, stream_ptr)
        call = _Call(prepared, plan.out_shape, _nbytes(c), out_dtype, a.device, ())
        inputs = (b.obj, a.obj) if swapped else (a.obj, b.obj)
        _launch_on(a.device, prepared, framework, inputs, c.obj, call.out_nbytes, out_dtype, stream_ptr)
        if memoize and not prepared.provisional:
            run = _swapped(_repeat(framework, call)) if swapped else _repeat(framework, call)
            _memoize(framework, signature, *_native_first(framework, call, "matmul", (len(a.shape), len(b.shape)), run),
                     call=call, swapped=swapped)
        return c.obj
    padded = padded_plan(plan.kernel, dtype, plan.layout, plan.shape, setting, a.device, stream_ptr)
    if padded is not None:
        with _device_of(a.device):  # the copy kernels are compiled and loaded there
            run = padding.PaddedCall(plan.layout, plan.shape, plan.batch_strides, dtype, a.device, padded,
                                     framework.allocate)
            run(a.ptr, b.ptr, c.ptr, stream_ptr)
        if memoize and not padded.provisional:
            _memoize(framework, signature, _repeat_padded(framework, run, plan.out_shape, out_dtype, a.device))
        return c.obj
    with _device_of(a.device):
        prepared = _prepare(plan.kernel, dtype, plan.layout, plan.shape, setting, a.device, stream_ptr)
    call = _Call(prepared, plan.out_shape, _nbytes(c), out_dtype, a.device, plan.batch_strides)
    _launch_on(a.device, prepared, framework, (a.obj, b.obj), c.obj, call.out_nbytes, out_dtype, stream_ptr,
               plan.batch_strides)
    # only signatures of the framework's own arrays that needed no copy (others convert every call)
    if memoize and not prepared.provisional:
        _memoize(framework, signature,
                 *_native_first(framework, call, "matmul", (len(a.shape), len(b.shape)), _repeat(framework, call)),
                 call=call)
    return c.obj


class _Int8Products:
    """The emulation's int8 products of one shape (M, N, K) in layout nt (A M x K and B N x K, both
    K-major): the library's own int8 matmul, called with device pointers (int32 sums), and where that is a
    generated kernel whose K splits, if any, are summed by the last block, the same kernel with each sum
    leaving as its residue modulo a modulus, an int8 (`residues`): a quarter of the bytes to write and to
    read back."""

    def __init__(self, prepared: _Prepared, shape: tuple[int, int, int], allocate: Any):
        self.prepared, self.shape, self.allocate = prepared, shape, allocate

    def __call__(self, pointers: tuple[int, int], out_ptr: int, out_nbytes: int, stream_ptr: int) -> None:
        self.prepared.call_pointers(pointers, out_ptr, out_nbytes, "int32", stream_ptr, self.allocate)

    def _direct_kernel(self) -> tuple[Any, Any, Any]:
        """(the Generated implementation, its runner, its launch geometry) where the selection runs a wgmma_direct
        kernel whose K splits, if any, are summed by the last block: a variant of its source (`residues`,
        `unless`) or its batched twin (`batched`) launches with the same geometry; else three Nones."""
        from autotile.runtime.impl import Generated

        implementation = self.prepared.selection.implementation_object()
        runner = self.prepared.runner
        launch = getattr(runner, "geometry", None)
        if (not isinstance(implementation, Generated) or launch is None or launch.zero_output
                or implementation.config.get("MATH") != "wgmma_direct"):
            return None, None, None
        return implementation, runner, launch

    def batched(self, count: int) -> Callable[[tuple[int, int], int, int], None] | None:
        """One launch (pointers, out, stream) of `count` products of this shape, each operand's matrices packed
        one after another, as are the int32 results: one strided batched GEMM, no gap between launches and one
        tail of partly filled waves instead of `count`. cuBLAS's batched GEMM where the selection runs cuBLAS;
        the same generated kernel, batched (its copies from 3-D tensor maps), where it runs a wgmma_direct
        kernel whose K splits, if any, are summed by the last block; else None."""
        m, n, k = self.shape
        strides = (m * k, n * k)
        bmm = ProblemKey("bmm", "int8", "nt", (count, m, n, k))
        if self.prepared.direct is not None:
            key = (self.prepared.direct.device, count, self.shape)
            call = _batched_products.get(key)
            if call is None:
                call = _batched_products.setdefault(key, CublasCall(bmm, self.prepared.direct.device))
            return lambda pointers, out_ptr, stream_ptr: call(pointers, out_ptr, stream_ptr, strides)
        implementation, _, _ = self._direct_kernel()
        if implementation is None:
            return None
        runner_key = (id(self.prepared.runner), count)
        runner = _batched_runners.get(runner_key)
        if runner is None:
            runner = _batched_runners.setdefault(runner_key, implementation.prepare(bmm))
        allocate, nbytes = self.allocate, count * m * n * 4
        return lambda pointers, out_ptr, stream_ptr: runner.launch(pointers, out_ptr, nbytes, "int32", stream_ptr,
                                                                   strides, allocate)

    def _variant(self, cache: dict[tuple[int, int], Any], option: str, extra: Any) -> Any:
        """The runner of this product's wgmma_direct kernel rendered with the template option `option` on and
        the argument `extra` after the sizes (compiled once per runner and `extra`, kept in `cache`), or None
        where the selection runs cuBLAS or a kernel whose splits add atomically into C."""
        from autotile.codegen import kernels
        from autotile.runtime.impl import KernelRunner

        implementation, runner, launch = self._direct_kernel()
        if implementation is None:
            return None
        key = (id(runner), int(extra))
        found = cache.get(key)
        if found is None:
            from autotile.codegen import build

            spec = kernels.get("matmul")
            source = spec.render(implementation.config, "int8", "nt", {option: True})
            kernel = build.compile_kernel(source, "autotile_matmul")
            sizes = (*spec.size_args(self.shape), extra)
            found = cache.setdefault(key, KernelRunner(kernel, launch, sizes, False, 2))
        return found

    def residues(self, modulus: int) -> Callable[[tuple[int, int], int, int], None] | None:
        """A launch (pointers, out, stream) writing each sum modulo `modulus` (symmetric, int8), or None
        where the selection runs cuBLAS or a kernel whose splits add atomically into C."""
        runner = self._variant(_residue_runners, "RESIDUES", np.int32(modulus))
        if runner is None:
            return None
        m, n, _ = self.shape
        allocate = self.allocate
        return lambda pointers, out_ptr, stream_ptr: runner.launch(pointers, out_ptr, m * n, "int32", stream_ptr,
                                                                   (), allocate)

    def unless(self, skip_ptr: int) -> Callable[[tuple[int, int], int, int, int], None] | None:
        """A launch (pointers, out, out_nbytes, stream) of this product that does nothing where the int32 word at
        `skip_ptr` (device memory, kept for the stream) is nonzero when it runs: the same generated kernel
        with a `skip` argument, where the selection runs a wgmma_direct kernel whose K splits, if any, are
        summed by the last block; else None (cuBLAS cannot be told: the caller runs the product anyway)."""
        runner = self._variant(_skipping_runners, "SKIP", np.uint64(skip_ptr))
        if runner is None:
            return None
        allocate = self.allocate
        return lambda pointers, out_ptr, out_nbytes, stream_ptr: runner.launch(pointers, out_ptr, out_nbytes, "int32",
                                                                               stream_ptr, (), allocate)


_residue_runners: dict[tuple[int, int], Any] = {}  # (the int32 runner's id, modulus) -> its residue twin
# (the int32 runner's id, the skip word's address) -> its twin that a device word can stop
_skipping_runners: dict[tuple[int, int], Any] = {}
_batched_runners: dict[tuple[int, int], Any] = {}  # (the int32 runner's id, count) -> its batched twin
# (device, count, shape) -> the emulation's products of that shape as one cuBLAS call
_batched_products: dict[tuple[int, int, tuple[int, int, int]], CublasCall] = {}


def _int8_gemm(framework: Framework, device: int,
               stream_ptr: int | None = None) -> Callable[[tuple[int, int, int]], _Int8Products]:
    """What the emulation's int8 products run, per shape (M, N, K): `_Int8Products` of the int8 selection, or
    of the model's runner-up where the products are large enough to run as a sustained load
    (`_sustained_products`). `stream_ptr`: the call's stream (`_prepare`'s)."""

    def gemm(shape: tuple[int, int, int]) -> _Int8Products:
        prepared = _prepare("matmul", "int8", "nt", shape, None, device, stream_ptr)
        prepared = _sustained_products(prepared, shape, device)
        return _Int8Products(prepared, shape, framework.allocate)

    return gemm


_sustained: dict[tuple[int, tuple[int, int, int]], _Prepared] = {}


def _sustained_products(prepared: _Prepared, shape: tuple[int, int, int], device: int) -> _Prepared:
    """`prepared`, the int8 selection of the products' `shape`; or, where that is cuBLAS on the model's word,
    the model's runner-up if the products are of at least `emulation.SUSTAINED_MIN_WORK` multiply-adds and it
    was predicted at least `emulation.SUSTAINED_FLOOR` x cuBLAS (why: `autotile.library.emulation`). Decided
    once per device and shape."""
    from autotile.dispatch.select import Selection, runner_up
    from autotile.library import emulation
    from autotile.runtime.impl import Generated

    if prepared.direct is None or prepared.selection.step != "model":  # a generated kernel, or a tuned record
        return prepared
    found = _sustained.get((device, shape))
    if found is not None:
        return found
    chosen = prepared
    if math.prod(shape) >= emulation.SUSTAINED_MIN_WORK:
        key = ProblemKey("matmul", "int8", "nt", shape)
        best = runner_up(key, _device(device))
        if best is not None and best[1] >= emulation.SUSTAINED_FLOOR:
            config, predicted = best
            why = (f"the model's runner-up, predicted {predicted:.2f}x cuBLAS on one product, for products run back "
                   f"to back ({prepared.selection.why})")
            selection = Selection(config, "sustained products", None, None, "generated", why,
                                  prepared.selection.precision, "model", None)
            with _device_of(device):
                chosen = _Prepared(Generated(config).prepare(key), selection)
    with _lock:
        return _sustained.setdefault((device, shape), chosen)


def matvec_no_autograd(A: Any, x: Any, out: Any = None, precision: str | None = None, stream: Any = None) -> Any:
    """`autotile.matvec` without the autograd check (`autotile.library.api.matvec` says what it takes): what
    the PyTorch operator runs."""
    known = repeated_call(A, x, out, precision, "matvec")  # the per-call path, as matmul's
    if known is not None:
        return known(A, x, out, stream)
    setting = precision_mod.resolve(precision)
    framework = framework_by_type(A, x)
    signature = ("matvec", framework.pair_signature(A, x), None if out is None else framework.signature(out),
                 setting)
    a, v = as_framework(framework, A, "A"), as_framework(framework, x, "x")
    if len(a.shape) != 2 or len(v.shape) != 1:
        raise ArgumentError(f"matvec takes a 2-D A and a 1-D x; got {len(a.shape)}-D and {len(v.shape)}-D")
    M, K = a.shape
    if v.shape[0] != K:
        raise ArgumentError(f"matvec shapes do not match: A is {M}x{K}, x has {v.shape[0]} elements")
    dtype = _check_dtypes("Ax", a, v)
    if dtype not in MATVEC_DTYPES:
        raise ArgumentError(f"matvec takes {', '.join(MATVEC_DTYPES)}; got {dtype} (int8 and the 8-bit floats are "
                            "for matmul)")
    if min(M, K) == 0:
        return _zeros(framework, out, (M,), dtype, a.device)
    order = matrix_order(M, K, *a.strides)
    if order is None:
        a, order = framework.operand(framework.row_major(a.obj), "A"), "n"
    copied = v.obj is not x or a.obj is not A
    if K > 1 and v.strides[0] != 1:
        v, copied = framework.operand(framework.row_major(v.obj), "x"), True
    y = _output(framework, out, (M,), dtype, a.device)
    stream_ptr = _stream(framework, stream, a.device)
    with _device_of(a.device):
        prepared = _prepare("matvec", dtype, "row" if order == "n" else "col", (M, K), setting, a.device, stream_ptr)
    _launch_on(a.device, prepared, framework, (a.obj, v.obj), y.obj, _nbytes(y), dtype, stream_ptr)
    memoize = not copied and signature[1] is not None and (out is None or signature[2] is not None)
    if memoize and not prepared.provisional:
        call = _Call(prepared, (M,), _nbytes(y), dtype, a.device, ())
        # only signatures of the framework's own arrays that needed no copy
        _memoize(framework, signature, *_native_first(framework, call, "matvec", (2, 1), _repeat(framework, call)),
                 call=call)
    return y.obj


# (A, B, scale_a, scale_b, out, stream) -> C: a signature's repeated call of `scaled_matmul`
ScaledRepeat = Callable[[Any, Any, Any, Any, Any, Any], Any]
_scaled_calls: dict[tuple[Any, ...], ScaledRepeat] = {}


def scaled_matmul(A: Any, B: Any, scale_a: Any, scale_b: Any, out: Any = None, stream: Any = None) -> Any:
    """C = (scale_a scale_b) (A @ B) for torch CUDA tensors of an 8-bit float (torch.float8_e4m3fn or
    torch.float8_e5m2, both of one type) and one-element float32 scales on the same GPU: torch._scaled_mm's
    contract with per-tensor scales, float32 sums and C rounded once to bfloat16 (the 8-bit floats have no
    CuPy or NumPy type). A is M x K, B is K x N, each row- or column-major (torch._scaled_mm takes only A
    row-major and B column-major; here every layout runs, the other three by transposing 8-bit tiles on
    their way to the tensor cores). Runs a generated kernel (sm_90) where the selection predicts one faster,
    else torch._scaled_mm itself (where it takes the problem). `out`, `stream`: as `matmul`'s."""
    framework = framework_by_type(A, B)
    if framework.name != "torch":
        raise ArgumentError("scaled_matmul takes torch tensors (CuPy and NumPy have no 8-bit float type)")
    signature = (framework.signature(A), framework.signature(B), framework.signature(scale_a),
                 framework.signature(scale_b), None if out is None else framework.signature(out))
    known = _scaled_calls.get(signature)
    if known is not None:  # checked and prepared by the signature's first call
        return known(A, B, scale_a, scale_b, out, stream)
    a, b = as_framework(framework, A, "A"), as_framework(framework, B, "B")
    dtype = _check_dtypes("AB", a, b)
    if not dtypes_mod.get(dtype).scaled:
        raise ArgumentError(f"scaled_matmul takes {' or '.join(dtypes_mod.FLOAT8_DTYPES)} operands; got {dtype} "
                            "(autotile.matmul takes the others)")
    torch = sys.modules["torch"]  # the inputs are torch tensors: torch is imported
    scales = []
    for name, scale in (("scale_a", scale_a), ("scale_b", scale_b)):
        if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32 \
                or scale.numel() != 1 or scale.device != A.device:
            raise ArgumentError(f"{name} must be a one-element float32 tensor on {A.device} (a per-tensor scale); "
                                f"got {getattr(scale, 'dtype', type(scale).__name__)} "
                                f"{tuple(getattr(scale, 'shape', ()))} on {getattr(scale, 'device', '?')}")
        scales.append(scale)
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise ArgumentError(f"scaled_matmul takes 2-D A and B; got {len(a.shape)}-D and {len(b.shape)}-D")
    out_dtype = dtypes_mod.get(dtype).output_name
    a, b, plan, copied = _planned(framework, a, b)
    if not plan.kernel:
        return _zeros(framework, out, plan.out_shape, out_dtype, a.device)
    c = _output(framework, out, plan.out_shape, out_dtype, a.device)
    with _device_of(a.device):
        prepared = _prepare(plan.kernel, dtype, plan.layout, plan.shape, None, a.device,
                            _stream(framework, stream, a.device))
    call = _Call(prepared, plan.out_shape, _nbytes(c), out_dtype, a.device, ())
    run = _scaled_repeat(torch, framework, prepared, call)
    result = run(a.obj, b.obj, scales[0], scales[1], c.obj, stream)
    memoize = not copied and None not in signature[:4] and (out is None or signature[4] is not None)
    if memoize and not prepared.provisional:
        with _lock:
            _scaled_calls[signature] = run
    return result


def _scaled_repeat(torch: Any, framework: Framework, prepared: _Prepared, call: _Call) -> ScaledRepeat:
    """A `scaled_matmul` signature's call: the generated kernel, or where the selection chose the vendor's
    call (nothing predicted faster), torch._scaled_mm itself."""
    if prepared.selection.implementation == "cublas":
        return lambda a, b, scale_a, scale_b, out, stream: _scaled_mm(torch, a, b, scale_a, scale_b, out, stream)
    return lambda a, b, scale_a, scale_b, out, stream: call.run(framework, (a, b, scale_a, scale_b), out, stream)


def _scaled_mm(torch: Any, a: Any, b: Any, scale_a: Any, scale_b: Any, out: Any, stream: Any) -> Any:
    """torch._scaled_mm with per-tensor scales and a bfloat16 C (float32 sums), into `out` where given, on
    `stream` where given (else torch's current stream)."""
    if stream is not None:
        with torch.cuda.stream(torch.cuda.ExternalStream(stream_pointer(stream), device=a.device)):
            return _scaled_mm(torch, a, b, scale_a, scale_b, out, None)
    if out is None:
        return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
    return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16, out=out)


_emulation_choices: dict[tuple[Any, ...], bool] = {}


def emulation_pays(kernel: str, dtype: str, layout: str, shape: tuple[int, ...], device_id: int) -> bool:
    """Whether a `kernel` ("matmul", or "bmm": each matrix) of `dtype` and `shape` runs emulated under the
    "emulated" setting on `device_id`: `emulation.pays`, which for float32 weighs what "high" would run
    (its selection, memoized per problem)."""
    from autotile.library import emulation

    if not emulation.pays(dtype, shape[-3:]):
        return False
    if dtype != "float32":
        return True
    memo_key = (device_id, kernel, layout, shape)
    found = _emulation_choices.get(memo_key)
    if found is None:
        direct, padded = _padded_choice(kernel, dtype, layout, shape, "high", device_id)
        native = padded[0] if padded is not None else direct  # the padded plan's product, where it pays
        # a record that runs cuBLAS keeps its best config all the same: what runs is cuBLAS
        config = native.config if native.implementation == "generated" else None
        found = _emulation_choices.setdefault(memo_key, emulation.pays(dtype, shape[-3:], config))
    return found


def _padded_choice(kernel: str, dtype: str, layout: str, shape: tuple[int, ...], setting: str, device_id: int
                   ) -> tuple[Selection, tuple[Selection, tuple[int, ...]] | None]:
    """The selection of a matmul of `shape` as it is, and where the padded plan (`autotile.library.padding`)
    pays under the precision `setting`, the padded shape's selection and that shape: the selections of the
    two problems weighed by `padding.pays`. Nothing is prepared."""
    from autotile.dispatch.select import select

    device = _device(device_id)
    direct = select(ProblemKey(kernel, dtype, layout, shape), device, precision=setting)
    if not padding.applies(dtype, setting, kernel, layout, shape):
        return direct, None
    padded_shape = padding.padded_shape(layout, shape, dtype)
    padded = select(ProblemKey(kernel, dtype, layout, padded_shape), device, precision=setting)
    return direct, ((padded, padded_shape) if padding.pays(direct, padded, layout, shape, dtype) else None)


def padded_plan(kernel: str, dtype: str, layout: str, shape: tuple[int, ...], setting: str,
                device_id: int | None = None, stream_ptr: int | None = None) -> _Prepared | None:
    """Where a matmul of `shape` ((batch,) M, N, K) in `layout` takes the padded plan
    (`autotile.library.padding`) under the precision `setting` (resolved) on `device_id` (None: CuPy's
    current device): what runs the padded shape, prepared; None where the plan does not pay. Decided once
    per problem: the selections of the shape as it is and of the padded shape, weighed by `padding.pays`.
    `stream_ptr`: the call's stream, as `_prepare`'s."""
    if not padding.applies(dtype, setting, kernel, layout, shape):
        return None
    if device_id is None:
        device_id = _device_id(_cupy().cuda.runtime)
    memo_key = (device_id, kernel, dtype, layout, shape, setting)
    if memo_key in _padded_plans:
        return _padded_plans[memo_key]
    _, padded = _padded_choice(kernel, dtype, layout, shape, setting, device_id)
    found = None
    if padded is not None:
        with _device_of(device_id):  # its kernel is compiled and loaded there
            found = _prepare(kernel, dtype, layout, padded[1], setting, device_id, stream_ptr)
    if found is not None and found.provisional:  # decided again by the first call outside the capture
        return found
    with _lock:
        return _padded_plans.setdefault(memo_key, found)


def selection_for(kernel: str, dtype: str, layout: str, shape: tuple[int, ...],
                  precision: str | None = None) -> Selection:
    """Which config the library runs for a problem on the current GPU under the precision setting (None:
    the process-wide one), preparing it as a call would."""
    layout = canonical_layout(kernel, layout)
    setting = precision_mod.resolve(precision)
    if as_matvec(kernel, dtype, layout, tuple(shape)) is not None:
        vector = _matvec_plan(kernel, dtype, layout, tuple(shape), setting, _current_device())
        if vector is not None:  # what the library runs: the matvec
            kernel, layout, shape = "matvec", vector[0], vector[1]
    return _prepare(kernel, dtype, layout, tuple(shape), setting).selection


def forget() -> None:
    """Drop memoized kernels and selections (after tuning in the same process)."""
    with _lock:
        _prepared.clear()
        _padded_plans.clear()
        _matvec_plans.clear()
        _calls.clear()
        torch_lookup.clear()
        _scaled_calls.clear()
        _residue_runners.clear()
        _batched_products.clear()
        _batched_runners.clear()
        _skipping_runners.clear()
        _emulation_choices.clear()
        _sustained.clear()


events.on_records_changed(forget)  # a record tuned in this process is served from the next call on
padding.on_toggle(forget)  # the padded plan turned on or off: every signature plans again
