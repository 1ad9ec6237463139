"""What runs a problem: one interface for a generated kernel and for cuBLAS.

An `Implementation` is prepared once for a problem (compile, launch geometry, the dynamic shared-memory
opt-in) and gives a `Runner`; `Runner.run(arrays, out, stream)` then only launches. The tuner's worker, the
library, the benchmark and the GPU tests all run kernels through this, so "zero the output of a split-K
kernel, then launch" (or "pass this stream's split-K workspace") is written once, and cuBLAS is one more
implementation a caller can time or pick.

Needs CuPy and a GPU when preparing and running; importing this module needs neither.
"""

from __future__ import annotations

import ctypes
import dataclasses
import struct
import threading
from typing import Any, Callable, Protocol

import numpy as np

from autotile.codegen import kernels
from autotile.codegen.dtypes import TENSOR_CORE_DTYPES
from autotile.codegen.problem import ProblemKey
from autotile.codegen.space import Config
from autotile.codegen.tensor_map import MAP_BYTES, TensorMapCache
from autotile.errors import InvalidValueError
from autotile.runtime.device import stream_is_capturing


class Runner(Protocol):
    """A prepared implementation for one problem: `run` launches it and does nothing else."""

    def run(self, arrays: tuple[Any, ...], out: Any, stream: Any = None) -> None:
        """Compute `out` from the input arrays on `stream` (CuPy's current stream when None)."""


class Implementation(Protocol):
    """Something that can compute a problem: `prepare` does the one-time work and returns a runner."""

    @property
    def name(self) -> str: ...

    def prepare(self, key: ProblemKey) -> Runner: ...


def _stream_ptr(stream: Any) -> int:
    import cupy

    return int((stream if stream is not None else cupy.cuda.get_current_stream()).ptr)


_external_streams: dict[int, Any] = {}


def cupy_stream(ptr: int) -> Any:
    """A CuPy stream object for the CUDA stream `ptr` (another framework's, such as torch's), made once."""
    stream = _external_streams.get(ptr)
    if stream is None:
        import warnings

        import cupy

        with warnings.catch_warnings():  # CuPy 14 prefers Stream.from_external, which needs an object, not a pointer
            warnings.simplefilter("ignore", DeprecationWarning)
            stream = _external_streams.setdefault(ptr, cupy.cuda.ExternalStream(ptr))
    return stream


# (elements, dtype, stream pointer) -> (an object that owns the memory, its device pointer)
Allocator = Callable[[int, str, int], tuple[Any, int]]


def cupy_allocator(elems: int, dtype: str, stream_ptr: int) -> tuple[Any, int]:
    """Memory from CuPy's pool, told it belongs to the stream `stream_ptr`."""
    import cupy

    with cupy_stream(stream_ptr):
        array = cupy.empty(elems, dtype=dtype)
    return array, int(array.data.ptr)


class ParameterBlock:
    """A kernel's launch parameters in one host buffer that every launch reuses.

    CuPy's kernel call converts a tuple of Python arguments on every launch (microseconds of host time, the
    bulk of a small call's cost); here each parameter has a fixed slot, the driver's array of pointers to
    the slots is built once, and a launch writes only the slots that change. `types` names each
    parameter's C type: "ptr", "int32" or "int64" (an 8-byte slot: the driver reads as many bytes as the
    type has, and a 32-bit int is the slot's low half on these little-endian hosts) or "tensormap" (a
    128-byte `CUtensorMap` passed by value, in a slot 64-byte aligned like the type). The driver copies
    the values during the launch call, so the buffer is free again when the call returns.
    """

    def __init__(self, types: tuple[str, ...]):
        self.types = types
        self.offsets: list[int] = []  # bytes from the buffer's start
        size = 0
        for kind in types:
            if kind == "tensormap":
                size = (size + 63) // 64 * 64
                self.offsets.append(size)
                size += MAP_BYTES
            else:
                self.offsets.append(size)
                size += 8
        self.size = size  # bytes
        self._storage = (ctypes.c_uint8 * (size + 64))()
        self._base = (ctypes.addressof(self._storage) + 63) // 64 * 64
        self._pointers = (ctypes.c_void_p * len(types))(*(self._base + o for o in self.offsets))
        self.address = ctypes.addressof(self._pointers)  # what cuLaunchKernel takes as kernelParams
        self.lock = threading.Lock()  # held from filling the slots to the end of the launch call
        # One ctypes view per 8-byte slot, made once: writing `.value` is the whole cost of a set.
        self.words = [ctypes.c_uint64.from_address(self._base + o) for o in self.offsets]

    def set(self, index: int, value: int) -> None:
        """An integer or pointer parameter (a negative int64 as its two's complement)."""
        self.words[index].value = int(value) & 0xFFFFFFFFFFFFFFFF

    def set_bytes(self, index: int, value: bytes) -> None:
        """A "tensormap" parameter: its 128 bytes."""
        if self.types[index] != "tensormap" or len(value) != MAP_BYTES:
            raise ValueError(f"parameter {index} is a {self.types[index]}, not {len(value)} bytes")
        ctypes.memmove(self._base + self.offsets[index], value, MAP_BYTES)

    def image(self) -> bytes:
        """The buffer's bytes (`size` of them) as they stand: each slot at its offset."""
        return ctypes.string_at(self._base, self.size)

    def arguments(self) -> tuple[Any, ...]:
        """The slots as typed NumPy scalars, as `cupy.RawKernel` would take them, and tensor maps as bytes
        (for tests and messages)."""
        kinds = {"ptr": np.uint64, "int32": np.int32, "int64": np.int64}
        values: list[Any] = []
        for kind, offset in zip(self.types, self.offsets, strict=True):
            if kind == "tensormap":
                values.append(ctypes.string_at(self._base + offset, MAP_BYTES))
            else:
                word = ctypes.c_uint64.from_address(self._base + offset).value
                values.append(np.uint64(word).astype(kinds[kind]))
        return tuple(values)


