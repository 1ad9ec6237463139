"""Candidates run in a worker process, so that no candidate can take the tuning run down with it.

The worker is a fresh interpreter that imports this module and calls `worker_main` (`python -c "from
autotile.runtime.worker import worker_main; worker_main()"`), talking to the parent over its standard input and
output: it never re-imports the caller's script, so a tuning call
needs no `if __name__ == "__main__":` guard. The parent renders the sources and computes the launch
geometry (pure Python); the worker compiles them
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
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from autotile.codegen import build, dtypes
from autotile.codegen.kernels import Launch
from autotile.codegen.problem import ProblemKey
from autotile.errors import AutotileError
from autotile.runtime.cublas import unsupported_reason
from autotile.runtime.timing import Timing

OK, COMPILE, LAUNCH, CRASH, TIMEOUT, WRONG = "ok", "compile", "launch", "crash", "timeout", "wrong result"
FAILURES = (COMPILE, LAUNCH, CRASH, TIMEOUT, WRONG)
# Not run, and no failure of the config: its compile was still running when the tune's time was up
# (`Candidate.wait_until`).
LATE = "late"


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One kernel to try: its source, its function name and its launch geometry for every shape."""

    id: int
    source: str
    name: str
    launches: dict[tuple[int, ...], Launch]
    config_key: str = ""
    # Timing stops after a few runs where even the fastest took longer than this (ms; None: never): the
    # tuner's threshold above its best time so far (`timing.clearly_slower`).
    give_up_ms: float | None = None
    # A compile still running at this time (seconds since the epoch, `time.time()`) is not waited for: the
    # candidate comes back LATE (the tune's --timeout; None: waited for).
    wait_until: float | None = None


@dataclasses.dataclass(frozen=True)
class CandidateResult:
    id: int
    status: str
    message: str = ""
    timing: Timing | None = None
    error: float | None = None  # worst relative error over the verified shapes
    registers: int | None = None
    compile_s: float | None = None
    # Where the worker's time went for this candidate, in seconds: waiting for its compile (NVRTC, or the
    # compile cache), checking its results against the reference, timing it.
    compile_wait_s: float = 0.0
    check_s: float = 0.0
    timing_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == OK


@dataclasses.dataclass(frozen=True)
class Setup:
    """The problem a worker prepares inputs for: the tuning shape plus the kernel's check shapes."""

    key: ProblemKey
    seed: int = 0
    compile_threads: int = dataclasses.field(default_factory=build.host_compile_threads)
    device_id: int = 0
    # Whether to stop waiting for a compile that runs past `compile_deadline_s` (False: wait for every
    # compile, as a sweep must: it times every config).
    compile_deadline: bool = True


# A compile that has run COMPILE_DEADLINE_FACTOR times this worker's median compile, and at least
# COMPILE_DEADLINE_FLOOR_S, is not waited for: the candidate fails as a compile that took too long, and the
# compile goes on in the background into the compile cache. NVRTC takes 0.1-1.3 s for most configs on one
# core, 1-5 s with a 16-core host's threads all compiling, but 44 s for a few (a SIMT config with 16 x 8
# accumulators a thread, VEC 2 and UNROLL 4; 1 of 24 uniform draws of the float32 matmul space, 2026-11-27):
# with a floor of 20 s, the tunes that drew it waited 20 s for it, most of their wall time.
COMPILE_DEADLINE_FACTOR = 5.0
COMPILE_DEADLINE_FLOOR_S = 8.0


