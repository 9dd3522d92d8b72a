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

import itertools
import time
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
    "(or none) computes; x*x is kept (square)",
    "shape": "the operands' shapes do not fit the operator (invalid μGraph)",
    "shared_memory": "the block's tensors would exceed the GPU's shared memory (invalid)",
    "too_many_leaves": "more unused values than the remaining operators can consume and the "
    "outputs can save",
    "unused_tensor": "the last kernel must consume every value not yet used, or it is dead",
    "abstract_error": "the abstraction rejects the operator (e.g. a sum_todimx that does not "
    "divide)",
    "invalid_graph": "the complete graph failed the builder's checks (counted, never returned)",
    "verification": "the complete graph is not equivalent to the program (finite-field test)",
}


class SearchTimeout(Exception):
    """Raised inside the enumeration when the time budget is spent."""


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


@dataclass
class Stats:
    states: int = 0
    block_graphs: int = 0
    candidates: int = 0
    pruned: Counter = field(default_factory=Counter)

    def merge(self, other: Stats) -> None:
        self.states += other.states
        self.block_graphs += other.block_graphs
        self.candidates += other.candidates
        self.pruned.update(other.pruned)


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

    def __init__(self, program, config: SearchConfig, oracle: Oracle | None,
                 deadline: float | None = None) -> None:
        self.program = program
        self.config = config
        self.oracle = oracle if config.abstract_pruning else None
        self.deadline = deadline
        self.stats = Stats()
        self.input_labels = lab.program_input_labels(program)
        self.target_types = program.output_types
        self.smem_budget = program.gpu.shared_memory_per_block
        self._subexpr_cache: dict[Term, bool] = {}

    # ---- kernel level ------------------------------------------------------------------------

    def initial_tensors(self) -> list[Tensor]:
        out = []
        for i, op in enumerate(self.program.input_ops):
            out.append(Tensor(TensorRef(i, 0), op.outputs[0], self.input_labels[i], var(f"in{i}")))
        return out

    def initial_ops(self) -> list[Op]:
        return list(self.program.input_ops)

    def custom_choices(self, tensors: list[Tensor]) -> Iterator[CustomChoice]:
        """Input sets, grids, for-loops and the maps they imply, in a fixed order."""
        cfg = self.config
        usable = list(range(len(tensors)))
        for count in range(1, min(cfg.max_kernel_inputs, len(usable)) + 1):
            for inputs in itertools.combinations(usable, count):
                yield from self._schedules([tensors[i] for i in inputs], inputs)

    def _schedules(self, ins: list[Tensor], positions: tuple[int, ...]) -> Iterator[CustomChoice]:
        cfg = self.config
        atoms = sorted({lab.outer_atom(lbl) for t in ins for lbl in t.labels if lbl} - {None})
        sizes = {a: _atom_size(ins, a) for a in atoms}
        axis_options = [(a, g) for a in atoms for g in cfg.grid_sizes or () if sizes[a] % g == 0]
        for n_axes in range(0, cfg.max_grid_axes + 1):
            for axes in itertools.combinations(axis_options, n_axes):
                if len({a for a, _ in axes}) != n_axes:
                    continue
                blocks = 1
                for _, g in axes:
                    blocks *= g
                if blocks > cfg.max_blocks:
                    continue
                split = [_split_labels(t.labels, axes) for t in ins]
                if any(s is None for s in split):
                    continue
                for loop in self._loops(split):
                    choice = self._maps(ins, positions, Grid(tuple(axes), loop))
                    if choice is not None:
                        yield choice

    def _loops(self, split: list) -> Iterator[tuple[str, int] | None]:
        yield None
        atoms = sorted({lab.outer_atom(lbl) for labels in split for lbl in labels if lbl} - {None})
        for atom in atoms:
            size = min(lbl[0][1] for labels in split for lbl in labels if lbl and lbl[0][0] == atom)
            for f in self.config.forloop_ranges or ():
                if f > 1 and size % f == 0:
                    yield (atom, f)

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
                labels = _split_labels(t.labels, grid.axes)
                dims = [d for d, lbl in enumerate(labels) if lab.outer_atom(lbl) == grid.loop[0]]
                fdim = dims[0] if dims else -1
            fdims.append(fdim)
        if grid.loop and all(f < 0 for f in fdims):
            return None  # a loop that splits nothing only repeats work
        return CustomChoice(positions, grid, tuple(imaps), tuple(fdims))

    # ---- block level -------------------------------------------------------------------------

    def block_inputs(self, choice: CustomChoice, tensors: list[Tensor]) -> tuple[list[Op], list[Tensor]] | None:
        """The input iterators of a custom kernel; None when the tiles exceed shared memory."""
        from mugraph.ir import maps

        grid = choice.grid
        ops, btensors = [], []
        used = 0
        for i, (pos, imap, fdim) in enumerate(zip(choice.inputs, choice.imaps, choice.fdims, strict=True)):
            src = tensors[pos]
            try:
                tile = maps.input_tile_dims("new_input", src.type.dims, grid.grid_dim, imap,
                                            grid.forloop_range, fdim)
            except MugraphError:
                return None
            labels = _split_labels(src.labels, grid.axes)
            if fdim >= 0 and labels is not None:
                labels = tuple(lab.split_outer(lbl, grid.forloop_range) if d == fdim else lbl
                               for d, lbl in enumerate(labels))
            ttype = TensorType(tile, src.type.dtype)
            used += ttype.num_bytes
            attrs = {"index": i, "imap": imap, "forloop_dim": fdim, "dtensor": src.type}
            ops.append(Op(OpKind.BLOCK_INPUT, (), freeze_attrs(attrs), (ttype,)))
            phase = Phase.LOOP if fdim >= 0 else Phase.INVARIANT
            btensors.append(Tensor(TensorRef(i, 0), ttype, labels or tuple(None for _ in tile),
                                   src.expr, phase))
        if used > self.smem_budget:
            self.stats.pruned["shared_memory"] += 1
            return None
        return ops, btensors

    def block_candidates(self, ops: list[Op], tensors: list[Tensor], grid: Grid,
                         last_rank: tuple) -> Iterator[tuple[tuple, OpKind, tuple[int, ...], dict]]:
        """(rank, kind, input positions, attrs) of every operator that may extend the prefix.

        In canonical form a new operator's newest input is at least the previous operator's,
        so only those are generated (the rank check settles ties). Operand pairs that mix
        for-loop phases, or that are the same tensor, are skipped here (counted as pruned)."""
        cfg = self.config
        kinds = sorted(cfg.block_kinds or (), key=_KIND_ORDER.__getitem__)
        n = len(tensors)
        lowest = max(last_rank[0], 0) if cfg.canonical_form else 0
        for j in range(lowest, n):
            phase = tensors[j].phase
            partners = []
            for i in range(n):
                other = tensors[i].phase
                if {phase, other} == {Phase.LOOP, Phase.POST}:
                    self.stats.pruned["phase"] += 1
                elif i != j:
                    partners.append(i)
            for kind in kinds:
                yield from self._candidates_with_newest(kind, j, partners, tensors, grid, last_rank)

    def _candidates_with_newest(self, kind, j, partners, tensors, grid, last_rank):
        cfg = self.config
        if kind in Group.ELEMENTWISE_UNARY:
            yield from self._ranked(kind, (j,), _unary_attrs(kind), last_rank)
        elif kind in Group.ELEMENTWISE_BINARY or kind is OpKind.MATMUL or kind is OpKind.CONCAT:
            commutative = kind in (OpKind.ADD, OpKind.MUL)
            pairs = [(i, j) for i in partners if i < j]
            if not commutative:
                pairs += [(j, i) for i in partners if i < j]
            if kind is OpKind.MUL:
                pairs.append((j, j))  # x*x (square) is the one useful self-operand
            for pair in pairs:
                if kind is OpKind.CONCAT:
                    for d in range(len(tensors[j].type.dims)):
                        yield from self._ranked(kind, pair, {"dim": d}, last_rank)
                else:
                    yield from self._ranked(kind, pair, {}, last_rank)
        elif kind is OpKind.FORLOOP_ACCUM:
            if grid.forloop_range > 1 and tensors[j].phase is Phase.LOOP:
                for acc in sorted(cfg.accum_kinds, key=lambda a: a.value):
                    yield from self._ranked(kind, (j,), {"acc": acc}, last_rank)
        elif kind is OpKind.REDUCTION:
            for d, size in enumerate(tensors[j].type.dims):
                if size > 1:
                    yield from self._ranked(kind, (j,), {"dim": d}, last_rank)

    def _ranked(self, kind, inputs, attrs, last_rank):
        rank = (max(inputs), inputs, _KIND_ORDER[kind], tuple(sorted((k, str(v)) for k, v in attrs.items())))
        if self.config.canonical_form and rank <= last_rank:
            self.stats.pruned["canonical_form"] += 1
            return
        yield rank, kind, inputs, attrs

    def make_block_op(self, kind: OpKind, inputs: tuple[int, ...], attrs: dict,
                      tensors: list[Tensor], grid: Grid, smem_used: int) -> tuple[Op, Tensor] | None:
        """Check one block operator; return it and its output tensor, or None (counted).

        Checks run cheapest first: phases, operands, shapes, index labels, shared memory, and
        last the abstract expression."""
        pruned = self.stats.pruned
        args = [tensors[i] for i in inputs]
        phases = [a.phase for a in args]
        if Phase.LOOP in phases and Phase.POST in phases:
            pruned["phase"] += 1
            return None
        if len(inputs) == 2 and inputs[0] == inputs[1] and kind is not OpKind.MUL:
            pruned["self_operand"] += 1
            return None
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
        full_attrs = {**attrs, "forloop_range": grid.forloop_range, "reduction_dimx": 64}
        try:
            expr = ABSTRACT_SEMANTICS[kind]([a.expr for a in args], in_dims, full_attrs)
        except Exception:  # noqa: BLE001 - an operator the abstraction rejects is pruned
            pruned["abstract_error"] += 1
            return None
        if not self.subexpr(expr):
            pruned["abstract_expression"] += 1
            return None
        phase = Phase.POST if kind in Group.ACCUMULATOR else combine_phases(phases)
        op = Op(kind, tuple(a.ref for a in args), freeze_attrs(attrs), (otype,))
        return op, Tensor(TensorRef(-1, 0), otype, out_labels, expr, phase)

    def subexpr(self, term: Term) -> bool:
        if self.oracle is None:
            return True
        cached = self._subexpr_cache.get(term)
        if cached is None:
            cached = self._subexpr_cache[term] = bool(self.oracle.is_subexpr(term))
        return cached

    def outputs_for(self, tensors: list[Tensor], grid: Grid, n_inputs: int):
        """Output savers for the prefix's leaves, or None when it cannot be closed yet: every
        input iterator must be used and every leaf must be savable (Algorithm 1, line 18)."""
        leaves = [i for i, t in enumerate(tensors) if t.uses == 0]
        if not leaves or len(leaves) > self.config.max_block_outputs:
            return None
        if any(i < n_inputs for i in leaves):
            return None
        outs = []
        for i in leaves:
            spec = _output_spec(tensors[i], grid)
            if spec is None:
                return None
            outs.append((i, *spec))
        return outs

    def check_time(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise SearchTimeout


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


def _output_spec(t: Tensor, grid: Grid) -> tuple[tuple[int, int, int], int, lab.Labels] | None:
    """omap and forloop_dim for a leaf, from its labels; None if it cannot be saved."""
    rank = len(t.type.dims)
    omap: list[int] = []
    labels = list(t.labels)
    for atom, g in grid.axes:
        dims = [d for d, lbl in enumerate(labels) if lab.outer_atom(lbl) == atom and d not in omap]
        d = dims[0] if dims else rank - 1  # a reduced index: partial results side by side
        if d in omap:
            return None
        omap.append(d)
        labels[d] = lab.join_outer(labels[d], atom, g)
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


def build_custom_op(block_ops: list[Op], tensors: list[Tensor], outputs, grid: Grid,
                    input_refs: tuple[TensorRef, ...]) -> tuple[Op, list[tuple[TensorType, lab.Labels, Term]]]:
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

    def run(self, visit: Visitor, first: CustomChoice | None = None) -> None:
        """Enumerate every μGraph (or those whose first custom kernel is ``first``)."""
        kops, kts = self.initial_ops(), self.initial_tensors()
        if first is None:
            self.kernel_dfs(kops, kts, 0, 0, (-1,), visit)
        else:
            self.expand_custom(first, kops, kts, 0, 0, visit)

    def kernel_dfs(self, kops, kts, n_custom, n_ops, last_rank, visit) -> None:
        self.stats.states += 1
        self.check_time()
        self.try_complete(kops, kts, visit)
        cfg = self.config
        if n_ops >= cfg.max_kernel_ops or n_custom >= cfg.max_custom_kernels:
            return
        last_kernel = n_ops + 1 == cfg.max_kernel_ops or n_custom + 1 == cfg.max_custom_kernels
        unused = {i for i, t in enumerate(kts) if t.uses == 0}
        for choice in self.custom_choices(kts):
            if last_kernel and not unused <= set(choice.inputs):
                self.stats.pruned["unused_tensor"] += 1
                continue
            rank = (max(choice.inputs), choice.inputs, _KIND_ORDER[OpKind.CUSTOMIZED], choice.key())
            if cfg.canonical_form and rank <= last_rank:
                self.stats.pruned["canonical_form"] += 1
                continue
            self.expand_custom(choice, kops, kts, n_custom, n_ops, visit, rank)

    def expand_custom(self, choice, kops, kts, n_custom, n_ops, visit, rank=(-1,)) -> None:
        made = self.block_inputs(choice, kts)
        if made is None:
            return
        bops, bts = made
        smem = sum(t.type.num_bytes for t in bts)
        input_refs = tuple(kts[i].ref for i in choice.inputs)

        def close(bops, bts, outs):
            op, metas = build_custom_op(bops, bts, outs, choice.grid, input_refs)
            self.stats.block_graphs += 1
            for i in choice.inputs:
                kts[i].uses += 1
            kops.append(op)
            for j, (ttype, labels, expr) in enumerate(metas):
                kts.append(Tensor(TensorRef(len(kops) - 1, j), ttype, labels, expr))
            try:
                self.kernel_dfs(kops, kts, n_custom + 1, n_ops + 1, rank, visit)
            finally:
                del kts[len(kts) - len(metas):]
                kops.pop()
                for i in choice.inputs:
                    kts[i].uses -= 1

        self.block_dfs(bops, bts, choice.grid, (-1,), smem, 0, len(bops), close)

    def block_dfs(self, bops, bts, grid, last_rank, smem, depth, n_inputs, close) -> None:
        self.stats.states += 1
        if self.stats.states % 512 == 0:
            self.check_time()
        outs = self.outputs_for(bts, grid, n_inputs)
        if outs is not None:
            close(bops, bts, outs)
        remaining = self.config.max_block_ops - depth
        if remaining <= 0:
            return
        leaves = sum(1 for t in bts if t.uses == 0)
        if leaves - self.config.max_block_outputs > remaining:
            self.stats.pruned["too_many_leaves"] += 1
            return
        for rank, kind, ins, attrs in list(self.block_candidates(bops, bts, grid, last_rank)):
            made = self.make_block_op(kind, ins, attrs, bts, grid, smem)
            if made is None:
                continue
            op, t = made
            t.ref = TensorRef(len(bops), 0)
            for i in ins:
                bts[i].uses += 1
            bops.append(op)
            bts.append(t)
            try:
                self.block_dfs(bops, bts, grid, rank, smem + t.type.num_bytes, depth + 1,
                               n_inputs, close)
            finally:
                bops.pop()
                bts.pop()
                for i in ins:
                    bts[i].uses -= 1

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
                self.stats.candidates += 1
                visit(list(kops), [t.ref for t in perm])
                return

    def _matches(self, t: Tensor, output: int) -> bool:
        want = self.target_types[output]
        if t.type.dims != want.dims or t.type.dtype != want.dtype:
            return False
        if self.oracle is None:
            return True
        return bool(self.oracle.is_equivalent(t.expr, output))
