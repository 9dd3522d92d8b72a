"""Index labels: which logical loop index each tensor dim runs over (an interpretation of the
operators, like einsum letters).

A label is a tuple of factors ``(atom, size)`` from outer to inner whose sizes multiply to the
dim's extent; size-1 dims have the empty label ``()``; ``None`` means unknown (it matches
anything). The naive program fixes the atoms: its input dims get one atom each and operators
unify them (matmul's inner dims, broadcast partners). The search then uses labels to pick
imaps and forloop dims that split the same index in every input of a kernel, and to prune
block operators that combine different indices (an elementwise product of a row index with a
column index of the same size, say).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from mugraph.ir.ops import AccumKind, Group, OpKind

Factor = tuple[str, int]
Label = tuple[Factor, ...] | None
Labels = tuple[Label, ...]


def atom_label(atom: str, size: int) -> Label:
    return () if size == 1 else ((atom, size),)


def partial_atom(atom: str) -> str:
    """The index of partial results: blocks that each reduced their part of ``atom`` wrote
    their results side by side along it; a later kernel must sum over it."""
    return atom + "#partial"


def is_partial_atom(atom: str) -> bool:
    return atom.endswith("#partial")


def simplify(label: Label) -> Label:
    if label is None:
        return None
    return tuple(f for f in label if f[1] != 1)


def label_size(label: Label) -> int | None:
    return None if label is None else math.prod(size for _, size in label)


def outer_atom(label: Label) -> str | None:
    return label[0][0] if label else None


def split_outer(label: Label, parts: int) -> Label:
    """The label of one of ``parts`` contiguous chunks of a dim. A factor split completely
    stays as ``(atom, 1)``, so the dim still says which index it came from."""
    if label is None:
        return None
    if not label or label[0][1] % parts:
        return None
    (atom, size), rest = label[0], label[1:]
    return ((atom, size // parts), *rest)


def join_outer(label: Label, atom: str, parts: int) -> Label:
    """The label of ``parts`` tiles of ``label`` concatenated, each tile being chunk of ``atom``."""
    if label is None:
        return None
    if label and label[0][0] == atom:
        return ((atom, label[0][1] * parts), *label[1:])
    return simplify(((atom, parts), *label))


def same(a: Label, b: Label) -> bool:
    """Labels agree (ignoring size-1 factors), or one of them is unknown."""
    return a is None or b is None or simplify(a) == simplify(b)


def broadcast(a: Label, b: Label, size_a: int, size_b: int) -> tuple[bool, Label]:
    """Elementwise partner dims: a size-1 dim takes the other's label."""
    if size_a == 1 and size_b != 1:
        return True, b
    if size_b == 1:
        return True, a
    return same(a, b), a if a is not None else b


def regroup(labels: Labels, dims: Sequence[int]) -> Labels:
    """Labels after a reshape to ``dims``: factors flow into the new dims when boundaries line
    up; a dim whose factors would have to be cut gets an unknown label."""
    if any(lab is None for lab in labels):
        return tuple(None for _ in dims)
    factors = [f for lab in labels for f in lab]  # type: ignore[union-attr]
    out: list[Label] = []
    i = 0
    for d in dims:
        group: list[Factor] = []
        size = 1
        while size < d and i < len(factors):
            group.append(factors[i])
            size *= factors[i][1]
            i += 1
        out.append(tuple(group) if size == d else None)
        if size != d:
            return tuple(out) + tuple(None for _ in dims[len(out) :])
    return tuple(out)


# ---- label rules per operator kind: (input labels, input dims, attrs) -> (ok, output labels) --


def _rule_unary(labs, dims, attrs):
    return True, [labs[0]]


def _rule_binary(labs, dims, attrs):
    out = []
    ok = True
    for la, lb, sa, sb in zip(labs[0], labs[1], dims[0], dims[1], strict=True):
        good, lab = broadcast(la, lb, sa, sb)
        ok &= good
        out.append(lab)
    return ok, [tuple(out)]


def _rule_matmul(labs, dims, attrs):
    a, b = labs
    da, db = dims
    ok = same(a[-1], b[-2])
    batch_a, batch_b = list(a[:-2]), list(b[:-2])
    size_a, size_b = list(da[:-2]), list(db[:-2])
    width = max(len(batch_a), len(batch_b))
    batch_a = [()] * (width - len(batch_a)) + batch_a
    batch_b = [()] * (width - len(batch_b)) + batch_b
    size_a = [1] * (width - len(size_a)) + size_a
    size_b = [1] * (width - len(size_b)) + size_b
    batch = []
    for la, lb, sa, sb in zip(batch_a, batch_b, size_a, size_b, strict=True):
        good, lab = broadcast(la, lb, sa, sb)
        ok &= good
        batch.append(lab)
    return ok, [(*batch, a[-2], b[-1])]


def _rule_reduce(labs, dims, attrs):
    out = list(labs[0])
    out[attrs["dim"]] = ()
    return True, [tuple(out)]


def _rule_concat(labs, dims, attrs):
    d = attrs["dim"]
    ok = all(same(x, y) for i, (x, y) in enumerate(zip(labs[0], labs[1], strict=True)) if i != d)
    la, lb = labs[0][d], labs[1][d]
    joined = (
        None
        if la is None or lb is None
        else (("cat(" + _text(la) + "|" + _text(lb) + ")", dims[0][d] + dims[1][d]),)
    )
    out = list(labs[0])
    out[d] = joined
    return ok, [tuple(out)]


