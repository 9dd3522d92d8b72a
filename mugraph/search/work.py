"""Work items of a search and how a worker runs them, whatever runs the worker (this process,
a local process pool or a Ray cluster).

A search's *units* are the first custom kernel's schedules (see ``driver.plan_units``). A
*work item* is a unit, or a region of a unit's tree handed back by a worker that stopped early
so that idle workers could share it (:class:`mugraph.search.generator.Trail`). Every item is
enumerated by exactly one worker, which verifies the complete candidates it meets and returns
them in the order it met them, so the driver can merge the items of a unit in DFS order and
get the same answer as one worker running the whole unit.

Everything here is plain data that pickles: the program travels as JSON, the oracle as its
exported tables (no e-graph library object is sent or used by a worker).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from mugraph.errors import MugraphError
from mugraph.ir.rebuild import rebuild_kernel_graph
from mugraph.ir.serialize import from_json, to_json
from mugraph.search.config import SearchConfig
from mugraph.search.generator import (
    _WORKER_MEMO,
    CustomChoice,
    Enumerator,
    HandBack,
    SearchTimeout,
    Stats,
    Trail,
)
from mugraph.search.memo import SharedArrays
from mugraph.search.verify import NotVerifiableError
from mugraph.semantics import field_arith


@dataclass(frozen=True)
class WorkItem:
    """A unit (``region == ()``) or a region of one (see ``Trail``)."""

    kernels: int
    cap: int
    choice: CustomChoice
    region: tuple[int, ...] = ()

    @property
    def unit_key(self) -> str:
        return f"{self.kernels}|{self.cap}|{self.choice.key()}"

    @property
    def key(self) -> str:
        return f"{self.unit_key}@{'.'.join(map(str, self.region))}"

    def part(self, region: tuple[int, ...]) -> WorkItem:
        return WorkItem(self.kernels, self.cap, self.choice, tuple(region))


@dataclass
class ItemResult:
    """What a worker did with one item.

    ``found``: verified candidates (``{"graph", "hash", "verification"}``) in the order met,
    at most ``max_candidates`` distinct ones; ``rest``: regions handed back (the item stopped
    early); ``timed_out``: the time budget ended it. Complete when neither."""

    item: WorkItem
    found: list[dict]
    stats: Stats
    timed_out: bool = False
    rest: list[tuple[int, ...]] = field(default_factory=list)
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # the worker process's CPU time on it (all its threads)
    worker: str = ""
    began: float = 0.0  # wall-clock time (time.time()) the worker started the item
    # ``rest`` was handed back to avoid waiting for a continuation another worker was
    # computing (best run after other work), not because idle workers wanted work
    blocked: bool = False

    @property
    def complete(self) -> bool:
        return not self.timed_out and not self.rest


@dataclass
class SearchSetup:
    """What every worker needs for a search; ``token`` names it in workers' caches."""

    token: str
    program_json: str
    config: SearchConfig
    oracle: Any  # the driver's oracle adapter (exported tables) or None
    threads: int = 0  # verification threads per worker (0: this process's default)
    memo_dir: str = ""  # where workers on ``memo_host`` share continuations ("": they do not)
    memo_host: str = ""
    estimate: bool = False  # workers attach the default cost estimate of what they find
    # the oracle is still being built: this setup only lets a worker load the program and
    # draw its verification rounds meanwhile (:meth:`program_side`), never run an item
    oracle_pending: bool = False

    def program_side(self) -> SearchSetup:
        """This setup without its oracle (same token): what a worker needs to draw the
        program's verification rounds, sent before the driver has built the oracle, so that
        the rounds are ready when the oracle comes (the complete setup then finds the program
        and its rounds loaded, :func:`prepared`)."""
        return replace(self, oracle=None, oracle_pending=True)

    def shared_memo(self) -> str | None:
        """The shared continuation directory, for a worker on the driver's machine."""
        if self.memo_dir and self.memo_host == socket.gethostname() and os.path.isdir(
            self.memo_dir
        ):
            return self.memo_dir
        return None


