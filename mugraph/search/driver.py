"""Running a search: work units over all local cores, verification, ranking, progress, time
budget, Ctrl-C and resume. ``superoptimize`` is the entry point.

The units are the first custom kernel's schedules (inputs, grid, for-loop), in a fixed order;
each unit is enumerated to completion (or to the deadline) by one worker, which verifies the
complete candidates it finds. Results are merged, deduplicated by structural hash and sorted
by (cost, hash), so the answer does not depend on the number of workers — as long as no unit
is cut short by the time budget.
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
            "verification": str(self.verification),
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
            f"{self.stats.candidates} candidates, {len(self.candidates)} verified, best {best}, "
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
    _WORKER.update(program=program, config=config, oracle=oracle, deadline=deadline, cost=cost_fn,
                   rounds=None)


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
        try:
            result = _verify(graph, config.delta, config.verify_rounds)
        except NotVerifiableError:
            gen.stats.pruned["not_verifiable"] += 1
            return
        if not result.passed:
            gen.stats.pruned["verification"] += 1
            return
        found[key] = Candidate(graph, _WORKER["cost"](graph), key, result).to_dict()

    timed_out = False
    try:
        gen.run(visit, first=choice)
    except SearchTimeout:
        timed_out = True
    return _unit_key(unit), list(found.values()), gen.stats, timed_out


def _unit_key(unit: tuple[int, int, CustomChoice]) -> str:
    return f"{unit[0]}|{unit[1]}|{unit[2].key()}"


def _verify(graph, delta, rounds):
    """The candidate against this worker's program, on rounds whose program side is kept
    from one candidate to the next (:class:`~mugraph.search.verify.ProgramRounds`)."""
    from mugraph.search.verify import ProgramRounds

    rounds_of = _WORKER.get("rounds")
    if rounds_of is None or rounds_of.program is not _WORKER["program"]:
        rounds_of = _WORKER["rounds"] = ProgramRounds(_WORKER["program"], max_bytes=_ROUND_BYTES)
    return rounds_of.verify(graph, delta, max_rounds=rounds)


_ROUND_BYTES = 1 << 30  # memory a worker keeps for the program's side of its rounds


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
    oracle = _OracleAdapter(program_terms(program)) if cfg.abstract_pruning else None
    try:
        units = plan_units(program, cfg, oracle, deadline)
    except SearchTimeout:
        units = []
        warnings.warn("mugraph: the time budget ran out while planning the search", stacklevel=2)
    done, saved = _load_checkpoint(checkpoint, program, cfg)
    todo = [u for u in units if _unit_key(u) not in done]
    result = SearchResult(
        program, [], Stats(), cfg, units_total=len(units), units_done=len(units) - len(todo)
    )
    found: dict[str, dict] = {c["hash"]: c for c in saved}
    try:
        for key, cands, stats, timed_out in _execute(todo, program, cfg, oracle, deadline, cost):
            result.stats.merge(stats)
            for c in cands:
                found.setdefault(c["hash"], c)
            if timed_out:
                result.timed_out = True
            else:
                done.add(key)
                result.units_done += 1
            if report:
                report(_progress_line(result, found, started, cfg))
            if target_cost is not None and any(c["cost"] <= target_cost for c in found.values()):
                result.reached_target = True
                break
    except KeyboardInterrupt:
        result.interrupted = True
    result.elapsed = time.monotonic() - started
    # units the pool never started because the deadline passed also mean the budget ran out
    if not (result.interrupted or result.reached_target) and result.units_done < len(units):
        result.timed_out = result.timed_out or time.monotonic() > deadline
    _save_checkpoint(checkpoint, program, cfg, done, found)
    ranked = sorted(found.values(), key=lambda c: (c["cost"], c["hash"]))
    result.candidates = [
        Candidate(from_json(json.dumps(c["graph"])), c["cost"], c["hash"], c["verification"])
        for c in ranked
    ]
    if report:
        report(result.summary())
    return result


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
        choices = [
            c
            for c in probe.custom_choices(
                tensors, last=last, partial=not last and cfg.split_before_boundary
            )
            if not last or set(c.inputs) == set(range(n_inputs))
        ]
        choices.sort(key=lambda c: (probe.choice_traffic(c, tensors), c.key()))
        units += [(kernels, cap, c) for cap in caps for c in choices]
    return units


def _execute(units, program, cfg, oracle, deadline, cost):
    """Yield each unit's results, in unit order, from a pool of forked workers (or inline)."""
    count = min(cfg.worker_count, max(1, len(units)))
    if count == 1 or "fork" not in multiprocessing.get_all_start_methods():
        _init_worker(program, cfg, oracle, deadline, cost)
        try:
            for unit in units:
                if time.monotonic() > deadline:
                    return
                yield _run_unit(unit)
        finally:
            _WORKER["rounds"] = None  # the kept rounds' memory
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


def _progress_line(result: SearchResult, found: dict, started: float, cfg: SearchConfig) -> str:
    best = min((c["cost"] for c in found.values()), default=None)
    best_text = f"{best * 1e6:.2f} us" if best is not None else "-"
    top = ", ".join(f"{k} {v}" for k, v in result.stats.pruned.most_common(3))
    return (
        f"[{time.monotonic() - started:6.1f}/{cfg.time_limit:.0f} s] units {result.units_done}/"
        f"{result.units_total}  states {result.stats.states}  pruned: {top}  "
        f"verified {len(found)}  best {best_text}"
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
