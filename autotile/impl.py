"""What runs a problem: one interface for a generated kernel and for cuBLAS.

An `Implementation` is prepared once for a problem (compile, launch geometry, the dynamic shared-memory
opt-in) and gives a `Runner`; `Runner.run(arrays, out, stream)` then only launches. The tuner's worker, the
library, the benchmark and the GPU tests all run kernels through this, so "zero the output of a split-K
kernel, then launch" (or "pass this stream's split-K workspace") is written once, and cuBLAS is one more
implementation a caller can time or pick.

Needs CuPy and a GPU when preparing and running; importing this module needs neither.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import numpy as np

from . import kernels
from .problem import ProblemKey
from .space import Config


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


class KernelRunner:
    """A compiled kernel and its launch geometry for one shape.

    A SPLIT_REDUCE=last_block kernel also takes a workspace for its partial results and a ticket counter
    per output tile (sizes in `launch`): allocated on a stream's first run and kept for that stream,
    tickets zeroed once then (the kernel resets each one it uses). One pair per stream, because two
    streams running this runner at the same time must not count into, or sum, each other's partials;
    launches on one stream are ordered, so they can share. The first run on a stream allocates: make it
    before capturing that stream into a CUDA graph.
    """

    def __init__(self, kernel: Any, launch: kernels.Launch, shape: tuple[int, ...]):
        from . import build

        self.kernel = kernel
        self.launch = launch
        self.sizes = tuple(np.int32(d) for d in shape)
        self._buffers: dict[int, tuple[Any, Any]] = {}  # stream pointer -> (workspace, tickets)
        build.allow_dynamic_smem(kernel, launch.dynamic_smem_bytes)

    def run(self, arrays: tuple[Any, ...], out: Any, stream: Any = None) -> None:
        launch = self.launch
        args = (*arrays, out, *self.sizes)
        if launch.zero_output:
            # Split-K blocks add their partial sums into the output: it starts at zero, on the same stream
            # as the launch so that the two stay ordered for any caller (and inside a graph capture).
            import cupy

            cupy.cuda.runtime.memsetAsync(out.data.ptr, 0, out.nbytes, _stream_ptr(stream))
        elif launch.tickets:
            ptr = _stream_ptr(stream)
            buffers = self._buffers.get(ptr)
            if buffers is None:
                buffers = self._allocate(out.dtype, stream, ptr)
            args = (*args, *buffers)
        self.kernel(launch.grid, launch.block, args, shared_mem=launch.dynamic_smem_bytes, stream=stream)

    def _allocate(self, dtype: Any, stream: Any, ptr: int) -> tuple[Any, Any]:
        """The workspace (uninitialized: every split stores its slice before any block reads it) and the
        tickets (zeroed on `stream`, so the zeroing is ordered before this stream's first launch), with
        CuPy's pool told the memory belongs to `stream`."""
        import contextlib

        import cupy

        with stream if stream is not None else contextlib.nullcontext():
            workspace = cupy.empty(self.launch.workspace_elems, dtype=dtype)
            tickets = cupy.empty(self.launch.tickets, dtype=cupy.uint32)
        cupy.cuda.runtime.memsetAsync(tickets.data.ptr, 0, tickets.nbytes, ptr)
        # Two threads may allocate for one stream at once: both zeroed their own, one pair is kept.
        return self._buffers.setdefault(ptr, (workspace, tickets))


@dataclasses.dataclass(frozen=True)
class Generated:
    """A config of a kernel's search space, rendered and compiled with the library's options."""

    config: Config
    source: str | None = None  # the rendered source when the caller has it already (the worker does)

    @property
    def name(self) -> str:
        return "generated"

    def prepare(self, key: ProblemKey) -> KernelRunner:
        from . import build

        spec = kernels.get(key.kernel)
        source = self.source if self.source is not None else spec.render(self.config, key.dtype, key.layout)
        kernel = build.compile_kernel(source, "autotile_" + spec.name)
        return KernelRunner(kernel, spec.launch(self.config, key.shape, key.dtype, key.layout), key.shape)


class CublasRunner:
    """cuBLAS through CuPy (SGEMM/DGEMM for matmul, SGEMV/DGEMV for matvec), the baseline of every ratio."""

    def run(self, arrays: tuple[Any, ...], out: Any, stream: Any = None) -> None:
        import cupy

        a, b = arrays
        if stream is None:
            cupy.matmul(a, b, out=out)
        else:
            with stream:
                cupy.matmul(a, b, out=out)


@dataclasses.dataclass(frozen=True)
class Cublas:
    """cuBLAS as an implementation: nothing to compile."""

    @property
    def name(self) -> str:
        return "cublas"

    def prepare(self, key: ProblemKey) -> CublasRunner:
        return CublasRunner()


__all__ = ["Cublas", "CublasRunner", "Generated", "Implementation", "KernelRunner", "Runner"]
