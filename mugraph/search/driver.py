"""Running a search: work units on an engine (this process, a local process pool, or a Ray
cluster), verification, ranking, progress, time budget, Ctrl-C and resume. ``superoptimize``
is the entry point.

The units are the first custom kernel's schedules (inputs, grid, for-loop), in a fixed order.
Each unit is enumerated by workers as one or more *work items* (:mod:`mugraph.search.work`):
a worker that runs long while others wait hands the rest of its item back as regions of the
unit's tree, which idle workers take. A unit's items are merged in DFS order and capped at
``max_candidates`` exactly as if one worker had run it, and units are merged, deduplicated by
structural hash and sorted by (cost, hash), so the answer does not depend on the engine or the
number of workers — as long as no item is cut short by the time budget. Costs are computed
here, in the calling process, with the ``cost`` function given.

With ``checkpoint=PATH`` every finished item is journalled as it arrives
(:mod:`mugraph.search.journal`), so a search stopped in any way resumes where it was.
"""

from __future__ import annotations

import gc
import hashlib
import json
import math
import multiprocessing
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from queue import Empty, SimpleQueue
from typing import Any

import numpy as np

from mugraph.ir.ops import OpKind
from mugraph.ir.serialize import from_json, to_json
from mugraph.search.config import SearchConfig, SearchOptionError, default_config
from mugraph.search.generator import (
    REGION_NUMBERING,
    CustomChoice,
    Enumerator,
    SearchTimeout,
    Stats,
)
from mugraph.semantics.abstract import ABSTRACT_SEMANTICS, Term

# seconds the driver waits past the deadline for workers to report before stopping them
DEADLINE_GRACE_S = 5.0
# a work item lost with a dead worker this many times is reported and skipped
MAX_ITEM_LOSSES = 3


@dataclass
class Candidate:
    """A verified μGraph with its estimated cost. ``source`` is the μGraph, or the JSON text
    a worker sent, parsed the first time ``graph`` is read (a search of thousands of
    candidates does not parse them all before it returns)."""

    source: Any
    cost: float
    hash: str
    verification: Any = None

    @property
    def graph(self):
        if isinstance(self.source, str | dict):
            self.source = graph_from_worker(self.source)
        return self.source

    def to_dict(self) -> dict:
        return {
            "graph": json.loads(to_json(self.graph, indent=None)),
            "cost": self.cost,
            "hash": self.hash,
            "verification": str(self.verification),
        }


@dataclass
class SearchResult:
    """What a search found and how it went.

    The same type whether the program was searched whole or split into subprograms: then
    ``parts`` holds each subprogram's own result (in program order) and the counts, flags and
    statistics here add them up. ``candidates`` are this search's verified μGraphs (empty for
    a split program, whose answer is the stitched graph the search returned)."""

    program: Any
    candidates: list[Candidate]
    stats: Stats
    config: SearchConfig
    elapsed: float = 0.0
    units_done: int = 0
    units_total: int = 0
    timed_out: bool = False
    interrupted: bool = False
    reached_target: bool = False
    log: list[str] = field(default_factory=list)
    ranking: Any = None  # how superoptimize chose among the candidates (RankingResult)
    resumed_units: int = 0
    engine: str = ""
    failed_items: list[str] = field(default_factory=list)
    handed_back: int = 0  # regions of units handed back by busy workers to idle ones
    parts: list[SearchResult] = field(default_factory=list)
    cache: str = ""  # "hit": answered by the result cache; "miss": not there (cache_only)
    # seconds spent in each phase: engine (joining Ray, asking for the workers), oracle (built
    # while the workers start), plan (until the first units are planned: the rest are planned
    # while the workers run them), start workers (until the first can take work), search,
    # finish
    phases: dict[str, float] = field(default_factory=dict)
    # how busy the workers were: seconds spent on work items, summed over them (and the CPU
    # time the workers' processes spent on them: below the seconds when cores are shared);
    # seconds from the first moment the queue was empty while a worker was idle to the end
    worker_seconds: float = 0.0
    worker_cpu_seconds: float = 0.0
    tail_seconds: float = 0.0
    # seconds from the start of the search to each worker's first work item, in order
    first_work: list[float] = field(default_factory=list)

    @property
    def best(self):
        return self.candidates[0].graph if self.candidates else None

    @classmethod
    def of_parts(cls, program, parts: list[SearchResult], elapsed: float) -> SearchResult:
        """The result of a program split into subprograms, from the parts' results."""
        stats = Stats()
        for part in parts:
            stats.merge(part.stats)
        return cls(
            program,
            [],
            stats,
            parts[0].config if parts else SearchConfig(),
            elapsed=elapsed,
            units_done=sum(p.units_done for p in parts),
            units_total=sum(p.units_total for p in parts),
            timed_out=any(p.timed_out for p in parts),
            interrupted=any(p.interrupted for p in parts),
            reached_target=bool(parts) and all(p.reached_target for p in parts),
            log=[line for p in parts for line in p.log],
            resumed_units=sum(p.resumed_units for p in parts),
            engine=parts[0].engine if parts else "",
            failed_items=[key for p in parts for key in p.failed_items],
            handed_back=sum(p.handed_back for p in parts),
            worker_seconds=sum(p.worker_seconds for p in parts),
            worker_cpu_seconds=sum(p.worker_cpu_seconds for p in parts),
            parts=list(parts),
            cache="miss" if any(p.cache == "miss" for p in parts) else "",
        )

    def _state(self) -> str:
        return (
            "interrupted"
            if self.interrupted
            else "target cost reached"
            if self.reached_target
            else "time budget spent"
            if self.timed_out
            else "incomplete (work items lost: see .log)"
            if self.failed_items
            else "complete"
        )

    def summary(self) -> str:
        pruned = ", ".join(f"{k} {v}" for k, v in self.stats.pruned.most_common())
        if self.parts:
            head = (
                f"search {self._state()}: the program was split into {len(self.parts)} "
                f"subprograms, {self.units_done}/{self.units_total} units, "
                f"{self.stats.states} states, {self.elapsed:.1f} s"
            )
            lines = [head] + [
                f"  part {i}: " + part.summary().replace("\n", "\n    ")
                for i, part in enumerate(self.parts)
            ]
            if self.ranking is not None:
                lines.append("  " + self.ranking.summary())
            return "\n".join(lines)
        best = f"{self.candidates[0].cost * 1e6:.2f} us (est.)" if self.candidates else "none"
        resumed = f" ({self.resumed_units} from the checkpoint)" if self.resumed_units else ""
        failed = f", {len(self.failed_items)} work items lost" if self.failed_items else ""
        if self.handed_back:
            failed += f", {self.handed_back} regions handed back to idle workers"
        text = (
            f"search {self._state()}: {self.units_done}/{self.units_total} units{resumed}, "
            f"{self.stats.states} states, {self.stats.block_graphs} block graphs, "
            f"{self.stats.candidates} candidates, {len(self.candidates)} verified, best {best}, "
            f"{self.elapsed:.1f} s{failed}\n  pruned: {pruned or 'nothing'}"
        )
        if self.ranking is not None:
            text += "\n  " + self.ranking.summary()
        return text


