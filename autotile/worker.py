"""Candidates run in a worker process, so that no candidate can take the tuning run down with it.

The parent renders the sources and computes the launch geometry (pure Python); the worker compiles them
(several at once, on NVRTC threads), verifies each against a float64 reference on the tuning shape and on
small odd shapes, and times it. A candidate that fails gets a typed status:

- ``compile``: NVRTC rejected the source;
- ``launch``: the launch was refused (too many resources) and the GPU is still usable;
- ``crash``: the CUDA context is gone (illegal address, ...) or the process died; the worker is replaced;
- ``timeout``: no answer within the time limit (a hang); the worker is killed and replaced;
- ``wrong result``: ||out - ref|| / ||ref|| above the tolerance, NaN included.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import time
import traceback
from typing import Any

from .kernels import Launch
from .timing import Timing

OK, COMPILE, LAUNCH, CRASH, TIMEOUT, WRONG = "ok", "compile", "launch", "crash", "timeout", "wrong result"
FAILURES = (COMPILE, LAUNCH, CRASH, TIMEOUT, WRONG)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One kernel to try: its source, its function name and its launch geometry for every shape."""

    id: int
    source: str
    name: str
    launches: dict[tuple[int, ...], Launch]
    config_key: str = ""


@dataclasses.dataclass(frozen=True)
class CandidateResult:
    id: int
    status: str
    message: str = ""
    timing: Timing | None = None
    error: float | None = None  # worst relative error over the verified shapes
    registers: int | None = None
    compile_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == OK


@dataclasses.dataclass(frozen=True)
class Setup:
    """The problem a worker prepares inputs for: the tuning shape plus the kernel's check shapes."""

    kernel: str
    shape: tuple[int, ...]
    dtype: str
    layout: str
    seed: int = 0
    compile_threads: int = 4


# -- the worker process --------------------------------------------------------------------------------

class _WorkerState:
    def __init__(self, setup: Setup):
        import cupy

        from . import device, kernels
        from .timing import L2Flusher, time_launch

        self.setup = setup
        self.spec = kernels.get(setup.kernel)
        self.limits = device.live_device()
        self.flush = L2Flusher(self.limits.l2_bytes)
        self.shapes = [setup.shape] + [s for s in self.spec.check_shapes if s != setup.shape]
        rng = cupy.random.default_rng(setup.seed)
        self.inputs: dict[tuple[int, ...], tuple[Any, ...]] = {}
        self.refs: dict[tuple[int, ...], Any] = {}
        self.outputs: dict[tuple[int, ...], Any] = {}
        for shape in self.shapes:
            self.inputs[shape] = tuple(self.spec.make_inputs(shape, setup.dtype, setup.layout, rng, cupy))
            # The float64 reference through cuBLAS (DGEMM/DGEMV) on upcast copies of the same inputs.
            ref = self.inputs[shape][0].astype(cupy.float64) @ self.inputs[shape][1].astype(cupy.float64)
            self.refs[shape] = ref
            self.outputs[shape] = cupy.empty(self.spec.output_shape(shape), dtype=setup.dtype)
        a, b = self.inputs[setup.shape][:2]
        base_out = self.outputs[setup.shape]
        # cuBLAS through CuPy, timed the same way as the candidates.
        self.baseline = time_launch(lambda: cupy.matmul(a, b, out=base_out), self.flush)
        self.kernels: dict[int, Any] = {}

    def environment(self) -> dict[str, Any]:
        import cupy

        rt = cupy.cuda.runtime
        from .build import compiler_version

        return {
            "gpu": self.limits.name,
            "device": self.limits.fingerprint,
            "limits": dataclasses.asdict(self.limits),
            "driver": rt.driverGetVersion(),
            "cuda_runtime": rt.runtimeGetVersion(),
            "cupy": cupy.__version__,
            "compiler": compiler_version(),
            "date": time.strftime("%Y-%m-%d"),
        }

    def run_fn(self, kernel: Any, launch: Launch, shape: tuple[int, ...]):
        out = self.outputs[shape]
        args = self.spec.kernel_args(self.inputs[shape], out, shape)

        def run() -> None:
            if launch.zero_output:
                out.fill(0)
            kernel(launch.grid, launch.block, args, shared_mem=launch.dynamic_smem_bytes)

        return run, out


