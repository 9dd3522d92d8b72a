"""Engines that run a search's work items: in this process, or on a pool of local worker
processes. (:mod:`mugraph.search.cluster` runs them on Ray.)

An engine takes batches of work items (:mod:`mugraph.search.work`) while it has free slots and
hands back what became of them; :func:`mugraph.search.driver.superoptimize` schedules.

Why the pool cannot hang on the solver or e-graph libraries
-----------------------------------------------------------
- Workers never use them: the oracle travels as its exported tables (plain Python), the
  program as JSON; a worker enumerates, verifies (NumPy) and answers.
- No worker is a copy of this process: it inherits no thread pool, lock or library object of
  it (egglog's rayon threads, OpenMP, a CUDA context, a lock another thread held at fork
  time) and never imports the caller's ``__main__``. By default (``start_method="zygote"``)
  one fresh interpreter (``python -m mugraph.search.pool --zygote``) imports the search,
  loads each search's program side, draws the program's verification rounds and evaluates the
  program on them (while the driver builds the oracle), and then, given the complete setup,
  forks the workers: they start in milliseconds instead of each importing mugraph, and they
  share the rounds' memory (one copy in the CPU's cache instead of one per worker). The
  zygote runs no thread when it forks. ``start_method="exec"`` starts every worker as a fresh
  interpreter (``python -m mugraph.search.pool``);
  ``"fork" | "spawn" | "forkserver"`` start workers through :mod:`multiprocessing`; with
  ``fork``, this process collects its garbage and freezes the collector's view of every
  object first, so a child never frees an object it inherited.
- Waiting is bounded: the driver waits for results with a timeout, a worker that dies (its
  channel closes) is replaced and its items go back to the queue, and at the deadline (plus a
  grace period) the remaining workers are killed.
- Workers ignore SIGINT (Ctrl-C is the driver's to handle), and die with this process
  (``PR_SET_PDEATHSIG`` on Linux).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import mmap
import multiprocessing
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, NamedTuple

from mugraph.errors import MugraphError
from mugraph.search.work import (
    ItemFailed,
    ItemResult,
    SearchSetup,
    SliceTimer,
    WorkItem,
    prepare_rounds,
    prepared,
    rounds_held,
    run_batch,
)

START_METHODS = ("zygote", "exec", "fork", "spawn", "forkserver")
DEFAULT_START_METHOD = "zygote"
# a hungry pool asks a worker to hand back the rest of its batch after this many seconds
# (gqa_b1 on 16 workers, 2026-11-23: 0.1 s left 0.42 / 0.84 s from the queue's running dry
# to the end where 0.5 s left 0.75 / 1.21 s)
SLICE_SECONDS = 0.1
STARTUP_TIMEOUT_S = 120.0
# thread counts of the BLAS libraries NumPy may use; an exec'd worker that the user did not
# give one gets its share of the cores (sixteen workers each starting a thread per core for
# their GEMMs would oversubscribe the machine sixteenfold)
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
# a pool whose workers die this many times per slot stops replacing them
MAX_DEATHS_PER_SLOT = 3
_MAIN_HINT = {
    method: f"; with start_method {method!r} every worker imports the main module first: "
    "guard the script's search with if __name__ == '__main__':, or use the default "
    "start method ('exec'), which does not import it"
    for method in ("spawn", "forkserver")
}


class ZygoteClock(NamedTuple):
    """The zygote's clock (``time.time()``) as it readied a search: when its interpreter
    had imported this module (and with it the search), when it was ready for messages, when
    it received the search's setup, and when it had drawn the program's verification rounds
    (None: it drew none). (It imports the modules of :data:`WORKER_MODULES` while it waits.)"""

    entered: float
    imported: float
    setup: float
    drawn: float | None


class EngineError(MugraphError):
    """An engine could not be started or used (a bad option, a missing package...)."""


@dataclass
class Outcome:
    """What became of one batch: results, items given back untouched, and items lost with a
    worker that died (``lost_reason`` says how)."""

    results: list[ItemResult] = field(default_factory=list)
    returned: list[WorkItem] = field(default_factory=list)
    lost: list[WorkItem] = field(default_factory=list)
    lost_reason: str = ""


class InlineEngine:
    """One worker: this process (no hand-backs needed, nothing to start)."""

    name = "inline"
    slots = 1
    max_batch = 1

    def __init__(self) -> None:
        self._pending: list[tuple[list[WorkItem], float]] = []

    def start(self) -> None:
        """Nothing to start: this process is the worker."""

    def start_times(self) -> list[float]:
        return []

    def rounds_inherited(self) -> list[int]:
        return []  # this process draws its rounds when it first verifies

    def ready_clock(self) -> tuple[list[float], ZygoteClock | None]:
        return [], None  # (see ProcessPool.ready_clock)

    def prepare(self, setup: SearchSetup) -> None:
        """Nothing to prepare: this process draws its rounds when it first verifies."""

    def launch(self, setup: SearchSetup) -> None:
        self.setup = setup

    def ready(self) -> None:
        """Nothing to wait for: this process is the worker."""

    def threads(self) -> int:
        return 0  # this process keeps its verifier threads

    def free(self) -> int:
        return 0 if self._pending else 1

    def busy(self) -> int:
        return len(self._pending)

    def submit(self, items: list[WorkItem], seconds: float) -> None:
        self._pending.append((items, seconds))

    def set_hungry(self, hungry: bool) -> None:
        pass

    def wait(self, timeout: float) -> list[Outcome]:
        if not self._pending:
            return []
        items, seconds = self._pending.pop()
        try:
            results, returned = run_batch(self.setup, items, seconds, worker="inline")
        except ItemFailed as failed:  # in this process: the error itself reaches the caller
            raise failed.__cause__ from None
        return [Outcome(results, returned)]

    def close(self) -> None:
        self._pending.clear()


class _ForkedChild:
    """A worker the zygote forked: not this process's child (the zygote's; the kernel reaps
    it), known by the pid it reports when it is ready. The parts of ``subprocess.Popen``'s
    interface the pool uses."""

    returncode = None  # not known: its exit is seen as its channel closing

    def __init__(self) -> None:
        self.pid: int | None = None

    def poll(self) -> int | None:
        if self.pid is None:
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return -1
        except OSError:
            return None
        return None

    def kill(self) -> None:
        if self.pid is not None:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)

    def wait(self, timeout: float) -> None:
        limit = time.monotonic() + timeout
        while self.poll() is None and self.pid is not None and time.monotonic() < limit:
            time.sleep(0.005)


@dataclass
class _Worker:
    conn: Connection
    handle: Any  # subprocess.Popen, _ForkedChild or multiprocessing.Process
    batch: list[WorkItem] | None = None
    loaded: bool = False  # has answered "ready" to the last setup sent to it
    started: float = field(default_factory=time.monotonic)
    loaded_after: float | None = None  # seconds from its start to loading its first setup
    preloaded: bool = False  # forked with the search's setup loaded: it says "ready" unasked
    rounds: int = 0  # the program's verification rounds it held when it said "ready"
    # its own clock (time.time()) when it said "ready" to its first setup, and the clock of
    # the zygote that forked it
    ready_wall: float | None = None
    zygote_clock: ZygoteClock | None = None

    def alive(self) -> bool:
        if isinstance(self.handle, _PROCESS_LIKE):
            return self.handle.poll() is None
        return self.handle.is_alive()

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.handle.kill()

    def reap(self, timeout: float) -> None:
        with contextlib.suppress(Exception):
            if isinstance(self.handle, _PROCESS_LIKE):
                self.handle.wait(timeout)
            else:
                self.handle.join(timeout)
        self.conn.close()

    def exit_text(self) -> str:
        code = self.handle.returncode if isinstance(self.handle, _PROCESS_LIKE) else (
            self.handle.exitcode)  # fmt: skip
        if code is None:
            return "its channel closed"
        if code < 0:
            return f"killed by signal {signal.Signals(-code).name}"
        return f"exit code {code}"


_PROCESS_LIKE = (subprocess.Popen, _ForkedChild)


def _worker_environment(blas_threads: int) -> dict[str, str]:
    """A fresh interpreter's environment: this copy of mugraph first on its path, and the
    BLAS under NumPy limited to ``blas_threads`` unless the user set its variables."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [root, *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    )
    for name in BLAS_THREAD_VARIABLES:
        env.setdefault(name, str(blas_threads))
    return env


