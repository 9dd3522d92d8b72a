"""Running a search: work units over all local cores, verification, ranking, progress, time
budget, Ctrl-C and resume. ``superoptimize`` is the entry point.

The units are the first custom kernel's schedules (inputs, grid, for-loop), in a fixed order;
each unit is enumerated to completion (or to the deadline) by one worker, which estimates the
cost of the complete graphs it finds. Results are merged, deduplicated by structural hash and
sorted by (cost, hash). Verification is lazy: only graphs the search may return are verified —
the best ``keep`` by estimate and the best ``keep_per_structure`` of each distinct kernel
structure (:func:`mugraph.search.forms.structure_key`, up to ``max_structures``) — in
parallel, after the enumeration (which gets ``ENUMERATION_SHARE`` of the budget when it cannot
finish sooner); a graph that fails is replaced by the next one. So the answer does not depend
on the number of workers — as long as no unit is cut short by the time budget.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mugraph.errors import MugraphError
from mugraph.ir.ops import OpKind
from mugraph.ir.rebuild import rebuild_kernel_graph
from mugraph.ir.serialize import from_json, to_json
from mugraph.search.config import SearchConfig, default_config
from mugraph.search.forms import structure_key
from mugraph.search.generator import CustomChoice, Enumerator, SearchTimeout, Stats
from mugraph.search.verify import NotVerifiableError
from mugraph.semantics.abstract import ABSTRACT_SEMANTICS, Term


@dataclass
class Candidate:
    """A verified μGraph with its estimated cost."""

    graph: Any
    cost: float
    hash: str
    verification: Any = None

    def to_dict(self) -> dict:
        return {
            "graph": json.loads(to_json(self.graph, indent=None)),
            "cost": self.cost,
            "hash": self.hash,
            "verification": None if self.verification is None else str(self.verification),
        }


@dataclass
class SearchResult:
    """What a search found and how it went."""

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
    unverified: int = 0  # complete graphs found but never verified (not among those returned)
    log: list[str] = field(default_factory=list)

    @property
    def best(self):
        return self.candidates[0].graph if self.candidates else None

    def summary(self) -> str:
        pruned = ", ".join(f"{k} {v}" for k, v in self.stats.pruned.most_common())
        best = f"{self.candidates[0].cost * 1e6:.2f} us (est.)" if self.candidates else "none"
        state = (
            "interrupted"
            if self.interrupted
            else "target cost reached"
            if self.reached_target
            else "time budget spent"
            if self.timed_out
            else "complete"
        )
        return (
            f"search {state}: {self.units_done}/{self.units_total} units, "
            f"{self.stats.states} states, {self.stats.block_graphs} block graphs, "
            f"{self.stats.candidates} candidates, {len(self.candidates)} verified "
            f"({self.unverified} left unverified), best {best}, "
            f"{self.elapsed:.1f} s\n  pruned: {pruned or 'nothing'}"
        )


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


# ---- the worker side ---------------------------------------------------------------------------

_WORKER: dict[str, Any] = {}


def _init_worker(program, config, oracle, deadline, cost_fn) -> None:
    _WORKER.update(program=program, config=config, oracle=oracle, deadline=deadline, cost=cost_fn)


def _run_unit(unit: tuple[int, int, CustomChoice]) -> tuple[str, list[dict], Stats, bool]:
    kernels, cap, choice = unit
    if time.monotonic() > _WORKER["deadline"]:
        return _unit_key(unit), [], Stats(), True
    program = _WORKER["program"]
    base = _WORKER["config"]
    # a unit enumerates graphs of exactly ``kernels`` custom kernels (plus, when
    # kernel_kinds allows them, pre-defined operators after the first custom kernel)
    config = base.with_overrides(
        max_block_ops=cap,
        max_custom_kernels=kernels,
        max_kernel_ops=base.max_kernel_ops if base.kernel_kinds else kernels,
    )
    gen = Enumerator(program, config, _WORKER["oracle"], _WORKER["deadline"])
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
        found[key] = Candidate(graph, _WORKER["cost"](graph), key).to_dict()

    timed_out = False
    try:
        gen.run(visit, first=choice)
    except SearchTimeout:
        timed_out = True
    return _unit_key(unit), list(found.values()), gen.stats, timed_out


def _verify_one(cand: dict, program=None, config=None) -> tuple[str, str | None, str]:
    """(hash, verification text or None, verdict): verdict is "passed", "verification"
    (not equivalent) or "not_verifiable" (a PRUNING_RULES name). ``program`` and ``config``
    default to the worker's."""
    program = program if program is not None else _WORKER["program"]
    config = config if config is not None else _WORKER["config"]
    graph = from_json(json.dumps(cand["graph"]))
    try:
        result = _verify(graph, program, config.delta, config.verify_rounds)
    except NotVerifiableError:
        return cand["hash"], None, "not_verifiable"
    return cand["hash"], str(result), "passed" if result.passed else "verification"