_PROGRAMS: dict[str, Any] = {}  # token -> the program of the search this process serves


def prepared(setup: SearchSetup) -> tuple[Any, SearchConfig, Any]:
    """(program, config, oracle) of ``setup``. The program is parsed once per search (token)
    and kept for later items, with its verification rounds: the complete setup that follows
    a :meth:`~SearchSetup.program_side` finds them ready."""
    program = _PROGRAMS.get(setup.token)
    if program is None:
        _PROGRAMS.clear()
        _WORKER_MEMO.clear()  # continuations of an earlier search (bounded memory)
        _ROUNDS.clear()  # and its programs' verification rounds
        if setup.threads:  # a worker's share of the cores for the verifier's threads
            field_arith._MAX_WORKERS = setup.threads
        program = _PROGRAMS[setup.token] = from_json(setup.program_json)
    return program, setup.config, setup.oracle


def run_batch(
    setup: SearchSetup,
    items: list[WorkItem],
    seconds: float,
    due: Callable[[], bool] | None = None,
    worker: str = "",
) -> tuple[list[ItemResult], list[WorkItem]]:
    """Run ``items`` one after the other within ``seconds``; returns their results and the
    items given back untouched (when ``due`` says to stop between two items)."""
    started = time.monotonic()
    deadline = started + seconds
    results: list[ItemResult] = []
    for i, item in enumerate(items):
        if results and due is not None and due():
            return results, items[i:]
        try:
            result = run_item(setup, item, deadline, due)
        except Exception as error:  # noqa: BLE001 - charged to this item only
            raise ItemFailed(results, item, items[i + 1 :], error) from error
        result.worker = worker
        results.append(result)
        if result.timed_out:
            return results, items[i + 1 :]
    return results, []


class ItemFailed(Exception):
    """An item of a batch raised: the results of the items before it, the item, and the items
    after it (not started), so that only the item that failed is charged with the loss."""

    def __init__(self, results: list, item: WorkItem, rest: list, error: BaseException) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.results, self.item, self.rest = results, item, rest


def run_item(
    setup: SearchSetup, item: WorkItem, deadline: float, due: Callable[[], bool] | None = None
) -> ItemResult:
    """Enumerate one item (this process's clock ``deadline``), verifying what it finds."""
    started, began, cpu = time.monotonic(), time.time(), time.process_time()
    if setup.oracle_pending:
        raise MugraphError("a work item was sent with a setup whose oracle is not built yet")
    program, base, oracle = prepared(setup)
    if started > deadline:
        return ItemResult(item, [], Stats(), timed_out=True)
    # a unit enumerates graphs of exactly ``kernels`` custom kernels (plus, when
    # kernel_kinds allows them, pre-defined operators after the first custom kernel)
    config = base.with_overrides(
        max_block_ops=item.cap,
        max_custom_kernels=item.kernels,
        max_kernel_ops=base.max_kernel_ops if base.kernel_kinds else item.kernels,
    )
    gen = Enumerator(program, config, oracle, deadline, shared_memo=setup.shared_memo())
    store = _program_rounds(program).shared
    shared_before = store.counts() if store is not None else {}
    found: dict[str, dict] = {}

    def visit(ops, outputs) -> None:
        try:
            graph = rebuild_kernel_graph(ops, outputs)
        except MugraphError:
            gen.stats.pruned["invalid_graph"] += 1
            return
        key = graph.structural_hash()
        gen.stats.candidates += 1
        if key in found or len(found) >= config.max_candidates:
            return
        checking = time.perf_counter()
        try:
            check = _verify(graph, program, config.delta, config.verify_rounds)
        except NotVerifiableError:
            gen.stats.pruned["not_verifiable"] += 1
            return
        finally:
            gen.stats.timers["verify"] += round((time.perf_counter() - checking) * 1e3)
        if not check.passed:
            gen.stats.pruned["verification"] += 1
            return
        found[key] = {
            # as text: the driver keeps thousands, and strings are no work for its collector
            "graph": to_json(graph, indent=None),
            "hash": key,
            "verification": str(check),
        }
        if setup.estimate:
            from mugraph.search.driver import default_cost

            found[key]["estimate"] = default_cost(graph)

    trail = Trail(item.region, due)
    result = ItemResult(item, [], gen.stats, began=began)
    try:
        gen.run(visit, first=item.choice, trail=trail)
    except SearchTimeout:
        result.timed_out = True
    except HandBack:
        result.rest, result.blocked = trail.rest, trail.blocked
    result.found = list(found.values())
    result.seconds = time.monotonic() - started
    result.cpu_seconds = time.process_time() - cpu
    gen.stats.pruned.update({name: n for name, n in gen.memo.counts().items() if n})
    if store is not None:  # what this item read of the arrays other workers shared
        gen.stats.pruned.update({name: n - shared_before[name]
                                 for name, n in store.counts().items() if n > shared_before[name]})
    return result