class _Zygote:
    """The interpreter that forks a pool's workers (``start_method="zygote"``).

    Requests go out in order from one sender thread, so that this process never waits for
    the zygote (which may still be importing mugraph, or evaluating the program's rounds):
    a setup (once per search), then "fork N" followed by the N channels' ends."""

    def __init__(self) -> None:
        mine, theirs = socket.socketpair()
        env = _worker_environment(1)
        for name in BLAS_THREAD_VARIABLES:  # no BLAS thread may run when it forks
            env[name] = "1"
        command = [sys.executable, "-m", "mugraph.search.pool", "--zygote", str(theirs.fileno())]
        self.process = subprocess.Popen(
            command, pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL
        )
        theirs.close()
        self.conn = Connection(mine.detach())
        self.held: SearchSetup | None = None  # the setup it holds (the sender's to read)
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._sender = threading.Thread(target=self._send_loop, name="mugraph-zygote",
                                        daemon=True)  # fmt: skip
        self._sender.start()

    def alive(self) -> bool:
        return self.process.poll() is None

    def _send_loop(self) -> None:
        while (job := self._outbox.get()) is not None:
            with contextlib.suppress(OSError):  # a dead zygote: the channels it had close
                job()

    def load(self, setup: SearchSetup, hunger_path: str) -> None:
        """Have the zygote load ``setup`` and draw the program's verification rounds now
        (a :meth:`~SearchSetup.program_side` while the driver builds the oracle)."""
        self._outbox.put(lambda: self._send_setup(setup, hunger_path))

    def _send_setup(self, setup: SearchSetup, hunger_path: str) -> None:
        """(The sender thread) ``setup``, unless the zygote holds it already."""
        if setup is not self.held:
            # the cores are idle meanwhile, but for the driver's
            threads = max(1, min(8, (os.cpu_count() or 1) - 1))
            self.conn.send(("setup", setup, hunger_path, threads))
            self.held = setup

    def fork(self, setup: SearchSetup, hunger_path: str, count: int) -> list[_Worker]:
        """``count`` workers forked with ``setup`` loaded; they say "ready" when forked."""
        from multiprocessing.reduction import send_handle

        if setup.oracle_pending:
            raise EngineError("workers are forked with a complete setup, not its program side")
        pairs = [socket.socketpair() for _ in range(count)]
        workers = [_Worker(Connection(mine.detach()), _ForkedChild(), preloaded=True)
                   for mine, _ in pairs]  # fmt: skip
        theirs = [t for _, t in pairs]

        def send() -> None:
            try:
                self._send_setup(setup, hunger_path)
                self.conn.send(("fork", count))
                for t in theirs:
                    send_handle(self.conn, t.fileno(), self.process.pid)
            finally:
                for t in theirs:
                    t.close()

        self._outbox.put(send)
        return workers

    def stop(self) -> None:
        self._outbox.put(lambda: self.conn.send(("stop",)))
        self._outbox.put(None)
        self._sender.join(2.0)
        with contextlib.suppress(Exception):
            self.process.wait(2.0)
        if self.process.poll() is None:
            self.process.kill()
            with contextlib.suppress(Exception):
                self.process.wait(2.0)
        self.conn.close()