def _unit_key(unit: tuple[int, int, CustomChoice]) -> str:
    return f"{unit[0]}|{unit[1]}|{unit[2].key()}"


def _verify(graph, program, delta, rounds):
    from mugraph.search.verify import verify

    return verify(graph, program, delta=delta, max_rounds=rounds)


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
    **overrides,
) -> SearchResult:
    """Search μGraphs equivalent to ``program``; every candidate returned is verified.

    The search ends when every unit is done, the time budget is spent, Ctrl-C is pressed
    (what was found is kept; with ``checkpoint`` a later call resumes), or — with
    ``target_cost`` (seconds) — once a verified candidate is estimated at most that cost."""
    program.check()
    from mugraph.search.verify import check_verifiable

    check_verifiable(program)
    cfg = config or default_config(program, preset)
    if time_limit is not None:
        overrides["time_limit"] = time_limit
    if workers is not None:
        overrides["workers"] = workers
    cfg = cfg.with_overrides(**overrides) if overrides else cfg
    report = _progress_printer(progress)
    started = time.monotonic()
    deadline = started + cfg.time_limit
    enumeration_deadline = started + cfg.time_limit * ENUMERATION_SHARE
    oracle = _OracleAdapter(program_terms(program)) if cfg.abstract_pruning else None
    try:
        units = plan_units(program, cfg, oracle, enumeration_deadline)
    except SearchTimeout:
        units = []
        warnings.warn("mugraph: the time budget ran out while planning the search", stacklevel=2)
    done, saved = _load_checkpoint(checkpoint, program, cfg)
    todo = [u for u in units if _unit_key(u) not in done]
    result = SearchResult(
        program, [], Stats(), cfg, units_total=len(units), units_done=len(units) - len(todo)
    )
    pool = _CandidatePool(cfg, {c["hash"]: c for c in saved})
    try:
        for key, cands, stats, timed_out in _execute(
            todo, program, cfg, oracle, enumeration_deadline, cost
        ):
            result.stats.merge(stats)
            pool.add(cands)
            if timed_out:
                result.timed_out = True
            else:
                done.add(key)
                result.units_done += 1
            if report:
                report(_progress_line(result, pool, started, cfg))
            if target_cost is not None and pool.reach_target(program, target_cost, result.stats):
                result.reached_target = True
                break
    except KeyboardInterrupt:
        result.interrupted = True
    # units the pool never started because the deadline passed also mean the budget ran out
    if not (result.interrupted or result.reached_target) and result.units_done < len(units):
        result.timed_out = result.timed_out or time.monotonic() > enumeration_deadline
    if not result.interrupted:
        try:
            pool.verify_wanted(program, oracle, cost, deadline, result.stats)
        except KeyboardInterrupt:
            result.interrupted = True
    result.elapsed = time.monotonic() - started
    _save_checkpoint(checkpoint, program, cfg, done, pool.entries)
    result.candidates = [
        Candidate(from_json(json.dumps(c["graph"])), c["cost"], c["hash"], c["verification"])
        for c in pool.verified()
    ]
    result.unverified = pool.unverified_count()
    if report:
        report(result.summary())
    return result


# ---- lazy verification -------------------------------------------------------------------------

ENUMERATION_SHARE = 0.8  # of the budget, when the enumeration cannot finish sooner