@dataclasses.dataclass(frozen=True)
class PackedLaunch:
    """One kernel launch as data, for a caller that launches without Python (the compiled lookup of torch
    calls, `autotile.runtime.torch_lookup`): cuLaunchKernel's arguments but the stream, and the parameters'
    values, whose first three slots (the inputs' and the output's addresses) the caller writes per call."""

    function: int  # CUfunction
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int  # dynamic shared memory
    image: bytes  # the parameter buffer: 8-byte slots at `offsets`
    offsets: tuple[int, ...]  # bytes from the image's start, one per kernel parameter
    zero_bytes: int  # bytes of the output zeroed on the stream before the launch (split-K adding into it), or 0


SPLIT_ROWS_PER_LAUNCH = 65535 * 32  # a LOADER=presplit split kernel's rows per launch: grid y's limit, 32 rows a block


class KernelRunner:
    """A compiled kernel and its launch geometry for one shape.

    `launch` takes device pointers, so that CuPy arrays and other frameworks' tensors go through the same
    code without a conversion; `run` is the same for CuPy arrays. A batched kernel (bmm) also takes the
    batch strides of A and B, in elements (0: one matrix for the whole batch).

    A SPLIT_REDUCE=last_block kernel also takes a workspace for its partial results and a ticket counter
    per output tile (sizes in `launch`): allocated on a stream's first run and kept for that stream,
    tickets zeroed once then (the kernel resets each one it uses). One pair per stream, because two
    streams running this runner at the same time must not count into, or sum, each other's partials;
    launches on one stream are ordered, so they can share. The first run on a stream allocates (from
    CuPy's pool; inside a CUDA-graph capture through the caller's allocator: torch's graph pool), every
    later one does not.

    A kernel that copies its tiles with the tensor memory accelerator (wgmma, LOADER=tma) takes, last, a
    flag and one tensor map per operand: encoded here for the operands' addresses (and, batched, their
    batch strides: 3-D maps, for wgmma_direct), cached by them; where an operand cannot be described
    (misaligned, rows or a batch's matrices not a multiple of 16 bytes apart) or the template copies no
    batch with maps (the tf32x3 wgmma kernels) the flag is 0 and the kernel loads through registers
    instead, with the same results.

    A wgmma LOADER=presplit kernel (`Launch.presplit_k`) has two split kernels in its source: each call
    allocates a workspace on its stream (A's and B's big and small parts, (M + N) 2 presplit_k floats a
    matrix; freed to the stream-ordered pool once enqueued), launches the splits into it, then the product,
    whose maps describe the workspace (always describable: no flag, no register path).
    """

    def __init__(self, kernel: Any, launch: kernels.Launch, sizes: tuple[Any, ...], batched: bool = False,
                 inputs: int = 2):
        from autotile.codegen import build

        self.kernel = kernel
        self.geometry = launch
        self.sizes = sizes  # the kernel's size arguments (`KernelSpec.size_args`)
        self.batched = batched
        self._buffers: dict[int, tuple[Any, int, int]] = {}  # stream pointer -> (owners, workspace, tickets)
        # The parameters, in the kernels' order: inputs, output, sizes, (batched) batch strides of the
        # inputs, (last_block) workspace and tickets. The sizes never change: written once here.
        types = ("ptr",) * (inputs + 1) + tuple(str(np.asarray(s).dtype) for s in sizes)
        types += ("int64",) * (inputs if batched else 0) + (("ptr", "ptr") if launch.tickets else ())
        batch_slot = len(types)  # (a persistent wgmma kernel of a batch) the batch's matrices
        types += ("int32",) if launch.persistent_batch else ()
        self._first_map = len(types)  # (tensor maps) the flag's slot; the maps follow it (presplit: no flag)
        self._map_offset = 0 if launch.presplit_k else 1
        if launch.tensor_maps:
            types += ("int32",) * self._map_offset + ("tensormap",) * len(launch.tensor_maps)
        # A batch copies with tensor maps only where its boxes are 3-D (a template that takes the batch as the
        # copies' coordinate); else through registers
        copies = launch.tensor_maps and (not batched or all(box.batch for box in launch.tensor_maps))
        # LOADER=presplit: the split kernels of the same source
        self._splits = (kernel.sibling(kernel.name + "_split_a"), kernel.sibling(kernel.name + "_split_b")) \
            if launch.presplit_k else None
        # their parameters (source, target, rows, K, leading dimension, presplit K, (batched) batch stride),
        # packed as the product's are: CuPy's generic call would convert them on every launch
        split_types = ("ptr", "ptr", "int32", "int32", "int32", "int32") + (("int64",) if batched else ())
        self._split_parameters = (ParameterBlock(split_types), ParameterBlock(split_types)) \
            if launch.presplit_k else None
        self._tensor_maps = TensorMapCache(launch.tensor_maps) if copies else None
        self.parameters = ParameterBlock(types)
        # the inputs (pointers, batch strides) whose maps the block holds
        self._maps_written_for: tuple[tuple[int, ...], tuple[int, ...]] | None = None
        for i, size in enumerate(sizes):
            self.parameters.set(inputs + 1 + i, int(size))
        if launch.persistent_batch:  # written once, as the sizes are
            self.parameters.set(batch_slot, launch.persistent_batch)
        self._first_stride = inputs + 1 + len(sizes)
        build.allow_dynamic_smem(kernel, launch.dynamic_smem_bytes)

    def launch(self, pointers: tuple[int, ...], out_ptr: int, out_nbytes: int, dtype: str, stream_ptr: int,
               batch_strides: tuple[int, ...] = (), allocate: Allocator = cupy_allocator) -> None:
        """Compute the output at `out_ptr` (`out_nbytes` bytes of `dtype`) from the inputs at `pointers`, on
        the CUDA stream `stream_ptr`. Allocates only on a last_block kernel's first run on a stream."""
        launch = self.geometry
        buffers = None
        if launch.zero_output:
            # Split-K blocks add their partial sums into the output: it starts at zero, on the same stream
            # as the launch so that the two stay ordered for any caller (and inside a graph capture).
            import cupy

            cupy.cuda.runtime.memsetAsync(out_ptr, 0, out_nbytes, stream_ptr)
        elif launch.tickets:
            buffers = self._buffers.get(stream_ptr)
            if buffers is None:
                buffers = self._allocate(dtype, stream_ptr, allocate)
        parameters = self.parameters
        with parameters.lock:
            for i, pointer in enumerate(pointers):
                parameters.set(i, pointer)
            parameters.set(len(pointers), out_ptr)
            slot = self._first_stride
            for stride in batch_strides:
                parameters.set(slot, stride)
                slot += 1
            if buffers is not None:
                parameters.set(slot, buffers[1])
                parameters.set(slot + 1, buffers[2])
            if launch.presplit_k:
                # the workspace is dropped once the product is enqueued: the pool hands it out again on
                # this stream only, after this launch
                _workspace, parts, part_strides = self._presplit(pointers, batch_strides, stream_ptr, allocate)
                self._write_maps(parts, part_strides)
            elif launch.tensor_maps:
                self._write_maps(pointers, batch_strides)
            self.kernel.launch_packed(launch.grid, launch.block, launch.dynamic_smem_bytes, stream_ptr, parameters)

    def _presplit(self, pointers: tuple[int, ...], batch_strides: tuple[int, ...], stream_ptr: int,
                  allocate: Allocator) -> tuple[Any, tuple[int, ...], tuple[int, ...]]:
        """LOADER=presplit: A's and B's big and small parts into a new workspace on the stream (the split
        kernels, enqueued there). Returns the workspace's owner, the four parts' addresses (A big, A small,
        B big, B small: each part's rows 2 presplit_k floats apart) and their batch strides in floats (0: a
        matrix the batch shares)."""
        assert self._splits is not None
        kp = self.geometry.presplit_k
        m, n, k = (int(size) for size in self.sizes)
        a_trans, b_trans = self.geometry.presplit_transposed
        strides = batch_strides or (0, 0)
        batch = self.geometry.tensor_maps[0].batch or 1  # the presplit boxes count a batch's matrices
        counts = [batch if stride else 1 for stride in strides]
        rows = (m, n)
        elems = [count * r * 2 * kp for count, r in zip(counts, rows, strict=True)]
        workspace, base = allocate(elems[0] + elems[1], "float32", stream_ptr)
        part_a, part_b = base, base + 4 * elems[0]
        lds = (m if a_trans else k, k if b_trans else n)
        kcontig = (not a_trans, b_trans)  # the operand's rows run along K in memory
        assert self._split_parameters is not None
        for split, parameters, source, target, r, ld, count, stride, along_k in zip(
                self._splits, self._split_parameters, pointers[:2], (part_a, part_b), rows, lds, counts, strides,
                kcontig, strict=True):
            # grid y takes 32 rows a block, at most 65535 blocks: one matrix's taller operand goes in slices
            # (a batch's matrices are found from its own row count, so a batch goes in one launch)
            if self.batched and r > SPLIT_ROWS_PER_LAUNCH:
                raise InvalidValueError(f"a batch of matrices of {r} rows exceeds the {SPLIT_ROWS_PER_LAUNCH} "
                                        "rows LOADER=presplit's split kernel takes per launch")
            step = r if self.batched else SPLIT_ROWS_PER_LAUNCH
            with parameters.lock:
                for slot, value in ((3, k), (4, ld), (5, kp), (6, stride)):
                    if slot < len(parameters.types):
                        parameters.set(slot, value)
                for first in range(0, r, step):
                    height = min(step, r - first)
                    offset = first * ld if along_k else first  # element (first, 0) of the operand
                    parameters.set(0, source + 4 * offset)
                    parameters.set(1, target + 8 * kp * first)
                    parameters.set(2, height)
                    split.launch_packed(((k + 31) // 32, (height + 31) // 32, count), (32, 8, 1), 0, stream_ptr,
                                        parameters)
        part_strides = tuple(2 * kp * r if stride else 0 for r, stride in ((m, strides[0]), (m, strides[0]),
                                                                          (n, strides[1]), (n, strides[1])))
        return workspace, (part_a, part_a + 4 * kp, part_b, part_b + 4 * kp), part_strides

    def bound_launch(self, batch_strides: tuple[int, ...] = (), out_nbytes: int = 0, dtype: str = "float32",
                     allocate: Allocator = cupy_allocator) -> Callable[[int, int, int, int], None]:
        """`launch` of a two-input kernel as a function of (A's, B's and the output's pointers, the stream),
        everything else bound once: the library's repeated call of one signature. A split-K kernel that adds
        into its output zeroes it first (`out_nbytes` bytes); one that sums by its last block takes the
        workspace kept for the stream (the first call on a stream goes through `launch`, which makes it); a
        kernel that copies with tensor maps writes them only when the inputs' addresses differ from the
        last launch's (a model's weights and buffers come back at the same addresses call after call)."""
        assert self._first_stride >= 3

        def general(a_ptr: int, b_ptr: int, out_ptr: int, stream_ptr: int) -> None:
            self.launch((a_ptr, b_ptr), out_ptr, out_nbytes, dtype, stream_ptr, batch_strides, allocate)

        if self.geometry.presplit_k:  # a workspace and the splits on every call: the general launch
            return general
        launch, parameters = self.geometry, self.parameters
        import cupy

        words = parameters.words
        word_a, word_b, word_out = words[0], words[1], words[2]
        slot = self._first_stride + len(batch_strides)
        strides = tuple(zip(words[self._first_stride:slot], batch_strides, strict=True))
        workspace_words = (words[slot], words[slot + 1]) if launch.tickets else None
        lock, go, function = parameters.lock, self.kernel.launch_function, self.kernel.function_pointer
        (gx, gy, gz), (bx, by, bz), smem, address = launch.grid, launch.block, launch.dynamic_smem_bytes, \
            parameters.address
        memset, zero, buffers = cupy.cuda.runtime.memsetAsync, launch.zero_output, self._buffers
        maps = bool(launch.tensor_maps)

        def run(a_ptr: int, b_ptr: int, out_ptr: int, stream_ptr: int) -> None:
            if zero:  # the splits add into the output: it starts at zero, on the launch's stream
                memset(out_ptr, 0, out_nbytes, stream_ptr)
            elif workspace_words is not None and stream_ptr not in buffers:
                general(a_ptr, b_ptr, out_ptr, stream_ptr)  # a stream's first call makes its workspace
                return
            with lock:
                word_a.value, word_b.value, word_out.value = a_ptr, b_ptr, out_ptr
                for word, stride in strides:  # non-negative: an element count, or 0 for a broadcast operand
                    word.value = stride
                if workspace_words is not None:
                    _, workspace_words[0].value, workspace_words[1].value = buffers[stream_ptr]
                if maps and self._maps_written_for != ((a_ptr, b_ptr), batch_strides):
                    self._write_maps((a_ptr, b_ptr), batch_strides)
                go(function, gx, gy, gz, bx, by, bz, smem, stream_ptr, address, 0)

        return run

    def packed_launch(self, batch_strides: tuple[int, ...] = (), out_nbytes: int = 0) -> PackedLaunch | None:
        """`bound_launch`'s launch as data (`PackedLaunch`: the batch strides written in, the output of
        `out_nbytes` bytes zeroed first where the splits add into it), or None where a launch needs more than
        three addresses written into fixed values: a workspace kept per stream (last_block), tensor maps
        encoded for the operands' addresses, or LOADER=presplit's split kernels."""
        launch, parameters = self.geometry, self.parameters
        if launch.presplit_k or launch.tickets or launch.tensor_maps:
            return None
        with parameters.lock:  # the sizes are fixed; the address and stride slots are written below or per call
            image = bytearray(parameters.image())
        for slot, stride in enumerate(batch_strides, start=self._first_stride):
            struct.pack_into("<q", image, parameters.offsets[slot], stride)
        return PackedLaunch(self.kernel.function_pointer, launch.grid, launch.block, launch.dynamic_smem_bytes,
                            bytes(image), tuple(parameters.offsets), out_nbytes if launch.zero_output else 0)

    def _write_maps(self, pointers: tuple[int, ...], batch_strides: tuple[int, ...] = ()) -> None:
        """The flag and the tensor maps for the inputs at `pointers` (batched: their batch strides, in
        elements) into the parameter block, unless it holds them already (call with the block's lock
        held)."""
        if self._maps_written_for == (pointers, batch_strides):
            return
        maps = self._tensor_maps.maps(pointers, batch_strides) if self._tensor_maps is not None else None
        if self._map_offset:
            self.parameters.set(self._first_map, maps is not None)
        for i, tensor_map in enumerate(maps or ()):
            self.parameters.set_bytes(self._first_map + self._map_offset + i, tensor_map)
        self._maps_written_for = (pointers, batch_strides)

    def uses_tensor_maps(self, pointers: tuple[int, ...], batch_strides: tuple[int, ...] = ()) -> bool:
        """Whether a launch with the inputs at `pointers` (batched: `batch_strides` elements between their
        matrices) copies its tiles with tensor maps (LOADER=tma and every operand describable), rather than
        loading them through registers."""
        return self._tensor_maps is not None and self._tensor_maps.maps(pointers, batch_strides) is not None

    def run(self, arrays: tuple[Any, ...], out: Any, stream: Any = None) -> None:
        """`launch` for CuPy arrays, on `stream` (CuPy's current stream when None)."""
        from autotile.codegen.kernels import batch_strides

        strides = tuple(int(s) for s in batch_strides(arrays)) if self.batched else ()
        self.launch(tuple(int(a.data.ptr) for a in arrays), int(out.data.ptr), int(out.nbytes), str(out.dtype),
                    _stream_ptr(stream), strides)

    def _allocate(self, dtype: str, stream_ptr: int, allocate: Allocator) -> tuple[Any, int, int]:
        """The workspace (uninitialized: every split stores its slice before any block reads it) and the
        tickets (zeroed on the stream, so the zeroing is ordered before this stream's first launch)."""
        import cupy

        if not stream_is_capturing(stream_ptr):
            # Kept for the stream, so from CuPy's pool rather than the caller's framework's: torch.compile's
            # CUDA graph trees warm up with torch's allocations in their graph's pool and refuse to record
            # while a tensor of that pool outlives the call without being its output. Inside a capture
            # the caller's allocator is the only safe one (torch's: the graph's pool, kept for its replays).
            allocate = cupy_allocator
        workspace_dtype = self.geometry.workspace_dtype or dtype
        workspace, workspace_ptr = allocate(self.geometry.workspace_elems, workspace_dtype, stream_ptr)
        tickets, tickets_ptr = allocate(self.geometry.tickets, "uint32", stream_ptr)
        cupy.cuda.runtime.memsetAsync(tickets_ptr, 0, 4 * self.geometry.tickets, stream_ptr)
        # Two threads may allocate for one stream at once: both zeroed their own, one pair is kept.
        return self._buffers.setdefault(stream_ptr, ((workspace, tickets), workspace_ptr, tickets_ptr))


@dataclasses.dataclass(frozen=True)
class Generated:
    """A config of a kernel's search space, rendered and compiled with the library's options."""

    config: Config
    source: str | None = None  # the rendered source when the caller has it already (the worker does)

    @property
    def name(self) -> str:
        return "generated"

    def prepare(self, key: ProblemKey) -> KernelRunner:
        from autotile.codegen import build

        spec = kernels.get(key.kernel)
        source = self.source if self.source is not None else spec.render(self.config, key.dtype, key.layout)
        kernel = build.compile_kernel(source, spec.function_name)
        launch = spec.launch(self.config, key.shape, key.dtype, key.layout, sm_count=sm_count())
        return KernelRunner(kernel, launch, spec.size_args(key.shape), spec.batched, spec.operand_count(key.dtype))


_sm_counts: dict[int, int] = {}


def sm_count() -> int:
    """The current device's SM count (a persistent kernel's grid), asked once per device."""
    import cupy

    device = cupy.cuda.Device()
    count = _sm_counts.get(device.id)
    if count is None:
        count = _sm_counts[device.id] = int(device.attributes["MultiProcessorCount"])
    return count


class CublasRunner:
    """cuBLAS, the baseline of every ratio: float32 and float64 through CuPy (SGEMM/DGEMM for matmul,
    SGEMV/DGEMV for matvec), bfloat16, float16 and int8 through `autotile.runtime.cublas` (GemmEx, float32
    sums, or int32 sums and C for int8: PyTorch's contracts). CuPy holds bfloat16 as uint16 bit patterns, so
    its matmul would multiply integers; float16 takes the same route, so both 16-bit types are timed against
    one and the same cuBLAS call; CuPy's int8 matmul would sum in int8."""

    def __init__(self, key: ProblemKey):
        self.key = key
        self._direct = key.dtype in TENSOR_CORE_DTYPES
        self._call: Any = None  # the CublasCall, made on the first run (with the device current then)

    def run(self, arrays: tuple[Any, ...], out: Any, stream: Any = None) -> None:
        if self._direct:
            self._run_direct(arrays, out, stream)
            return
        import cupy

        a, b = arrays
        if stream is None:
            cupy.matmul(a, b, out=out)
        else:
            with stream:
                cupy.matmul(a, b, out=out)

    def _run_direct(self, arrays: tuple[Any, ...], out: Any, stream: Any) -> None:
        call = self._call
        if call is None:
            import cupy

            from autotile.runtime.cublas import CublasCall

            call = self._call = CublasCall(self.key, cupy.cuda.Device().id)
        strides = tuple(int(s) for s in kernels.batch_strides(arrays)) if call.batched else ()
        call(tuple(int(a.data.ptr) for a in arrays), int(out.data.ptr), _stream_ptr(stream), strides)


@dataclasses.dataclass(frozen=True)
class Cublas:
    """cuBLAS as an implementation: nothing to compile."""

    @property
    def name(self) -> str:
        return "cublas"

    def prepare(self, key: ProblemKey) -> CublasRunner:
        return CublasRunner(key)


__all__ = ["Allocator", "Cublas", "CublasRunner", "Generated", "Implementation", "KernelRunner", "Runner",
           "cupy_allocator", "cupy_stream"]