def compile_deadline_s(durations: list[float]) -> float:
    """Seconds a compile may run before it is given up on, from the durations of the compiles finished."""
    ordered = sorted(durations)
    median = ordered[len(ordered) // 2] if ordered else 0.0
    return max(COMPILE_DEADLINE_FLOOR_S, COMPILE_DEADLINE_FACTOR * median)


class CompileTooSlow(Exception):
    """A compile ran past its deadline (`compile_deadline_s`)."""


class TimeUp(Exception):
    """A compile was still running when the tune's time was up (`Candidate.wait_until`)."""


class WorkerError(AutotileError, RuntimeError):
    """The GPU worker process could not start, prepare the problem, or answer."""


# -- the worker process --------------------------------------------------------------------------------

class _WorkerState:
    def __init__(self, setup: Setup):
        import cupy

        from autotile.codegen import kernels
        from autotile.runtime import device
        from autotile.runtime.impl import Cublas
        from autotile.runtime.timing import L2Flusher, time_launch

        cupy.cuda.Device(setup.device_id).use()
        self.setup = setup
        self.spec = kernels.get(setup.key.kernel)
        self.limits = device.live_device(setup.device_id)
        self.flush = L2Flusher(self.limits.l2_bytes)
        self.shapes = [setup.key.shape] + [s for s in self.spec.check_shapes if s != setup.key.shape]
        rng = cupy.random.default_rng(setup.seed)
        self.inputs: dict[tuple[int, ...], tuple[Any, ...]] = {}
        self.refs: dict[tuple[int, ...], Any] = {}
        self.outputs: dict[tuple[int, ...], Any] = {}
        out_dtype = dtypes.output_storage(setup.key.dtype)
        for shape in self.shapes:
            self.inputs[shape] = tuple(self.spec.make_inputs(shape, setup.key.dtype, setup.key.layout, rng, cupy))
            self.refs[shape] = self.spec.reference(self.inputs[shape], setup.key.dtype)  # float64, on the GPU
            self.outputs[shape] = cupy.empty(self.spec.output_shape(shape), dtype=out_dtype)
        cublas = Cublas().prepare(setup.key)
        args, out = self.inputs[setup.key.shape], self.outputs[setup.key.shape]
        # where cuBLAS cannot compute the problem (int8 outside nt or with odd leading dimensions): no baseline
        runs = unsupported_reason(setup.key) is None
        self.time_cublas: Callable[[], Timing | None] = \
            (lambda: time_launch(lambda: cublas.run(args, out), self.flush)) if runs else (lambda: None)
        self.baseline = self.time_cublas()
        self.kernels: dict[int, Any] = {}
        # (source, name) -> the future of its compile, from "prepare" until its "evaluate" takes it
        self.compiling: dict[tuple[str, str], Any] = {}
        # (source, name) -> (when its compile began, when it ended or None), as the compile threads write it
        self.compile_clock: dict[tuple[str, str], tuple[float, float | None]] = {}

    def await_compile(self, job: tuple[str, str], future: Any, wait_until: float | None = None) -> Any:
        """The kernel `future` compiles; raises CompileTooSlow where the compile runs past its deadline, and
        TimeUp where it is still running at `wait_until` (`time.time()`)."""
        import concurrent.futures

        while True:
            done, _ = concurrent.futures.wait([future], timeout=0.05)
            if done:
                return future.result()
            if wait_until is not None and time.time() > wait_until:
                raise TimeUp("the tune's time was up before its compile ended (it goes on into the compile cache)")
            began = self.compile_clock.get(job, (None, None))[0]
            if self.setup.compile_deadline and began is not None:
                finished = [end - start for start, end in self.compile_clock.values() if end is not None]
                limit = compile_deadline_s(finished)
                if time.monotonic() - began > limit:
                    raise CompileTooSlow(f"the compile was still running after {limit:.0f} s (over "
                                         f"{COMPILE_DEADLINE_FACTOR:g} times this tune's median compile): not "
                                         f"waited for (it goes on into the compile cache while the tune runs)")

    def environment(self) -> dict[str, Any]:
        import cupy

        from autotile.codegen.build import COMPILE_OPTIONS, compiler_version

        rt = cupy.cuda.runtime
        return {
            "gpu": self.limits.name,
            "device": self.limits.fingerprint,
            "limits": dataclasses.asdict(self.limits),
            "driver": rt.driverGetVersion(),
            "cuda_runtime": rt.runtimeGetVersion(),
            "cupy": cupy.__version__,
            "compiler": compiler_version(),
            "compile_options": list(COMPILE_OPTIONS),
            "date": time.strftime("%Y-%m-%d"),
        }

    def runner(self, kernel: Any, launch: Launch, shape: tuple[int, ...]) -> Any:
        """The run of this kernel on this shape's inputs, through the library's own launcher."""
        from autotile.runtime.impl import KernelRunner

        runner = KernelRunner(kernel, launch, self.spec.size_args(shape), self.spec.batched)
        args, out = self.inputs[shape], self.outputs[shape]
        return lambda: runner.run(args, out)


def _context_alive() -> bool:
    import cupy

    try:
        return float((cupy.ones(4) * 2).sum().item()) == 8.0
    except Exception:
        return False


def _evaluate(state: _WorkerState, cand: Candidate, kernel: Any, compile_s: float) -> CandidateResult:
    """Check `kernel` on every shape, time it on the tuning shape, check it again; the result says how long
    the checks and the timing took."""
    spent = {"check_s": 0.0, "timing_s": 0.0}
    result = _check_and_time(state, cand, kernel, compile_s, spent)
    return dataclasses.replace(result, check_s=spent["check_s"], timing_s=spent["timing_s"])


def _check_and_time(state: _WorkerState, cand: Candidate, kernel: Any, compile_s: float,
                    spent: dict[str, float]) -> CandidateResult:
    from autotile.runtime.timing import time_launch

    def check(shape: tuple[int, ...], when: str) -> tuple[CandidateResult | None, float]:
        started = time.perf_counter()
        try:
            return _check(state, cand, shape, runs[shape], regs, compile_s, when)
        finally:
            spent["check_s"] += time.perf_counter() - started

    regs = _registers(kernel)
    worst = 0.0
    runs: dict[tuple[int, ...], Any] = {}
    for shape in state.shapes:
        try:
            runs[shape] = state.runner(kernel, cand.launches[tuple(shape)], shape)
        except Exception as exc:  # the dynamic shared-memory opt-in, refused by the device
            return _launch_failure(cand, exc, regs, compile_s)
        failed, err = check(shape, "")
        if failed is not None:
            return failed
        worst = max(worst, err)
    shape = state.setup.key.shape
    started = time.perf_counter()
    try:
        timing = time_launch(runs[shape], state.flush, give_up_ms=cand.give_up_ms)
    except Exception as exc:
        status = LAUNCH if _context_alive() else CRASH
        return CandidateResult(cand.id, status, f"{type(exc).__name__}: {exc}", registers=regs)
    finally:
        spent["timing_s"] += time.perf_counter() - started
    # Once more on the runner just timed: a kernel that leaves state behind for its next launch (the
    # tickets of SPLIT_REDUCE=last_block, which each launch must reset) fails here, not in the library.
    failed, err = check(shape, " after the timed runs")
    if failed is not None:
        return failed
    state.kernels[cand.id] = kernel
    return CandidateResult(cand.id, OK, "", timing, max(worst, err), regs, compile_s)


def _launch_failure(cand: Candidate, exc: Exception, regs: int | None, compile_s: float) -> CandidateResult:
    """A launch that raised: CUDA errors come as several CuPy types; the probe tells them apart."""
    status = LAUNCH if _context_alive() else CRASH
    return CandidateResult(cand.id, status, f"{type(exc).__name__}: {exc}", registers=regs, compile_s=compile_s)


def _check(state: _WorkerState, cand: Candidate, shape: tuple[int, ...], run: Any, regs: int | None,
           compile_s: float, when: str) -> tuple[CandidateResult | None, float]:
    """One run of `run` on a poisoned output, compared with the reference: (the failure or None, the
    relative error)."""
    import cupy

    from autotile.codegen.kernels import poison, tolerance
    from autotile.runtime.timing import relative_error

    out = state.outputs[shape]
    try:
        poison(out)  # an element the kernel does not write fails the check
        run()
        cupy.cuda.Device().synchronize()
    except Exception as exc:
        return _launch_failure(cand, exc, regs, compile_s), 0.0
    err = relative_error(out, state.refs[shape])
    tol = tolerance(state.setup.key.dtype, shape[-1])
    if not err <= tol:  # NaN fails too
        return CandidateResult(cand.id, WRONG, f"shape {'x'.join(map(str, shape))}{when}: relative error "
                               f"{err:.3g} > tolerance {tol:.3g}", error=err, registers=regs,
                               compile_s=compile_s), err
    return None, err


def _registers(kernel: Any) -> int | None:
    registers = getattr(kernel, "registers", None)
    if registers is None:
        registers = getattr(kernel, "num_regs", None)
    return int(registers) if registers else None


def _start_compiles(state: _WorkerState, jobs: list[tuple[str, str]]) -> None:
    """Start compiling each (source, name) not under way already (once: two configs may render alike)."""
    fresh = list(dict.fromkeys(job for job in jobs if job not in state.compiling))
    futures = build.compile_many(fresh, state.setup.compile_threads, state.compile_clock)
    for job, future in zip(fresh, futures, strict=True):
        state.compiling[job] = future


def _serve(conn: Any) -> None:
    from autotile.errors import CompileError
    from autotile.runtime.timing import time_launch

    state: _WorkerState | None = None
    while True:
        msg = conn.recv()
        op = msg["op"]
        if op == "stop":
            return
        if op == "echo":  # the protocol's own check (tests): a value pickled there and back
            conn.send(msg["value"])
        elif op == "setup":
            state = _WorkerState(msg["setup"])
            conn.send({"baseline": state.baseline, "environment": state.environment()})
        elif op == "prepare":  # start compiling what a later "evaluate" will bring; no answer
            assert state is not None
            _start_compiles(state, [(c.source, c.name) for c in msg["candidates"]])
        elif op == "evaluate":
            assert state is not None
            cands: list[Candidate] = msg["candidates"]
            t0 = time.perf_counter()
            # Compiles a "prepare" started are taken up where they are (under way, or done), not begun again.
            _start_compiles(state, [(c.source, c.name) for c in cands])
            futures = [state.compiling[(c.source, c.name)] for c in cands]
            for c in cands:
                state.compiling.pop((c.source, c.name), None)
            for cand, fut in zip(cands, futures, strict=True):
                waiting = time.perf_counter()  # the GPU idles while a compile is awaited
                try:
                    kernel = state.await_compile((cand.source, cand.name), fut, cand.wait_until)
                    waited = time.perf_counter() - waiting
                    result = dataclasses.replace(_evaluate(state, cand, kernel, time.perf_counter() - t0),
                                                 compile_wait_s=waited)
                except CompileError as exc:
                    result = CandidateResult(cand.id, COMPILE, str(exc) + "\n" + exc.log[-2000:],
                                             compile_wait_s=time.perf_counter() - waiting)
                except CompileTooSlow as exc:
                    result = CandidateResult(cand.id, COMPILE, str(exc), compile_wait_s=time.perf_counter() - waiting)
                except TimeUp as exc:
                    result = CandidateResult(cand.id, LATE, str(exc), compile_wait_s=time.perf_counter() - waiting)
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
                    shape = state.setup.key.shape
                    run = state.runner(state.kernels[i], cand.launches[shape], shape)
                    medians[i].append(time_launch(run, state.flush, warmup=1, min_reps=5, target_ms=50).median_ms)
            conn.send({"medians": medians, "baseline": state.time_cublas()})
        else:
            conn.send({"error": f"unknown op {op!r}"})


class _Pipes:
    """Both directions of the worker's conversation, on two file descriptors (pickled, length-framed
    messages through multiprocessing's `Connection`)."""

    def __init__(self, read_fd: int, write_fd: int):
        self.reader = Connection(read_fd, writable=False)
        self.writer = Connection(write_fd, readable=False)

    def send(self, obj: Any) -> None:
        self.writer.send(obj)

    def recv(self) -> Any:
        return self.reader.recv()

    def poll(self, timeout: float) -> bool:
        return self.reader.poll(timeout)

    def close(self) -> None:
        for conn in (self.reader, self.writer):
            try:
                conn.close()
            except OSError:
                pass


def worker_main() -> None:
    """Entry point of the worker process: serve requests on stdin/stdout until told to stop or the pipe
    closes. Anything a library prints goes to stderr: the real stdout carries only messages."""
    message_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    conn = _Pipes(os.dup(0), message_fd)
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
    # Told to stop, or the parent gone: out at once, not after the compiles still under way (asked ahead and
    # not needed, or past their deadline), which the interpreter's exit would wait for. A compile cut short
    # leaves no file in the compile cache (its writes are atomic).
    sys.stderr.flush()
    os._exit(0)


# -- the parent side -------------------------------------------------------------------------------------

WORKER_COMMAND = "from autotile.runtime.worker import worker_main; worker_main()"


class WorkerCrashed(Exception):
    pass


class IsolatedRunner:
    """Owns one worker process; replaces it after a crash or a timeout and replays the setup."""

    def __init__(self, setup: Setup, timeout_s: float = 60.0, setup_timeout_s: float = 600.0):
        self.setup = setup
        self.timeout_s = timeout_s
        self.setup_timeout_s = setup_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._conn: _Pipes | None = None
        self.baseline: Timing | None = None
        self.environment: dict[str, Any] = {}
        self.restarts = 0

    def __enter__(self) -> IsolatedRunner:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def start(self, meanwhile: Callable[[], Any] | None = None) -> None:
        """Start the worker process and have it prepare the problem (inputs, reference, cuBLAS's time).
        `meanwhile` runs in this process while the worker prepares (a check of the caller's own, which
        would otherwise add its time to the start's); where it raises, the worker is stopped and its error
        raised."""
        self._spawn()
        self._send({"op": "setup", "setup": self.setup})
        if meanwhile is not None:
            try:
                meanwhile()
            except BaseException:
                self._kill()
                raise
        try:
            reply = self._receive(self.setup_timeout_s)
        except WorkerCrashed:
            reply = {"fatal": f"the worker process exited with status {self._proc.poll() if self._proc else '?'}"}
        if reply is None or "fatal" in reply:
            detail = reply["fatal"].strip().splitlines()[-1] if reply else f"no answer in {self.setup_timeout_s:g} s"
            self._kill()
            raise WorkerError(f"the GPU worker could not prepare {self.setup.key}: {detail}")
        self.baseline = reply["baseline"]
        self.environment = reply["environment"]

    def _spawn(self) -> None:
        env = dict(os.environ)
        # The worker imports this very autotile, wherever it was imported from (a checkout, a wheel).
        package_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
        try:
            # `-c` and an import, not `-m autotile.runtime.worker`: run as __main__, the module's classes would
            # pickle as __main__.CandidateResult, which the parent cannot load.
            self._proc = subprocess.Popen([sys.executable, "-c", WORKER_COMMAND], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, env=env)
        except OSError as exc:
            raise WorkerError(f"cannot start the GPU worker ({sys.executable} -c {WORKER_COMMAND!r}): {exc}") from None
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._conn = _Pipes(os.dup(self._proc.stdout.fileno()), os.dup(self._proc.stdin.fileno()))
        self._proc.stdout.close()
        self._proc.stdin.close()

    def _send(self, message: Any) -> None:
        assert self._conn is not None
        try:
            self._conn.send(message)
        except (BrokenPipeError, OSError):
            raise WorkerCrashed() from None

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            try:
                self._send({"op": "stop"})
                self._proc.wait(5)
            except Exception:  # it did not stop by itself: killed below
                pass
        self._kill()

    def _kill(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        if self._conn is not None:
            self._conn.close()
        self._proc = None
        self._conn = None

    def _receive(self, timeout: float) -> Any:
        """The next message, or None on timeout; raises WorkerCrashed if the process died."""
        assert self._conn is not None
        try:
            if self._conn.poll(timeout):
                return self._conn.recv()
        except (EOFError, OSError):
            raise WorkerCrashed() from None
        if self._proc is not None and self._proc.poll() is not None:
            raise WorkerCrashed()
        return None

    def evaluate(self, candidates: list[Candidate]) -> list[CandidateResult]:
        """Results in the order given. After a crash or a hang the rest of the batch goes to a new worker."""
        results: list[CandidateResult] = []
        pending = list(candidates)
        while pending:
            try:
                self._send({"op": "evaluate", "candidates": pending})
            except WorkerCrashed:
                self._restart()
                continue
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
                    self._restart()
                    break
        return results

    def _restart(self) -> None:
        self._kill()
        self.restarts += 1
        self.start()

    def prepare(self, candidates: list[Candidate]) -> None:
        """Have the worker start compiling `candidates`, which a later `evaluate` brings (the tuner asks for
        a batch while the one before is timed). Nothing is answered; a worker that dies meanwhile loses
        only the head start."""
        try:
            self._send({"op": "prepare", "candidates": candidates})
        except WorkerCrashed:
            self._restart()

    def retime(self, candidates: dict[int, Candidate], rounds: int) -> tuple[dict[int, list[float]], Timing]:
        """Per candidate, its median in each of `rounds` interleaved rounds; and cuBLAS re-timed."""
        try:
            self._send({"op": "retime", "ids": list(candidates), "candidates": candidates, "rounds": rounds})
            reply = self._receive(self.timeout_s * max(1, len(candidates)) * rounds)
        except WorkerCrashed:
            reply = {"fatal": f"the worker process exited with status {self._proc.poll() if self._proc else '?'}"}
        if not isinstance(reply, dict) or "medians" not in reply:
            detail = reply.get("fatal", reply) if isinstance(reply, dict) else "no answer in time"
            raise WorkerError(f"re-timing the finalists failed: {str(detail).strip().splitlines()[-1]}")
        return reply["medians"], reply["baseline"]

