"""Algorithm 1: grow kernel graphs and their block graphs one operator at a time.

Every prefix is kept only if it is valid (shapes, maps, phases, shared memory — the builder's
own rules), in canonical form (operators in increasing rank, §4.1), index-consistent (its
imaps / forloop dims split one index in every input, see :mod:`mugraph.semantics.labels`) and
its abstract expression is a subexpression of the program's (§4.3). Complete graphs whose
output expression is equivalent to the program's are handed to the caller for verification.

The generator is pure enumeration; :mod:`mugraph.search.driver` runs it in parallel, verifies,
ranks and reports progress.
"""

from __future__ import annotations

import functools
import itertools
import math
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from mugraph.dtypes import DType
from mugraph.errors import MugraphError
from mugraph.ir.builder import customized_output_types
from mugraph.ir.graph import BlockGraph, Op, freeze_attrs
from mugraph.ir.ops import AccumKind, Group, Level, OpKind
from mugraph.ir.phase import Phase, combine_phases
from mugraph.ir.shapes import ShapeContext, infer_output_types
from mugraph.ir.tensor import TensorRef, TensorType
from mugraph.search.config import SearchConfig
from mugraph.search.memo import LocalMemo, SharedMemo
from mugraph.semantics import labels as lab
from mugraph.semantics.abstract import ABSTRACT_SEMANTICS, Term, var

_KIND_ORDER = {kind: i for i, kind in enumerate(OpKind)}
_ANY_DTYPE = DType.float16

# Why a prefix or a choice is dropped: each entry states the law that makes dropping it safe
# (or, for the heuristics, what it gives up). Statistics count prunes under these names.
PRUNING_RULES: dict[str, str] = {
    "canonical_form": "operators are added in increasing rank (§4.1); every graph has exactly "
    "one canonical order, so nothing is lost",
    "abstract_expression": "the prefix's abstract expression is not a subexpression of the "
    "program's under A_eq ∪ A_sub (§4.3, Theorem 1)",
    "index_labels": "an operator combines different indices of equal size (a row index with a "
    "column index); heuristic: such graphs only pass verification by accident of symmetry",
    "phase": "a value from inside the for-loop meets one computed after it (invalid μGraph)",
    "self_operand": "x+x, x-x, x/x and x@x are 2x, 0, 1 or a square that a cheaper operator "
    "(or none) computes; x*x is kept (square). Such operand pairs are never listed "
    "(block_candidates pairs the newest tensor with older ones), so nothing counts here",
    "shape": "the operands' shapes do not fit the operator (invalid μGraph)",
    "shared_memory": "the block's tensors would exceed the GPU's shared memory (invalid)",
    "too_many_leaves": "more unused values than the remaining operators can consume and the "
    "outputs can save",
    "unused_tensor": "the last kernel must consume every value not yet used, or it is dead",
    "split_before_boundary": "search-space restriction: a kernel followed by another splits "
    "a reduced index over its grid (partial results); otherwise one kernel could do both",
    "abstract_equivalence": "a complete graph whose output is decided not A_eq-equal to the "
    "program's (Theorem 1 covers only A_eq-equal graphs)",
    "abstract_error": "the abstraction rejects the operator (e.g. a sum_todimx that does not "
    "divide)",
    "memo_replay": "not a loss: the continuations of a kernel-graph prefix whose tensors equal "
    "an earlier prefix's were replayed from the memo instead of enumerated again",
    "memo_shared": "not a loss: continuations replayed from an entry another worker of the "
    "search computed (mugraph.search.memo); also counted under memo_replay",
    "memo_waits": "not a loss: times a worker waited for a continuation another worker was "
    "computing (memo_wait_ms: the milliseconds, summed over workers)",
    "memo_wait_ms": "not a loss: see memo_waits",
    "memo_hand_backs": "not a loss: times a worker handed the rest of its work item back "
    "instead of waiting for a continuation another worker was computing",
    "memo_io_ms": "not a loss: milliseconds spent reading and writing shared continuations, "
    "summed over workers",
    "kept_shared": "not a loss: products of a verification round's memory read from "
    "another worker of the search instead of computed (mugraph.search.memo.SharedArrays)",
    "kept_io_ms": "not a loss: milliseconds spent reading and writing those shared arrays, "
    "summed over workers",
    "invalid_graph": "the complete graph failed the builder's checks (counted, never returned)",
    "not_verifiable": "the complete graph is outside what the verifier decides (two "
    "exponentials on one path, reachable without abstract pruning); never returned",
    "verification": "the complete graph is not equivalent to the program (finite-field test)",
}


# Continuations of kernel-graph prefixes, shared by every unit a worker process runs (the key
# holds everything they depend on, including the program's tensors and the search caps).
_WORKER_MEMO: dict = {}


def _memo_scope(program, config: SearchConfig) -> tuple:
    """What continuations depend on besides the prefix: the program and the search space."""
    fields = []
    for name, value in sorted(vars(config).items()):
        if name in ("time_limit", "workers", "extra", "max_block_ops"):
            continue
        if isinstance(value, frozenset):
            value = tuple(sorted(str(v) for v in value))
        fields.append((name, str(value)))
    return (program.structural_hash(), tuple(fields))


class SearchTimeout(Exception):
    """Raised inside the enumeration when the time budget is spent."""


class HandBack(Exception):
    """Raised inside the enumeration when a work item stops early to hand the rest of its
    region back (``Trail.rest``), so that idle workers can take it."""


# A region's last entry ``v - VISIT_OFFSET`` (negative) resumes a node at visit ``v``; two
# such entries ``v - VISIT_OFFSET, w - VISIT_OFFSET`` are the node's visits ``v`` to ``w - 1``.
VISIT_OFFSET = 1 << 40


# Which children a region's indices number (see Trail): changed when block_candidates lists
# other operators (2: those the abstract expression rejects are no longer listed). A search's
# checkpoint holds regions, so it is resumed only under the numbering it was written with.
REGION_NUMBERING = 2