class _CandidatePool:
    """Complete graphs of a search by hash, each unverified, verified (its verification
    text) or failed; which ones to verify next (the best ``keep`` by estimate and the best of
    each structure), verified in parallel."""

    def __init__(self, cfg: SearchConfig, saved: dict[str, dict]) -> None:
        self.cfg = cfg
        self.entries: dict[str, dict] = dict(saved)

    def add(self, cands: list[dict]) -> None:
        for c in cands:
            self.entries.setdefault(c["hash"], c)

    def ranked(self) -> list[dict]:
        return sorted(self.entries.values(), key=lambda c: (c["cost"], c["hash"]))

    def verified(self) -> list[dict]:
        return [c for c in self.ranked() if c.get("verification") and not c.get("failed")]

    def unverified_count(self) -> int:
        return sum(1 for c in self.entries.values() if not c.get("verification"))

    def wanted(self) -> list[dict]:
        """Unverified graphs among the best ``keep`` not known to fail, and the best
        ``keep_per_structure`` of each structure (the first ``max_structures`` structures by
        their best estimate)."""
        alive = [c for c in self.ranked() if not c.get("failed")]
        chosen = {c["hash"]: c for c in alive[: self.cfg.keep]}
        structures: dict[str, list[dict]] = {}
        for c in alive:
            if "structure" not in c:
                c["structure"] = _structure_of(c)
            best = structures.get(c["structure"])
            if best is None and len(structures) < self.cfg.max_structures:
                structures[c["structure"]] = [c]
            elif best is not None and len(best) < self.cfg.keep_per_structure:
                best.append(c)
        chosen.update((c["hash"], c) for group in structures.values() for c in group)
        return [c for c in chosen.values() if not c.get("verification")]

    def record(self, key: str, text: str | None, verdict: str, stats: Stats) -> None:
        entry = self.entries[key]
        entry["verification"] = text or verdict
        if verdict != "passed":
            entry["failed"] = True
            stats.pruned[verdict] += 1

    def verify_wanted(self, program, oracle, cost, deadline: float, stats: Stats) -> None:
        """Verify what :meth:`wanted` names, batch after batch, until nothing is wanted or
        the deadline passed (the first batch always runs: a search that found graphs
        returns a verified one)."""
        first = True
        while True:
            batch = self.wanted()
            if not batch or (not first and time.monotonic() > deadline):
                return
            first = False
            for key, text, verdict in _verify_all(batch, program, self.cfg, oracle, cost):
                self.record(key, text, verdict, stats)

    def reach_target(self, program, target: float, stats: Stats) -> bool:
        """Verify (here, in order) unverified graphs estimated at most ``target``; True once
        one passes."""
        for c in self.ranked():
            if c["cost"] > target:
                return False
            if c.get("failed"):
                continue
            if c.get("verification"):
                return True
            self.record(*_verify_one(c, program, self.cfg), stats)
            if not c.get("failed"):
                return True
        return False


def _structure_of(cand: dict) -> str:
    return structure_key(from_json(json.dumps(cand["graph"])))


def _verify_all(batch: list[dict], program, cfg: SearchConfig, oracle, cost):
    """(hash, text, verdict) of each graph of ``batch``, verified over the local cores."""
    count = min(cfg.worker_count, len(batch))
    if count == 1 or "fork" not in multiprocessing.get_all_start_methods():
        _init_worker(program, cfg, oracle, float("inf"), cost)
        return [_verify_one(c) for c in batch]
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(
        count, initializer=_init_worker, initargs=(program, cfg, oracle, float("inf"), cost)
    ) as pool:
        try:
            return list(pool.imap(_verify_one, batch, chunksize=1))
        finally:
            pool.terminate()


def plan_units(
    program, cfg: SearchConfig, oracle, deadline: float | None = None
) -> list[tuple[int, int, CustomChoice]]:
    """The work units: (custom kernels, block-operator cap, first custom kernel's schedule).

    Iterative deepening: graphs of one custom kernel come first, then two...; within a
    kernel count the cap on block operators grows from ``cfg.min_block_ops`` (with
    ``cfg.deepening``) so small μGraphs are found first; within a cap, schedules go
    cheapest-traffic first. A unit of n kernels enumerates graphs of exactly n kernels."""
    probe = Enumerator(program, cfg, oracle, deadline)
    tensors = probe.initial_tensors()
    n_inputs = len(tensors)
    low = min(cfg.min_block_ops, cfg.max_block_ops)
    caps = list(range(low, cfg.max_block_ops + 1)) if cfg.deepening else [cfg.max_block_ops]
    units = []
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
        units += [(kernels, cap, c) for cap in caps for c in choices]
    return units