def _context_alive() -> bool:
    import cupy

    try:
        return float((cupy.ones(4) * 2).sum().item()) == 8.0
    except Exception:
        return False


def _evaluate(state: _WorkerState, cand: Candidate, kernel: Any, compile_s: float) -> CandidateResult:
    import cupy

    from .build import allow_dynamic_smem
    from .kernels import tolerance
    from .timing import relative_error, time_launch

    regs = int(getattr(kernel, "num_regs", 0)) or None
    worst = 0.0
    for shape in state.shapes:
        launch = cand.launches[tuple(shape)]
        try:
            allow_dynamic_smem(kernel, launch.dynamic_smem_bytes)
            run, out = state.run_fn(kernel, launch, shape)
            out.fill(float("nan"))  # poison: an element the kernel does not write fails the check
            run()
            cupy.cuda.Device().synchronize()
        except Exception as exc:  # CUDA errors come as several CuPy types; the probe tells them apart
            status = LAUNCH if _context_alive() else CRASH
            return CandidateResult(cand.id, status, f"{type(exc).__name__}: {exc}", registers=regs,
                                   compile_s=compile_s)
        err = relative_error(out, state.refs[shape])
        tol = tolerance(state.setup.dtype, shape[-1])
        if not err <= tol:  # NaN fails too
            return CandidateResult(cand.id, WRONG, f"shape {'x'.join(map(str, shape))}: relative error "
                                   f"{err:.3g} > tolerance {tol:.3g}", error=err, registers=regs,
                                   compile_s=compile_s)
        worst = max(worst, err)
    run, _ = state.run_fn(kernel, cand.launches[tuple(state.setup.shape)], state.setup.shape)
    try:
        timing = time_launch(run, state.flush)
    except Exception as exc:
        status = LAUNCH if _context_alive() else CRASH
        return CandidateResult(cand.id, status, f"{type(exc).__name__}: {exc}", registers=regs)
    state.kernels[cand.id] = kernel
    return CandidateResult(cand.id, OK, "", timing, worst, regs, compile_s)


def _serve(conn: Any) -> None:
    from . import build
    from .errors import CompileError
    from .timing import time_launch

    state: _WorkerState | None = None
    while True:
        msg = conn.recv()
        op = msg["op"]
        if op == "stop":
            return
        if op == "setup":
            state = _WorkerState(msg["setup"])
            conn.send({"baseline": state.baseline, "environment": state.environment()})
        elif op == "evaluate":
            assert state is not None
            cands: list[Candidate] = msg["candidates"]
            t0 = time.perf_counter()
            futures = build.compile_many([(c.source, c.name) for c in cands], state.setup.compile_threads)
            for cand, fut in zip(cands, futures):
                try:
                    kernel = fut.result()
                    result = _evaluate(state, cand, kernel, time.perf_counter() - t0)
                except CompileError as exc:
                    result = CandidateResult(cand.id, COMPILE, str(exc) + "\n" + exc.log[-2000:])
                conn.send(result)
                if result.status == CRASH:
                    os._exit(3)  # the context is unusable: the parent starts a fresh worker
        elif op == "retime":
            assert state is not None
            # Interleaved: round r times every candidate once, so drift in clocks or neighbours' load
            # hits all of them alike.
            ids: list[int] = msg["ids"]
            medians: dict[int, list[float]] = {i: [] for i in ids}
            for _ in range(msg["rounds"]):
                for i in ids:
                    cand = msg["candidates"][i]
                    if i not in state.kernels:  # compiled in a worker that has since been replaced
                        state.kernels[i] = build.compile_kernel(cand.source, cand.name)
                    launch = cand.launches[tuple(state.setup.shape)]
                    build.allow_dynamic_smem(state.kernels[i], launch.dynamic_smem_bytes)
                    run, _ = state.run_fn(state.kernels[i], launch, state.setup.shape)
                    medians[i].append(time_launch(run, state.flush, warmup=1, min_reps=5, target_ms=50).median_ms)
            a, b = state.inputs[state.setup.shape][:2]
            import cupy

            base_out = state.outputs[state.setup.shape]
            baseline = time_launch(lambda: cupy.matmul(a, b, out=base_out), state.flush)
            conn.send({"medians": medians, "baseline": baseline})
        else:
            conn.send({"error": f"unknown op {op!r}"})