class ProcessPool:
    """``workers`` local worker processes (see the module docstring)."""

    name = "local"
    max_batch = 32

    def __init__(self, workers: int, start_method: str | None = None) -> None:
        method = _start_method(start_method)
        if method not in START_METHODS:
            raise EngineError(
                f"superoptimize: start_method must be one of {list(START_METHODS)}, "
                f"got {start_method!r}"
            )
        available = ["exec", *multiprocessing.get_all_start_methods()]
        if "fork" in available:
            available.append("zygote")
        if method not in available:
            raise EngineError(f"superoptimize: start_method {method!r} is not available here")
        self.method = method
        self._zygote: _Zygote | None = None
        self.slots = workers
        self.workers: list[_Worker] = []
        self._hunger_file: Path | None = None
        self._hunger: mmap.mmap | None = None
        self._hungry = False
        self._closed = False
        self._deaths = 0
        self.shared = False
        self.in_use = False

    @classmethod
    def acquire(cls, workers: int, start_method: str | None) -> ProcessPool:
        """This process's pool for ``start_method``, resized to ``workers`` (its workers
        outlive a search, so the next one does not start them again); a private pool when
        that one is in use (searches running in several threads at once)."""
        method = _start_method(start_method)
        with _SHARED_LOCK:
            pool = _SHARED.get(method)
            if pool is None or pool.in_use:
                pool = cls(workers, method)
                if method not in _SHARED:
                    pool.shared = True
                    _SHARED[method] = pool
            pool.slots = workers
            pool.in_use = True
        return pool

    # ---- life cycle ----------------------------------------------------------------------

    def threads(self) -> int:
        """Verifier threads per worker: the workers share the cores."""
        from mugraph.semantics import field_arith

        return max(1, min(field_arith._MAX_WORKERS, (os.cpu_count() or 1) // self.slots))

    def ready(self) -> None:
        """Wait until at least one worker can take work (the others join as they load the
        setup: :meth:`wait` reads their answers)."""
        if self.workers and not any(w.loaded for w in self.workers):
            self._await_ready(self.workers, first=True)

    def start(self) -> None:
        """Start the missing worker processes (and stop extra ones) without a setup: they
        import mugraph while this process builds the oracle and plans the search. With the
        zygote, start it: the workers are forked once it has the setup (:meth:`launch`)."""
        self._closed = False
        if self.method == "zygote":
            if self._zygote is None or not self._zygote.alive():
                if self._zygote is not None:
                    self._zygote.stop()
                self._zygote = _Zygote()
            return
        for w in [w for w in self.workers if not w.alive()]:
            w.reap(0.1)
            self.workers.remove(w)
        for w in self.workers[self.slots :]:
            self._stop(w)
        del self.workers[self.slots :]
        self.workers += [self._spawn() for _ in range(self.slots - len(self.workers))]

    def prepare(self, setup: SearchSetup) -> None:
        """With the zygote: have it load ``setup`` (the search's program side) and draw the
        program's verification rounds while the caller builds the oracle, so that it forks
        the workers as soon as :meth:`launch` brings the complete setup. (Other start
        methods load the setup once, at :meth:`launch`.)"""
        self.start()
        if self._zygote is not None:
            self._zygote.load(setup, str(self._hunger_path()))

    def _hunger_path(self) -> Path:
        """The file of the "workers are waiting" byte (made on first use)."""
        if self._hunger is None:
            folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
            fd, name = tempfile.mkstemp(prefix="mugraph-hunger-", dir=folder)
            os.write(fd, b"\0" * 8)
            self._hunger = mmap.mmap(fd, 8)
            os.close(fd)
            self._hunger_file = Path(name)
        return self._hunger_file

    def launch(self, setup: SearchSetup) -> None:
        """Send ``setup`` to every worker, starting the missing ones, without waiting for them
        (the caller plans the search meanwhile; a worker takes work once it has loaded it)."""
        self.setup = setup
        self._deaths = 0
        self._hunger_path()
        self._hungry = True
        self.set_hungry(False)
        self.start()
        if self._zygote is not None:
            # workers of an earlier search go: fresh ones share this search's rounds
            self._stop_all(self.workers)
            self.workers = self._zygote.fork(setup, str(self._hunger_file), self.slots)
            return
        for w in list(self.workers):
            self._send_setup(w)

    def _send_setup(self, worker: _Worker) -> None:
        worker.loaded = False
        try:
            worker.conn.send(("setup", self.setup, str(self._hunger_file)))
        except OSError:
            worker.kill()
            worker.reap(1.0)
            self.workers.remove(worker)
            self.workers.append(fresh := self._spawn())
            self._send_setup(fresh)

    def _await_ready(
        self, workers: list[_Worker], timeout: float = STARTUP_TIMEOUT_S, first: bool = False
    ) -> None:
        """Wait until every one of ``workers`` (or, with ``first``, one) has loaded the
        search; one that dies first is an error."""
        waiting = {w.conn: w for w in workers if not w.loaded}
        limit = time.monotonic() + timeout
        while waiting:
            ready = wait(list(waiting), max(0.0, limit - time.monotonic()))
            if not ready:
                self._fail()
                raise EngineError(f"search workers did not start within {timeout:.0f} s")
            for conn in ready:
                self._loaded(waiting.pop(conn))
            if first:
                return

    def _loaded(self, worker: _Worker) -> None:
        """Read a starting worker's answer to its setup; one that died is an error."""
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):
            worker.reap(2.0)
            reason = worker.exit_text()
            self._fail()
            raise EngineError(
                f"a search worker ({self.method}) died while starting ({reason})"
                + _MAIN_HINT.get(self.method, "")
            ) from None
        if isinstance(worker.handle, _ForkedChild):
            worker.handle.pid = message[1]
        worker.rounds = message[2]
        worker.loaded = True
        if worker.loaded_after is None:
            worker.loaded_after = time.monotonic() - worker.started
            worker.ready_wall = message[3]
            worker.zygote_clock = ZygoteClock(*message[4]) if message[4] else None

    def start_times(self) -> list[float]:
        """Seconds each worker of this search took from its start to loading its first setup
        (workers kept from an earlier search included)."""
        return sorted(w.loaded_after for w in self.workers if w.loaded_after is not None)

    def rounds_inherited(self) -> list[int]:
        """The verification rounds each loaded worker held when it said "ready" (forked by
        the zygote after it evaluated the program on them; 0: it draws its own)."""
        return sorted(w.rounds for w in self.workers if w.loaded)

    def ready_clock(self) -> tuple[list[float], ZygoteClock | None]:
        """When (``time.time()``) each worker of this search said it had loaded its first
        setup, by its own clock (the driver may read it later), and the clock of the zygote
        that forked the first of them (None: no zygote)."""
        times = sorted(w.ready_wall for w in self.workers if w.ready_wall is not None)
        clocks = [w.zygote_clock for w in self.workers if w.zygote_clock is not None]
        return times, min(clocks, default=None, key=lambda c: c.setup)

    def _spawn(self) -> _Worker:
        """A fresh worker process, not yet sent a setup (unless ``preloaded``: forked by the
        zygote, which holds the setup)."""
        if self.method == "zygote":
            self.start()  # (a zygote that died is started again)
            return self._zygote.fork(self.setup, str(self._hunger_file), 1)[0]
        if self.method == "exec":
            return self._spawn_exec()
        return self._spawn_mp()

    def _spawn_exec(self) -> _Worker:
        mine, theirs = socket.socketpair()
        # the BLAS under NumPy: the worker's share of the cores
        env = _worker_environment(self.threads())
        command = [sys.executable, "-m", "mugraph.search.pool", str(theirs.fileno())]
        handle = subprocess.Popen(
            command, pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL
        )
        theirs.close()
        return _Worker(Connection(mine.detach()), handle)

    def _spawn_mp(self) -> _Worker:
        ctx = multiprocessing.get_context(self.method)
        mine, theirs = ctx.Pipe()
        process = ctx.Process(
            target=worker_main, args=(theirs,), daemon=True
        )
        if self.method == "fork":
            # every object this process holds stays out of the children's garbage collector
            # (a child freeing an inherited e-graph or lock owner is how forks hang)
            gc.collect()
            gc.freeze()
            try:
                process.start()
            finally:
                gc.unfreeze()
        else:
            process.start()
        theirs.close()
        return _Worker(mine, process)

    def close(self) -> None:
        """End of a search: stop the workers still busy (what they do is no longer wanted);
        idle ones stay for the next search of this process unless the pool is private."""
        if self._closed:
            return
        self._closed = True
        self.set_hungry(False)
        # workers holding a batch, and workers that never loaded this search's setup (their
        # late "ready" would be taken for a batch's result in the next search)
        for w in [w for w in self.workers if w.batch is not None or not w.loaded]:
            w.kill()
            w.reap(2.0)
            self.workers.remove(w)
        if not self.shared:
            self.shutdown()
        self.in_use = False

    def _fail(self) -> None:
        self._closed = True
        self.in_use = False
        self.shutdown()

    def shutdown(self) -> None:
        """Stop every worker (and the zygote) and remove the pool's files."""
        self._stop_all(self.workers)
        self.workers.clear()
        if self._zygote is not None:
            self._zygote.stop()
            self._zygote = None
        if self._hunger is not None:
            self._hunger.close()
            self._hunger = None
        if self._hunger_file is not None:
            with contextlib.suppress(OSError):
                self._hunger_file.unlink()
            self._hunger_file = None

    @classmethod
    def _stop_all(cls, workers: list[_Worker]) -> None:
        """Tell every one of ``workers`` to stop, then wait for each (killing the slow)."""
        for w in workers:
            with contextlib.suppress(OSError):
                w.conn.send(("stop",))
        for w in workers:
            cls._stop(w)

    @staticmethod
    def _stop(worker: _Worker) -> None:
        with contextlib.suppress(OSError):
            worker.conn.send(("stop",))
        worker.reap(2.0)
        if worker.alive():
            worker.kill()
            worker.reap(2.0)

    # ---- work ----------------------------------------------------------------------------

    def free(self) -> int:
        """Workers that have loaded the setup and hold no batch."""
        return sum(1 for w in self.workers if w.loaded and w.batch is None)

    def busy(self) -> int:
        """Workers holding a batch (those still starting are heard from in :meth:`wait`)."""
        return sum(1 for w in self.workers if w.batch is not None)

    def submit(self, items: list[WorkItem], seconds: float) -> None:
        worker = next(w for w in self.workers if w.loaded and w.batch is None)
        worker.batch = list(items)
        try:
            worker.conn.send(("run", worker.batch, seconds, SLICE_SECONDS))
        except OSError:
            pass  # a dead worker: wait() finds its channel closed and gives the batch back

    def set_hungry(self, hungry: bool) -> None:
        if hungry != self._hungry and self._hunger is not None:
            self._hunger[0] = 1 if hungry else 0
            self._hungry = hungry

    def wait(self, timeout: float) -> list[Outcome]:
        """Outcomes of finished batches; workers that finished loading the setup meanwhile
        become free (their answer is no outcome)."""
        busy = {w.conn: w for w in self.workers if w.batch is not None or not w.loaded}
        if not busy:
            return []
        outcomes = []
        for conn in wait(list(busy), timeout):
            worker = busy[conn]
            if not worker.loaded:
                self._loaded(worker)
                continue
            try:
                message = conn.recv()
            except (EOFError, OSError):
                outcomes.append(self._replace(worker))
                continue
            batch, worker.batch = worker.batch or [], None
            if message[0] == "failed" and len(message) == 5:  # one item raised
                _, text, results, item, rest = message
                outcomes.append(Outcome(results, rest, [item], f"worker error: {text}"))
            elif message[0] == "failed":  # an error in the worker: its text, the batch again
                outcomes.append(Outcome(lost=batch, lost_reason=f"worker error: {message[1]}"))
            else:
                outcomes.append(Outcome(message[1], message[2]))
        return outcomes

    def _replace(self, dead: _Worker) -> Outcome:
        """A worker died: its batch is lost (the driver queues it again); start another."""
        dead.kill()
        dead.reap(1.0)
        reason = f"worker {dead.exit_text()}"
        outcome = Outcome(lost=list(dead.batch or []), lost_reason=reason)
        self.workers.remove(dead)
        self._deaths += 1
        if self._deaths > MAX_DEATHS_PER_SLOT * self.slots:
            self.close()
            raise EngineError(f"search workers keep dying ({self._deaths} times; last: {reason})")
        if not self._closed:
            fresh = self._spawn()
            self.workers.append(fresh)
            if not fresh.preloaded:
                self._send_setup(fresh)  # it takes work once loaded
        return outcome


# ---- the worker side ---------------------------------------------------------------------


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the one that started it dies."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class _Loaded:
    """What a worker (or the zygote) holds of the search it serves."""

    setup: SearchSetup | None = None
    hunger_path: str = ""
    hunger: mmap.mmap | None = None  # the pool's "hand back your batch" flag
    clock: ZygoteClock | None = None  # (the zygote) when it got this search ready

    def load(self, setup: SearchSetup, hunger_path: str) -> None:
        if self.setup is None or self.setup.token != setup.token:
            self.clock = None  # (another search's)
        if hunger_path != self.hunger_path:
            with open(hunger_path, "r+b") as file:
                self.hunger = mmap.mmap(file.fileno(), 8)
            self.hunger_path = hunger_path
        prepared(setup)
        self.setup = setup


def worker_main(conn: Connection, loaded: _Loaded | None = None) -> None:
    """Serve batches until told to stop or the channel closes. A worker forked by the zygote
    starts ``loaded`` with the search's setup and says so at once."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    state = loaded or _Loaded()
    name = f"pid {os.getpid()}"
    if loaded is not None:
        clock = tuple(state.clock) if state.clock else None
        conn.send(("ready", os.getpid(), rounds_held(), time.time(), clock))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        setup, hunger = state.setup, state.hunger
        if message[0] == "setup":
            _, setup, path = message
            state.load(setup, path)
            conn.send(("ready", os.getpid(), rounds_held(), time.time(), None))
        elif message[0] == "run":
            _, items, seconds, slice_s = message
            timer = SliceTimer(lambda flag=hunger: flag[0] == 1, slice_s)
            try:
                results, returned = run_batch(setup, items, seconds, timer, worker=name)
            except ItemFailed as failed:  # reported to the driver, which goes on
                text = traceback.format_exc(limit=8).strip().splitlines()[-1]
                conn.send(("failed", text, failed.results, failed.item, failed.rest))
                continue
            except Exception:  # noqa: BLE001 - the whole batch, as the driver is told
                conn.send(("failed", traceback.format_exc(limit=8).strip().splitlines()[-1]))
                continue
            conn.send(("done", results, returned))
        else:
            return


# modules a worker imports at its first find (the cost estimate, a found graph's hash)
WORKER_MODULES = ("mugraph.optimize.cost_model", "mugraph.search.driver", "mugraph.ir.hashing",
                  "mugraph.codegen.decisions", "mugraph.runtime.compiled")


def zygote_main(conn: Connection) -> None:
    """The zygote: load each setup it is sent (and draw the program's rounds), fork a worker
    for each channel it is handed; until told to stop or the channel closes."""
    from multiprocessing.reduction import recv_handle

    entered = time.time()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the workers it forks
    preload = list(WORKER_MODULES)
    imported = time.time()
    state = _Loaded()
    while True:
        # what every worker would import at its first find: imported here while nothing
        # waits (the driver still builds the oracle), and the rest before the first fork
        _preload(preload, conn.poll)
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == "setup":
            received = time.time()
            _, setup, path, threads = message
            state.load(setup, path)
            drawn = None
            with contextlib.suppress(Exception):  # else each worker draws its own rounds
                if prepare_rounds(setup, threads):
                    drawn = time.time()
            if state.clock is None:
                state.clock = ZygoteClock(entered, imported, received, drawn)
        elif message[0] == "fork":
            fds = [recv_handle(conn) for _ in range(message[1])]
            _preload(preload, lambda: False)  # once in here, not once in every worker
            gc.collect()
            gc.freeze()  # a child's collector never walks (so never writes) inherited objects
            try:
                for fd in fds:
                    _fork_worker(fd, fds, conn, state)
            finally:
                gc.unfreeze()  # (only here: a forked child never returns)
            for fd in fds:
                os.close(fd)
        else:
            return


def _preload(modules: list[str], stop: Callable[[], bool]) -> None:
    """Import ``modules`` (taking them off the list) until ``stop()`` says to stop."""
    while modules and not stop():
        with contextlib.suppress(ImportError):
            importlib.import_module(modules.pop(0))


def _fork_worker(fd: int, fds: list[int], zygote_conn: Connection, state: _Loaded) -> None:
    """Fork a worker serving channel ``fd`` (the zygote runs no other thread here)."""
    if os.fork():
        return
    code = 0
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        zygote_conn.close()
        for other in fds:
            if other != fd:
                os.close(other)
        worker_main(Connection(fd), state)
    except BaseException:  # noqa: BLE001 - a forked child never returns into the zygote
        code = 1
    finally:
        os._exit(code)


def _main(argv: list[str]) -> None:
    if argv[0] == "--zygote":
        zygote_main(Connection(int(argv[1])))
    else:
        worker_main(Connection(int(argv[0])))


def _start_method(asked: str | None) -> str:
    """The start method asked for, else the default (where this system can fork)."""
    if asked is not None:
        return asked
    if DEFAULT_START_METHOD == "zygote" and "fork" not in multiprocessing.get_all_start_methods():
        return "exec"
    return DEFAULT_START_METHOD


def engine_for(engine: str, workers: int, *, start_method: str | None, address: str | None):
    """The engine a search asked for (``engine`` "local" or "ray")."""
    if engine == "ray":
        from mugraph.search.cluster import RayEngine

        return RayEngine(workers=workers, address=address)
    if engine != "local":
        raise EngineError(f"superoptimize: engine must be 'local' or 'ray', got {engine!r}")
    if address is not None:
        raise EngineError("superoptimize: address is a Ray cluster's address: use engine='ray'")
    if workers == 1 and start_method is None:
        return InlineEngine()
    return ProcessPool.acquire(workers, start_method)


_SHARED: dict[str, ProcessPool] = {}
_SHARED_LOCK = threading.Lock()


def shutdown() -> None:
    """Stop the worker processes this process keeps for later searches."""
    with _SHARED_LOCK:
        pools = list(_SHARED.values())
        _SHARED.clear()
    for pool in pools:
        pool.shutdown()


atexit.register(shutdown)


if __name__ == "__main__":
    _main(sys.argv[1:])
