"""LAX partitioning (paper §1, Fig. 1): split a program into subprograms that one search can
handle and the verifier can decide, search each, and stitch the results back together.

A subprogram is a run of operators in program order, one computation (independent ones are
split apart), that (1) has at most ``max_ops`` operators and (2) is verifiable on its own: at
most one exponential on any path once its inputs are taken as fresh variables. Its inputs are
the tensors it reads from outside and its outputs the tensors read after it (or marked as
program outputs). Replacing each subprogram by a verified equivalent graph keeps the whole
program's function (substitution of equals), even where the whole is outside LAX (two
exponentials in a row across a cut).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mugraph.errors import MugraphError
from mugraph.ir.builder import KernelGraph
from mugraph.ir.graph import Op
from mugraph.ir.ops import Group, OpKind
from mugraph.ir.rebuild import rebuild_block_graph
from mugraph.ir.tensor import TensorRef
from mugraph.search.verify import NotVerifiableError, check_verifiable


@dataclass
class Subprogram:
    """Operators ``ops`` (positions in the program) as a graph of their own."""

    ops: list[int]
    inputs: list[TensorRef]  # program tensors it reads
    outputs: list[TensorRef]  # program tensors it provides
    graph: KernelGraph


def _replay(graph: KernelGraph, op: Op, args: list) -> list:
    """Append ``op`` to ``graph`` on the given argument handles (through the builder)."""
    if op.kind is OpKind.CUSTOMIZED:
        return graph.customized(args, rebuild_block_graph(op.attr("graph"), args))
    return graph._append(op.kind, args, op.attr_dict)


def _build(program: KernelGraph, positions: list[int]) -> Subprogram:
    members = set(positions)
    graph = KernelGraph(program.gpu)
    handles: dict[TensorRef, object] = {}
    inputs: list[TensorRef] = []
    for pos in positions:
        op = program.ops[pos]
        for ref in op.inputs:
            if ref.op not in members and ref not in handles:
                t = program.tensor_type(ref)
                handles[ref] = graph.new_input(t.dims, t.strides, t.dtype)
                inputs.append(ref)
        made = _replay(graph, op, [handles[r] for r in op.inputs])
        for i, h in enumerate(made):
            handles[TensorRef(pos, i)] = h
    later = {r for p, op in enumerate(program.ops) if p not in members for r in op.inputs}
    outputs = [
        TensorRef(pos, i)
        for pos in positions
        for i in range(len(program.ops[pos].outputs))
        if TensorRef(pos, i) in later or TensorRef(pos, i) in program.outputs
    ]
    for ref in outputs:
        graph.mark_output(handles[ref])
    return Subprogram(list(positions), inputs, outputs, graph)


def partition_program(program: KernelGraph, max_ops: int = 6) -> list[Subprogram]:
    """Greedy cut in program order: grow a subprogram while it stays small and verifiable —
    and cut at the boundaries of every attention core (:func:`attention_cores`) that fits
    in one subprogram, so that the core is searched whole (its own shape class) instead of
    being cut between its matmuls. A view (``permute``) is a subprogram of its own, kept as
    it is (:func:`moves_only`): no kernel holds it, the next subprogram reads its input
    through the view's strides."""
    compute = [p for p, op in enumerate(program.ops) if op.kind is not OpKind.INPUT]
    boundaries = set()
    for first, last in attention_cores(program):
        span = [p for p in compute if first <= p <= last]
        if len(span) <= max_ops:
            boundaries |= {first, last + 1}
    for pos in compute:
        if program.ops[pos].kind in Group.VIEW:
            boundaries |= {pos, pos + 1}
    parts: list[Subprogram] = []
    current: list[int] = []
    for pos in compute:
        trial = current + [pos]
        if current and (
            pos in boundaries or len(trial) > max_ops or not _verifiable(program, trial)
        ):
            parts.append(_build(program, current))
            trial = [pos]
        if not _verifiable(program, trial):
            raise NotVerifiableError(
                f"{program.ops[pos].kind.value} (operator {pos}): cannot be verified even alone"
            )
        current = trial
    if current:
        parts.append(_build(program, current))
    return [piece for part in parts for piece in _independent(program, part)]


def split_at_views(program: KernelGraph) -> list[Subprogram]:
    """``program`` as its maximal runs of operators between views, and each view alone, in
    program order (what :func:`stitch` puts back together)."""
    compute = [p for p, op in enumerate(program.ops) if op.kind is not OpKind.INPUT]
    runs: list[list[int]] = []
    for pos in compute:
        view = program.ops[pos].kind in Group.VIEW
        if view or not runs or program.ops[runs[-1][-1]].kind in Group.VIEW:
            runs.append([pos])
        else:
            runs[-1].append(pos)
    return [_build(program, run) for run in runs]