@dataclass
class Trail:
    """A work item's place in the first custom kernel's block-graph DFS.

    A *region* names part of a unit's tree: ``()`` is the whole unit; ``(i0, ..., ik)`` is the
    subtrees of children ``ik, ik + 1, ...`` (to the last) of the node reached by taking child
    ``i0`` at the root, ``i1`` below it, and so on (children in the order
    ``Generator.block_candidates`` lists them). A region whose last entry is negative,
    ``(i0, ..., ik, v - VISIT_OFFSET)``, is the node reached by ``(i0, ..., ik)`` itself from
    the ``v``-th complete graph its closing visits (in the order a walk visits them), then its
    children's subtrees; ``(i0, ..., ik, v - VISIT_OFFSET, w - VISIT_OFFSET)`` is that node's
    visits ``v`` to ``w - 1`` alone (a *visit range*). Regions sort in DFS order, so an item's
    results come before those of the regions it hands back. ``due`` says when to stop: it is
    asked before each child once the item has finished some work, and between two graphs a
    node's closing visits; the rest of the item (the rest of the node, the remaining children
    at every level of the current path) then goes to ``rest``. The rest of a node's visits goes
    back in two halves (a visit range, then the rest), so that a node with many graphs to
    verify is shared by several workers instead of passing from one to the next.
    """

    region: tuple[int, ...] = ()
    due: Callable[[], bool] | None = None
    stack: list[int] = field(default_factory=list)  # child taken at each depth
    sizes: list[int] = field(default_factory=list)  # children of the node at each depth
    rest: list[tuple[int, ...]] = field(default_factory=list)
    progressed: bool = False
    # the item stopped because a continuation it needs was being computed by another worker
    # (its rest is best taken after other work); else because idle workers wanted work
    blocked: bool = False
    # the statistics as they were when the walk entered its current node (see stop_blocked)
    entered: tuple | None = None

    @property
    def visit_range(self) -> bool:
        """Whether the region is a node's visit range (its last two entries are visits)."""
        return len(self.region) >= 2 and self.region[-2] < 0

    @property
    def path(self) -> tuple[int, ...]:
        """The children taken from the root down to the node the region starts under (a
        node-resuming region or visit range: to the node itself)."""
        return self.region[: -2 if self.visit_range else -1]

    @property
    def base(self) -> int:
        """The depth of the node whose children this item explores."""
        return len(self.path) if self.region else 0

    @property
    def resumes_at(self) -> int | None:
        """The visit a node-resuming region starts at (None for other regions)."""
        if self.region and self.region[-1] < 0:
            return self.region[-2 if self.visit_range else -1] + VISIT_OFFSET
        return None

    @property
    def visits_end(self) -> int | None:
        """The visit a visit range ends before (None for other regions)."""
        return self.region[-1] + VISIT_OFFSET if self.visit_range else None

    def stop_visit(self, index: int, end: int) -> bool:
        """Whether to stop before the ``index``-th graph the current node's closing visits
        (of ``end``); if so, ``rest`` is the rest of the node (from that graph, in two halves
        when there are several), then, unless the item is a visit range, the node's later
        siblings and those of every node above it, down to this item's base."""
        if self.due is None or not self.due():
            return False
        node = tuple(self.stack)
        mid = index + (end - index + 1) // 2
        halves = [(*node, index - VISIT_OFFSET, mid - VISIT_OFFSET)] if end - index > 1 else []
        if self.visit_range:
            first = index if not halves else mid
            self.rest = [*halves, (*node, first - VISIT_OFFSET, end - VISIT_OFFSET)]
            return True
        self._rest_after((*node, (mid if halves else index) - VISIT_OFFSET), len(node) - 1)
        self.rest[:0] = halves
        return True

    def stop_here(self, depth: int, index: int) -> bool:
        """Whether to stop before child ``index`` of the node at ``depth``; if so, ``rest``
        holds the regions left to explore."""
        if self.due is None or not self.progressed or not self.due():
            return False
        self._rest_after((*self.stack[:depth], index), depth - 1)
        return True

    def enter(self, stats: Stats) -> None:
        """The walk enters a node that closes a kernel: remember the statistics, for
        :meth:`stop_blocked`."""
        self.entered = (stats.states, stats.block_graphs, stats.candidates, dict(stats.pruned))

    def stop_blocked(self, stats: Stats) -> bool:
        """Whether to stop at the node the walk is at, before anything of it was visited
        (its continuations are being computed elsewhere): the item must have finished some
        work (so its rest is smaller than it) and be one that may hand work back. If so, the
        node goes back whole, and ``stats`` forget what was counted since the walk entered
        it (whoever takes the rest counts it), so the totals equal an undivided search's."""
        depth = len(self.stack) - 1  # the node's parent; the node is its child stack[depth]
        if self.due is None or not self.progressed or depth < self.base or not self.entered:
            return False
        self._rest_after(tuple(self.stack[: depth + 1]), depth - 1)
        self.blocked = True
        stats.states, stats.block_graphs, stats.candidates, pruned = self.entered
        stats.pruned.clear()
        stats.pruned.update(pruned)
        return True

    def _rest_after(self, first: tuple[int, ...], depth: int) -> None:
        """``rest``: the region ``first``, then the later siblings of the path's nodes at
        ``depth`` and above, down to this item's base."""
        self.rest = [first]
        for d in range(depth, self.base - 1, -1):
            if self.stack[d] + 1 < self.sizes[d]:
                self.rest.append((*self.stack[:d], self.stack[d] + 1))


@dataclass
class Tensor:
    """A tensor of a prefix: its type, index labels, abstract expression and uses."""

    ref: TensorRef
    type: TensorType
    labels: lab.Labels
    expr: Term
    phase: Phase = Phase.INVARIANT
    uses: int = 0


@dataclass(frozen=True)
class Grid:
    """A custom kernel's schedule: which index each grid axis and the for-loop split."""

    axes: tuple[tuple[str, int], ...]  # (atom, size) for x, y, z in order
    loop: tuple[str, int] | None  # (atom, forloop_range)

    @property
    def grid_dim(self) -> tuple[int, int, int]:
        sizes = [g for _, g in self.axes]
        return tuple(sizes + [1] * (3 - len(sizes)))  # type: ignore[return-value]

    @property
    def forloop_range(self) -> int:
        return self.loop[1] if self.loop else 1


@dataclass(frozen=True)
class BlockLimits:
    """What closing a block graph requires: input iterators (all must be used) and the most
    outputs it may save."""

    n_inputs: int
    max_outputs: int
    max_ops: int  # block operators the graph may still hold (max_block_ops, max_total_block_ops)


@dataclass
class Stats:
    states: int = 0
    block_graphs: int = 0
    candidates: int = 0
    pruned: Counter = field(default_factory=Counter)
    # milliseconds spent on named parts of the work, summed over workers ("verify": checking
    # complete candidates against the program)
    timers: Counter = field(default_factory=Counter)

    def merge(self, other: Stats) -> None:
        self.states += other.states
        self.block_graphs += other.block_graphs
        self.candidates += other.candidates
        self.pruned.update(other.pruned)
        self.timers.update(other.timers)


@dataclass(frozen=True)
class CustomChoice:
    """The first decision of a custom kernel: its inputs and schedule (a unit of work)."""

    inputs: tuple[int, ...]  # positions in the kernel state's tensor list
    grid: Grid
    imaps: tuple[tuple[int, int, int], ...]
    fdims: tuple[int, ...]

    def key(self) -> str:
        return f"{self.inputs}|{self.grid.axes}|{self.grid.loop}|{self.imaps}|{self.fdims}"


class Oracle:
    """What the generator asks about abstract expressions (see mugraph.search.oracle)."""

    def is_subexpr(self, term: Term) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    def is_equivalent(self, term: Term, output: int) -> bool:  # pragma: no cover - interface
        raise NotImplementedError