def _execute(units, program, cfg, oracle, deadline, cost):
    """Yield each unit's results, in unit order, from a pool of forked workers (or inline)."""
    count = min(cfg.worker_count, max(1, len(units)))
    if count == 1 or "fork" not in multiprocessing.get_all_start_methods():
        _init_worker(program, cfg, oracle, deadline, cost)
        for unit in units:
            if time.monotonic() > deadline:
                return
            yield _run_unit(unit)
        return
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(
        count, initializer=_init_worker, initargs=(program, cfg, oracle, deadline, cost)
    ) as pool:
        try:
            for outcome in pool.imap(_run_unit, units, chunksize=1):
                yield outcome
                if time.monotonic() > deadline:
                    break
        finally:
            pool.terminate()


# ---- the final verification: its rounds over the local cores ----------------------------------

_PAIR: dict[str, Any] = {}


def _init_pair(candidate, program, delta) -> None:
    _PAIR.update(candidate=candidate, program=program, delta=delta)


def _verify_chunk(task: tuple[int, int]):
    from mugraph.search.verify import verify

    rounds, seed = task
    return verify(
        _PAIR["candidate"], _PAIR["program"], _PAIR["delta"], max_rounds=rounds, seed=seed
    )


def verify_in_parallel(candidate, program, delta: float = 1e-9, *, max_rounds: int = 64,
                       workers: int | None = None):
    """:func:`mugraph.verify` with its rounds spread over ``workers`` forked processes, each
    drawing its own random points (independent seeds): the same plan (rounds, bound) as one
    process running them all, in a fraction of the time. A failure in any process fails."""
    from mugraph.search.verify import analyse, difference, plan_rounds, verify

    pair = difference(analyse(candidate), analyse(program))
    rounds, bound, guarantee = plan_rounds(pair, delta, max_rounds)
    count = min(workers or os.cpu_count() or 1, rounds)
    if count <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return verify(candidate, program, delta, max_rounds=max_rounds)
    chunks = [rounds // count + (1 if i < rounds % count else 0) for i in range(count)]
    seeds = [int(s.generate_state(1)[0]) for s in np.random.SeedSequence().spawn(count)]
    started = time.perf_counter()
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(count, initializer=_init_pair, initargs=(candidate, program, delta)) as pool:
        try:
            parts = pool.map(_verify_chunk, list(zip(chunks, seeds, strict=True)), chunksize=1)
        finally:
            pool.terminate()
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


def _progress_line(result: SearchResult, pool, started: float, cfg: SearchConfig) -> str:
    best = min((c["cost"] for c in pool.entries.values()), default=None)
    best_text = f"{best * 1e6:.2f} us" if best is not None else "-"
    top = ", ".join(f"{k} {v}" for k, v in result.stats.pruned.most_common(3))
    return (
        f"[{time.monotonic() - started:6.1f}/{cfg.time_limit:.0f} s] units {result.units_done}/"
        f"{result.units_total}  states {result.stats.states}  pruned: {top}  "
        f"complete graphs {len(pool.entries)}  best {best_text} (est., unverified)"
    )


def _progress_printer(progress) -> Callable[[str], None] | None:
    if callable(progress):
        return progress
    if progress:
        return lambda line: print(line, file=sys.stderr, flush=True)
    return None


# ---- checkpoints: interrupt now, resume later --------------------------------------------------


def _checkpoint_key(program, cfg: SearchConfig) -> str:
    """The program and the search space (not the budget or the worker count)."""
    fields = {}
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


def _load_checkpoint(path, program, cfg) -> tuple[set[str], list[dict]]:
    if path is None or not Path(path).exists():
        return set(), []
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        warnings.warn(f"mugraph: ignoring unreadable search checkpoint {path}", stacklevel=3)
        return set(), []
    if data.get("key") != _checkpoint_key(program, cfg):
        return set(), []
    return set(data.get("done", [])), list(data.get("found", []))


def _save_checkpoint(path, program, cfg, done: set[str], found: dict) -> None:
    if path is None:
        return
    data = {
        "key": _checkpoint_key(program, cfg),
        "done": sorted(done),
        "found": list(found.values()),
    }
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


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
