"""Running GPU work where a fault cannot reach the caller: tasks in child processes.

A kernel that faults the GPU (an illegal address, say) leaves the process's CUDA context
unusable: nothing can run on the GPU in that process afterwards, and some faults end the
process outright. Candidates whose kernels have never run are therefore compiled, checked
and timed in worker processes (:class:`IsolatedWorkers`); a task whose worker raises a CUDA
fault, dies (a signal, an exit) or outlives its time limit yields an :class:`Outcome` that
says so, the worker is replaced, and the remaining tasks go on.

Workers are fresh interpreters (``python -m mugraph.optimize.isolate``) fed pickled
``(function, argument)`` pairs over a pipe, not ``multiprocessing`` children, so the caller's
``__main__`` (a user's script) is never imported again in them. They see the caller's
``sys.path`` and environment (``TRITON_INTERPRET`` included). Their stderr goes to a
temporary file whose tail a failure report quotes.

``IsolatedWorkers(0)`` runs the tasks in the calling process instead (no protection; for
debugging and tests that need none).
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# what CUDA reports when a kernel faults; the process's CUDA context is lost after it
FAULT_MARKERS = (
    "illegal memory access",
    "unspecified launch failure",
    "misaligned address",
    "illegal instruction",
    "an illegal address",
    "device-side assert",
)
FAULT_EXIT = 86  # a worker's exit status after it reported a CUDA fault
_HEADER = struct.Struct(">Q")
_STDERR_TAIL = 600


def is_cuda_fault(error: object) -> bool:
    """Whether an error (or its text) is a CUDA fault that ends the CUDA context."""
    text = str(error).lower()
    return any(marker in text for marker in FAULT_MARKERS)


@dataclass(frozen=True)
class Outcome:
    """What became of one task.

    kind: "ok" (``value`` holds the result), "error" (the function raised; the worker goes
    on), "fault" (a CUDA fault: the worker was replaced), "died" (the worker process ended
    without answering: a signal or an exit) or "timeout" (killed after the time limit).
    """

    kind: str
    value: Any = None
    error: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.kind == "ok"

    def describe(self) -> str:
        if self.ok:
            return "ok"
        return {
            "error": f"failed: {self.error}",
            "fault": f"faulted the GPU: {self.error}",
            "died": f"its worker process died: {self.error}",
            "timeout": f"timed out: {self.error}",
        }[self.kind]


# ---- the worker side -------------------------------------------------------------------------


def _write_frame(stream, payload: Any) -> None:
    data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _read_stream_frame(stream) -> Any:
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(head)
    return pickle.loads(stream.read(size))


def _error_text(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:300] if text else ''}"


def worker_main() -> None:
    """The worker loop: read (function, argument), answer ("ok", value) or ("error", text,
    fault); exit after a CUDA fault (the context is gone) or at end of input."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints of the work go to stderr, never into the protocol
    inp = sys.stdin.buffer
    while True:
        message = _read_stream_frame(inp)
        if message is None:
            break
        fn, arg = message
        try:
            reply = ("ok", fn(arg), False)
        except BaseException as error:  # noqa: BLE001 - reported to the caller
            fault = is_cuda_fault(error) or is_cuda_fault(traceback.format_exc())
            reply = ("error", _error_text(error), fault)
            traceback.print_exc(file=sys.stderr)
        try:
            _write_frame(out, reply)
        except Exception as error:  # noqa: BLE001 - an unpicklable result
            _write_frame(out, ("error", f"result could not be sent: {_error_text(error)}", False))
        if reply[2]:
            sys.stderr.flush()
            os._exit(FAULT_EXIT)


# ---- the caller side -------------------------------------------------------------------------


def _looks_like_error(line: str) -> bool:
    """A line of a worker's stderr worth quoting: an error message, not a traceback's code."""
    text = line.strip()
    return bool(text) and not line.startswith(" ") and (
        "error" in text.lower() or "fault" in text.lower() or "abort" in text.lower()
    )


def _signal_name(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


class _Worker:
    """One worker process and the task it is running."""

    def __init__(self, env: dict[str, str]) -> None:
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mugraph.optimize.isolate"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=env,
            bufsize=0,
        )
        self.fd = self.proc.stdout.fileno()
        self.buffer = b""
        self.task: int | None = None
        self.started = 0.0

    def send(self, task: int, payload: Any) -> None:
        data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
        self.task, self.started = task, time.monotonic()
        self.proc.stdin.write(_HEADER.pack(len(data)) + data)
        self.proc.stdin.flush()

    def feed(self) -> bool:
        """Read what is available; False at end of file (the worker is gone)."""
        chunk = os.read(self.fd, 1 << 20)
        if not chunk:
            return False
        self.buffer += chunk
        return True

    def reply(self) -> Any | None:
        """A complete reply from the buffer, or None."""
        if len(self.buffer) < _HEADER.size:
            return None
        (size,) = _HEADER.unpack(self.buffer[: _HEADER.size])
        end = _HEADER.size + size
        if len(self.buffer) < end:
            return None
        data, self.buffer = self.buffer[_HEADER.size : end], self.buffer[end:]
        return pickle.loads(data)

    def stderr_tail(self) -> str:
        try:
            self.stderr.seek(0, os.SEEK_END)
            size = self.stderr.tell()
            self.stderr.seek(max(0, size - _STDERR_TAIL))
            text = self.stderr.read().decode("utf-8", "replace")
        except OSError:
            return ""
        lines = [line.strip() for line in text.splitlines() if _looks_like_error(line)]
        return lines[-1][:200] if lines else ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.close_files()

    def end_input(self) -> None:
        """End of input: the worker leaves its loop and exits."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass

    def stop(self, wait: float = 5.0) -> None:
        self.end_input()
        try:
            self.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass
        self.kill()

    def close_files(self) -> None:
        for handle in (self.proc.stdin, self.proc.stdout, self.stderr):
            try:
                handle.close()
            except OSError:
                pass


def _child_env() -> dict[str, str]:
    """The caller's environment, with its import path (so workers import the same code)."""
    env = dict(os.environ)
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    cwd = os.getcwd()
    if "" in sys.path or cwd in sys.path:
        paths.insert(0, cwd)
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