def graph_from_worker(source: str | dict):
    """The μGraph of a candidate a worker found: its JSON text (or, journalled by an earlier
    version, the parsed JSON document)."""
    return from_json(source if isinstance(source, str) else json.dumps(source))


def program_terms(program) -> list[Term]:
    """The abstract expressions of the program's outputs (inputs are ``in0``, ``in1``...)."""
    values: list[list[Term]] = []
    for op in program.ops:
        if op.kind is OpKind.INPUT:
            values.append([ABSTRACT_SEMANTICS[op.kind]([], [], {"name": f"in{op.attr('index')}"})])
            continue
        args = [values[r.op][r.index] for r in op.inputs]
        dims = [program.tensor_type(r).dims for r in op.inputs]
        values.append([ABSTRACT_SEMANTICS[op.kind](args, dims, op.attr_dict)])
    return [values[r.op][r.index] for r in program.outputs]


class _OracleAdapter:
    """The generator's view of the pruning oracle: keep a prefix unless it is decided useless."""

    def __init__(self, targets: list[Term]) -> None:
        from mugraph.search.oracle import SubexprOracle

        self.targets = targets
        self.oracle = SubexprOracle(targets)

    def is_subexpr(self, term: Term) -> bool:
        return self.oracle.is_subexpr(term).keep

    def is_equivalent(self, term: Term, output: int) -> bool:
        """Keep a complete graph unless its output is decided not A_eq-equal to the target."""
        return self.oracle.equivalent_to_target(term, output).keep


# ---- the driver --------------------------------------------------------------------------------


def default_cost(graph) -> float:
    try:
        from mugraph.optimize.cost_model import estimate
    except ImportError:
        from mugraph.search.cost import traffic_estimate

        return traffic_estimate(graph)
    return estimate(graph).seconds