def _verify(graph, program, delta, rounds):
    """The candidate against ``program`` on rounds whose program side is kept from one
    candidate to the next in this process (:class:`~mugraph.search.verify.ProgramRounds`)."""
    return _program_rounds(program).verify(graph, delta, max_rounds=rounds)


def _program_rounds(program, shared_dir: str | None = None):
    """This process's verification rounds of ``program`` (made on first use; ``shared_dir``:
    the search's shared directory, where the workers forked after the rounds were drawn
    share what candidates compute from them, :class:`~mugraph.search.memo.SharedArrays`)."""
    from mugraph.search.verify import ProgramRounds

    kept = _ROUNDS.get("rounds")
    if kept is None or kept.program is not program:
        _ROUNDS.clear()  # the earlier program's rounds first: at most one set in memory
        store = None
        if shared_dir:
            directory = os.path.join(shared_dir, "kept")
            os.makedirs(directory, exist_ok=True)
            store = SharedArrays(directory)
        kept = _ROUNDS["rounds"] = ProgramRounds(program, max_bytes=ROUND_BYTES, shared=store)
    return kept


def rounds_held() -> int:
    """How many of its program's verification rounds this process holds (drawn and
    evaluated)."""
    kept = _ROUNDS.get("rounds")
    return kept.prepared() if kept is not None else 0


def prepare_rounds(setup: SearchSetup, threads: int) -> int:
    """Load ``setup`` and draw the program's first verification rounds now, evaluating the
    program on them with ``threads`` threads, which are stopped before this returns (the
    zygote of :mod:`mugraph.search.pool` does this before it forks the workers, so that they
    share the rounds). Returns how many rounds are kept."""
    program, config, _ = prepared(setup)
    kept_threads = field_arith._MAX_WORKERS
    field_arith._MAX_WORKERS = max(1, threads)
    try:
        return _program_rounds(program, setup.shared_memo()).prepare(config.verify_rounds)
    finally:
        field_arith._MAX_WORKERS = kept_threads
        field_arith.stop_threads()
        field_arith.release_memory()


ROUND_BYTES = 1 << 30  # memory a worker keeps for the program's side of its rounds
_ROUNDS: dict[str, Any] = {}


class SliceTimer:
    """``due`` for a worker: stop early once ``slice_s`` seconds have passed since ``start()``
    and ``hungry()`` says other workers wait for work."""

    def __init__(self, hungry: Callable[[], bool], slice_s: float) -> None:
        self.hungry = hungry
        self.slice_s = slice_s
        self.started = time.monotonic()

    def start(self) -> None:
        self.started = time.monotonic()

    def __call__(self) -> bool:
        return time.monotonic() - self.started > self.slice_s and self.hungry()