class Generator:
    """Enumerates μGraphs for ``program`` under ``config``; yields complete kernel graphs."""

    def __init__(
        self,
        program,
        config: SearchConfig,
        oracle: Oracle | None,
        deadline: float | None = None,
        shared_memo: str | None = None,
    ) -> None:
        """``shared_memo``: a directory where the workers of one search on this machine share
        the continuations of kernel-graph prefixes (:mod:`mugraph.search.memo`)."""
        self.program = program
        self.config = config
        self.oracle = oracle if config.abstract_pruning else None
        self.deadline = deadline
        self.stats = Stats()
        self.input_labels, self.output_labels = lab.program_labels(program)
        self.output_atoms = {lab.outer_atom(x) for labels in self.output_labels for x in labels} - {
            None
        }
        # batch indices: in the output and in every input (attention's heads)
        self.batch_atoms = set(self.output_atoms)
        for labels in self.input_labels:
            self.batch_atoms &= {lab.outer_atom(x) for x in labels}
        self.atom_extents: dict[str, int] = {}  # whole extent of each index of the inputs
        for labels in self.input_labels:
            for lbl in labels:
                if lbl:
                    atom, size = lbl[0]
                    self.atom_extents[atom] = max(self.atom_extents.get(atom, 0), size)
        self.target_types = program.output_types
        self.smem_budget = program.gpu.shared_memory_per_block
        self._subexpr_cache: dict[Term, bool] = {}
        self._checked = _checked_table(self.oracle)  # see _checked_expression
        # Parameters of the program's own parametrised unary operators (mul_scalar's scalar,
        # clamp's bounds, pow's exponent, rms_norm's shape and epsilon): the only values the
        # search tries.
        self._unary_variants: dict[OpKind, tuple[dict, ...]] = {}
        for op in program.ops:
            if op.kind in _UNARY_KINDS and op.attrs:
                known = self._unary_variants.setdefault(op.kind, ())
                if op.attr_dict not in known:
                    self._unary_variants[op.kind] = known + (op.attr_dict,)
        # The epsilons of the program's rms_norm operators: the rms accumulator tries each.
        self._rms_eps: tuple[float, ...] = tuple(
            sorted({float(op.attr("eps", 0.0)) for op in program.ops if op.kind is OpKind.RMS_NORM})
        ) or (0.0,)
        self._trail: Trail | None = None  # the work item's place (Enumerator.run)
        self._recording = 0  # continuations being recorded around the current walk
        # a node being resumed: (its first visit, the statistics to count in from there)
        self._resume: tuple[int, Stats] | None = None
        scope = _memo_scope(program, config)
        table = _WORKER_MEMO.setdefault(scope, {})
        self.memo = SharedMemo(table, shared_memo, scope) if shared_memo else LocalMemo(table)

    # ---- kernel level ------------------------------------------------------------------------

    def initial_tensors(self) -> list[Tensor]:
        out = []
        for i, op in enumerate(self.program.input_ops):
            out.append(Tensor(TensorRef(i, 0), op.outputs[0], self.input_labels[i], var(f"in{i}")))
        return out

    def initial_ops(self) -> list[Op]:
        return list(self.program.input_ops)

    def custom_choices(
        self,
        tensors: list[Tensor],
        last: bool = False,
        partial: bool = False,
        required: frozenset[int] = frozenset(),
    ) -> Iterator[CustomChoice]:
        """Input sets, grids, for-loops and the maps they imply, in a fixed order.

        The ``last`` kernel of a graph splits only indices of the program's output over its
        grid: splitting any other index leaves partial results no later kernel combines. A
        kernel that must leave ``partial`` results for a later one splits at least one index
        that is not an output index (split_before_boundary). Input sets always contain
        ``required`` (the last kernel must consume every tensor not used yet)."""
        cfg = self.config
        needed = sorted(required)
        others = [
            i for i in range(len(tensors)) if i not in required and self._may_read(tensors, i)
        ]
        for count in range(max(1, len(needed)), min(cfg.max_kernel_inputs, len(tensors)) + 1):
            for extra in itertools.combinations(others, count - len(needed)):
                inputs = tuple(sorted((*needed, *extra)))
                yield from self._schedules([tensors[i] for i in inputs], inputs, last, partial)

    def _may_read(self, tensors: list[Tensor], i: int) -> bool:
        """A program input an earlier kernel read already is read again only when it has at
        most max_reread_bytes (re-reading a large one doubles its traffic)."""
        limit = self.config.max_reread_bytes
        n_inputs = len(self.input_labels)
        return (
            limit is None or i >= n_inputs or tensors[i].uses == 0
            or tensors[i].type.num_bytes <= limit
        )

    def _schedules(
        self,
        ins: list[Tensor],
        positions: tuple[int, ...],
        last: bool = False,
        partial: bool = False,
    ) -> Iterator[CustomChoice]:
        cfg = self.config
        atoms = sorted({lab.outer_atom(lbl) for t in ins for lbl in t.labels if lbl} - {None})
        if last and cfg.label_pruning:
            atoms = [a for a in atoms if a in self.output_atoms]
        sizes = {a: _atom_size(ins, a) for a in atoms}
        axis_options = [(a, g) for a in atoms for g in self._grid_splits(a, sizes[a])]
        grids = []
        for n_axes in range(0, cfg.max_grid_axes + 1):
            self.check_time()
            for axes in itertools.combinations(axis_options, n_axes):
                if len({a for a, _ in axes}) != n_axes:
                    continue
                if partial and all(a in self.output_atoms for a, _ in axes):
                    continue
                blocks = math.prod(g for _, g in axes)
                if blocks > cfg.max_blocks:
                    continue
                split = [_split_labels(t.labels, axes) for t in ins]
                if any(s is None for s in split):
                    continue
                grid_dim = Grid(tuple(axes), None).grid_dim
                if cfg.griddims is not None and grid_dim not in cfg.griddims:
                    continue
                grids.append((axes, blocks, split, list(self._loops(split))))
        # at least min_blocks blocks, or a quarter of as many as these inputs' indices allow
        # in grids that leave a for-loop (accumulators need one; any grid when none does):
        # small programs cannot fill the GPU, and their best grid may leave some index whole
        looping = [b for _, b, _, loops in grids if len(loops) > 1]
        reach = max(looping or [b for _, b, _, _ in grids] or [1])
        fewest = min(cfg.min_blocks, max(1, reach // 4))
        for axes, blocks, _, loops in grids:
            if blocks < fewest:
                continue
            for loop in loops:
                choice = self._maps(ins, positions, Grid(tuple(axes), loop))
                if choice is not None and self._maps_allowed(choice):
                    yield choice

    def _grid_splits(self, atom: str, extent: int) -> list[int]:
        """The part counts a grid axis may cut index ``atom`` (of ``extent``) into: by the
        shape rules of the config (grid_tiles, partial_splits) where it sets them, else the
        grid sizes that leave at least min_tile per block (or split a small index
        completely)."""
        cfg = self.config
        if cfg.griddims is not None:
            sizes = sorted({g for dims in cfg.griddims for g in dims if g > 1})
            return [g for g in sizes if self._split_ok(extent, g)]
        reduced = atom not in self.output_atoms and not lab.is_partial_atom(atom)
        if reduced and self.atom_extents.get(atom, 0) < cfg.split_min_extent:
            return []
        if reduced and cfg.partial_splits is not None:
            return [
                g for g in cfg.partial_splits
                if g >= 2 and extent % g == 0 and extent // g >= cfg.min_tile
            ]
        if not reduced and cfg.grid_tiles is not None:
            out = {extent // t for t in cfg.grid_tiles if extent % t == 0 and extent // t >= 2}
            untiled = not any(extent % t == 0 for t in cfg.grid_tiles)
            if (atom in self.batch_atoms or untiled) and 2 <= extent <= cfg.max_full_split:
                # one head (batch element) per block; or one row per block, for rows no
                # tile divides (71 query heads on one KV head, 8 rows per KV group)
                out.add(extent)
            return sorted(out)
        return [g for g in sorted(cfg.grid_sizes or ()) if self._split_ok(extent, g)]

    def _loops(self, split: list) -> Iterator[tuple[str, int] | None]:
        """For-loop choices: an index and a range leaving tiles of at least min_tile (of a
        loop_tiles extent, where the config sets them) — or, for partial results side by
        side (an index that is the outer factor of a compound dim), one iteration per
        partial, which combines them. No loop unless the config requires one."""
        cfg = self.config
        if not cfg.loop_required:
            yield None
        atoms = sorted({lab.outer_atom(lbl) for labels in split for lbl in labels if lbl} - {None})
        for atom in atoms:
            partials = lab.is_partial_atom(atom)
            if cfg.loop_reduced_only and atom in self.output_atoms and not partials:
                continue
            reduced = atom not in self.output_atoms and not partials
            if reduced and self.atom_extents.get(atom, 0) < cfg.split_min_extent:
                continue
            factors = [lbl for labels in split for lbl in labels if lbl and lbl[0][0] == atom]
            size = min(lbl[0][1] for lbl in factors)
            for f in cfg.forloop_ranges or ():
                if f < 2 or size % f:
                    continue
                if partials and f == size:
                    yield (atom, f)
                elif cfg.loop_tiles is not None:
                    if size // f in cfg.loop_tiles:
                        yield (atom, f)
                elif size // f >= cfg.min_tile:
                    yield (atom, f)

    def _maps_allowed(self, choice: CustomChoice) -> bool:
        cfg = self.config
        if cfg.imaps is not None and any(m not in cfg.imaps for m in choice.imaps):
            return False
        return cfg.fmaps is None or all(f in cfg.fmaps for f in choice.fdims)

    def _split_ok(self, extent: int, parts: int) -> bool:
        """May an index of ``extent`` be cut into ``parts`` (grid axis or for-loop)?"""
        if parts < 2 or extent % parts:
            return False
        cfg = self.config
        return extent // parts >= cfg.min_tile or (parts == extent and extent <= cfg.max_full_split)

    def _maps(self, ins: list[Tensor], positions, grid: Grid) -> CustomChoice | None:
        imaps, fdims = [], []
        for t in ins:
            imap = []
            for atom, _ in grid.axes:
                dims = [d for d, lbl in enumerate(t.labels) if lab.outer_atom(lbl) == atom]
                imap.append(dims[0] if dims else -1)
            imaps.append(tuple(imap + [-1] * (3 - len(imap))))
            fdim = -1
            if grid.loop:
                fdim = _loop_dim(_split_labels(t.labels, grid.axes), *grid.loop)
            fdims.append(fdim)
        if grid.loop and all(f < 0 for f in fdims):
            return None  # a loop that splits nothing only repeats work
        return CustomChoice(positions, grid, tuple(imaps), tuple(fdims))

    def choice_traffic(self, choice: CustomChoice, tensors: list[Tensor]) -> int:
        """Bytes the kernel's blocks load from device memory: a lower bound on its traffic,
        used to explore cheap schedules first."""
        from mugraph.ir import maps

        grid = choice.grid
        blocks = 1
        for _, g in grid.axes:
            blocks *= g
        total = 0
        for pos, imap, fdim in zip(choice.inputs, choice.imaps, choice.fdims, strict=True):
            src = tensors[pos]
            try:
                tile = maps.input_tile_dims(
                    "", src.type.dims, grid.grid_dim, imap, grid.forloop_range, fdim
                )
            except MugraphError:
                return 1 << 62
            elems = 1
            for d in tile:
                elems *= d
            total += (
                elems * src.type.dtype.itemsize * blocks * (grid.forloop_range if fdim >= 0 else 1)
            )
        return total

    def choice_seconds(self, choice: CustomChoice, tensors: list[Tensor]) -> float:
        """A rough time of the kernel's loads: its traffic at the bandwidth its blocks can
        draw (few blocks draw little), plus the latency of its loop; used to explore likely
        fast schedules first (cost-model constants, :mod:`mugraph.optimize.cost_model`)."""
        from mugraph.optimize.cost_model import DEFAULT_PARAMS as params

        gpu = self.program.gpu
        traffic = self.choice_traffic(choice, tensors)
        blocks = math.prod(g for _, g in choice.grid.axes)
        busiest = math.ceil(blocks / gpu.multiprocessors)
        sm_bandwidth = gpu.memory_bandwidth / gpu.multiprocessors * params.sm_burst
        memory = max(
            traffic / (gpu.memory_bandwidth * params.l2_bandwidth_ratio),
            traffic / blocks * busiest / sm_bandwidth,
        )
        return memory + busiest * choice.grid.forloop_range * params.iteration_latency

    # ---- block level -------------------------------------------------------------------------

    def block_inputs(
        self, choice: CustomChoice, tensors: list[Tensor]
    ) -> tuple[list[Op], list[Tensor]] | None:
        """The input iterators of a custom kernel; None when the tiles exceed shared memory."""
        from mugraph.ir import maps

        grid = choice.grid
        ops, btensors = [], []
        used = 0
        for i, (pos, imap, fdim) in enumerate(
            zip(choice.inputs, choice.imaps, choice.fdims, strict=True)
        ):
            src = tensors[pos]
            try:
                tile = maps.input_tile_dims(
                    "new_input", src.type.dims, grid.grid_dim, imap, grid.forloop_range, fdim
                )
            except MugraphError:
                return None
            labels = _split_labels(src.labels, grid.axes)
            if fdim >= 0 and labels is not None:
                labels = tuple(
                    lab.split_outer(lbl, grid.forloop_range) if d == fdim else lbl
                    for d, lbl in enumerate(labels)
                )
            ttype = TensorType(tile, src.type.dtype)
            used += ttype.num_bytes
            attrs = {"index": i, "imap": imap, "forloop_dim": fdim, "dtensor": src.type}
            ops.append(Op(OpKind.BLOCK_INPUT, (), freeze_attrs(attrs), (ttype,)))
            phase = Phase.LOOP if fdim >= 0 else Phase.INVARIANT
            btensors.append(
                Tensor(TensorRef(i, 0), ttype, labels or tuple(None for _ in tile), src.expr, phase)
            )
        if used > self.smem_budget:
            self.stats.pruned["shared_memory"] += 1
            return None
        return ops, btensors

    def block_candidates(
        self, ops: list[Op], tensors: list[Tensor], grid: Grid, last_rank: tuple
    ) -> Iterator[tuple[tuple, OpKind, tuple[int, ...], dict, Term]]:
        """(rank, kind, input positions, attrs, abstract expression) of every operator that
        may extend the prefix.

        In canonical form a new operator's newest input is at least the previous operator's,
        so only those are generated (the rank check settles ties). Operand pairs that mix
        for-loop phases, whose shapes cannot fit, or that are the same tensor are skipped here
        and counted as pruned, and so are operators whose abstract expression the oracle
        rejects (most of them: :meth:`_checked_expression`). The walk's regions number the
        operators listed here (:class:`Trail`)."""
        pruned = self.stats.pruned
        n = len(tensors)
        canonical = self.config.canonical_form
        lowest = max(last_rank[0], 0) if canonical else 0
        phases = [t.phase for t in tensors]
        plan, loops = self._kind_plan, grid.forloop_range
        for j in range(lowest, n):
            tj = tensors[j]
            dj = tj.type.dims
            pj = phases[j]
            # a for-loop body's tensor (LOOP = 1) never meets an accumulated one (POST = 2):
            # of the phases 0, 1, 2, only that pair multiplies to 2
            older = [i for i in range(j) if phases[i] * pj != _MIXED_PHASES]
            if len(older) < j:
                pruned["phase"] += j - len(older)
            shapes = _pair_shapes(older, tensors, dj)
            pruned["shape"] += shapes.rejected
            for kind, order, category, variants in plan:
                for inputs, attrs, key in self._operands(category, kind, variants, j, tj,
                                                         shapes, loops):  # fmt: skip
                    rank = (j, inputs, order, key)
                    if canonical and rank <= last_rank:
                        pruned["canonical_form"] += 1
                        continue
                    expr = self._checked_expression(kind, inputs, tensors, attrs, loops, rank)
                    if expr.__class__ is not Term:  # rejected: the reason's counter
                        pruned[expr] += 1
                        continue
                    yield rank, kind, inputs, attrs, expr

    def _operands(self, category: str, kind: OpKind, variants: tuple, j: int, tj: Tensor,
                  shapes, loops: int):  # fmt: skip
        """(inputs, attrs, attrs key) of one kind of operator whose newest input is ``j``
        (``variants``: see :attr:`_kind_plan`)."""
        if category == "unary":
            for attrs, key in variants:
                yield (j,), dict(attrs), key
        elif category == "binary":
            for i in shapes.broadcast:
                yield (i, j), {}, ()
                if not variants:  # not commutative
                    yield (j, i), {}, ()
            if kind is OpKind.MUL:
                yield (j, j), {}, ()  # x*x (square) is the one useful self-operand
        elif category == "matmul":
            for i in shapes.matmul_left:
                yield (i, j), {}, ()
            for i in shapes.matmul_right:
                yield (j, i), {}, ()
        elif category == "concat":
            for i, d in shapes.concat:
                yield (i, j), {"dim": d}, (("dim", d),)
                yield (j, i), {"dim": d}, (("dim", d),)
        elif category == "accum":
            if loops > 1 and tj.phase is Phase.LOOP:
                for acc in self._accum_order:
                    if acc is not AccumKind.RMS:
                        yield (j,), {"acc": acc}, (("acc", acc.value),)
                        continue
                    for eps in self._rms_eps:
                        extra = {"eps": eps} if eps else {}
                        yield (j,), {"acc": acc, **extra}, (("acc", acc.value), ("eps", eps))
        elif category == "reduction":
            for d, size in enumerate(tj.type.dims):
                if size > 1:
                    yield (j,), {"dim": d}, (("dim", d),)

    @property
    def _kind_plan(self) -> list[tuple[OpKind, int, str, tuple]]:
        """(kind, its order, how its operands are picked, variants) of each block operator
        kind the search enumerates, in order; the variants of a unary kind are its
        ``(attrs, attrs key)`` pairs, of a binary one ``(True,)`` when it commutes."""
        plan = self.__dict__.get("_plan")
        if plan is None:
            kinds = sorted(self.config.block_kinds or (), key=_KIND_ORDER.__getitem__)
            plan = [(k, _KIND_ORDER[k], _category(k), self._variants(k)) for k in kinds]
            plan = [p for p in plan if p[2] is not None]
            self.__dict__["_plan"] = plan
            self.__dict__["_accum_order"] = sorted(self.config.accum_kinds, key=lambda a: a.value)
        return plan

    def _variants(self, kind: OpKind) -> tuple:
        if _category(kind) == "unary":
            return tuple((attrs, tuple(sorted((k, str(v)) for k, v in attrs.items())))
                         for attrs in self._unary_variants.get(kind, ({},)))  # fmt: skip
        return (True,) if kind in _COMMUTATIVE else ()

    @property
    def _accum_order(self) -> list[AccumKind]:
        self._kind_plan  # noqa: B018 - fills the cache
        return self.__dict__["_accum_order"]

    def make_block_op(
        self,
        kind: OpKind,
        inputs: tuple[int, ...],
        attrs: dict,
        tensors: list[Tensor],
        grid: Grid,
        smem_used: int,
        expr: Term,
    ) -> tuple[Op, Tensor] | None:
        """Check one block operator of :meth:`block_candidates` (which checked its operands'
        phases and its abstract expression ``expr``); return it and its output tensor, or
        None (counted). Checks run in order of how much they prune per unit of cost: shapes,
        index labels and shared memory."""
        pruned = self.stats.pruned
        args = [tensors[i] for i in inputs]
        in_dims = [a.type.dims for a in args]
        dims = quick_dims(kind, in_dims, attrs, grid.forloop_range)
        if dims is None:
            pruned["shape"] += 1
            return None
        ok, (out_labels,) = lab.LABEL_RULES[kind]([a.labels for a in args], in_dims, attrs)
        if not ok and self.config.label_pruning:
            pruned["index_labels"] += 1
            return None
        otype = TensorType(dims, args[0].type.dtype)
        if smem_used + otype.num_bytes > self.smem_budget:
            pruned["shared_memory"] += 1
            return None
        phase = Phase.POST if kind in Group.ACCUMULATOR else combine_phases(a.phase for a in args)
        op = Op(kind, tuple(a.ref for a in args), freeze_attrs(attrs), (otype,))
        return op, Tensor(TensorRef(-1, 0), otype, out_labels, expr, phase)

    def _checked_expression(self, kind, inputs, tensors, attrs, loops, rank) -> Term | str:
        """The abstract expression of a block operator if the oracle keeps it, else the name
        of the pruning counter that rejects it ("abstract_error": the abstraction rejects the
        operator; "abstract_expression": not a subexpression of the program).

        Both are functions of (kind, attributes, loop range, operand expressions, operand
        dims), asked again for every prefix holding the same tensors: the answers are kept in
        a table this process shares between the enumerators of one oracle (one search), keyed
        by the operands' interned expressions by identity (a table entry holds them, so an
        identity stays theirs while the entry lives)."""
        exprs = tuple([tensors[i].expr for i in inputs])
        in_dims = [tensors[i].type.dims for i in inputs]
        key = (rank[2], rank[3], loops, *map(id, exprs), *in_dims)
        table = self._checked
        known = table.get(key)
        if known is not None:
            return known[0]
        expr = _abstract_expression(kind, list(exprs), in_dims, attrs, loops)
        if expr is None:
            answer: Term | str = "abstract_error"
        else:
            answer = expr if self.subexpr(expr) else "abstract_expression"
        if len(table) >= _CHECKED_MAX:
            table.clear()
        table[key] = (answer, exprs)
        return answer

    def subexpr(self, term: Term) -> bool:
        if self.oracle is None:
            return True
        cached = self._subexpr_cache.get(term)
        if cached is None:
            cached = self._subexpr_cache[term] = bool(self.oracle.is_subexpr(term))
        return cached

    def outputs_for(self, tensors: list[Tensor], grid: Grid, limits: BlockLimits):
        """Output savers for the prefix's leaves, or None when it cannot be closed yet: every
        input iterator must be used and every leaf must be savable (Algorithm 1, line 18)."""
        leaves = [i for i, t in enumerate(tensors) if t.uses == 0]
        if not leaves or len(leaves) > limits.max_outputs:
            return None
        if any(i < limits.n_inputs for i in leaves):
            return None
        outs = []
        partial = False
        for i in leaves:
            spec = _output_spec(tensors[i], grid, self.output_atoms)
            if spec is None:
                return None
            if self.config.omaps is not None and spec[0] not in self.config.omaps:
                return None
            outs.append((i, *spec))
            tile_atoms = {lab.outer_atom(x) for x in tensors[i].labels}
            partial |= any(atom not in tile_atoms for atom, _ in grid.axes)
        return outs, partial

    def check_time(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise SearchTimeout


_COMMUTATIVE = frozenset({OpKind.ADD, OpKind.MUL})
_MIXED_PHASES = Phase.LOOP * Phase.POST  # the one product of two phases that cannot meet
assert sorted(Phase) == [0, 1, 2] and _MIXED_PHASES == 2


# operators of one operand the enumeration applies to the newest tensor, with the program's
# own parameters: the elementwise ones, and rms_norm of rows a block holds whole
_UNARY_KINDS = Group.ELEMENTWISE_UNARY | {OpKind.RMS_NORM}


def _category(kind: OpKind) -> str | None:
    """How the enumeration picks operands for ``kind`` (None: not enumerated)."""
    if kind in _UNARY_KINDS:
        return "unary"
    if kind in Group.ELEMENTWISE_BINARY:
        return "binary"
    return {
        OpKind.MATMUL: "matmul",
        OpKind.CONCAT: "concat",
        OpKind.FORLOOP_ACCUM: "accum",
        OpKind.REDUCTION: "reduction",
    }.get(kind)


class _PairShapes:
    """Which older tensors can pair with the newest one, by shape alone."""

    def __init__(self, older: tuple[int, ...], dims: tuple, dj: tuple[int, ...]) -> None:
        """``older``: the positions of the older tensors; ``dims``: their dims, in order."""
        self.broadcast, self.matmul_left, self.matmul_right, self.concat = [], [], [], []
        self.rejected = 0
        rank = len(dj)
        for i, di in zip(older, dims, strict=True):
            if len(di) != rank:
                self.rejected += 1
                continue
            if all(x == y or x == 1 or y == 1 for x, y in zip(di, dj, strict=True)):
                self.broadcast.append(i)
            if rank >= 2:
                batch_ok = all(
                    x == y or x == 1 or y == 1 for x, y in zip(di[:-2], dj[:-2], strict=True)
                )
                if batch_ok and di[-1] == dj[-2]:
                    self.matmul_left.append(i)
                if batch_ok and dj[-1] == di[-2]:
                    self.matmul_right.append(i)
            for d in range(rank):
                if all(x == y for k, (x, y) in enumerate(zip(di, dj, strict=True)) if k != d):
                    self.concat.append((i, d))


def _abstract_expression(kind: OpKind, exprs: list[Term], dims: list, attrs: dict, loops: int):
    """The abstract expression of a block operator, or None when the abstraction rejects it
    (its caller, :meth:`Enumerator._checked_expression`, keeps the answer for the search)."""
    full_attrs = {**attrs, "forloop_range": loops, "reduction_dimx": 64}
    try:
        return ABSTRACT_SEMANTICS[kind](list(exprs), list(dims), full_attrs)
    except Exception:  # noqa: BLE001 - counted by the caller
        return None


def _pair_shapes(older: list[int], tensors: list[Tensor], dj: tuple[int, ...]) -> _PairShapes:
    """:class:`_PairShapes` of the older tensors and the newest, cached by their dims (a
    search meets the same ones again and again)."""
    return _pair_shapes_cached(tuple(older), tuple([tensors[i].type.dims for i in older]), dj)


_pair_shapes_cached = functools.lru_cache(maxsize=1 << 16)(_PairShapes)

_CHECKED_MAX = 1 << 17  # entries of a checked-expressions table (emptied when full)
_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_CHECKED_NO_ORACLE: dict = {}


def _checked_table(oracle) -> dict:
    """The table of :meth:`Enumerator._checked_expression` for ``oracle``: one per oracle
    object, so that the enumerators of one search (one per work item) share it, and it goes
    with the oracle; a table of its own for an oracle that takes no weak reference."""
    if oracle is None:
        return _CHECKED_NO_ORACLE
    try:
        return _CHECKED.setdefault(oracle, {})
    except TypeError:
        return {}


def _push_block_op(bops: list[Op], bts: list[Tensor], op: Op, t: Tensor, ins) -> None:
    t.ref = TensorRef(len(bops), 0)
    for i in ins:
        bts[i].uses += 1
    bops.append(op)
    bts.append(t)


def _pop_block_op(bops: list[Op], bts: list[Tensor], ins) -> None:
    bops.pop()
    bts.pop()
    for i in ins:
        bts[i].uses -= 1


def quick_dims(kind: OpKind, dims: list[tuple[int, ...]], attrs: dict, loops: int):
    """Output dims of an enumerated block operator, or None when the shapes do not fit: the
    rules of :mod:`mugraph.ir.shapes` without building error messages (the hot path)."""
    if kind in Group.ELEMENTWISE_UNARY:
        return dims[0]
    if kind in Group.ELEMENTWISE_BINARY:
        a, b = dims
        if len(a) != len(b):
            return None
        out = []
        for x, y in zip(a, b, strict=True):
            if x != y and x != 1 and y != 1:
                return None
            out.append(x if x > y else y)
        return tuple(out)
    if kind is OpKind.MATMUL:
        a, b = dims
        if len(a) != len(b) or len(a) < 2 or a[-1] != b[-2]:
            return None
        batch = []
        for x, y in zip(a[:-2], b[:-2], strict=True):
            if x != y and x != 1 and y != 1:
                return None
            batch.append(x if x > y else y)
        return (*batch, a[-2], b[-1])
    if kind is OpKind.FORLOOP_ACCUM:
        acc = attrs["acc"]
        if acc is AccumKind.NONE:
            return dims[0]
        if acc is AccumKind.SUM_TODIMX:
            return None if dims[0][-1] % 64 else dims[0][:-1] + (64,)
        return dims[0][:-1] + (1,)
    try:
        ctx = ShapeContext(Level.BLOCK, loops, 64)
        types = [TensorType(d, _ANY_DTYPE) for d in dims]
        return infer_output_types(kind, types, attrs, ctx)[0].dims
    except MugraphError:
        return None


def _unary_attrs(kind: OpKind) -> dict[str, Any]:
    return {}


def _block_ops_in(kops: list[Op]) -> int:
    """Block operators (not inputs or outputs) of the custom kernels in ``kops``."""
    return sum(
        sum(1 for bop in op.attr("graph").ops if bop.kind not in Group.BOUNDARY)
        for op in kops if op.kind is OpKind.CUSTOMIZED
    )


def _atom_size(ins: list[Tensor], atom: str) -> int:
    return min(lbl[0][1] for t in ins for lbl in t.labels if lbl and lbl[0][0] == atom)


def _split_labels(labels: lab.Labels, axes) -> lab.Labels | None:
    out = list(labels)
    for atom, g in axes:
        for d, lbl in enumerate(out):
            if lab.outer_atom(lbl) == atom:
                new = lab.split_outer(lbl, g)
                if new is None:
                    return None
                out[d] = new
                break
    return tuple(out)


def _loop_dim(labels: lab.Labels | None, atom: str, f: int) -> int:
    """The dim of a tile with ``labels`` that a loop over ``atom`` walks (-1: none). A loop
    over partial results of index a (one iteration per partial) also walks index a itself
    in as many chunks: the accumulations stay independent (labels keep a partial apart from a
    chunk), and a combining kernel can reduce an input beside the partials (rms(X) beside the
    split-K partial sums of X @ W)."""
    if labels is None:
        return -1
    for d, lbl in enumerate(labels):
        if lab.outer_atom(lbl) == atom:
            return d
    if lab.is_partial_atom(atom):
        base = atom.removesuffix("#partial")
        for d, lbl in enumerate(labels):
            if lab.outer_atom(lbl) == base and lbl[0][1] % f == 0:
                return d
    return -1


def _output_spec(
    t: Tensor, grid: Grid, output_atoms: set[str]
) -> tuple[tuple[int, int, int], int, lab.Labels] | None:
    """omap and forloop_dim for a leaf, from its labels; None if it cannot be saved — also
    when a grid axis splits an index of the program's output that the tile does not vary
    along (every block of that axis would write the same copy, not a partial result)."""
    rank = len(t.type.dims)
    labels = list(t.labels)
    placed: dict[int, int] = {}  # grid axis -> the dim its blocks' tiles are stacked along
    for axis, (atom, _) in enumerate(grid.axes):
        dims = [d for d, lbl in enumerate(labels)
                if lab.outer_atom(lbl) == atom and d not in placed.values()]
        if dims:
            placed[axis] = dims[0]
    for axis, (atom, _) in enumerate(grid.axes):
        if axis not in placed and atom in output_atoms:
            return None
        if axis not in placed:  # a reduced index: partial results side by side, along the
            free = [d for d in range(rank - 1, -1, -1) if d not in placed.values()]
            if not free:  # last dim not taken by another axis (else the one before it...)
                return None
            placed[axis] = free[0]
    omap = [placed[axis] for axis in range(len(grid.axes))]
    for axis, (atom, g) in enumerate(grid.axes):
        d = placed[axis]
        own = lab.outer_atom(t.labels[d]) == atom
        labels[d] = lab.join_outer(labels[d], atom if own else lab.partial_atom(atom), g)
    fdim = -1
    if t.phase is Phase.LOOP and grid.forloop_range > 1:
        atom, f = grid.loop  # type: ignore[misc]
        dims = [d for d, lbl in enumerate(t.labels) if lab.outer_atom(lbl) == atom]
        if not dims:
            return None
        fdim = dims[0]
        labels[fdim] = lab.join_outer(labels[fdim], atom, f)
    omap_t = tuple(omap + [-1] * (3 - len(omap)))
    return omap_t, fdim, tuple(labels)  # type: ignore[return-value]


def build_custom_op(
    block_ops: list[Op],
    tensors: list[Tensor],
    outputs,
    grid: Grid,
    input_refs: tuple[TensorRef, ...],
) -> tuple[Op, list[tuple[TensorType, lab.Labels, Term]]]:
    """The CUSTOMIZED kernel operator for a closed block graph, and its outputs' metadata."""
    ops = list(block_ops)
    meta_labels = []
    for i, omap, fdim, labels in outputs:
        attrs = {"omap": omap, "forloop_dim": fdim}
        ops.append(Op(OpKind.BLOCK_OUTPUT, (tensors[i].ref,), freeze_attrs(attrs), ()))
        meta_labels.append((labels, tensors[i].expr))
    block = BlockGraph(grid.grid_dim, (128, 1, 1), grid.forloop_range, 64, tuple(ops))
    out_types = customized_output_types(block)
    op = Op(OpKind.CUSTOMIZED, input_refs, freeze_attrs({"graph": block}), out_types)
    return op, [(t, labels, expr) for t, (labels, expr) in zip(out_types, meta_labels, strict=True)]


Visitor = Callable[[list[Op], list[TensorRef]], None]


class Enumerator(Generator):
    """The recursive part of Algorithm 1 (GenerateNextKernelOperator / ...BlockOperator)."""

    def run(
        self, visit: Visitor, first: CustomChoice | None = None, trail: Trail | None = None
    ) -> None:
        """Enumerate every μGraph (or those whose first custom kernel is ``first``; with a
        ``trail``, those in its region of that kernel's block-graph tree)."""
        kops, kts = self.initial_ops(), self.initial_tensors()
        self._trail = trail
        if first is None:
            self.kernel_dfs(kops, kts, 0, 0, (-1,), visit)
        else:
            cfg = self.config
            last = cfg.max_custom_kernels == 1 or cfg.max_kernel_ops == 1
            rank = (max(first.inputs), first.inputs, _KIND_ORDER[OpKind.CUSTOMIZED], first.key())
            self.expand_custom(
                first, kops, kts, 0, 0, visit, rank, last, must_continue=not last, trail=trail
            )

    def kernel_dfs(self, kops, kts, n_custom, n_ops, last_rank, visit, more=True) -> None:
        """Complete the kernel graph if it computes the program; else, when ``more`` kernels
        may follow, extend it by one custom kernel."""
        self.stats.states += 1
        self.check_time()
        if n_custom == 0:
            self._kernel_step(kops, kts, n_custom, n_ops, last_rank, visit, more)
            return
        # What can follow depends only on the tensors so far (types, labels, expressions,
        # uses), not on how they were computed: replay continuations found before.
        key = (
            tuple((t.type, t.labels, t.expr, t.uses) for t in kts),
            n_custom,
            n_ops,
            last_rank[:2],
            self.config.max_block_ops,
            _block_ops_in(kops),
            more,
        )
        # the walk of a work item's first kernel, not a continuation being recorded: it may
        # stop between two of the graphs it visits here (Trail.stop_visit)
        top = n_custom == 1 and not self._recording and self._trail is not None
        known = self.memo.get(key)
        if known is None and not self.memo.claim(key, self.deadline, self._busy_claim):
            known = self.memo.get(key)  # another worker computed it while this one waited
        if known is not None:
            self.stats.pruned["memo_replay"] += 1
            self._visit_all(kops, known, visit, top)
            return
        # The continuations are collected first and visited after (the same graphs in the
        # same order): a claim on the key is held while enumerating only, not while the
        # caller verifies what was found.
        base = len(kops)
        found: list = []

        def record(ops, outs):
            found.append((ops[base:], outs))

        self._recording += 1
        try:
            self._kernel_step(kops, kts, n_custom, n_ops, last_rank, record, more)
            self.memo.put(key, found)
        finally:
            self._recording -= 1
            self.memo.release(key)
        self._visit_all(kops, found, visit, top)

    def _visit_all(self, kops, found: list, visit, top: bool) -> None:
        """Visit the complete graphs ``kops`` + each continuation in ``found``. At the top of
        a work item's walk: a resumed node starts at its region's visit (and counts from
        there), and the item may stop between two visits once it has done some work."""
        start, end = 0, len(found)
        if top and self._resume is not None:
            start, self.stats = self._resume
            self._resume = None
            if self._trail.visits_end is not None:  # a visit range: its visits alone
                end = min(end, self._trail.visits_end)
        for index in range(start, end):
            if top and (index > start or self._trail.progressed) and self._trail.stop_visit(
                index, end
            ):
                raise HandBack
            extra, outs = found[index]
            visit(kops + extra, outs)
        if top and len(found) > start:
            self._trail.progressed = True

    def _busy_claim(self) -> None:
        """A continuation this walk needs is being computed by another worker: rather than
        wait for it, hand the rest of the item back (:meth:`Trail.stop_blocked`) when the
        walk is at the first kernel's level — where nothing of the node asking has been
        visited yet — and not inside a continuation being recorded."""
        trail = self._trail
        if trail is not None and not self._recording and trail.stop_blocked(self.stats):
            raise HandBack

    def _kernel_step(self, kops, kts, n_custom, n_ops, last_rank, visit, more) -> None:
        self.try_complete(kops, kts, visit)
        cfg = self.config
        if not more or n_ops >= cfg.max_kernel_ops:
            return
        for rank, op, tensor in self.predefined_ops(kts, last_rank):
            for r in op.inputs:
                kts[self._position(kts, r)].uses += 1
            kops.append(op)
            tensor.ref = TensorRef(len(kops) - 1, 0)
            kts.append(tensor)
            try:
                self.kernel_dfs(kops, kts, n_custom, n_ops + 1, rank, visit, more)
            finally:
                kts.pop()
                kops.pop()
                for r in op.inputs:
                    kts[self._position(kts, r)].uses -= 1
        if n_custom >= cfg.max_custom_kernels:
            return
        last_kernel = n_ops + 1 == cfg.max_kernel_ops or n_custom + 1 == cfg.max_custom_kernels
        unused = frozenset(i for i, t in enumerate(kts) if t.uses == 0)
        if last_kernel and len(unused) > cfg.max_kernel_inputs:
            self.stats.pruned["unused_tensor"] += 1
            return
        for choice in self.custom_choices(
            kts, last=last_kernel, required=unused if last_kernel else frozenset()
        ):
            rank = (max(choice.inputs), choice.inputs, _KIND_ORDER[OpKind.CUSTOMIZED], choice.key())
            if cfg.canonical_form and rank[:2] <= last_rank[:2]:
                self.stats.pruned["canonical_form"] += 1
                continue
            self.expand_custom(choice, kops, kts, n_custom, n_ops, visit, rank, last_kernel)

    @staticmethod
    def _position(kts: list[Tensor], ref: TensorRef) -> int:
        for i, t in enumerate(kts):
            if t.ref == ref:
                return i
        raise KeyError(ref)

    def predefined_ops(self, kts: list[Tensor], last_rank: tuple):
        """Pre-defined kernel operators (config.kernel_kinds) on the kernel tensors so far, in
        canonical order, checked like block operators (shapes, labels, abstract expression)."""
        kinds = sorted(self.config.kernel_kinds, key=_KIND_ORDER.__getitem__)
        n = len(kts)
        ctx = ShapeContext(Level.KERNEL)
        for kind in kinds:
            arity = 2 if kind in Group.ELEMENTWISE_BINARY or kind is OpKind.MATMUL else 1
            variants = self._unary_variants.get(kind, ({},)) if arity == 1 else ({},)
            dims_attr = kind in Group.REDUCING
            for inputs in itertools.product(range(n), repeat=arity):
                rank0 = (max(inputs), inputs, _KIND_ORDER[kind])
                if self.config.canonical_form and rank0 <= tuple(last_rank[:3]):
                    continue
                args = [kts[i] for i in inputs]
                attr_sets = (
                    [{"dim": d} for d in range(len(args[0].type.dims))]
                    if dims_attr
                    else [dict(v) for v in variants]
                )
                for attrs in attr_sets:
                    made = self._kernel_op(kind, args, attrs, ctx)
                    if made is not None:
                        yield (*rank0, tuple(sorted(attrs.items()))), *made

    def _kernel_op(self, kind, args, attrs, ctx):
        in_dims = [a.type.dims for a in args]
        try:
            expr = ABSTRACT_SEMANTICS[kind]([a.expr for a in args], in_dims, attrs)
        except Exception:  # noqa: BLE001 - an operator the abstraction rejects is pruned
            return None
        if not self.subexpr(expr):
            self.stats.pruned["abstract_expression"] += 1
            return None
        try:
            (otype,) = infer_output_types(kind, [a.type for a in args], attrs, ctx)
        except MugraphError:
            self.stats.pruned["shape"] += 1
            return None
        ok, (labels,) = lab.LABEL_RULES[kind]([a.labels for a in args], in_dims, attrs)
        if not ok and self.config.label_pruning:
            self.stats.pruned["index_labels"] += 1
            return None
        op = Op(kind, tuple(a.ref for a in args), freeze_attrs(attrs), (otype,))
        return op, Tensor(TensorRef(-1, 0), otype, labels, expr)

    def expand_custom(
        self,
        choice,
        kops,
        kts,
        n_custom,
        n_ops,
        visit,
        rank,
        last,
        must_continue: bool = False,
        trail: Trail | None = None,
    ) -> None:
        """Grow the block graph of a custom kernel with schedule ``choice``; each way to close
        it continues at the kernel level. A kernel that ``last`` must end the graph saves only
        the program's outputs; one that leaves no partial results ends it too (with
        split_before_boundary), since a later kernel could have been fused into it."""
        made = self.block_inputs(choice, kts)
        if made is None:
            return
        bops, bts = made
        cfg = self.config
        limits = BlockLimits(
            len(bops),
            len(self.target_types) if last else cfg.max_block_outputs,
            min(cfg.max_block_ops, cfg.max_total_block_ops - _block_ops_in(kops)),
        )
        smem = sum(t.type.num_bytes for t in bts)
        input_refs = tuple(kts[i].ref for i in choice.inputs)

        def close(bops, bts, outs, partial):
            more = not last and (partial or not cfg.split_before_boundary)
            if not last and not more:
                self.stats.pruned["split_before_boundary"] += 1
            if must_continue and not more:
                return  # a graph of fewer kernels, enumerated by an earlier unit
            op, metas = build_custom_op(bops, bts, outs, choice.grid, input_refs)
            self.stats.block_graphs += 1
            for i in choice.inputs:
                kts[i].uses += 1
            kops.append(op)
            for j, (ttype, labels, expr) in enumerate(metas):
                kts.append(Tensor(TensorRef(len(kops) - 1, j), ttype, labels, expr))
            try:
                self.kernel_dfs(kops, kts, n_custom + 1, n_ops + 1, rank, visit, more)
            finally:
                del kts[len(kts) - len(metas) :]
                kops.pop()
                for i in choice.inputs:
                    kts[i].uses -= 1

        if trail is not None and trail.region:
            self._region_dfs(bops, bts, choice.grid, smem, limits, close, trail)
        else:
            self.block_dfs(bops, bts, choice.grid, (-1,), smem, 0, limits, close, trail)

    def block_dfs(self, bops, bts, grid, last_rank, smem, depth, limits, close, trail=None):
        closing = self.outputs_for(bts, grid, limits)
        if closing is not None and trail is not None and trail.due is not None:
            trail.enter(self.stats)  # before the node counts anything (only a closing waits)
        self.stats.states += 1
        if self.stats.states % 512 == 0:
            self.check_time()
        if closing is not None:
            close(bops, bts, *closing)
        if trail is not None and self._resume is not None:  # a resumed node visited nothing
            self.stats = self._resume[1]
            self._resume = None
        remaining = limits.max_ops - depth
        if remaining <= 0:
            return
        leaves = sum(1 for t in bts if t.uses == 0)
        if leaves - limits.max_outputs > remaining:
            self.stats.pruned["too_many_leaves"] += 1
            return
        children = list(self.block_candidates(bops, bts, grid, last_rank))
        self._children(bops, bts, grid, children, smem, depth, limits, close, trail)

    def _children(self, bops, bts, grid, children, smem, depth, limits, close, trail, start=0):
        """Explore the subtrees of ``children[start:]`` (a trail may stop before any)."""
        if trail is not None:
            trail.sizes.append(len(children))
        for index in range(start, len(children)):
            if trail is not None and trail.stop_here(depth, index):
                raise HandBack
            rank, kind, ins, attrs, expr = children[index]
            made = self.make_block_op(kind, ins, attrs, bts, grid, smem, expr)
            if made is None:
                continue
            op, t = made
            _push_block_op(bops, bts, op, t, ins)
            if trail is not None:
                trail.stack.append(index)
            try:
                self.block_dfs(
                    bops, bts, grid, rank, smem + t.type.num_bytes, depth + 1, limits, close, trail
                )
            finally:
                if trail is not None:
                    trail.stack.pop()
                _pop_block_op(bops, bts, ins)
            if trail is not None:
                trail.progressed = True
        if trail is not None:
            trail.sizes.pop()

    def _region_dfs(self, bops, bts, grid, smem, limits, close, trail: Trail) -> None:
        """Walk to the node a non-empty region starts under, then explore its children from
        the region's first one (or, for a node-resuming region, the node itself from its
        visit, then its children). The walk repeats what the item that handed the region
        back already did and counted, so it counts nothing (a resumed node counts from its
        visit on: :meth:`_visit_all`)."""
        counted, self.stats = self.stats, Stats()
        last_rank: tuple = (-1,)
        resume = trail.resumes_at
        walk = trail.path
        try:
            for index in walk:
                children = list(self.block_candidates(bops, bts, grid, last_rank))
                rank, kind, ins, attrs, expr = children[index]
                made = self.make_block_op(kind, ins, attrs, bts, grid, smem, expr)
                if made is None:  # pragma: no cover - the region came from a walk through here
                    raise MugraphError(f"search: work region {trail.region} does not exist")
                op, t = made
                _push_block_op(bops, bts, op, t, ins)
                trail.stack.append(index)
                trail.sizes.append(len(children))
                smem += t.type.num_bytes
                last_rank = rank
            if resume is None:
                children = list(self.block_candidates(bops, bts, grid, last_rank))
        except BaseException:
            self.stats = counted
            raise
        if resume is None:
            self.stats = counted
            self._children(bops, bts, grid, children, smem, len(walk), limits, close, trail,
                           start=trail.region[-1])  # fmt: skip
            return
        self._resume = (resume, counted)
        try:
            if trail.visit_range:  # the node's visits alone
                closing = self.outputs_for(bts, grid, limits)
                if closing is not None:
                    close(bops, bts, *closing)
            else:
                self.block_dfs(bops, bts, grid, last_rank, smem, len(walk), limits, close, trail)
        finally:
            self._resume = None  # (set already, unless the item ended before the node's visits)
            self.stats = counted

    def try_complete(self, kops, kts, visit) -> None:
        """A kernel graph is complete when its unused tensors are exactly the program's
        outputs (same types, equivalent abstract expressions) and every input is used."""
        n_in = len(self.program.input_ops)
        if any(t.uses == 0 for t in kts[:n_in]):
            return
        leaves = [t for t in kts[n_in:] if t.uses == 0]
        if len(leaves) != len(self.target_types):
            return
        for perm in itertools.permutations(leaves):
            if all(self._matches(t, o) for o, t in enumerate(perm)):
                visit(list(kops), [t.ref for t in perm])
                return

    def _matches(self, t: Tensor, output: int) -> bool:
        want = self.target_types[output]
        if t.type.dims != want.dims or t.type.dtype != want.dtype:
            return False
        if self.config.label_pruning and not all(
            lab.same(a, b) for a, b in zip(t.labels, self.output_labels[output], strict=True)
        ):
            self.stats.pruned["index_labels"] += 1
            return False
        if self.oracle is None:
            return True
        if not self.oracle.is_equivalent(t.expr, output):
            self.stats.pruned["abstract_equivalence"] += 1
            return False
        return True