def superoptimize(
    program,
    *,
    config: SearchConfig | None = None,
    preset: str | None = None,
    time_limit: float | None = None,
    workers: int | None = None,
    progress: bool | Callable[[str], None] = False,
    checkpoint: str | os.PathLike | None = None,
    cost: Callable[[Any], float] = default_cost,
    target_cost: float | None = None,
    engine: str = "local",
    address: str | None = None,
    start_method: str | None = None,
    **overrides,
) -> SearchResult:
    """Search μGraphs equivalent to ``program``; every candidate returned is verified.

    The search ends when every unit is done, the time budget is spent, Ctrl-C is pressed
    (what was found is kept; with ``checkpoint`` a later call resumes), or — with
    ``target_cost`` (seconds) — once a verified candidate is estimated at most that cost.

    ``workers``: how many units run at once (default: every local core; on Ray, every CPU of
    the cluster). ``engine``: ``"local"`` (this process for one worker, else worker processes
    started with ``start_method``: ``"zygote"`` (default where the system forks: forked from
    a fresh process that has loaded the search), ``"exec"``, ``"fork"``, ``"spawn"`` or
    ``"forkserver"``) or ``"ray"`` (Ray tasks on the cluster at ``address``; a local Ray is
    started when none is given; ``pip install mugraph[cluster]``)."""
    program.check()
    from mugraph.search.verify import check_verifiable

    check_verifiable(program)
    _check_search_options(time_limit, workers, target_cost)
    _check_search_arguments(config, progress, checkpoint, cost)
    cfg = config or default_config(program, preset)
    if time_limit is not None:
        overrides["time_limit"] = time_limit
    if workers is not None:
        overrides["workers"] = workers
    cfg = cfg.with_overrides(**overrides) if overrides else cfg
    _check_search_options(cfg.time_limit, cfg.workers, target_cost)
    report = _progress_printer(progress)
    started = time.monotonic()
    deadline = started + cfg.time_limit
    with _FrozenHeap() as heap:
        from mugraph.search.pool import engine_for

        runner = engine_for(engine, cfg.worker_count, start_method=start_method, address=address)
        search = _Search(program, cfg, runner, cost, started, deadline, report, target_cost)
        _search_on(search, runner, checkpoint, heap)
        result = search.finish()
    if report:
        report(result.summary())
    return result


def _search_on(search: _Search, runner, checkpoint, heap: _FrozenHeap) -> None:
    """Start ``runner``, build the oracle, launch the workers and run ``search`` on them as
    its units are planned; the runner is closed at the end, whatever happens."""
    program, cfg, started = search.program, search.cfg, search.started
    setup = None
    try:
        # the workers start (import mugraph, draw the program's verification rounds) while
        # this process builds the oracle; each takes work as soon as it has loaded the setup
        runner.start()
        joined = time.monotonic() - started
        setup = _search_setup(program, cfg, None, runner, search.cost_fn)
        setup = _launch(program, cfg, runner, setup)
        heap.freeze()  # egglog's modules and the oracle too
        launched = time.monotonic() - started
        search.result.phases.update({"engine": joined, "oracle": launched - joined})
        search.resume(checkpoint)
        # the units are planned in a thread: the workers run the first ones (one custom
        # kernel) while it plans the rest (two kernels...)
        planner = _Planner(program, cfg, search.deadline)
        try:
            search.run(setup, planner)
        finally:
            planner.stop()
        if planner.timed_out:
            warnings.warn(
                "mugraph: the time budget ran out while planning the search", stacklevel=3
            )
    finally:
        runner.close()
        if setup is not None and setup.memo_dir:
            shutil.rmtree(setup.memo_dir, ignore_errors=True)


class _FrozenHeap:
    """While a search runs, the objects this process holds out of the cyclic garbage
    collector's sight (``gc.freeze``), unfrozen when it ends.

    A full collection walks every object of the process: with a deep-learning framework
    loaded that is hundreds of thousands of objects, 0.1-0.3 s a time (gqa_b1 on one worker
    here: six full collections, 1.0 s), and it comes at whatever moment the search's
    allocations trigger it: while the workers wait for their first units, or as the last
    candidates arrive. Frozen, the caller's objects (and, after :meth:`freeze`, egglog's
    and the oracle's) are not walked: a collection looks at the search's own. Nothing is
    frozen when objects were frozen before the search (someone else's freeze, which
    ``gc.unfreeze`` would undo)."""

    def __init__(self) -> None:
        self.active = False

    def __enter__(self) -> _FrozenHeap:
        if not gc.get_freeze_count():
            gc.freeze()
            self.active = True
        return self

    def freeze(self) -> None:
        """Freeze what the search has loaded since (for the rest of the search)."""
        if self.active:
            gc.freeze()

    def __exit__(self, *exc) -> None:
        if self.active:
            gc.unfreeze()


def _launch(program, cfg: SearchConfig, runner, setup):
    """Build the oracle and launch ``runner`` with ``setup`` completed by it; returns the
    complete setup. The workers get the program side of the setup first: they draw the
    program's verification rounds while this process builds the oracle (importing egglog and
    saturating the e-graph: the longest step of a search's start), instead of after."""
    if not cfg.abstract_pruning:
        runner.launch(setup)
        return setup
    runner.prepare(setup.program_side())
    setup = replace(setup, oracle=_OracleAdapter(program_terms(program)))
    runner.launch(setup)
    return setup