def worker_main(conn: Any) -> None:
    """Entry point of the worker process: serve requests until told to stop or the pipe closes."""
    try:
        _serve(conn)
    except EOFError:
        pass
    except Exception:
        try:
            conn.send({"fatal": traceback.format_exc()})
        except Exception:
            pass
        os._exit(4)


# -- the parent side -------------------------------------------------------------------------------------

class WorkerCrashed(Exception):
    pass


class IsolatedRunner:
    """Owns one worker process; replaces it after a crash or a timeout and replays the setup."""

    def __init__(self, setup: Setup, timeout_s: float = 60.0, setup_timeout_s: float = 600.0):
        self.setup = setup
        self.timeout_s = timeout_s
        self.setup_timeout_s = setup_timeout_s
        self._ctx = multiprocessing.get_context("spawn")
        self._proc: Any = None
        self._conn: Any = None
        self.baseline: Timing | None = None
        self.environment: dict[str, Any] = {}
        self.restarts = 0

    def __enter__(self) -> "IsolatedRunner":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=worker_main, args=(child,), daemon=True, name="autotile-worker")
        self._proc.start()
        child.close()
        self._conn = parent
        self._conn.send({"op": "setup", "setup": self.setup})
        reply = self._receive(self.setup_timeout_s)
        if reply is None or "fatal" in reply:
            detail = reply["fatal"] if reply else "no answer"
            self._kill()
            raise RuntimeError(f"the GPU worker could not prepare the problem: {detail}")
        self.baseline = reply["baseline"]
        self.environment = reply["environment"]

    def close(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            try:
                self._conn.send({"op": "stop"})
                self._proc.join(5)
            except Exception:
                pass
        self._kill()

    def _kill(self) -> None:
        if self._proc is not None:
            if self._proc.is_alive():
                self._proc.kill()
            self._proc.join(5)
        self._proc = None

    def _receive(self, timeout: float) -> Any:
        """The next message, or None on timeout; raises WorkerCrashed if the process died."""
        try:
            if self._conn.poll(timeout):
                return self._conn.recv()
        except (EOFError, OSError):
            raise WorkerCrashed() from None
        if self._proc is not None and not self._proc.is_alive():
            raise WorkerCrashed()
        return None

    def evaluate(self, candidates: list[Candidate]) -> list[CandidateResult]:
        """Results in the order given. After a crash or a hang the rest of the batch goes to a new worker."""
        results: list[CandidateResult] = []
        pending = list(candidates)
        while pending:
            self._conn.send({"op": "evaluate", "candidates": pending})
            for cand in list(pending):
                try:
                    reply = self._receive(self.timeout_s)
                except WorkerCrashed:
                    reply = CandidateResult(cand.id, CRASH, "the worker process died")
                if reply is None:
                    reply = CandidateResult(cand.id, TIMEOUT, f"no result within {self.timeout_s:g} s")
                if isinstance(reply, dict):  # a fatal error report from the worker
                    reply = CandidateResult(cand.id, CRASH, reply.get("fatal", str(reply))[-2000:])
                results.append(reply)
                pending.remove(cand)
                if reply.status in (CRASH, TIMEOUT):
                    self._kill()
                    self.restarts += 1
                    self.start()
                    break
        return results

    def retime(self, candidates: dict[int, Candidate], rounds: int) -> tuple[dict[int, list[float]], Timing]:
        """Per candidate, its median in each of `rounds` interleaved rounds; and cuBLAS re-timed."""
        self._conn.send({"op": "retime", "ids": list(candidates), "candidates": candidates, "rounds": rounds})
        reply = self._receive(self.timeout_s * max(1, len(candidates)) * rounds)
        if not isinstance(reply, dict) or "medians" not in reply:
            raise RuntimeError(f"re-timing failed: {reply}")
        return reply["medians"], reply["baseline"]