def _text(label: Label) -> str:
    return "?" if label is None else "*".join(f"{a}{s}" for a, s in label) or "1"


def _rule_reshape(labs, dims, attrs):
    return True, [regroup(labs[0], attrs["dims"])]


def _rule_permute(labs, dims, attrs):
    return True, [tuple(labs[0][p] for p in attrs["perm"])]


def _rule_accum(labs, dims, attrs):
    acc = attrs.get("acc", AccumKind.NONE)
    out = list(labs[0])
    if acc is AccumKind.SUM_TODIMX:
        out[-1] = None
    elif acc is not AccumKind.NONE:
        out[-1] = ()
    return True, [tuple(out)]


def _rule_rescale(labs, dims, attrs):
    ok, (out,) = _rule_accum(labs[:1], dims[:1], attrs)
    return ok, [out]


def _rule_thread_graph(labs, dims, attrs):
    out = labs[0]
    ok = True
    size = dims[0]
    for lab, d in zip(labs[1:], dims[1:], strict=True):
        good, (out,) = _rule_binary([out, lab], [size, d], attrs)
        size = tuple(max(x, y) for x, y in zip(size, d, strict=True))
        ok &= good
    return ok, [out]


LABEL_RULES = {
    **{k: _rule_unary for k in Group.ELEMENTWISE_UNARY},
    **{k: _rule_binary for k in Group.ELEMENTWISE_BINARY},
    OpKind.MATMUL: _rule_matmul,
    OpKind.REDUCTION: _rule_reduce,
    OpKind.REDUCTION_MAX: _rule_reduce,
    OpKind.RMS_NORM: _rule_unary,
    OpKind.CONCAT: _rule_concat,
    OpKind.RESHAPE: _rule_reshape,
    OpKind.PERMUTE: _rule_permute,
    OpKind.FORLOOP_ACCUM: _rule_accum,
    OpKind.FORLOOP_ACCUM_MAX: _rule_unary,
    OpKind.FORLOOP_ACCUM_RESCALE: _rule_rescale,
    OpKind.THREAD_GRAPH: _rule_thread_graph,
}


# ---- the naive program's atoms ---------------------------------------------------------------


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def program_input_labels(graph) -> list[Labels]:
    """Labels of the program's input dims, atoms unified through its operators.

    Atoms are named by the first input dim that carries them (``i0.1`` = input 0, dim 1)."""
    return program_labels(graph)[0]


def program_labels(graph) -> tuple[list[Labels], list[Labels]]:
    """Labels of the program's input dims and output dims (see program_input_labels)."""
    uf = _UnionFind()
    values: list[list[list[str | None]]] = []
    for op in graph.ops:
        if op.kind is OpKind.INPUT:
            i = op.attr("index")
            values.append(
                [[f"i{i}.{d}" if n > 1 else None for d, n in enumerate(op.outputs[0].dims)]]
            )
            continue
        ins = [values[r.op][r.index] for r in op.inputs]
        in_dims = [graph.ops[r.op].outputs[r.index].dims for r in op.inputs]
        values.append([_unify_program_op(uf, op, ins, in_dims)])
    inputs: list[Labels] = []
    for op in graph.input_ops:
        dims = op.outputs[0].dims
        inputs.append(
            tuple(atom_label(uf.find(f"i{op.attr('index')}.{d}"), n) for d, n in enumerate(dims))
        )
    outputs: list[Labels] = []
    for ref in graph.outputs:
        atoms = values[ref.op][ref.index]
        dims = graph.tensor_type(ref).dims
        outputs.append(
            tuple(
                atom_label(uf.find(a), n) if a is not None else ()
                for a, n in zip(atoms, dims, strict=True)
            )
        )
    return inputs, outputs


def _unify_program_op(uf: _UnionFind, op, ins, in_dims) -> list[str | None]:
    """Union the atoms an operator identifies; return its output's per-dim atoms."""
    kind = op.kind
    out_dims = op.outputs[0].dims

    def pair(a, b):
        if a is not None and b is not None:
            uf.union(a, b)
        return a if a is not None else b

    if kind in Group.ELEMENTWISE_BINARY:
        return [pair(a, b) for a, b in zip(ins[0], ins[1], strict=True)]
    if kind is OpKind.MATMUL:
        a, b = ins
        pair(a[-1], b[-2])
        width = len(out_dims) - 2
        ba = [None] * (width - len(a[:-2])) + list(a[:-2])
        bb = [None] * (width - len(b[:-2])) + list(b[:-2])
        return [pair(x, y) for x, y in zip(ba, bb, strict=True)] + [a[-2], b[-1]]
    if kind in Group.REDUCING:
        out = list(ins[0])
        out[op.attr("dim")] = None
        return out
    if kind in Group.ELEMENTWISE_UNARY or kind is OpKind.RMS_NORM:
        return list(ins[0])
    if kind is OpKind.RESHAPE and tuple(in_dims[0]) == tuple(out_dims):
        return list(ins[0])
    # concat, reshape, custom kernels: fresh atoms
    return [f"op{id(op)}.{d}" if n > 1 else None for d, n in enumerate(out_dims)]