_MOVES_ONLY = Group.VIEW | {OpKind.RESHAPE, OpKind.INPUT}


def moves_only(graph: KernelGraph) -> bool:
    """Whether every operator of ``graph`` only moves data (views, reshapes): nothing to
    search, it is kept as it is."""
    return all(op.kind in _MOVES_ONLY for op in graph.ops)


def has_views(graph: KernelGraph) -> bool:
    return any(op.kind in Group.VIEW for op in graph.ops)


def _independent(program: KernelGraph, part: Subprogram) -> list[Subprogram]:
    """``part`` as its independent computations (operators linked by no tensor inside the
    part: the norms of Q and of K in front of QK-norm attention), each a subprogram of its
    own, in program order: searched apart, their spaces add instead of multiplying, and each
    gets kernels shaped for its own tensors. One computation: ``part`` itself."""
    root = {pos: pos for pos in part.ops}

    def find(pos: int) -> int:
        while root[pos] != pos:
            root[pos] = root[root[pos]]
            pos = root[pos]
        return pos

    for pos in part.ops:
        for ref in program.ops[pos].inputs:
            if ref.op in root:
                root[find(pos)] = find(ref.op)
    groups: dict[int, list[int]] = {}
    for pos in part.ops:
        groups.setdefault(find(pos), []).append(pos)
    if len(groups) == 1:
        return [part]
    return [_build(program, sorted(group)) for group in sorted(groups.values(), key=min)]


def attention_cores(program: KernelGraph) -> list[tuple[int, int]]:
    """(first, last) operator positions of each softmax(A @ B) @ C in ``program``: from the
    matmul an exponential's input comes from to the matmul its value reaches."""
    ops = program.ops
    consumers: dict[int, list[int]] = {}
    for j, op in enumerate(ops):
        for r in op.inputs:
            consumers.setdefault(r.op, []).append(j)

    def producer_matmul(pos: int) -> int | None:
        stack, seen = [pos], set()
        while stack:
            p = stack.pop()
            if p in seen:
                continue
            seen.add(p)
            if ops[p].kind is OpKind.MATMUL:
                return p
            stack += [r.op for r in ops[p].inputs]
        return None

    def consumer_matmul(pos: int) -> int | None:
        found = [j for j in consumers.get(pos, []) if ops[j].kind is OpKind.MATMUL]
        if found:
            return min(found)
        later = [consumer_matmul(j) for j in consumers.get(pos, [])]
        later = [j for j in later if j is not None]
        return min(later) if later else None

    cores = []
    for pos, op in enumerate(ops):
        if op.kind is not OpKind.EXP:
            continue
        first = producer_matmul(op.inputs[0].op)
        last = consumer_matmul(pos)
        if first is not None and last is not None:
            cores.append((first, last))
    return cores


def _verifiable(program: KernelGraph, positions: list[int]) -> bool:
    try:
        check_verifiable(_build(program, positions).graph)
    except NotVerifiableError:
        return False
    return True


def stitch(
    program: KernelGraph, parts: list[Subprogram], replacements: list[KernelGraph]
) -> KernelGraph:
    """The program with each subprogram replaced by its replacement (same interface)."""
    out = KernelGraph(program.gpu)
    values: dict[TensorRef, object] = {}
    for op in program.input_ops:
        t = op.outputs[0]
        values[TensorRef(program.ops.index(op), 0)] = out.new_input(t.dims, t.strides, t.dtype)
    for part, graph in zip(parts, replacements, strict=True):
        local: list[list] = []
        for op in graph.ops:
            if op.kind is OpKind.INPUT:
                local.append([values[part.inputs[op.attr("index")]]])
            else:
                local.append(_replay(out, op, [local[r.op][r.index] for r in op.inputs]))
        for ref, produced in zip(part.outputs, graph.outputs, strict=True):
            values[ref] = local[produced.op][produced.index]
    for ref in program.outputs:
        out.mark_output(values[ref])
    return out


def superoptimize_partitioned(
    program: KernelGraph, optimize: Callable[[KernelGraph], KernelGraph], max_ops: int = 6
) -> tuple[KernelGraph, list[Subprogram]]:
    """Partition, optimize every part with ``optimize``, stitch."""
    parts = partition_program(program, max_ops)
    if not parts:
        raise MugraphError("superoptimize: the program has no operators")
    return stitch(program, parts, [optimize(p.graph) for p in parts]), parts
