"""The search's work items as Ray tasks (``superoptimize(..., engine="ray")``,
``mugraph optimize --cluster [ADDRESS]``).

Ray is optional (``pip install mugraph[cluster]``). Without an address a local Ray is started
on demand (and kept for later searches of this process); with one, the search joins that
cluster (``"auto"``, ``"ray://host:10001"``...; its nodes need mugraph installed, or a
``RAY_RUNTIME_ENV`` that provides it).

The driver schedules exactly as with the local pool (:mod:`mugraph.search.pool`): each batch
of work items is one task; a small actor carries the "workers are waiting" signal that makes a
long task hand the rest of its work back. A task whose worker dies is retried by Ray; if Ray
gives up, the driver queues its items again. The search's setup (program, configuration,
the oracle's exported tables) is put in the object store once; a worker process loads it once
and keeps it for the later tasks of the search.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

from mugraph.search.pool import SLICE_SECONDS, EngineError, Outcome
from mugraph.search.work import ItemFailed, SearchSetup, SliceTimer, WorkItem, run_batch

# how often a task asks the actor whether workers wait (seconds)
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


class RayEngine:
    """Work items as Ray tasks; ``workers`` tasks at a time (default: the cluster's CPUs)."""

    name = "ray"
    max_batch = 32

    def __init__(self, workers: int | None = None, address: str | None = None) -> None:
        ray = import_ray()
        self.ray = ray
        if not ray.is_initialized():
            root = str(Path(__file__).resolve().parents[2])
            paths = [root, *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
            options: dict[str, Any] = {
                "address": address,
                "include_dashboard": False,
                "log_to_driver": False,
                "configure_logging": False,
            }
            if address is None:
                # a local Ray: its workers import this copy of mugraph
                options["runtime_env"] = {"env_vars": {"PYTHONPATH": os.pathsep.join(paths)}}
            try:
                ray.init(**options)
            except Exception as error:  # noqa: BLE001 - Ray raises many kinds: one clear error
                where = f"the Ray cluster at {address!r}" if address else "a local Ray"
                raise EngineError(f"could not start or join {where}: {error}") from None
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.slots = workers if workers else max(1, cpus)
        self._pending: dict[Any, list[WorkItem]] = {}
        self._hungry = False

    def start(self) -> None:
        """Nothing to start: Ray starts its workers as tasks arrive."""

    def start_times(self) -> list[float]:
        return []  # not known: Ray starts its workers itself

    def rounds_inherited(self) -> list[int]:
        return []  # each Ray worker draws its own rounds

    def ready(self) -> None:
        """Nothing to wait for: Ray starts its workers as tasks arrive."""

    def launch(self, setup: SearchSetup) -> None:
        ray = self.ray
        self._token = setup.token
        self._setup = [ray.put(setup)]  # in a list: passed as a reference, not fetched
        self._flag = ray.remote(num_cpus=0)(_Hunger).remote()
        self._task = ray.remote(num_cpus=1, max_retries=3)(_ray_run_batch)
        self._hungry = False

    def threads(self) -> int:
        return 1  # a task holds one CPU of the cluster

    def free(self) -> int:
        return self.slots - len(self._pending)

    def busy(self) -> int:
        return len(self._pending)

    def submit(self, items: list[WorkItem], seconds: float) -> None:
        ref = self._task.remote(self._token, self._setup, items, seconds, self._flag)
        self._pending[ref] = list(items)

    def set_hungry(self, hungry: bool) -> None:
        if hungry != self._hungry:
            self._flag.set.remote(hungry)
            self._hungry = hungry

    def wait(self, timeout: float) -> list[Outcome]:
        ray = self.ray
        if not self._pending:
            return []
        refs = list(self._pending)
        ready, _ = ray.wait(refs, num_returns=1, timeout=max(0.0, timeout))
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        outcomes = []
        for ref in ready:
            items = self._pending.pop(ref)
            try:
                results, returned = ray.get(ref)
            except Exception as error:  # noqa: BLE001 - a task Ray gave up on: queue it again
                outcomes.append(Outcome(lost=items, lost_reason=f"Ray task failed: {error}"))
                continue
            outcomes.append(Outcome(results, returned))
        return outcomes

    def close(self) -> None:
        for ref in list(self._pending):
            with contextlib.suppress(Exception):
                self.ray.cancel(ref, force=True)
        self._pending.clear()
        with contextlib.suppress(Exception):
            self.ray.kill(self._flag)


class _Hunger:
    """The actor behind the "workers are waiting" signal."""

    def __init__(self) -> None:
        self.hungry = False

    def set(self, hungry: bool) -> None:
        self.hungry = hungry

    def get(self) -> bool:
        return self.hungry


class _PolledFlag:
    """A task's view of the signal: asks the actor at most every POLL_SECONDS."""

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


_FETCHED: dict[str, SearchSetup] = {}  # this Ray worker's setup of the running search


def _ray_run_batch(token: str, setup_box: list, items: list[WorkItem], seconds: float, flag):
    """The task: run a batch in this Ray worker (the setup is fetched once per process)."""
    setup = _FETCHED.get(token)
    if setup is None:
        import ray

        setup = ray.get(setup_box[0])
        _FETCHED.clear()  # an earlier search's setup
        _FETCHED[token] = setup
    timer = SliceTimer(_PolledFlag(flag), SLICE_SECONDS)
    try:
        return run_batch(setup, items, seconds, timer, worker=f"ray pid {os.getpid()}")
    except ItemFailed as failed:  # the item's own error: Ray reports the task as failed
        raise failed.__cause__ from None