def _search_setup(program, cfg, oracle, runner, cost):
    """What every worker of the search needs (:class:`~mugraph.search.work.SearchSetup`);
    with several workers, a fresh directory where they share continuations
    (:mod:`mugraph.search.memo`), removed when the search ends."""
    from mugraph.search.work import SearchSetup

    token = hashlib.blake2b(f"{id(cfg)}:{time.time()}".encode(), digest_size=8).hexdigest()
    memo_dir = tempfile.mkdtemp(prefix="mugraph-memo-") if runner.slots > 1 else ""
    return SearchSetup(
        token,
        to_json(program, indent=None),
        cfg,
        oracle,
        runner.threads(),
        memo_dir=memo_dir,
        memo_host=socket.gethostname() if memo_dir else "",
        estimate=cost is default_cost,
    )


def _check_search_options(time_limit, workers, target_cost) -> None:
    """Options whose value makes no search: a clear error naming the option and the value."""
    if time_limit is not None and (
        isinstance(time_limit, bool)
        or not isinstance(time_limit, int | float)
        or not math.isfinite(time_limit)
        or time_limit <= 0
    ):
        raise SearchOptionError(
            f"superoptimize: time_limit must be a positive number of seconds, got {time_limit!r}"
        )
    if workers is not None and (
        isinstance(workers, bool) or not isinstance(workers, int) or workers < 1
    ):
        raise SearchOptionError(
            f"superoptimize: workers must be a positive integer, got {workers!r}"
        )
    if target_cost is not None and not (isinstance(target_cost, int | float) and target_cost > 0):
        raise SearchOptionError(
            f"superoptimize: target_cost must be a positive number of seconds, got {target_cost!r}"
        )


def _check_search_arguments(config, progress, checkpoint, cost) -> None:
    """The arguments of a search that are objects, not numbers: the right kind of each."""
    if config is not None and not isinstance(config, SearchConfig):
        raise SearchOptionError(
            f"superoptimize: config must be a SearchConfig (a preset by name: preset=...), got "
            f"{config!r}")
    if not (progress is None or isinstance(progress, bool) or callable(progress)):
        raise SearchOptionError(
            f"superoptimize: progress must be True, False or a function of one line, got "
            f"{progress!r}")
    if checkpoint is not None and not isinstance(checkpoint, str | os.PathLike):
        raise SearchOptionError(
            f"superoptimize: checkpoint must be None or a file path, got {checkpoint!r}")
    if not callable(cost):
        raise SearchOptionError(
            f"superoptimize: cost must be a function of a kernel graph, got {cost!r}")


class _UnitLedger:
    """The items of one unit: which regions are still open, and what each finished one found
    (merged in DFS order, as one worker would have met them)."""

    def __init__(self, unit) -> None:
        self.unit = unit
        self.opened: set[tuple[int, ...]] = {()}
        self.closed: dict[tuple[int, ...], list[dict]] = {}
        self.partial: list[dict] = []

    @property
    def done(self) -> bool:
        return not (self.opened - self.closed.keys())

    def record(self, region, found, rest, timed_out) -> None:
        region = tuple(region)
        if timed_out:
            self.partial.extend(found)
            return
        self.closed[region] = found
        self.opened |= {tuple(r) for r in rest}

    def open_regions(self) -> list[tuple[int, ...]]:
        return sorted(self.opened - self.closed.keys())

    def candidates(self, cap: int) -> list[dict]:
        """Finished: the first ``cap`` distinct candidates in DFS order; else all found."""
        ordered = [c for region in sorted(self.closed) for c in self.closed[region]]
        if not self.done:
            return ordered + self.partial
        seen: dict[str, dict] = {}
        for c in ordered:
            if len(seen) >= cap:
                break
            seen.setdefault(c["hash"], c)
        return list(seen.values())


