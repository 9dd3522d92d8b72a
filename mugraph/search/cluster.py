"""The search's work items on Ray (``superoptimize(..., engine="ray")``,
``mugraph optimize --cluster [ADDRESS]``).

Ray is optional (``pip install mugraph[cluster]``). Without an address a local Ray is started
on demand (and kept for later searches of this process); with one, the search joins that
cluster (``"auto"``, ``"ray://host:10001"``...; its nodes need mugraph installed, or a
``RAY_RUNTIME_ENV`` that provides it).

The workers are Ray actors, one per slot, each holding one CPU of the cluster: a process of
its own that imports the search once. They are created as soon as the search has joined Ray
(:meth:`RayEngine.start`), so they boot while the driver builds the oracle and plans the
units. :meth:`RayEngine.prepare` puts the search's program side (program, configuration) in
the object store and has every worker draw the program's verification rounds and evaluate the
program on them as soon as it has booted, while the driver builds the oracle (as the local
pool's zygote does, :mod:`mugraph.search.pool`); :meth:`RayEngine.launch` then brings the
complete setup (with the oracle's exported tables), which a worker loads before it takes
work. The driver schedules exactly as with the local pool: a batch of work items goes to a
worker that has loaded the setup and holds no batch. The actors stay for the later searches
of this process on the same Ray session (:func:`shutdown` ends them); a search running while
another holds them gets actors of its own, ended with it.

The "workers are waiting" signal, which makes a long batch hand the rest of its work back:
a byte in shared memory for the workers on the driver's machine (as with the local pool),
and, on a cluster of several nodes, a small actor that the workers of the other nodes ask at
most every ``POLL_SECONDS``.

A worker that dies loses its batch, which the driver queues again; a fresh actor takes its
slot. An item that raises is charged alone, as with the local pool.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import socket
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mugraph.search.pool import (
    MAX_DEATHS_PER_SLOT,
    SLICE_SECONDS,
    STARTUP_TIMEOUT_S,
    EngineError,
    Outcome,
)
from mugraph.search.work import (
    ItemFailed,
    SearchSetup,
    SliceTimer,
    WorkItem,
    prepare_rounds,
    prepared,
    rounds_held,
    run_batch,
)

# how often a worker on another node asks the flag actor whether workers wait (seconds)
POLL_SECONDS = 0.25
RAY_MISSING = (
    "engine='ray' (mugraph optimize --cluster) needs Ray: pip install 'mugraph[cluster]' "
    "(or pip install ray); without it the search runs on the local process pool"
)


def import_ray():
    try:
        import ray
    except ImportError as error:
        raise EngineError(f"{RAY_MISSING} ({error})") from None
    return ray


def _join_ray(ray, address: str | None) -> None:
    """Join the cluster at ``address``, or start a local Ray whose workers import this copy
    of mugraph: its processes inherit PYTHONPATH from this one's environment, set so for the
    start. (A job-level ``runtime_env`` giving the variable instead keeps Ray from using the
    worker processes it starts in advance: workers took 1.3-1.4 s from their creation to
    loading a search instead of 0.45 s, 2 workers on 2 cores.)"""
    options: dict[str, Any] = {
        "address": address,
        "include_dashboard": False,
        "log_to_driver": False,
        "configure_logging": False,
    }
    try:
        with _mugraph_on_path(address is None):
            ray.init(**options)
    except Exception as error:  # noqa: BLE001 - Ray raises many kinds: one clear error
        where = f"the Ray cluster at {address!r}" if address else "a local Ray"
        raise EngineError(f"could not start or join {where}: {error}") from None


@contextlib.contextmanager
def _mugraph_on_path(local: bool):
    """With ``local``: this copy of mugraph first on PYTHONPATH while the block runs."""
    if not local:
        yield
        return
    kept = os.environ.get("PYTHONPATH")
    root = str(Path(__file__).resolve().parents[2])
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [root, *(p for p in (kept or "").split(os.pathsep) if p)]
    )
    try:
        yield
    finally:
        if kept is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = kept


@dataclass
class _Slot:
    """One worker actor as the driver sees it."""

    actor: Any
    created: float  # time.monotonic() when the actor was asked for
    loading: Any = None  # the reference of its pending "load" call
    loaded: bool = False  # has loaded the running search's setup
    batch: list[WorkItem] | None = None
    ref: Any = None  # the reference of its pending "run" call
    loaded_after: float | None = None  # seconds from its creation to loading its first setup
    ready_wall: float | None = None  # its clock (time.time()) when it had loaded it
    pid: int = 0  # its process, once it has loaded a setup
    rounds: int = 0  # the program's verification rounds it held when it had loaded it


class RayEngine:
    """Work items on Ray actors; ``workers`` of them (default: the cluster's CPUs)."""

    name = "ray"
    max_batch = 32

    def __init__(self, workers: int | None = None, address: str | None = None) -> None:
        ray = import_ray()
        self.ray = ray
        if not ray.is_initialized():
            _join_ray(ray, address)
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.slots = workers if workers else max(1, cpus)
        self._crew: _Crew | None = None
        self._hunger: _HungerFlag | None = None
        self._deaths = 0

    # ---- life cycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Ask for the worker actors now: they boot and import the search while this process
        builds the oracle and plans the units. (Joining Ray in a thread meanwhile was slower
        on 16 cores: the join then competed with the oracle for this process.)"""
        if self._crew is None:
            self._crew = _Crew.acquire(self.ray, self.slots)

    def prepare(self, setup: SearchSetup) -> None:
        """Have every worker load ``setup`` (the search's program side) and draw the
        program's verification rounds as soon as it has booted, while this process builds
        the oracle; :meth:`launch` brings the complete setup. Nothing is waited for: a worker
        that fails here fails again when it loads the complete setup, which is answered."""
        self.start()
        box = [self.ray.put(setup)]  # in a list: passed as a reference, not fetched
        for slot in self._crew.slots:
            slot.actor.prepare.remote(setup.token, box)

    def launch(self, setup: SearchSetup) -> None:
        """Have every worker load ``setup`` (and draw the program's verification rounds),
        without waiting for them: a worker takes work once it has."""
        self.start()
        self._token = setup.token
        self._setup = [self.ray.put(setup)]  # in a list: passed as a reference, not fetched
        self._deaths = 0
        self._hunger = _HungerFlag(self.ray)
        for slot in self._crew.slots:
            self._load(slot)

    def _load(self, slot: _Slot) -> None:
        slot.loaded = False
        slot.loading = slot.actor.load.remote(self._token, self._setup, self._hunger.link)

    def ready(self) -> None:
        """Wait until at least one worker can take work (the others join as they load the
        setup: :meth:`wait` reads their answers)."""
        limit = time.monotonic() + STARTUP_TIMEOUT_S
        while not any(slot.loaded for slot in self._crew.slots):
            loading = {slot.loading: slot for slot in self._crew.slots if slot.loading}
            done, _ = self.ray.wait(list(loading), num_returns=1,
                                    timeout=max(0.0, limit - time.monotonic()))  # fmt: skip
            if not done:
                raise EngineError(f"Ray workers did not start within {STARTUP_TIMEOUT_S:.0f} s")
            self._loaded(loading[done[0]])

    def _loaded(self, slot: _Slot) -> None:
        """Read a worker's answer to its setup; a worker that died is replaced."""
        ref, slot.loading = slot.loading, None
        try:
            slot.pid, slot.rounds, ready_wall = self.ray.get(ref)
        except Exception as error:  # noqa: BLE001 - the actor died or could not load
            self._replace(slot, f"a Ray worker failed while loading the search: {error}")
            return
        slot.loaded = True
        if slot.loaded_after is None:
            slot.loaded_after = time.monotonic() - slot.created
            slot.ready_wall = ready_wall

    def _replace(self, slot: _Slot, reason: str) -> None:
        """A fresh actor in ``slot`` (loading this search), unless workers keep dying."""
        self._deaths += 1
        with contextlib.suppress(Exception):
            self.ray.kill(slot.actor)
        if self._deaths > MAX_DEATHS_PER_SLOT * self.slots:
            raise EngineError(f"Ray workers keep dying ({self._deaths} times; last: {reason})")
        slot.actor, slot.created, slot.loaded_after = _new_actor(self.ray), time.monotonic(), None
        slot.batch, slot.ref = None, None
        self._load(slot)

    def start_times(self) -> list[float]:
        """Seconds each worker took from its creation to loading its first setup (workers
        kept from an earlier search included)."""
        slots = self._crew.slots if self._crew else []
        return sorted(s.loaded_after for s in slots if s.loaded_after is not None)

    def rounds_inherited(self) -> list[int]:
        return []  # each Ray worker draws its rounds when it loads the setup

    def ready_clock(self) -> tuple[list[float], None]:
        """When (``time.time()`` of its node) each worker said it had loaded its first
        setup; no zygote."""
        slots = self._crew.slots if self._crew else []
        return sorted(s.ready_wall for s in slots if s.ready_wall is not None), None

    def threads(self) -> int:
        return 1  # a worker holds one CPU of the cluster

    def close(self) -> None:
        """End of a search: workers still running a batch are stopped (what they do is no
        longer wanted); idle ones stay for the next search of this process."""
        if self._crew is not None:
            for slot in [s for s in self._crew.slots if s.batch is not None]:
                with contextlib.suppress(Exception):
                    self.ray.kill(slot.actor)
                self._crew.slots.remove(slot)  # (the next search asks for a fresh one)
            for slot in self._crew.slots:
                slot.loading, slot.loaded = None, False
            self._crew.release()
            self._crew = None
        if self._hunger is not None:
            self._hunger.close()
            self._hunger = None

    # ---- work ----------------------------------------------------------------------------

    def free(self) -> int:
        return sum(1 for s in self._crew.slots if s.loaded and s.batch is None)

    def busy(self) -> int:
        return sum(1 for s in self._crew.slots if s.batch is not None)

    def submit(self, items: list[WorkItem], seconds: float) -> None:
        slot = next(s for s in self._crew.slots if s.loaded and s.batch is None)
        slot.batch = list(items)
        slot.ref = slot.actor.run.remote(self._token, slot.batch, seconds, SLICE_SECONDS)

    def set_hungry(self, hungry: bool) -> None:
        if self._hunger is not None:
            self._hunger.set(hungry)

    def wait(self, timeout: float) -> list[Outcome]:
        """Outcomes of finished batches; workers that finished loading the setup meanwhile
        become free (their answer is no outcome)."""
        ray = self.ray
        pending = {s.ref: s for s in self._crew.slots if s.batch is not None}
        pending.update({s.loading: s for s in self._crew.slots if s.loading is not None})
        if not pending:
            return []
        refs = list(pending)
        ready, _ = ray.wait(refs, num_returns=1, timeout=max(0.0, timeout))
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        outcomes = []
        for ref in ready:
            slot = pending[ref]
            if ref is slot.loading:
                self._loaded(slot)
            else:
                outcomes.append(self._finished(slot))
        return outcomes

    def _finished(self, slot: _Slot) -> Outcome:
        """What became of ``slot``'s batch (a worker that died is replaced)."""
        ref, batch = slot.ref, slot.batch or []
        slot.ref, slot.batch = None, None
        try:
            message = self.ray.get(ref)
        except self.ray.exceptions.RayActorError as error:
            self._replace(slot, f"{type(error).__name__}")
            return Outcome(lost=batch, lost_reason=f"Ray worker died: {type(error).__name__}")
        except Exception as error:  # noqa: BLE001 - an error outside the items: the batch again
            return Outcome(lost=batch, lost_reason=f"Ray worker error: {error}")
        if message[0] == "failed":  # one item raised
            _, text, results, item, rest = message
            return Outcome(results, rest, [item], f"worker error: {text}")
        return Outcome(message[1], message[2])


# ---- the workers ---------------------------------------------------------------------------


class _Crew:
    """The worker actors of this process: kept from one search to the next (on one Ray
    session); a search that finds them in use gets a private crew, ended with it."""

    _kept: _Crew | None = None
    _lock = threading.Lock()

    def __init__(self, ray, session: str, shared: bool) -> None:
        self.ray, self.session, self.shared = ray, session, shared
        self.slots: list[_Slot] = []
        self.in_use = False

    @classmethod
    def acquire(cls, ray, count: int) -> _Crew:
        """``count`` worker actors (the kept ones first; missing ones asked for now)."""
        session = ray.get_runtime_context().get_job_id()
        with cls._lock:
            crew = cls._kept
            if crew is None or crew.session != session:
                crew = cls._kept = cls(ray, session, shared=True)  # an old session's are gone
            elif crew.in_use:
                crew = cls(ray, session, shared=False)
            crew.in_use = True
        crew.resize(count)
        return crew

    def resize(self, count: int) -> None:
        for slot in self.slots[count:]:
            with contextlib.suppress(Exception):
                self.ray.kill(slot.actor)
        del self.slots[count:]
        while len(self.slots) < count:
            self.slots.append(_Slot(_new_actor(self.ray), time.monotonic()))

    def release(self) -> None:
        if not self.shared:
            self.resize(0)
        self.in_use = False


def _new_actor(ray):
    """A worker actor, asked for now (its process boots and imports the search)."""
    global _WORKER_CLASS
    if _WORKER_CLASS is None:
        _WORKER_CLASS = ray.remote(num_cpus=1, max_restarts=0)(SearchWorker)
    return _WORKER_CLASS.remote()


_WORKER_CLASS = None


def shutdown() -> None:
    """End the worker actors this process keeps for later searches."""
    with _Crew._lock:
        crew, _Crew._kept = _Crew._kept, None
    if crew is not None:
        crew.resize(0)


class SearchWorker:
    """A Ray actor that runs a search's batches of work items in its own process."""

    def __init__(self) -> None:
        with contextlib.suppress(ImportError):  # what a worker loads at its first find
            import mugraph.optimize.cost_model  # noqa: F401
            import mugraph.search.driver  # noqa: F401
        self.setup: SearchSetup | None = None
        self.hungry = _never

    def prepare(self, token: str, setup_box: list) -> None:
        """Load the search's program side and draw its verification rounds (see
        :meth:`RayEngine.prepare`); :meth:`load` then finds them ready."""
        if self.setup is not None and self.setup.token == token:
            return
        with contextlib.suppress(Exception):  # answered by load, which tries again
            import ray

            setup = ray.get(setup_box[0])
            prepared(setup)
            prepare_rounds(setup, max(1, setup.threads))

    def load(self, token: str, setup_box: list, link: _HungerLink) -> tuple[int, int, float]:
        """Load the search's setup and draw the program's verification rounds (evaluating
        the program on them); returns this process's id, the rounds it holds and when it
        was done (``time.time()``)."""
        if self.setup is None or self.setup.token != token:
            import ray

            setup = ray.get(setup_box[0])
            prepared(setup)
            with contextlib.suppress(Exception):  # else they are drawn at the first check
                prepare_rounds(setup, max(1, setup.threads))
            self.setup = setup
        self.hungry = link.reader()
        return os.getpid(), rounds_held(), time.time()

    def run(self, token: str, items: list[WorkItem], seconds: float, slice_s: float):
        """``("done", results, items given back)``, or ``("failed", error, results, the item
        that raised, the items after it)``."""
        if self.setup is None or self.setup.token != token:
            raise EngineError("a Ray worker was sent work of a search it has not loaded")
        timer = SliceTimer(self.hungry, slice_s)
        try:
            results, returned = run_batch(self.setup, items, seconds, timer,
                                          worker=f"ray pid {os.getpid()}")  # fmt: skip
        except ItemFailed as failed:
            text = traceback.format_exc(limit=8).strip().splitlines()[-1]
            return ("failed", text, failed.results, failed.item, failed.rest)
        return ("done", results, returned)


def _never() -> bool:
    return False


# ---- "workers are waiting" -----------------------------------------------------------------


@dataclass(frozen=True)
class _HungerLink:
    """How a worker reads the signal: the shared-memory byte at ``path`` on ``host``, else
    the flag actor (None on a cluster of one node)."""

    path: str
    host: str
    actor: Any = None

    def reader(self):
        if self.host == socket.gethostname() and os.path.exists(self.path):
            with open(self.path, "r+b") as file:
                view = mmap.mmap(file.fileno(), 8)
            return lambda: view[0] == 1
        if self.actor is not None:
            return _PolledFlag(self.actor)
        return _never


class _HungerFlag:
    """The driver's side of the signal: the shared-memory byte, and the flag actor when the
    cluster has more than one node."""

    def __init__(self, ray) -> None:
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, name = tempfile.mkstemp(prefix="mugraph-hunger-", dir=folder)
        os.write(fd, b"\0" * 8)
        self.view = mmap.mmap(fd, 8)
        os.close(fd)
        self.path = name
        self.ray = ray
        nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
        self.actor = ray.remote(num_cpus=0)(_Hunger).remote() if nodes > 1 else None
        self.link = _HungerLink(name, socket.gethostname(), self.actor)
        self.hungry = False

    def set(self, hungry: bool) -> None:
        if hungry != self.hungry:
            self.view[0] = 1 if hungry else 0
            if self.actor is not None:
                self.actor.set.remote(hungry)
            self.hungry = hungry

    def close(self) -> None:
        self.set(False)
        self.view.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        if self.actor is not None:
            with contextlib.suppress(Exception):
                self.ray.kill(self.actor)


class _Hunger:
    """The actor behind the signal for workers on other nodes."""

    def __init__(self) -> None:
        self.hungry = False

    def set(self, hungry: bool) -> None:
        self.hungry = hungry

    def get(self) -> bool:
        return self.hungry


class _PolledFlag:
    """A remote worker's view of the signal: asks the actor at most every POLL_SECONDS."""

    def __init__(self, actor) -> None:
        self.actor = actor
        self.value = False
        self.asked = 0.0

    def __call__(self) -> bool:
        now = time.monotonic()
        if now - self.asked > POLL_SECONDS:
            import ray

            self.asked = now
            with contextlib.suppress(Exception):
                self.value = bool(ray.get(self.actor.get.remote(), timeout=1.0))
        return self.value