STOP_SECONDS = 5.0  # how long closing waits for workers to exit before killing them


class IsolatedWorkers:
    """A set of worker processes running tasks one at a time each; see the module text.

    workers: how many run at once (0: in the calling process, unprotected).
    task_timeout: seconds after which a task's worker is killed (None: no limit).
    """

    def __init__(self, workers: int = 1, *, task_timeout: float | None = None) -> None:
        self.size = max(0, int(workers))
        self.task_timeout = task_timeout
        self._idle: list[_Worker] = []
        self._env = _child_env()
        self.started = 0  # worker processes started so far (replacements included)

    def __enter__(self) -> IsolatedWorkers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self, wait: float = STOP_SECONDS) -> None:
        """Stop the workers: all are told to exit first, then each is waited for (within
        ``wait`` seconds in all) and killed if still running. A worker that has used the GPU
        takes seconds to exit (its CUDA context and interpreter torn down): told one after
        the other, four of them took 9.4 s of a model's first call on the H100 machine."""
        workers, self._idle = self._idle, []
        for worker in workers:
            worker.end_input()
        deadline = time.monotonic() + wait
        for worker in workers:
            worker.stop(wait=max(0.0, deadline - time.monotonic()))

    def _new_worker(self) -> _Worker:
        self.started += 1
        return _Worker(self._env)

    def run(
        self,
        fn: Callable[[Any], Any],
        args: Sequence[Any],
        *,
        workers: int | None = None,
        on_done: Callable[[int, Outcome], None] | None = None,
    ) -> list[Outcome]:
        """``fn(arg)`` for every arg, at most ``workers`` (default: the pool's size) at once;
        one Outcome per arg, in order. ``fn`` must be picklable (a module-level function)."""
        count = self.size if workers is None else min(self.size, workers)
        if count <= 0:
            return [self._inline(fn, a, i, on_done) for i, a in enumerate(args)]
        outcomes: list[Outcome | None] = [None] * len(args)
        todo = list(range(len(args)))[::-1]
        busy: list[_Worker] = []
        try:
            while todo or busy:
                while todo and len(busy) < count:
                    worker = self._idle.pop() if self._idle else self._new_worker()
                    index = todo.pop()
                    try:
                        worker.send(index, (fn, args[index]))
                    except (BrokenPipeError, OSError):  # died while idle: start another
                        worker.kill()
                        todo.append(index)
                        continue
                    busy.append(worker)
                for worker, outcome in self._collect(busy):
                    busy.remove(worker)
                    outcomes[worker.task] = outcome
                    if on_done is not None:
                        on_done(worker.task, outcome)
                    if worker.proc.poll() is None and outcome.kind in ("ok", "error"):
                        worker.task = None
                        self._idle.append(worker)
                    else:
                        worker.kill()
        except BaseException:
            for worker in busy:
                worker.kill()
            raise
        return [o for o in outcomes if o is not None]

    def _inline(self, fn, arg, index: int, on_done) -> Outcome:
        started = time.monotonic()
        try:
            outcome = Outcome("ok", fn(arg), seconds=time.monotonic() - started)
        except Exception as error:  # noqa: BLE001 - reported like a worker's error
            kind = "fault" if is_cuda_fault(error) else "error"
            outcome = Outcome(kind, error=_error_text(error), seconds=time.monotonic() - started)
        if on_done is not None:
            on_done(index, outcome)
        return outcome

    def _collect(self, busy: list[_Worker]) -> list[tuple[_Worker, Outcome]]:
        """Wait for at least one busy worker to finish (or to die, or to time out)."""
        timeout = None
        if self.task_timeout is not None:
            now = time.monotonic()
            timeout = max(0.0, min(w.started + self.task_timeout - now for w in busy))
        ready, _, _ = select.select([w.fd for w in busy], [], [], timeout)
        done = []
        for worker in busy:
            elapsed = time.monotonic() - worker.started
            if worker.fd in ready:
                alive = worker.feed()
                message = worker.reply()
                if message is not None:
                    status, value, fault = message
                    if status == "ok":
                        done.append((worker, Outcome("ok", value, seconds=elapsed)))
                    else:
                        kind = "fault" if fault else "error"
                        done.append((worker, Outcome(kind, error=value, seconds=elapsed)))
                elif not alive:
                    code = worker.proc.wait()
                    tail = worker.stderr_tail()
                    error = _signal_name(code) + (f" ({tail})" if tail else "")
                    done.append((worker, Outcome("died", error=error, seconds=elapsed)))
            elif self.task_timeout is not None and elapsed > self.task_timeout:
                error = f"no answer after {self.task_timeout:g} s; its worker was killed"
                done.append((worker, Outcome("timeout", error=error, seconds=elapsed)))
        return done


if __name__ == "__main__":
    worker_main()