class _Search:
    """One search's state: the queue of work items, the units' ledgers, the journal."""

    def __init__(self, program, cfg, runner, cost, started, deadline, report, target):
        self.program, self.cfg, self.runner = program, cfg, runner
        self.cost_fn, self.started, self.deadline = cost, started, deadline
        self.report, self.target = report, target
        self.items: list = []  # the units' items in plan order (added as they are planned)
        self.ledgers: dict[str, _UnitLedger] = {}
        # journalled records of units not planned yet (a resumed search), by unit
        self.journalled: dict[str, list[dict]] = {}
        self.result = SearchResult(program, [], Stats(), cfg)
        self.result.engine = f"{runner.name}, {runner.slots} worker" + "s" * (runner.slots != 1)
        self.costs: dict[str, float] = {}
        self.graphs: dict[str, Any] = {}
        self.losses: dict[str, int] = {}
        self.journal = None
        self.dry_since: float | None = None  # when the queue first ran dry with a worker idle
        # the search's start on the wall clock (workers stamp their items with it)
        self.started_wall = time.time() - (time.monotonic() - started)
        self.first_began: dict[str, float] = {}  # worker -> when it started its first item

    # ---- checkpoint ------------------------------------------------------------------------

    def resume(self, checkpoint) -> None:
        if checkpoint is None:
            return
        from mugraph.search.journal import Journal

        self.journal = Journal.open(checkpoint, _checkpoint_key(self.program, self.cfg))
        for record in self.journal.records:
            self.journalled.setdefault(record.get("unit"), []).append(record)

    def _replay(self, ledger: _UnitLedger, records: list[dict]) -> None:
        """The journalled records of a unit just planned, into its ledger (records of units
        the plan does not have are never replayed). An item the time budget cut short runs
        again whole: its statistics are not counted twice."""
        for record in records:
            for c in record.get("found", []):
                self.costs.setdefault(c["hash"], c["cost"])
            ledger.record(record["region"], record["found"], record["rest"], record["timed_out"])
            if not record["timed_out"]:
                self.result.stats.merge(_stats_from(record.get("stats", {})))
        if ledger.done:
            self.result.resumed_units += 1
            self.result.units_done += 1

    def add_units(self, units, queue: deque) -> None:
        """Units just planned: their ledgers (with what the journal holds of them), and their
        open items at the end of ``queue``, in plan order."""
        from mugraph.search.work import WorkItem

        for kernels, cap, choice in units:
            item = WorkItem(kernels, cap, choice)
            ledger = self.ledgers[item.unit_key] = _UnitLedger(item)
            self.items.append(item)
            self._replay(ledger, self.journalled.pop(item.unit_key, []))
            queue.extend(item.part(region) for region in ledger.open_regions())
        self.result.units_total = len(self.items)

    def _journal(self, result) -> None:
        if self.journal is None:
            return
        self.journal.append(
            {
                "unit": result.item.unit_key,
                "region": list(result.item.region),
                "found": result.found,
                "rest": [list(r) for r in result.rest],
                "timed_out": result.timed_out,
                "stats": _stats_record(result.stats),
            }
        )

    # ---- running ---------------------------------------------------------------------------

    def run(self, setup, planner: _Planner) -> None:
        """Run the open items on the runner, already launched with ``setup``, as ``planner``
        plans the units (it is started here)."""
        queue: deque = deque()
        try:
            planner.start()
            self._first_units(queue, planner)
            if not queue and planner.done:
                return
            waiting = time.monotonic()
            self.runner.ready()
            self.result.phases["start workers"] = time.monotonic() - waiting
            self._loop(queue, planner)
            ended = time.monotonic()
            self.result.phases["search"] = ended - waiting - self.result.phases["start workers"]
            self.result.tail_seconds = ended - (self.dry_since or ended)
            self.result.first_work = sorted(
                round(t - self.started_wall, 3) for t in self.first_began.values()
            )
            self._log_start()
            self.result.log.append(planner.summary())
        except KeyboardInterrupt:
            self.result.interrupted = True
        finally:
            self._close()

    def _log_start(self) -> None:
        """How the workers started: how long each took to load the search, when by the
        search's clock (their own clocks), and the rounds they were forked holding."""
        times = self.runner.start_times()
        if not times:
            return
        rounds = self.runner.rounds_inherited()
        shared = (f", forked holding {rounds[0]}-{rounds[-1]} verification rounds of the "
                  "program" if rounds and rounds[-1] else "")  # fmt: skip
        ready, zygote = self.runner.ready_clock()
        if ready:
            shared += (f"; ready {ready[0] - self.started_wall:.2f}-"
                       f"{ready[-1] - self.started_wall:.2f} s into the search")  # fmt: skip
        if zygote is not None:
            shared += f" ({_zygote_text(zygote, self.started_wall)})"
        self.result.log.append(
            f"{len(times)} workers loaded the search {times[0]:.2f}-{times[-1]:.2f} s after "
            f"they were started{shared}"
        )

    def _first_units(self, queue: deque, planner: _Planner) -> None:
        """Wait for the planner's first units with an open item (or the end of the plan: a
        checkpoint of a finished search); the phase "plan" ends here."""
        while not queue and not planner.done:
            self.add_units(planner.take(wait=0.05), queue)
        before = sum(self.result.phases.values())  # engine and oracle
        self.result.phases["plan"] = time.monotonic() - self.started - before
        self.result.timed_out |= planner.timed_out

    def _close(self) -> None:
        """The journal; the runner is closed by ``superoptimize``, which launched it."""
        if self.journal is not None:
            self.journal.close()

    def _loop(self, queue: deque, planner: _Planner) -> None:
        runner = self.runner
        while queue or runner.busy() or not planner.done:
            if not (queue and runner.free()):  # (workers waiting for work get it first)
                self._take_planned(queue, planner)
            left = self.deadline - time.monotonic()
            if left <= -DEADLINE_GRACE_S or (left <= 0 and not runner.busy()):
                self.result.timed_out = True
                return
            hungry = not queue and runner.free() > 0 and runner.busy() > 0
            runner.set_hungry(hungry)
            if hungry and planner.done and self.dry_since is None:
                self.dry_since = time.monotonic()
            while queue and runner.free() and left > 0:
                runner.submit(_take(queue, runner.slots, runner.max_batch), left)
            # while the queue waits for the planner, look for its units every 10 ms
            timeout = min(0.2 if queue or planner.done else 0.01, left + DEADLINE_GRACE_S)
            for outcome in runner.wait(timeout=timeout):
                for result in outcome.results:
                    self._take_result(result, queue)
                queue.extendleft(reversed(outcome.returned))
                self._lost(outcome, queue)
                if self.report:
                    self.report(_progress_line(self.result, self.costs, self.started, self.cfg))
                if self.target is not None and any(c <= self.target for c in self.costs.values()):
                    self.result.reached_target = True
                    return

    def _take_planned(self, queue: deque, planner: _Planner) -> None:
        """The units planned since the last look; with nothing to run until more come,
        wait a little for them (rather than spin)."""
        idle = not queue and not self.runner.busy() and not planner.done
        self.add_units(planner.take(wait=0.05 if idle else 0.0), queue)
        self.result.timed_out |= planner.timed_out

    def _take_result(self, result, queue: deque) -> None:
        for c in result.found:
            c["cost"] = self._cost(c)
        ledger = self.ledgers[result.item.unit_key]
        was_done = ledger.done
        ledger.record(result.item.region, result.found, result.rest, result.timed_out)
        self._journal(result)
        self.result.stats.merge(result.stats)
        self.result.worker_seconds += result.seconds
        self.result.worker_cpu_seconds += result.cpu_seconds
        if result.worker and result.began:
            known = self.first_began.get(result.worker, result.began)
            self.first_began[result.worker] = min(known, result.began)
        self.result.timed_out |= result.timed_out
        rest = [result.item.part(r) for r in result.rest]
        if result.blocked:  # waiting on another worker's continuation: other work first
            queue.extend(rest)
        else:
            queue.extendleft(reversed(rest))
        self.result.handed_back += len(result.rest)
        if ledger.done and not was_done:
            self.result.units_done += 1

    def _lost(self, outcome, queue: deque) -> None:
        for item in outcome.lost:
            count = self.losses[item.key] = self.losses.get(item.key, 0) + 1
            if count < MAX_ITEM_LOSSES:
                queue.appendleft(item)
                self.result.log.append(f"work item {item.key}: {outcome.lost_reason}; retried")
            else:
                self.result.log.append(
                    f"work item {item.key}: lost {count} times ({outcome.lost_reason}); skipped"
                )
                self.result.failed_items.append(item.key)

    def _cost(self, candidate: dict) -> float:
        """The candidate's cost: the worker's estimate when the search ranks by the default
        cost (the worker holds the graph), else ``cost_fn`` of the graph, here."""
        key = candidate["hash"]
        if key not in self.costs:
            estimate = candidate.get("estimate") if self.cost_fn is default_cost else None
            if estimate is None:
                estimate = self.cost_fn(self._graph(candidate))
            self.costs[key] = float(estimate)
        return self.costs[key]

    def _graph(self, candidate: dict):
        key = candidate["hash"]
        if key not in self.graphs:
            self.graphs[key] = graph_from_worker(candidate["graph"])
        return self.graphs[key]

    # ---- the answer ------------------------------------------------------------------------

    def finish(self) -> SearchResult:
        finishing = time.monotonic()
        result = self.result
        result.elapsed = time.monotonic() - self.started
        if not (result.interrupted or result.reached_target):
            if result.units_done < result.units_total:
                result.timed_out = result.timed_out or time.monotonic() > self.deadline
        found: dict[str, dict] = {}
        for item in self.items:
            for c in self.ledgers[item.unit_key].candidates(self.cfg.max_candidates):
                found.setdefault(c["hash"], c)
        ranked = sorted(found.values(), key=lambda c: (self._cost(c), c["hash"]))
        result.candidates = [
            Candidate(self.graphs.get(c["hash"], c["graph"]), self._cost(c), c["hash"],
                      c["verification"])  # fmt: skip
            for c in ranked
        ]
        result.phases["finish"] = time.monotonic() - finishing
        return result


