"""The arrays a library call takes, whatever their framework, read without conversion or copy.

CuPy arrays and PyTorch CUDA tensors are read natively: pointer, shape, strides (in elements), dtype and
device, so that a call costs no DLPack exchange and no wrapper object. Anything else CuPy takes without a
copy (``__cuda_array_interface__``, DLPack) becomes a CuPy array first. A call answers in its inputs'
framework (`Framework.empty`), runs on that framework's current stream (`Framework.current_stream`), and
allocates what a kernel needs through it (`Framework.allocate`: inside a torch CUDA-graph capture, from the
graph's pool).

Importing this module imports neither CuPy nor torch: each is imported when an array of its kind arrives.
"""

from __future__ import annotations

import functools
import math
import sys
from typing import Any, Callable, NamedTuple

from autotile.codegen.dtypes import DTYPE_NAMES, FLOAT8_DTYPES
from autotile.errors import ArgumentError, DeviceUnavailableError
from autotile.runtime.device import stream_is_capturing


class Operand(NamedTuple):
    """One array as a kernel sees it: `obj` is the framework's own array."""

    obj: Any
    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # elements, not bytes
    dtype: str
    device: int


class Framework:
    """What a library call needs from the framework its arrays come from."""

    name = ""

    def operand(self, x: Any, name: str) -> Operand:
        raise NotImplementedError

    def signature(self, x: Any) -> tuple[Any, ...] | None:
        """What a call's plan depends on (shape, strides, dtype, device), cheap to read and hashable, for an
        array of this framework; None for anything else (which the full path reads and converts)."""
        raise NotImplementedError

    def read_pair(self, a: Any, b: Any) -> tuple[Any, ...]:
        """The signatures of two arrays of this framework (not checked: the caller knows their types, from
        `OWN_TYPES`) in one flat tuple, ending with whether autograd must see the call (a torch tensor that
        needs a gradient, with gradients on): the per-call path's one read of its operands."""
        first, second = self.signature(a), self.signature(b)
        assert first is not None and second is not None
        return (*first, *second, False)

    def pair_signature(self, a: Any, b: Any) -> tuple[Any, ...] | None:
        """`read_pair`, or None where either array is not this framework's."""
        if self.signature(a) is None or self.signature(b) is None:
            return None
        return self.read_pair(a, b)

    def current_stream(self, device: int) -> int:
        """The framework's current CUDA stream on `device`, as a pointer."""
        raise NotImplementedError

    def pointer(self, x: Any) -> int:
        """The device address of an array of this framework."""
        raise NotImplementedError

    def empty(self, shape: tuple[int, ...], dtype: str, device: int) -> Any:
        raise NotImplementedError

    def zeros(self, shape: tuple[int, ...], dtype: str, device: int) -> Any:
        raise NotImplementedError

    def fill_zero(self, x: Any) -> None:
        raise NotImplementedError

    def row_major(self, x: Any) -> Any:
        """A C-contiguous copy of `x` (on the current stream)."""
        raise NotImplementedError

    def allocate(self, elems: int, dtype: str, stream_ptr: int) -> tuple[Any, int]:
        """Device memory for `elems` elements of `dtype`, for use on `stream_ptr`: (owner, pointer)."""
        raise NotImplementedError

    def cupy_view(self, op: Operand) -> Any:
        """`op` as a CuPy array sharing its memory (for cuBLAS through CuPy)."""
        raise NotImplementedError

    def allocator(self, shape: tuple[int, ...], dtype: str, device: int) -> Callable[[], Any]:
        """A function of no arguments that returns a new array of `shape` and `dtype` on `device` (the
        current device when it is called): what a repeated call allocates, bound once."""
        return lambda: self.empty(shape, dtype, device)

    def stream_getter(self, device: int) -> Callable[[], int]:
        """A function of no arguments that returns the current stream on `device`, bound once."""
        return lambda: self.current_stream(device)

    def pointer_function(self) -> Callable[[Any], int]:
        """`pointer` as the cheapest function the framework has (one call per array and call)."""
        return self.pointer

    def native_op(self, kernel: str, dtype: str, dims: tuple[int, int]) -> tuple[str, str | None] | None:
        """The framework's own operator for a product autotile runs on cuBLAS, and the switch guarding its
        arithmetic (`TorchFramework.native_op`); None where it has none."""
        return None

    def native_first(self, kernel: str, dtype: str, dims: tuple[int, int], run: Repeat) -> Repeat:
        """The repeated call `run` of a product that autotile runs on cuBLAS (`kernel` "matmul" or "matvec",
        operands of `dims` dimensions), preceded by the framework's own call of it where that calls the
        same cuBLAS with the same arithmetic: the framework's call on its current stream, unless its
        switches, read per call, would change the arithmetic; `run` on a stream the caller names. `run`
        itself where the framework has no such call."""
        return run