def _take(queue: deque, slots: int, most: int) -> list:
    """The next batch: one item, or several when the queue is long compared with the number
    of workers (fewer round trips; each worker still gets a share, and a hungry pool makes a
    worker hand back what it has not started)."""
    size = max(1, min(most, len(queue) // (4 * slots)))
    return [queue.popleft() for _ in range(min(size, len(queue)))]


def _stats_record(stats: Stats) -> dict:
    return {
        "states": stats.states,
        "block_graphs": stats.block_graphs,
        "candidates": stats.candidates,
        "pruned": dict(stats.pruned),
        "timers": dict(stats.timers),
    }


def _stats_from(record: dict) -> Stats:
    stats = Stats(record.get("states", 0), record.get("block_graphs", 0),
                  record.get("candidates", 0))  # fmt: skip
    stats.pruned.update(record.get("pruned", {}))
    stats.timers.update(record.get("timers", {}))
    return stats


def plan_units(
    program, cfg: SearchConfig, deadline: float | None = None
) -> list[tuple[int, int, CustomChoice]]:
    """The work units: (custom kernels, block-operator cap, first custom kernel's schedule),
    in the order :func:`plan_chunks` plans them."""
    return [unit for chunk in plan_chunks(program, cfg, deadline) for unit in chunk]


def plan_chunks(
    program, cfg: SearchConfig, deadline: float | None = None
) -> Iterator[list[tuple[int, int, CustomChoice]]]:
    """The work units, one list per number of custom kernels (the search runs the units of
    one kernel while the next list is planned).

    Iterative deepening: graphs of one custom kernel come first, then two...; within a
    kernel count the cap on block operators grows from ``cfg.min_block_ops`` (with
    ``cfg.deepening``) so small μGraphs are found first; within a cap, schedules go
    cheapest first by estimated seconds (with ``cfg.split_reads_largest``, a first kernel
    of several reads the largest input). A unit of n kernels enumerates graphs of exactly
    n kernels."""
    probe = Enumerator(program, cfg, None, deadline)
    tensors = probe.initial_tensors()
    n_inputs = len(tensors)
    low = min(cfg.min_block_ops, cfg.max_block_ops)
    caps = list(range(low, cfg.max_block_ops + 1)) if cfg.deepening else [cfg.max_block_ops]
    for kernels in range(
        cfg.min_custom_kernels, min(cfg.max_custom_kernels, cfg.max_kernel_ops) + 1
    ):
        last = kernels == 1
        largest = max(t.type.num_bytes for t in tensors)
        choices = [
            c
            for c in probe.custom_choices(
                tensors, last=last, partial=not last and cfg.split_before_boundary
            )
            if (not last or set(c.inputs) == set(range(n_inputs)))
            and (last or not cfg.split_reads_largest
                 or any(tensors[i].type.num_bytes == largest for i in c.inputs))
        ]
        choices.sort(key=lambda c: (probe.choice_seconds(c, tensors), c.key()))
        yield [(kernels, cap, c) for cap in caps for c in choices]


def _zygote_text(clock, started_wall: float) -> str:
    """The zygote's clock (:class:`~mugraph.search.pool.ZygoteClock`) by the search's."""
    at = {name: f"{t - started_wall:.2f}" for name, t in clock._asdict().items() if t}
    text = (f"the zygote ran at {at['entered']} s, had imported the search at "
            f"{at['imported']} s, got its setup at {at['setup']} s")  # fmt: skip
    return text + (f", had drawn the rounds at {at['drawn']} s" if "drawn" in at else "")


class _Planner:
    """:func:`plan_chunks` in a thread, started when the workers are launched: the search
    takes each list of units as it comes (:meth:`take`). Planning is plain Python on the
    program and the configuration (no oracle, no e-graph library); it runs mostly while the
    driver waits for the workers' messages (which releases the GIL)."""

    def __init__(self, program, cfg: SearchConfig, deadline: float) -> None:
        self.program, self.cfg, self.deadline = program, cfg, deadline
        self.done = False  # every list has been taken (or planning ended early)
        self.timed_out = False  # the time budget ran out while planning
        self.units = 0
        self.seconds = 0.0  # how long planning took, from the thread's start
        self._lists: SimpleQueue = SimpleQueue()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._plan, name="mugraph-plan", daemon=True)

    def start(self) -> None:
        self._started = time.monotonic()
        self._thread.start()

    def _plan(self) -> None:
        """(The thread) each list of units, then ``None``; an error goes to the caller."""
        try:
            for units in plan_chunks(self.program, self.cfg, self.deadline):
                if self._stopped.is_set():
                    break
                self._lists.put(units)
            self._lists.put(None)
        except BaseException as error:  # noqa: BLE001 - raised again by take()
            self._lists.put(error)

    def take(self, wait: float = 0.0) -> list[tuple[int, int, CustomChoice]]:
        """The units planned since the last call (waiting up to ``wait`` seconds for some
        when there are none)."""
        units: list = []
        while not self.done:
            try:
                got = self._lists.get(timeout=wait) if wait > 0 and not units else (
                    self._lists.get_nowait())  # fmt: skip
            except Empty:
                break
            if isinstance(got, list):
                units += got
                continue
            self.done = True
            self.seconds = time.monotonic() - self._started
            if isinstance(got, SearchTimeout):
                self.timed_out = True
            elif isinstance(got, BaseException):
                raise got
        self.units += len(units)
        return units

    def stop(self) -> None:
        """The search is over: the thread stops after the list it is planning."""
        self._stopped.set()

    def summary(self) -> str:
        return f"planned {self.units} units in {self.seconds:.2f} s while the workers ran"


# ---- the final verification: its rounds over the local cores ----------------------------------

_PAIR: dict[str, Any] = {}


def _init_pair(candidate, program, delta, primes) -> None:
    _PAIR.update(candidate=candidate, program=program, delta=delta, primes=primes)


def _verify_chunk(task: tuple[int, int]):
    from mugraph.search.verify import verify

    rounds, seed = task
    return verify(
        _PAIR["candidate"], _PAIR["program"], _PAIR["delta"], max_rounds=rounds, seed=seed,
        primes=_PAIR["primes"],
    )


def verify_in_parallel(candidate, program, delta: float = 1e-9, *, max_rounds: int = 64,
                       workers: int | None = None, primes: tuple[int, int] | None = None):
    """:func:`mugraph.verify` with its rounds spread over ``workers`` forked processes, each
    drawing its own random points (independent seeds): the same plan (rounds, bound, primes
    chosen for all the rounds) as one process running them all, in a fraction of the time. A
    failure in any process fails."""
    from mugraph.search.verify import (
        LARGE_PRIMES,
        analyse,
        choose_primes,
        difference,
        plan_rounds,
        verify,
        voided_in_small_field,
    )

    pair = difference(analyse(candidate), analyse(program))
    chosen = primes or choose_primes(pair, delta)
    rounds, bound, guarantee = plan_rounds(pair, delta, max_rounds, p=chosen[0], q=chosen[1])
    count = min(workers or os.cpu_count() or 1, rounds)
    if count <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return verify(candidate, program, delta, max_rounds=max_rounds, primes=primes)
    chunks = [rounds // count + (1 if i < rounds % count else 0) for i in range(count)]
    seeds = [int(s.generate_state(1)[0]) for s in np.random.SeedSequence().spawn(count)]
    started = time.perf_counter()
    ctx = multiprocessing.get_context("fork")
    init = (candidate, program, delta, chosen)
    with ctx.Pool(count, initializer=_init_pair, initargs=init) as pool:
        try:
            parts = pool.map(_verify_chunk, list(zip(chunks, seeds, strict=True)), chunksize=1)
        finally:
            pool.terminate()
    if primes is None and any(voided_in_small_field(r) for r in parts):
        return verify_in_parallel(candidate, program, delta, max_rounds=max_rounds,
                                  workers=workers, primes=LARGE_PRIMES)
    merged = parts[0]
    merged.rounds = sum(r.rounds for r in parts)
    merged.redraws = sum(r.redraws for r in parts)
    merged.passed = all(r.passed for r in parts)
    merged.failure = next((r.failure for r in parts if not r.passed), None)
    merged.bound = bound if merged.passed and merged.rounds >= rounds else None
    merged.guarantee = guarantee
    merged.elapsed = time.perf_counter() - started
    merged.notes.append(f"rounds run in {count} processes")
    return merged


def _progress_line(result: SearchResult, costs: dict, started: float, cfg: SearchConfig) -> str:
    best = min(costs.values(), default=None)
    best_text = f"{best * 1e6:.2f} us" if best is not None else "-"
    top = ", ".join(f"{k} {v}" for k, v in result.stats.pruned.most_common(3))
    return (
        f"[{time.monotonic() - started:6.1f}/{cfg.time_limit:.0f} s] units {result.units_done}/"
        f"{result.units_total}  states {result.stats.states}  pruned: {top}  "
        f"verified {len(costs)}  best {best_text}"
    )


def _progress_printer(progress) -> Callable[[str], None] | None:
    if callable(progress):
        return progress
    if progress:
        return lambda line: print(line, file=sys.stderr, flush=True)
    return None


def _checkpoint_key(program, cfg: SearchConfig) -> str:
    """The program and the search space (not the budget or the worker count), and how work
    regions are numbered (a checkpoint's regions mean nothing under another numbering)."""
    fields = {"region numbering": str(REGION_NUMBERING)}
    for name, value in vars(cfg).items():
        if name in ("time_limit", "workers", "extra"):
            continue
        if isinstance(value, frozenset):
            value = sorted(str(v) for v in value)
        fields[name] = str(value)
    text = json.dumps(fields, sort_keys=True)
    return (
        f"{program.structural_hash()}:{hashlib.blake2b(text.encode(), digest_size=12).hexdigest()}"
    )


def reference_recheck(graph, program, seed: int = 0, rtol: float = 1e-6) -> float:
    """Max relative difference of ``graph`` and ``program`` on random floats (float64)."""
    from mugraph.semantics.reference import evaluate

    rng = np.random.default_rng(seed)
    inputs = [rng.standard_normal(t.dims) * 0.5 for t in program.input_types]
    worst = 0.0
    for a, b in zip(evaluate(graph, inputs), evaluate(program, inputs), strict=True):
        scale = max(float(np.max(np.abs(b))), 1e-30)
        worst = max(worst, float(np.max(np.abs(a - b))) / scale)
    return worst