# (A, B or x, out or None, stream or None) -> the result: a signature's repeated call
Repeat = Callable[[Any, Any, Any, Any], Any]

_DTYPES = DTYPE_NAMES


class CupyFramework(Framework):
    name = "cupy"

    def __init__(self, cupy: Any) -> None:
        self.cupy = cupy

    def operand(self, x: Any, name: str) -> Operand:
        if not isinstance(x, self.cupy.ndarray):
            x = as_cupy(self.cupy, x, name)
        itemsize = x.itemsize
        return Operand(x, x.data.ptr, x.shape, tuple(s // itemsize for s in x.strides), x.dtype.name, x.device.id)

    def signature(self, x: Any) -> tuple[Any, ...] | None:
        if not isinstance(x, self.cupy.ndarray):
            return None
        return x.shape, x.strides, x.dtype, x.device.id

    def read_pair(self, a: Any, b: Any) -> tuple[Any, ...]:
        return a.shape, a.strides, a.dtype, a.device.id, b.shape, b.strides, b.dtype, b.device.id, False

    def current_stream(self, device: int) -> int:
        return self.cupy.cuda.get_current_stream(device).ptr

    def pointer(self, x: Any) -> int:
        return int(x.data.ptr)

    def empty(self, shape: tuple[int, ...], dtype: str, device: int) -> Any:
        with self.cupy.cuda.Device(device):
            return self.cupy.empty(shape, dtype=dtype)

    def zeros(self, shape: tuple[int, ...], dtype: str, device: int) -> Any:
        with self.cupy.cuda.Device(device):
            return self.cupy.zeros(shape, dtype=dtype)

    def fill_zero(self, x: Any) -> None:
        x.fill(0)

    def row_major(self, x: Any) -> Any:
        return self.cupy.ascontiguousarray(x)

    def allocate(self, elems: int, dtype: str, stream_ptr: int) -> tuple[Any, int]:
        from autotile.runtime.impl import cupy_allocator

        return cupy_allocator(elems, dtype, stream_ptr)

    def cupy_view(self, op: Operand) -> Any:
        return op.obj

    def allocator(self, shape: tuple[int, ...], dtype: str, device: int) -> Callable[[], Any]:
        # a repeated call allocates only where `device` is current (it checks): no device switch here
        return functools.partial(self.cupy.empty, shape, dtype)

    def stream_getter(self, device: int) -> Callable[[], int]:
        get_current_stream = self.cupy.cuda.get_current_stream
        return lambda: get_current_stream().ptr


class TorchFramework(Framework):
    name = "torch"

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.dtype_names = {torch.float32: "float32", torch.float64: "float64", torch.bfloat16: "bfloat16",
                            torch.float16: "float16", torch.int8: "int8", torch.int32: "int32"}  # int32: int8's out
        for name in FLOAT8_DTYPES:  # the 8-bit floats, where this torch has them
            if hasattr(torch, name):
                self.dtype_names[getattr(torch, name)] = name
        self.torch_dtypes = {name: dtype for dtype, name in self.dtype_names.items()}
        self.torch_dtypes["uint32"] = torch.int32  # the split-K tickets: only their bytes matter
        # The raw current-stream query (what torch.compile's generated code calls) skips the Stream object.
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self._raw_stream = raw if callable(raw) else None
        self._devices: dict[int, Any] = {}  # index -> torch.device: a string such as "cuda:0" is parsed per use
        self._templates: dict[tuple[str, int], Any] = {}  # (dtype, device) -> `_one_element`

    def operand(self, x: Any, name: str) -> Operand:
        if x.device.type != "cuda":
            raise ArgumentError(f"{name} is a torch tensor on {x.device}; pass a CUDA tensor ({name}.cuda() copies it "
                                "to the GPU)")
        dtype = self.dtype_names.get(x.dtype)
        if dtype is None:
            raise ArgumentError(f"{name} has dtype {x.dtype}; autotile supports {', '.join(_DTYPES)}")
        return Operand(x, x.data_ptr(), tuple(x.shape), x.stride(), dtype, x.device.index)

    def signature(self, x: Any) -> tuple[Any, ...] | None:
        if not isinstance(x, self.torch.Tensor):
            return None
        return x.shape, x.stride(), x.dtype, x.get_device()  # get_device: no torch.device object made

    def read_pair(self, a: Any, b: Any) -> tuple[Any, ...]:
        needs_grad = (a.requires_grad or b.requires_grad) and self.torch.is_grad_enabled()
        return (a.shape, a.stride(), a.dtype, a.get_device(), b.shape, b.stride(), b.dtype, b.get_device(),
                needs_grad)

    def current_stream(self, device: int) -> int:
        if self._raw_stream is not None:
            return int(self._raw_stream(device))
        return int(self.torch.cuda.current_stream(device).cuda_stream)

    def allocator(self, shape: tuple[int, ...], dtype: str, device: int) -> Callable[[], Any]:
        torch = self.torch
        general = functools.partial(torch.empty, shape, dtype=self.torch_dtypes[dtype], device=self._device(device))
        # torch.empty_like of a one-element tensor expanded to `shape` (not dense: its result is C-contiguous)
        # parses one argument where torch.empty parses three: 1.3-2.3 us less per call, measured on an H100
        # host (2026-11-27). Checked once, as the rule is torch's and not promised. Inside a CUDA-graph
        # capture the host's time is spent once, and no memory may come from CuPy: the plain call there.
        if stream_is_capturing(self.current_stream(device)):
            return general
        template = self._one_element(dtype, device).expand(shape)
        made = torch.empty_like(template)
        contiguous = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
        packed = all(n <= 1 or s == e for n, s, e in zip(shape, made.stride(), contiguous, strict=True))
        if tuple(made.shape) != shape or not packed:
            return general
        return functools.partial(torch.empty_like, template)

    def _one_element(self, dtype: str, device: int) -> Any:
        """A tensor of one element of `dtype` on `device` (never read or written), on memory of CuPy's kept
        for the process: the repeated calls' allocators keep it, and torch.compile's CUDA graph trees refuse
        to record while a tensor of their pool (where torch allocates while they warm up) outlives a call
        without being its output."""
        key = (dtype, device)
        tensor = self._templates.get(key)
        if tensor is None:
            import cupy

            size = self.torch_dtypes[dtype].itemsize
            with cupy.cuda.Device(device):
                memory = cupy.empty(size, dtype=cupy.uint8)
            # __cuda_array_interface__: torch shares the memory and holds `memory`
            tensor = self.torch.as_tensor(memory, device=self._device(device)).view(self.torch_dtypes[dtype])
            tensor = self._templates.setdefault(key, tensor)
        return tensor

    def stream_getter(self, device: int) -> Callable[[], int]:
        if self._raw_stream is not None:
            return functools.partial(self._raw_stream, device)
        return lambda: self.current_stream(device)

    def pointer_function(self) -> Callable[[Any], int]:
        pointer: Callable[[Any], int] = self.torch.Tensor.data_ptr
        return pointer

    def pointer(self, x: Any) -> int:
        return int(x.data_ptr())

    def native_op(self, kernel: str, dtype: str, dims: tuple[int, int]) -> tuple[str, str | None] | None:
        """torch's operator for a product autotile runs on cuBLAS ("mm", "bmm", "mv" or "matmul") and the switch
        of torch's that, when on, makes it compute something else ("tf32", "fp16_accumulation" or None), or None
        where autotile's own cuBLAS call must run (int8)."""
        # torch.mm/bmm/mv/matmul enqueue cuBLAS from C++: measured on an H100 host (2026-11-28), less host time per call
        # than autotile's own cuBLAS call with its Python around it (the allocation, the pointers, the handle's stream;
        # `autotile.runtime.cublas`) on 16 of 20 cases, by up to 10 us. A switch of torch's that would change the
        # arithmetic is read per call (0.1 us): float32's GEMM is autotile's (IEEE FP32) only while torch's TF32 switch
        # is off; float16's sums are float32 only while torch's fp16-accumulation switch (torch 2.7+) is off. float64
        # and bfloat16 have no such switch. The 16-bit types' other switches, torch's reduced-precision reductions,
        # allow at most what autotile's own handle allows (cuBLAS's default math mode): with them on (torch's default)
        # the call is the same, with them off it only forbids more. int8 is left to autotile's call: torch._int_mm runs
        # cuBLASLt, whose kernels differ (faster on some shapes, slower on others).
        guard = {"float64": None, "bfloat16": None, "float32": "tf32", "float16": "fp16_accumulation"}
        if dtype not in guard:
            return None
        if kernel == "matvec":
            return "mv", guard[dtype]
        if kernel == "matmul":
            return {(2, 2): "mm", (3, 3): "bmm"}.get(dims, "matmul"), guard[dtype]
        return None

    def native_first(self, kernel: str, dtype: str, dims: tuple[int, int], run: Repeat) -> Repeat:
        native = self.native_op(kernel, dtype, dims)
        if native is None:
            return run
        torch = self.torch
        never: Callable[[], bool] = lambda: False  # noqa: E731
        switches = {None: never, "tf32": getattr(torch._C, "_get_cublas_allow_tf32", None),
                    "fp16_accumulation": getattr(torch._C, "_get_cublas_allow_fp16_accumulation", never)}
        changes_arithmetic = switches[native[1]]
        if changes_arithmetic is None:  # a torch without the TF32 read: autotile's own call
            return run
        op = getattr(torch, native[0])

        def run_native(a: Any, b: Any, out: Any, stream: Any) -> Any:
            if stream is None:
                try:
                    changed = changes_arithmetic()
                except RuntimeError:  # torch 2.9+ refuses this legacy read once its `fp32_precision` API set TF32
                    changed = True
                if not changed:
                    return op(a, b) if out is None else op(a, b, out=out)
            return run(a, b, out, stream)

        return run_native

    def _device(self, index: int) -> Any:
        device = self._devices.get(index)
        if device is None:
            device = self._devices[index] = self.torch.device("cuda", index)
        return device

    def empty(self, shape: tuple[int, ...], dtype: str, device: int) -> Any:
        return self.torch.empty(shape, dtype=self.torch_dtypes[dtype], device=self._device(device))

    def zeros(self, shape: tuple[int, ...], dtype: str, device: int) -> Any:
        return self.torch.zeros(shape, dtype=self.torch_dtypes[dtype], device=self._device(device))

    def fill_zero(self, x: Any) -> None:
        x.zero_()

    def row_major(self, x: Any) -> Any:
        return x.contiguous()

    def allocate(self, elems: int, dtype: str, stream_ptr: int) -> tuple[Any, int]:
        # torch's caching allocator: inside a CUDA-graph capture this memory comes from the graph's pool
        # (kept alive by the runner, as the graph's replays use it). The block belongs to the current stream,
        # which is the launch stream unless the caller named another `stream=`.
        tensor = self.torch.empty(elems, dtype=self.torch_dtypes[dtype], device="cuda")  # once per stream
        return tensor, tensor.data_ptr()

    def cupy_view(self, op: Operand) -> Any:
        import cupy

        size = op.obj.element_size()
        span = 1 + sum((n - 1) * s for n, s in zip(op.shape, op.strides, strict=True)) if all(op.shape) else 0
        memory = cupy.cuda.UnownedMemory(op.ptr, span * size, op.obj, op.device)
        return cupy.ndarray(op.shape, dtype=op.dtype, memptr=cupy.cuda.MemoryPointer(memory, 0),
                            strides=tuple(s * size for s in op.strides))


_frameworks: dict[str, Framework] = {}


def _cupy() -> Any:
    try:
        import cupy
    except ImportError as exc:
        raise DeviceUnavailableError(
            f"autotile.matmul/matvec need CuPy ({exc}); install autotile[cuda12] or autotile[cuda13]") from None
    return cupy


def is_torch_tensor(x: Any) -> bool:
    """Whether `x` is a torch tensor (without importing torch: a program that has none never has one)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def framework_of(*arrays: Any) -> Framework:
    """The framework a call answers in: torch if any input is a torch tensor, CuPy otherwise."""
    key = "torch" if any(is_torch_tensor(x) for x in arrays) else "cupy"
    found = _frameworks.get(key)
    if found is None:
        cupy = _cupy()  # the kernels are compiled and launched through CuPy either way
        found = _frameworks[key] = TorchFramework(sys.modules["torch"]) if key == "torch" else CupyFramework(cupy)
    return found


_by_type: dict[type, Framework] = {}  # an array's type -> `framework_of` one array of that type
# An array type that an earlier call found to be a framework's own (`Framework.signature` reads it) -> that
# framework: the per-call path reads two arrays of such types with `Framework.read_pair`, unchecked.
OWN_TYPES: dict[type, Framework] = {}


def framework_by_type(a: Any, b: Any) -> Framework:
    """`framework_of(a, b)`, through each array's type (a call's common case: two dictionary lookups; a torch
    tensor and an nn.Parameter are both torch's)."""
    found_a, found_b = _by_type.get(type(a)), _by_type.get(type(b))
    if found_a is None:
        found_a = _register(a)
    if found_b is None:
        found_b = _register(b)
    return found_a if found_a is found_b else framework_of(a, b)


def _register(x: Any) -> Framework:
    """`framework_of(x)`, remembered for `x`'s type (in `OWN_TYPES` too where the framework owns it)."""
    found = _by_type[type(x)] = framework_of(x)
    if found.signature(x) is not None:
        OWN_TYPES[type(x)] = found
    return found


def as_cupy(cupy: Any, value: Any, name: str) -> Any:
    """`value` as a CuPy array sharing its memory; `ArgumentError` for host data."""
    if isinstance(value, cupy.ndarray):
        return value
    if hasattr(value, "__cuda_array_interface__"):
        return cupy.asarray(value)  # shares the memory
    if hasattr(value, "__dlpack__") and hasattr(value, "__dlpack_device__"):
        device_type = value.__dlpack_device__()[0]
        if device_type in (2, 13):  # kDLCUDA, kDLCUDAManaged
            return cupy.from_dlpack(value)
    kind = type(value).__module__.split(".")[0] + "." + type(value).__name__
    raise ArgumentError(f"{name} is a {kind} on the host; pass a CuPy array (cupy.asarray({name}) copies it "
                        "to the GPU) or a CUDA tensor")


def as_framework(framework: Framework, value: Any, name: str) -> Operand:
    """`value` read as an operand of `framework` (a CuPy array among torch tensors becomes a tensor sharing
    its memory, and the reverse)."""
    if framework.name == "torch" and not is_torch_tensor(value):
        torch = sys.modules["torch"]
        value = torch.as_tensor(as_cupy(_cupy(), value, name), device="cuda")  # shares the memory
    return framework.operand(value, name)


def stream_pointer(stream: Any) -> int:
    """A stream given as `stream=`: a CuPy or torch stream, or a raw pointer (int)."""
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    for attribute in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy.cuda.Stream
        ptr = getattr(stream, attribute, None)
        if isinstance(ptr, int):
            return ptr
    raise ArgumentError(f"stream {stream!r} is not a CUDA stream: pass a torch.cuda.Stream, a cupy.cuda.Stream or "
                        "a stream pointer (int)")


def is_capturing(stream_ptr: int) -> bool:
    """Whether work enqueued on the stream `stream_ptr` is being captured into a CUDA graph (or the capture was
    invalidated). The legacy default stream (0) answers with an error while another stream captures in global
    mode: that counts as capturing, since a synchronising call there would break that capture too."""
    runtime = _cupy().cuda.runtime
    try:
        return bool(runtime.streamIsCapturing(stream_ptr))
    except runtime.CUDARuntimeError:  # cudaErrorStreamCaptureImplicit
        return True


__all__ = ["CupyFramework", "Framework", "Operand", "TorchFramework", "as_cupy", "as_framework", "framework_of",
           "is_capturing", "is_torch_tensor", "stream_pointer"]
