"""The probabilistic equivalence verifier (paper §5): acceptance, rejection, API, and speed paths.

(a) every hand-written μGraph of the library passes against its naive program;
(b) a mutation corpus: every library μGraph is edited op by op (operands, maps, accumulators,
    terms, kinds...), rebuilt through ``rebuild_kernel_graph`` (invalid mutants are skipped),
    and every mutant whose float reference output differs from the program's must be rejected;
(c) random small LAX programs: algebraic rewrites always pass, perturbations always fail;
(d) the Theorem 4 API: rounds, bounds, refusals, division by zero, interface errors;
(e) non-LAX operators as uninterpreted functions;
and the shared evaluation paths the verifier's speed rests on (folded matmuls, zero Z_q
components), which must not change any value.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import re
from collections.abc import Iterator

import numpy as np
import pytest

import mugraph
from mugraph.errors import GraphInputError, MugraphError
from mugraph.ir.graph import BlockGraph, Op, freeze_attrs
from mugraph.ir.ops import AccumKind, OpKind
from mugraph.ir.rebuild import rebuild_kernel_graph
from mugraph.ir.tensor import TensorRef
from mugraph.library import WORKLOADS
from mugraph.search import verify as verify_module
from mugraph.search.verify import analyse, difference, plan_rounds, q_inputs
from mugraph.semantics import reference
from mugraph.semantics.field import FieldInterpretation
from mugraph.semantics.field_arith import FieldArray, FieldContext, is_zero_view, matmul_mod
from mugraph.semantics.interpret import Interpretation, folded_matmul, run_kernel_graph

F32 = mugraph.float32


def _verify(candidate, program, **kw) -> mugraph.VerificationResult:
    kw.setdefault("seed", 0)
    return mugraph.verify(candidate, program, **kw)


# ---- (a) the library ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_library_graph_passes_at_small_sizes(name):
    work = WORKLOADS[name]
    result = _verify(work.optimized(work.small), work.naive(work.small), max_rounds=8)
    assert result.passed, str(result)
    assert result.rounds >= 1 and result.redraws == 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rmsnorm_linear", "lora"])
def test_library_graph_passes_at_suite_size(name):
    work = WORKLOADS[name]
    result = _verify(work.optimized(work.suite), work.naive(work.suite), max_rounds=2)
    assert result.passed and result.bound is not None and result.meets_delta, str(result)


# ---- (b) the mutation corpus --------------------------------------------------------------------

# Extra sizes per workload where many dims coincide, so that layout mutations (imap, omap,
# forloop_dim, which input a block reads) keep every tile shape and stay valid graphs.
EXTRA_SIZES = {
    "rmsnorm_linear": [{"m": 16, "k": 64, "n": 64, "k_tile": 16, "n_tile": 16},
                       {"m": 8, "k": 32, "n": 32, "k_tile": 8, "n_tile": 8}],
    "gated_mlp": [{"m": 16, "k": 64, "n": 64, "k_tile": 16, "n_tile": 16},
                  {"m": 8, "k": 32, "n": 32, "k_tile": 8, "n_tile": 8}],
    "lora": [{"m": 16, "k": 64, "n": 64, "r": 16, "k_tile": 16, "n_tile": 16}],
    "adapter_mlp": [{"m": 16, "k": 64, "r": 16, "n": 64, "parts": 4, "k_tile": 16,
                     "n_tile": 16}],
    "attention_flashdecoding": [{"h": 2, "h_kv": 2, "s": 16, "d": 16, "n": 64, "parts": 2,
                                 "n_tile": 16, "h_tile": 1, "h_tile2": 1, "s_parts": 2}],
    "attention_mirage_gqa": [{"h": 4, "h_kv": 2, "s": 1, "d": 16, "n": 64, "parts": 2,
                              "n_tile": 16, "h_tile2": 1}],
}

BIG = 1e30
ELEMENTWISE_BINARY = (OpKind.ADD, OpKind.SUB, OpKind.MUL, OpKind.DIV)
NON_COMMUTATIVE = (OpKind.SUB, OpKind.DIV, OpKind.MATMUL, OpKind.CONCAT)
BINARY_SWAPS = {
    OpKind.ADD: (OpKind.SUB, OpKind.MUL),
    OpKind.SUB: (OpKind.ADD, OpKind.DIV),
    OpKind.MUL: (OpKind.ADD, OpKind.DIV),
    OpKind.DIV: (OpKind.MUL, OpKind.SUB),
}
UNARY_SWAPS: dict[OpKind, tuple[tuple[OpKind, dict], ...]] = {
    OpKind.EXP: ((OpKind.SILU, {}), (OpKind.SQUARE, {})),
    OpKind.SILU: ((OpKind.EXP, {}), (OpKind.GELU, {})),
    OpKind.GELU: ((OpKind.SILU, {}),),
    OpKind.RELU: ((OpKind.CLAMP, {"min_val": 0.0, "max_val": BIG}), (OpKind.SQRT, {})),
    OpKind.SQRT: ((OpKind.RELU, {}),),
}
ACCUMULATORS = (AccumKind.NONE, AccumKind.SUM, AccumKind.MEAN, AccumKind.RMS)


@dataclasses.dataclass(frozen=True)
class Mutant:
    """An edited copy of a graph's frozen operators (not yet validated)."""

    what: str
    ops: tuple[Op, ...]
    outputs: tuple[TensorRef, ...]


def _set(op: Op, **changes) -> Op:
    """``op`` with attributes, kind or inputs changed."""
    attrs = changes.pop("attrs", {})
    merged = freeze_attrs({**op.attr_dict, **attrs}) if attrs else op.attrs
    return dataclasses.replace(op, attrs=merged, **changes)


def _insert_after(ops: tuple[Op, ...], i: int, new: Op,
                  outputs: tuple[TensorRef, ...] = ()) -> tuple[tuple[Op, ...], tuple]:
    """Insert ``new`` (reading op i's first output) after op i; later uses of that output now
    read ``new``'s, and later references shift by one."""

    def move(r: TensorRef) -> TensorRef:
        if r.op == i and r.index == 0:
            return TensorRef(i + 1, 0)
        return TensorRef(r.op + 1, r.index) if r.op > i else r

    tail = tuple(dataclasses.replace(op, inputs=tuple(move(r) for r in op.inputs))
                 for op in ops[i + 1:])
    return ops[: i + 1] + (new,) + tail, tuple(move(r) for r in outputs)


def _op_mutations(ops: tuple[Op, ...], i: int,
                  block: BlockGraph | None = None) -> Iterator[tuple[str, tuple[Op, ...]]]:
    """Edits of operator i of an op list (of ``block``, if given) that keep the list's length
    and references."""
    op = ops[i]
    kind = op.kind
    here = f"{kind.value}@{i}"

    def swap(new: Op) -> tuple[Op, ...]:
        return ops[:i] + (new,) + ops[i + 1:]

    if kind in NON_COMMUTATIVE and op.inputs[0] != op.inputs[1]:
        yield f"swap operands of {here}", swap(_set(op, inputs=op.inputs[::-1]))
    if kind in ELEMENTWISE_BINARY:
        for other in BINARY_SWAPS[kind]:
            yield f"{here} -> {other.value}", swap(_set(op, kind=other))
        for j, ref in enumerate(op.inputs):
            yield f"{here} -> operand {j} alone", swap(
                Op(OpKind.MUL_SCALAR, (ref,), freeze_attrs({"scalar": 1.0}), op.outputs))
            yield f"{here} -> operand {j} twice", swap(_set(op, inputs=(ref, ref)))
    for other, attrs in UNARY_SWAPS.get(kind, ()):
        new = Op(other, op.inputs, freeze_attrs(attrs), op.outputs)
        yield f"{here} -> {other.value}", swap(new)
    if kind in (OpKind.REDUCTION, OpKind.CONCAT):
        rank = len(op.outputs[0].dims)
        for dim in range(rank):
            if dim != op.attr("dim"):
                yield f"{here} dim -> {dim}", swap(_set(op, attrs={"dim": dim}))
    if kind is OpKind.FORLOOP_ACCUM:
        for acc in ACCUMULATORS:
            if acc is not op.attr("acc"):
                yield f"{here} acc -> {acc.value}", swap(_set(op, attrs={"acc": acc}))
    if kind is OpKind.BLOCK_INPUT:
        yield from _map_mutations(op, "imap", len(op.attr("dtensor").dims), block, here, swap)
        for index in range(len([o for o in ops if o.kind is OpKind.BLOCK_INPUT])):
            if index != op.attr("index"):
                yield f"{here} reads input {index}", swap(_set(op, attrs={"index": index}))
    if kind is OpKind.BLOCK_OUTPUT:
        ref = op.inputs[0]
        rank = len(ops[ref.op].outputs[ref.index].dims)
        yield from _map_mutations(op, "omap", rank, block, here, swap)


def _map_mutations(op: Op, name: str, rank: int, block: BlockGraph, here: str,
                   swap) -> Iterator[tuple[str, tuple[Op, ...]]]:
    """Every other value of each imap / omap entry and of forloop_dim. Entries of grid axes
    of size 1, and forloop_dim without a for-loop, change nothing: they are left alone."""
    current = op.attr(name)
    for axis in range(3):
        if block.grid_dim[axis] == 1:
            continue
        for value in range(-1, rank):
            if value != current[axis]:
                new = tuple(value if a == axis else v for a, v in enumerate(current))
                yield f"{here} {name}[{axis}] -> {value}", swap(_set(op, attrs={name: new}))
    if block.forloop_range == 1:
        return
    for value in range(-1, rank):
        if value != op.attr("forloop_dim"):
            yield f"{here} forloop_dim -> {value}", swap(_set(op, attrs={"forloop_dim": value}))


def _extra_scale(ops: tuple[Op, ...], i: int, outputs=()) -> tuple[tuple[Op, ...], tuple]:
    op = ops[i]
    scale = Op(OpKind.MUL_SCALAR, (TensorRef(i, 0),), freeze_attrs({"scalar": 2.0}),
               (op.outputs[0],))
    return _insert_after(ops, i, scale, outputs)


_BOUNDARY = (OpKind.INPUT, OpKind.BLOCK_INPUT, OpKind.BLOCK_OUTPUT, OpKind.CUSTOMIZED)


def mutants(graph) -> Iterator[Mutant]:
    """Every single edit of ``graph``'s kernel operators and block-graph operators."""
    ops, outputs = tuple(graph.ops), tuple(graph.outputs)
    for i, op in enumerate(ops):
        if op.kind is OpKind.CUSTOMIZED:
            yield from _block_mutants(ops, outputs, i)
            continue
        for what, new_ops in _op_mutations(ops, i):
            yield Mutant(what, new_ops, outputs)
        if op.kind not in _BOUNDARY:
            yield Mutant(f"extra scale after {op.kind.value}@{i}", *_extra_scale(ops, i, outputs))


def _block_mutants(ops: tuple[Op, ...], outputs, at: int) -> Iterator[Mutant]:
    kernel_op = ops[at]
    block: BlockGraph = kernel_op.attr("graph")

    def with_block(block_ops: tuple[Op, ...]) -> tuple[Op, ...]:
        new_block = dataclasses.replace(block, ops=block_ops)
        return ops[:at] + (_set(kernel_op, attrs={"graph": new_block}),) + ops[at + 1:]

    for i, op in enumerate(block.ops):
        for what, block_ops in _op_mutations(block.ops, i, block):
            yield Mutant(f"kernel {at}: {what}", with_block(block_ops), outputs)
        if op.kind not in _BOUNDARY:
            block_ops, _ = _extra_scale(block.ops, i)
            yield Mutant(f"kernel {at}: extra scale after {op.kind.value}@{i}",
                         with_block(block_ops), outputs)
    inputs = kernel_op.inputs
    for a, b in itertools.combinations(range(len(inputs)), 2):
        if inputs[a] != inputs[b]:
            order = list(inputs)
            order[a], order[b] = order[b], order[a]
            yield Mutant(f"kernel {at}: inputs {a} and {b} swapped",
                         ops[:at] + (_set(kernel_op, inputs=tuple(order)),) + ops[at + 1:],
                         outputs)
    for loops in {1, 2 * block.forloop_range, max(1, block.forloop_range // 2)}:
        if loops != block.forloop_range:
            changed = dataclasses.replace(block, forloop_range=loops)
            kernel = _set(kernel_op, attrs={"graph": changed})
            yield Mutant(f"kernel {at}: forloop_range -> {loops}",
                         ops[:at] + (kernel,) + ops[at + 1:], outputs)


def _build(mutant: Mutant, program):
    """The mutant as a valid graph with the program's interface, or None."""
    try:
        graph = rebuild_kernel_graph(list(mutant.ops), list(mutant.outputs))
        graph.check()
        verify_module._check_same_interface(graph, program)
    except (MugraphError, KeyError, TypeError, ValueError, IndexError):
        return None
    return graph


def _float_outputs(graph, inputs) -> list[np.ndarray]:
    return reference.evaluate(graph, inputs)


def float_differs(graph, program, draws: int = 2, seed: int = 0) -> bool:
    """Whether the float reference semantics tell ``graph`` and ``program`` apart."""
    rng = np.random.default_rng(seed)
    for _ in range(draws):
        inputs = [rng.standard_normal(t.dims) for t in program.input_types]
        for a, b in zip(_float_outputs(graph, inputs), _float_outputs(program, inputs),
                        strict=True):
            if not np.allclose(a, b, rtol=1e-7, atol=1e-9, equal_nan=True):
                return True
    return False


def _corpus_cases() -> Iterator[tuple[str, dict]]:
    for name, work in sorted(WORKLOADS.items()):
        yield name, work.small
        for sizes in EXTRA_SIZES.get(name, ()):
            yield name, sizes


def test_mutation_corpus_every_non_equivalent_mutant_is_rejected(record_property):
    tried = valid = differing = rejected = 0
    float_equal: list[str] = []
    accepted: list[str] = []
    must_reject_equal_floats: list[str] = []
    for name, sizes in _corpus_cases():
        work = WORKLOADS[name]
        program = work.naive(sizes)
        for mutant in mutants(work.optimized(sizes)):
            tried += 1
            graph = _build(mutant, program)
            if graph is None:
                continue
            valid += 1
            label = f"{name} {sizes}: {mutant.what}"
            result = _verify(graph, program, max_rounds=3)
            if float_differs(graph, program):
                differing += 1
                rejected += not result.passed
                if result.passed:
                    accepted.append(f"{label} ({result})")
            else:
                float_equal.append(f"{label}: {'accepted' if result.passed else 'rejected'}")
                if "-> clamp" in mutant.what and result.passed:
                    must_reject_equal_floats.append(label)
    summary = (
        f"mutation corpus: {tried} mutants tried, {valid} valid graphs, {differing} differ from "
        f"the program in floats, {rejected} of those rejected by the verifier; "
        f"{len(float_equal)} float-equal mutants (not required to be rejected)"
    )
    print(summary)
    record_property("mutation_corpus", summary)
    assert not accepted, summary + "\naccepted non-equivalent mutants:\n" + "\n".join(accepted)
    assert not must_reject_equal_floats, "relu -> clamp(0, big) accepted: " + str(
        must_reject_equal_floats)
    assert differing >= 200 and rejected == differing, summary
    assert any("-> clamp" in line and line.endswith("rejected") for line in float_equal), summary


def test_swapping_commutative_operands_is_not_a_mutant_but_passes():
    """Swapping add's operands inside a block graph is an equivalent edit: it must pass."""
    work = WORKLOADS["lora"]
    sizes = {**work.small, "k_tile": 32}  # the looped form adds X@W to (X@A)@B
    graph, program = work.optimized(sizes), work.naive(sizes)
    at = next(i for i, op in enumerate(graph.ops) if op.kind is OpKind.CUSTOMIZED)
    block = graph.ops[at].attr("graph")
    i = next(j for j, op in enumerate(block.ops) if op.kind is OpKind.ADD)
    swapped = block.ops[:i] + (_set(block.ops[i], inputs=block.ops[i].inputs[::-1]),) + \
        block.ops[i + 1:]
    ops = list(graph.ops)
    ops[at] = _set(ops[at], attrs={"graph": dataclasses.replace(block, ops=swapped)})
    mutant = rebuild_kernel_graph(ops, list(graph.outputs))
    assert not float_differs(mutant, program)
    assert _verify(mutant, program, max_rounds=4).passed


# ---- (c) random LAX programs: rewrites pass, perturbations fail ---------------------------------

# Inputs of the random programs: name -> shape.
SHAPES = {
    "A": (4, 6), "B": (6, 5), "C": (4, 5), "D": (4, 5), "E": (5, 3), "r": (4, 1),
    "A1": (4, 2), "A2": (4, 4), "B1": (2, 5), "B2": (4, 5),
}
NAMES = list(SHAPES)

Expr = tuple


def shape_of(e: Expr) -> tuple[int, ...]:
    tag = e[0]
    if tag == "in":
        return SHAPES[e[1]]
    if tag == "matmul":
        return shape_of(e[1])[:-1] + shape_of(e[2])[-1:]
    if tag in ("add", "sub", "mul", "div"):
        return tuple(np.broadcast_shapes(shape_of(e[1]), shape_of(e[2])))
    if tag == "sum":
        s = list(shape_of(e[1]))
        s[e[2]] = 1
        return tuple(s)
    if tag == "concat":
        a, b = shape_of(e[1]), shape_of(e[2])
        return tuple(x + y if i == e[3] else x for i, (x, y) in enumerate(zip(a, b, strict=True)))
    return shape_of(e[1])  # exp, scale


def has_exp(e: Expr) -> bool:
    return e[0] == "exp" or any(isinstance(x, tuple) and has_exp(x) for x in e[1:])


class Gen:
    """Random well-shaped expressions over SHAPES (at most one exp on any path)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def leaf(self, shape) -> Expr:
        names = [n for n in ("A", "B", "C", "D", "E", "r") if SHAPES[n] == tuple(shape)]
        return ("in", self.rng.choice(names))

    def expr(self, shape, depth: int, exp_ok: bool = True) -> Expr:
        shape = tuple(shape)
        if depth <= 0 or self.rng.random() < 0.2:
            return self.leaf(shape) if shape in {(4, 6), (6, 5), (4, 5), (5, 3), (4, 1)} \
                else self.expr((4, 5), 0)
        choices = ["add", "sub", "mul", "div", "scale"]
        if shape == (4, 5):
            choices += ["matmul", "matmul", "exp"] if exp_ok else ["matmul", "matmul"]
        if shape == (4, 3):
            choices = ["matmul"]
        if shape == (4, 1):
            choices += ["sum", "sum"]
        tag = self.rng.choice(choices)
        sub = depth - 1
        if tag == "matmul":
            inner = (4, 6) if shape == (4, 5) else (4, 5)
            left = (4, 6) if inner == (4, 6) else (4, 5)
            right = (6, 5) if shape == (4, 5) else (5, 3)
            return ("matmul", self.expr(left, sub, exp_ok), self.expr(right, 0))
        if tag == "exp":
            return ("exp", self.expr(shape, sub, exp_ok=False))
        if tag == "sum":
            return ("sum", self.expr((4, 5), sub, exp_ok), 1)
        if tag == "scale":
            return ("scale", self.expr(shape, sub, exp_ok), self.rng.choice([0.5, 3.0, -2.0]))
        other = shape if self.rng.random() < 0.6 or shape[-1] == 1 else shape[:-1] + (1,)
        if tag == "div":
            other = shape[:-1] + (1,) if shape == (4, 5) else shape
            return ("div", self.expr(shape, sub, exp_ok), self.expr(other, sub, exp_ok))
        return (tag, self.expr(shape, sub, exp_ok), self.expr(other, sub, exp_ok))


def build(exprs: list[Expr]):
    """A kernel graph with every SHAPES input (in order) computing ``exprs``."""
    g = mugraph.new_kernel_graph()
    inputs = {n: g.new_input(SHAPES[n], dtype=F32) for n in NAMES}

    def emit(e: Expr):
        tag = e[0]
        if tag == "in":
            return inputs[e[1]]
        if tag == "matmul":
            return g.matmul(emit(e[1]), emit(e[2]))
        if tag in ("add", "sub", "mul", "div"):
            return getattr(g, tag)(emit(e[1]), emit(e[2]))
        if tag == "exp":
            return g.exp(emit(e[1]))
        if tag == "sum":
            return g.reduction(emit(e[1]), e[2])
        if tag == "concat":
            return g.concat(emit(e[1]), emit(e[2]), e[3])
        return g.mul_scalar(emit(e[1]), e[2])

    for e in exprs:
        g.mark_output(emit(e))
    return g


def nodes(e: Expr, path=()) -> Iterator[tuple[tuple, Expr]]:
    yield path, e
    for i, x in enumerate(e[1:], start=1):
        if isinstance(x, tuple):
            yield from nodes(x, (*path, i))


def replace_at(e: Expr, path, new: Expr) -> Expr:
    if not path:
        return new
    i = path[0]
    return e[:i] + (replace_at(e[i], path[1:], new),) + e[i + 1:]


def rewrites(e: Expr, gen: Gen) -> Iterator[tuple[str, Expr, Expr]]:
    """(name, form 1, form 2): equal values by an algebraic identity, at each applicable node.

    Both forms embed the identity at the same node of ``e``."""
    for path, x in nodes(e):
        tag = x[0]
        if tag in ("add", "mul") and shape_of(x[1]) == shape_of(x[2]):
            yield f"commute {tag}", e, replace_at(e, path, (tag, x[2], x[1]))
        if tag == "mul" and x[2][0] == "add" and shape_of(x[2][1]) == shape_of(x[2][2]):
            a, (_, b, c) = x[1], x[2]
            yield "distribute", e, replace_at(e, path, ("add", ("mul", a, b), ("mul", a, c)))
        if tag == "matmul" and shape_of(x) == (4, 5) and not has_exp(x):
            c = gen.expr((4, 1), 1, exp_ok=False)
            yield ("division past matmul", replace_at(e, path, ("matmul", ("div", x[1], c), x[2])),
                   replace_at(e, path, ("div", x, c)))
        if tag == "matmul" and shape_of(x[1]) == (4, 6):
            # A1 (4, 2) | A2 (4, 4) is (4, 6); B1 (2, 5) over B2 (4, 5) is (6, 5)
            left = ("concat", ("in", "A1"), ("in", "A2"), 1)
            right = ("concat", ("in", "B1"), ("in", "B2"), 0)
            split = ("add", ("matmul", ("in", "A1"), ("in", "B1")),
                     ("matmul", ("in", "A2"), ("in", "B2")))
            yield ("split inner dim", replace_at(e, path, ("matmul", left, right)),
                   replace_at(e, path, split))
        if tag == "matmul" and shape_of(x) == (4, 5) and not has_exp(x):
            tail = ("in", "E")
            yield ("associativity", ("matmul", x, tail),
                   ("matmul", x[1], ("matmul", x[2], tail)))


def perturbations(e: Expr, gen: Gen) -> Iterator[tuple[str, Expr]]:
    """Edits that change the value (checked against floats before they are required to fail)."""
    for path, x in nodes(e):
        if x == ("in", "C"):
            yield "swap inputs C and D", replace_at(e, path, ("in", "D"))
        if x[0] == "exp":
            yield "exp(x) -> x", replace_at(e, path, x[1])
        if x[0] == "sum":
            yield "reduction dim 1 -> 0", replace_at(e, path, ("sum", x[1], 0))
        if shape_of(x) == (4, 5) and path:
            yield "extra term", replace_at(e, path, ("add", x, ("in", "D")))
        if x[0] == "scale":
            yield "scale changed", replace_at(e, path, ("scale", x[1], x[2] * 2))


def _program_pairs(seed: int, count: int) -> Iterator[tuple[str, Expr, Expr, bool]]:
    """(what, expr 1, expr 2, equal?) for ``count`` random programs."""
    rng = random.Random(seed)
    gen = Gen(rng)
    for _ in range(count):
        e = gen.expr((4, 5), 4)
        options = list(rewrites(e, gen))
        for what, one, two in rng.sample(options, min(3, len(options))):
            yield what, one, two, True
        changes = list(perturbations(e, gen))
        for what, changed in rng.sample(changes, min(3, len(changes))):
            yield what, e, changed, False


def _valid(expr: Expr) -> bool:
    """A buildable program whose value is defined (no division by an expression that is
    zero everywhere, such as r - r: its float value is not finite)."""
    try:
        graph = build([expr])
        graph.check()
    except MugraphError:
        return False
    inputs = [np.random.default_rng(0).standard_normal(t.dims) for t in graph.input_types]
    return all(np.isfinite(out).all() for out in _float_outputs(graph, inputs))


def test_random_rewrites_pass_and_perturbations_fail(record_property):
    counts = {"rewrites": 0, "perturbations": 0, "skipped (float-equal or invalid)": 0}
    wrong: list[str] = []
    seen_kinds: set[str] = set()
    for what, one, two, equal in _program_pairs(seed=1234, count=45):
        if not (_valid(one) and _valid(two)):
            counts["skipped (float-equal or invalid)"] += 1
            continue
        g1, g2 = build([one]), build([two])
        if not equal and not float_differs(g1, g2):
            counts["skipped (float-equal or invalid)"] += 1
            continue
        result = _verify(g1, g2, max_rounds=3)
        counts["rewrites" if equal else "perturbations"] += 1
        seen_kinds.add(what)
        if result.passed != equal:
            wrong.append(f"{what}: {one} vs {two}: {result}")
    summary = f"random programs: {counts}; kinds seen: {sorted(seen_kinds)}"
    print(summary)
    record_property("random_programs", summary)
    assert not wrong, summary + "\n" + "\n".join(wrong)
    assert counts["rewrites"] >= 40 and counts["perturbations"] >= 40, summary
    expected = {"commute add", "commute mul", "division past matmul", "split inner dim",
                "associativity", "swap inputs C and D", "extra term", "exp(x) -> x",
                "reduction dim 1 -> 0"}
    assert expected <= seen_kinds, summary


# ---- (d) the Theorem 4 API ----------------------------------------------------------------------


def _graph(shapes, body):
    g = mugraph.new_kernel_graph()
    xs = [g.new_input(s, dtype=F32) for s in shapes]
    out = body(g, *xs)
    for o in out if isinstance(out, tuple) else (out,):
        g.mark_output(o)
    return g


def test_result_fields_and_delta_monotonicity():
    exp_a = _graph([(3, 4)], lambda g, x: g.exp(x))
    exp_b = _graph([(3, 4)], lambda g, x: g.exp(g.mul_scalar(g.mul_scalar(x, 0.5), 2.0)))
    poly_a = _graph([(3, 4), (4, 2)], lambda g, x, w: g.matmul(x, w))
    poly_b = _graph([(3, 4), (4, 2)],
                    lambda g, x, w: g.mul_scalar(g.matmul(x, g.mul_scalar(w, 4.0)), 0.25))
    for a, b in ((exp_a, exp_b), (poly_a, poly_b)):
        loose = mugraph.verify(a, b, delta=1e-2, seed=1, max_rounds=1000)
        tight = mugraph.verify(a, b, delta=1e-12, seed=1, max_rounds=1000)
        assert loose.passed and tight.passed
        assert tight.rounds >= loose.rounds >= 1
        assert tight.bound is not None and tight.bound <= 1e-12 and tight.meets_delta
        assert loose.bound is not None and loose.bound <= 1e-2
    # exponentials: Theorem 3's 1 - 1/k per round (k = 2 here), so many rounds
    assert mugraph.verify(exp_a, exp_b, delta=1e-9, seed=0, max_rounds=1000).rounds == \
        math.ceil(math.log(1e9) / math.log(2))


def test_max_rounds_caps_and_reports_the_achieved_bound():
    a = _graph([(3, 4)], lambda g, x: g.exp(x))
    result = mugraph.verify(a, a, delta=1e-9, seed=0, max_rounds=5)
    assert result.passed and result.rounds == 5
    assert result.bound == pytest.approx(0.5**5) and not result.meets_delta


def test_no_bound_is_claimed_where_theorem_3_does_not_apply():
    work = WORKLOADS["attention_flashdecoding"]
    result = _verify(work.optimized(work.small), work.naive(work.small), max_rounds=2)
    assert result.passed and result.bound is None and not result.meets_delta
    assert "does not apply" in result.guarantee


def test_failure_reports_and_voids_the_bound():
    a = _graph([(3, 4), (4, 2)], lambda g, x, w: g.matmul(x, w))
    b = _graph([(3, 4), (4, 2)], lambda g, x, w: g.mul_scalar(g.matmul(x, w), 1.5))
    result = _verify(a, b)
    assert not result.passed and result.bound is None and "differs" in result.failure
    assert result.rounds == 1 and not result


@pytest.mark.parametrize("body", [
    lambda g, x: g.exp(g.exp(x)),
    lambda g, x: g.exp(g.silu(x)),
    lambda g, x: g.silu(g.add(g.exp(x), x)),
    lambda g, x: g.exp(g.relu(g.exp(x))),
])
def test_two_exponentials_on_one_path_are_refused(body):
    a = _graph([(3, 4)], body)
    with pytest.raises(mugraph.NotVerifiableError, match="second exponential"):
        mugraph.verify(a, a)
    with pytest.raises(mugraph.NotVerifiableError):
        verify_module.check_verifiable(a)


def test_exponentials_on_separate_paths_are_fine():
    a = _graph([(3, 4)], lambda g, x: g.mul(g.exp(x), g.silu(x)))
    assert mugraph.verify(a, a, max_rounds=2).passed


def test_different_interfaces_raise_graph_input_error():
    a = _graph([(3, 4)], lambda g, x: g.exp(x))
    b = _graph([(4, 3)], lambda g, x: g.exp(x))
    c = _graph([(3, 4)], lambda g, x: g.reduction(x, 1))
    d = _graph([(3, 4), (3, 4)], lambda g, x, y: g.add(x, y))
    for other in (b, c, d):
        with pytest.raises(GraphInputError):
            mugraph.verify(a, other)
    with pytest.raises(MugraphError):
        mugraph.verify(a, a, delta=0.0)


SMALL = (23, 11)  # q | p - 1: a field where a random divisor is often zero


def test_division_by_zero_redraws_the_round():
    a = _graph([(2, 2), (2, 2)], lambda g, x, y: g.div(x, y))
    b = _graph([(2, 2), (2, 2)],
               lambda g, x, y: g.div(g.mul_scalar(x, 3.0), g.mul_scalar(y, 3.0)))
    result = mugraph.verify(a, b, seed=3, max_redraws=20, primes=SMALL)
    assert result.passed and result.rounds >= 8 and result.redraws > 0, str(result)
    assert result.bound is not None and result.bound <= 1e-9 and "Z_23 x Z_11" in str(result)
    swapped = _graph([(2, 2), (2, 2)], lambda g, x, y: g.div(y, x))
    assert not mugraph.verify(a, swapped, seed=3, max_redraws=20, primes=SMALL).passed


@pytest.mark.parametrize(
    ("name", "primes"),
    [("gated_mlp", verify_module.SMALL_PRIMES), ("rmsnorm_linear", verify_module.SMALL_PRIMES),
     ("attention_flashdecoding", verify_module.LARGE_PRIMES)],
)
def test_verify_takes_the_small_primes_only_where_the_plan_is_the_same(name, primes):
    """The small pair (one float64 GEMM a product) where it plans the rounds the large pair
    plans, with a bound as good for delta; never where no bound exists (attention's heuristic
    rounds)."""
    work = WORKLOADS[name]
    candidate, program = work.optimized(work.small), work.naive(work.small)
    result = _verify(candidate, program, max_rounds=64)
    assert result.passed and result.primes == primes, str(result)
    pair = difference(analyse(candidate), analyse(program))
    large = plan_rounds(pair, 1e-9, 64, p=verify_module.P, q=verify_module.Q)
    assert (result.rounds, result.guarantee) == (large[0], large[2])
    session = verify_module.ProgramRounds(program, seed=0)
    assert session.primes == primes and session.verify(candidate).primes == primes


def test_choose_primes_keeps_the_large_field_where_the_small_one_loses_the_theorem():
    """Theorem 3 needs d*k^4 < q: k = 30 terms at degree 4 fits q ~ 2^30, not q ~ 2^20;
    Schwartz-Zippel's rounds at a high degree grow in the small field."""
    choose = verify_module.choose_primes
    theorem = verify_module.Analysis(max_exp_depth=1, degree=4, terms=4, uninterpreted=())
    assert choose(theorem, 1e-9) == verify_module.SMALL_PRIMES
    lost = dataclasses.replace(theorem, terms=30)
    assert plan_rounds(lost, 1e-9, 64)[1] is not None
    assert choose(lost, 1e-9) == verify_module.LARGE_PRIMES
    deep = verify_module.Analysis(max_exp_depth=0, degree=1 << 12, terms=1, uninterpreted=())
    assert choose(deep, 1e-9) == verify_module.LARGE_PRIMES
    low = dataclasses.replace(deep, degree=3)
    assert choose(low, 1e-9) == verify_module.SMALL_PRIMES


def test_small_primes_voided_by_zero_divisors_fall_back_to_the_large_ones(monkeypatch):
    """A division whose divisor is zero in every draw over the small field decides nothing:
    verify and ProgramRounds run the pair again over the large primes."""
    tiny = (23, 11)
    monkeypatch.setattr(verify_module, "SMALL_PRIMES", tiny)
    monkeypatch.setattr(verify_module, "choose_primes", lambda *args: tiny)
    a = _graph([(8, 8), (8, 8)], lambda g, x, y: g.div(x, y))
    b = _graph([(8, 8), (8, 8)],
               lambda g, x, y: g.div(g.mul_scalar(x, 3.0), g.mul_scalar(y, 3.0)))
    result = mugraph.verify(a, b, seed=3, max_rounds=4)
    assert result.passed and result.primes == verify_module.LARGE_PRIMES, str(result)
    session = verify_module.ProgramRounds(b, seed=3)
    assert session.primes == tiny
    again = session.verify(a, max_rounds=4)
    assert again.passed and again.primes == verify_module.LARGE_PRIMES, str(again)
    assert not mugraph.verify(a, _graph([(8, 8), (8, 8)], lambda g, x, y: g.div(y, x)),
                              seed=3, max_rounds=4).passed


def test_one_round_answers_redraw_in_a_small_field(monkeypatch):
    original = FieldContext.from_rng  # also through a patched context, as the brief has it
    monkeypatch.setattr(verify_module.FieldContext, "from_rng",
                        staticmethod(lambda rng, **kw: original(rng, p=23, q=11)))
    a = _graph([(4, 4), (4, 4)], lambda g, x, y: g.div(x, y))
    rng = np.random.default_rng(0)
    answers = [verify_module._one_round(a, a, rng) for _ in range(40)]
    redraws = [x for x in answers if isinstance(x, verify_module._Redraw)]
    assert redraws and all("division by zero" in x for x in redraws)
    assert all(x is None for x in answers if not isinstance(x, verify_module._Redraw))


def test_a_graph_that_always_divides_by_zero_fails_without_crashing():
    a = _graph([(2, 3), (2, 3)], lambda g, x, y: g.div(x, g.sub(y, y)))
    b = _graph([(2, 3), (2, 3)], lambda g, x, y: g.div(x, y))
    result = mugraph.verify(a, b, seed=0, max_redraws=3)
    assert not result.passed and "division by zero" in result.failure
    assert "candidate" in result.failure and result.redraws == 4


# ---- the analysis -------------------------------------------------------------------------------


def test_analysis_counts_the_terms_of_the_difference():
    silu = _graph([(3, 4)], lambda g, x: g.silu(x))
    pair = difference(analyse(silu), analyse(silu))
    assert (pair.terms, pair.max_exp_depth) == (4, 1)  # x(1 + e^-x') - x'(1 + e^-x)
    soft = _graph([(3, 8)], lambda g, x: g.softmax(x))
    form = analyse(soft).outputs[0]
    assert (form.n, form.m) == (1, 8)
    pair = difference(analyse(soft), analyse(soft))
    assert pair.terms == 16
    rounds, bound, why = plan_rounds(pair, 1e-9, 10**6)
    assert bound is not None and "Theorems 3-4" in why and rounds > 16 * 20


def test_analysis_keeps_one_denominator_for_sums_along_a_broadcast_axis():
    """softmax(x) @ v sums e_j / S with the same S for every j: k stays linear in the row."""
    g = _graph([(3, 8), (8, 2)], lambda g, x, v: g.matmul(g.softmax(x), v))
    form = analyse(g).outputs[0]
    assert (form.n, form.m) == (8, 8)
    # dividing by a value that varies along the summed axis multiplies denominators
    h = _graph([(3, 8), (3, 8)], lambda g, x, y: g.reduction(g.div(g.exp(x), g.exp(y)), 1))
    assert analyse(h).outputs[0].n >= 8


def test_analysis_degrees_without_exponentials():
    g = _graph([(3, 4), (4, 5)], lambda g, x, w: g.matmul(g.rms_norm(x, 4), w))
    form = analyse(g).outputs[0]
    assert (form.deg, form.gdeg) == (2, 1)
    a = analyse(g)
    assert a.uninterpreted == ("sqrt",)
    rounds, bound, _ = plan_rounds(difference(a, a), 1e-9, 64)
    assert rounds == 2 and bound < 1e-9


# ---- (e) non-LAX operators are uninterpreted functions ------------------------------------------


def test_relu_is_not_additive():
    a = _graph([(3, 4), (3, 4)], lambda g, x, y: g.add(g.relu(x), g.relu(y)))
    b = _graph([(3, 4), (3, 4)], lambda g, x, y: g.relu(g.add(x, y)))
    assert not _verify(a, b).passed


def test_relu_values_are_values():
    a = _graph([(3, 4)], lambda g, x: g.mul_scalar(g.relu(x), 2.0))
    b = _graph([(3, 4)], lambda g, x: g.add(g.relu(x), g.relu(x)))
    result = _verify(a, b)
    assert result.passed and any("uninterpreted" in n for n in result.notes)


def test_relu_is_not_clamp_and_sqrt_is_not_a_square_root_here():
    a = _graph([(3, 4)], lambda g, x: g.relu(x))
    b = _graph([(3, 4)], lambda g, x: g.clamp(x, 0.0, BIG))
    assert not _verify(a, b).passed
    c = _graph([(3, 4)], lambda g, x: g.mul(g.sqrt(x), g.sqrt(x)))
    d = _graph([(3, 4)], lambda g, x: g.mul_scalar(x, 1.0))
    assert not _verify(c, d).passed
    assert _verify(c, _graph([(3, 4)], lambda g, x: g.square(g.sqrt(x)))).passed


def _row_max(loop: bool):
    """The max of each row of X (8, 64): a for-loop of max-accumulated tile maxima, or one
    reduction_max over the whole row."""
    g = mugraph.new_kernel_graph()
    x = g.new_input((8, 64), dtype=F32)
    tb = mugraph.new_threadblock_graph((2, 1, 1), (128, 1, 1), 4 if loop else 1)
    tx = tb.new_input(x, (0, -1, -1), forloop_dim=1 if loop else -1)
    m = tb.reduction_max(tx, 1)
    tb.new_output(tb.forloop_accum_max(m) if loop else m, (0, -1, -1))
    (out,) = g.customized([x], tb)
    g.mark_output(out)
    return g


def test_max_is_associative_like_the_real_max():
    result = _verify(_row_max(True), _row_max(False))
    assert result.passed and "max" in result.notes[0]


# ---- the evaluation paths behind the speed ------------------------------------------------------


def _random_batch_shapes(rng: np.random.Generator) -> tuple[tuple, tuple]:
    ndim = rng.integers(0, 4)
    batch_a, batch_b = [], []
    for _ in range(ndim):
        n = int(rng.integers(2, 4))
        kind = rng.integers(0, 4)
        batch_a.append(n if kind in (0, 1) else 1)
        batch_b.append(n if kind in (0, 2) else 1)
    if rng.random() < 0.3 and batch_a:
        batch_a = batch_a[1:]  # kernel-level operands may differ in rank
    m, k, n = (int(x) for x in rng.integers(1, 6, size=3))
    return (*batch_a, m, k), (*batch_b, k, n)


class _Plain(Interpretation):
    name = "plain"
    table = {OpKind.MATMUL: lambda interp, op, args, ctx: [np.matmul(args[0], args[1])]}


def test_folded_matmul_equals_numpy_matmul():
    rng = np.random.default_rng(0)
    op = Op(OpKind.MATMUL, (), (), ())
    rule = _Plain.table[OpKind.MATMUL]
    for _ in range(200):
        sa, sb = _random_batch_shapes(rng)
        a, b = rng.integers(-9, 9, size=sa), rng.integers(-9, 9, size=sb)
        got = folded_matmul(_Plain(), rule, op, a, b, None)
        np.testing.assert_array_equal(got, np.matmul(a, b))


def test_folded_field_matmul_is_bit_identical():
    rng = np.random.default_rng(1)
    ctx = FieldContext.from_rng(rng)
    interp = FieldInterpretation(ctx)
    op = Op(OpKind.MATMUL, (), (), ())
    for _ in range(60):
        sa, sb = _random_batch_shapes(rng)
        a, b = ctx.random(sa, rng), ctx.random(sb, rng)
        got = interp.apply(op, [a, b], None)[0]  # folded by the driver
        want = FieldArray(matmul_mod(a.p, b.p, ctx.p), matmul_mod(a.q, b.q, ctx.q))
        assert got.equals(want)


def _unfused_driver_results(graph, interp, inputs):
    """run_kernel_graph with the matmul folding and accumulation fusion turned off."""
    import mugraph.semantics.interpret as interpret

    saved = interpret.deferred_matmuls, interpret.folded_matmul
    interpret.deferred_matmuls = lambda block: frozenset()
    interpret.folded_matmul = lambda i, rule, op, a, b, ctx: rule(i, op, [a, b], ctx)[0]
    try:
        return run_kernel_graph(interp, graph.ops, graph.outputs, inputs)
    finally:
        interpret.deferred_matmuls, interpret.folded_matmul = saved


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_driver_fusions_do_not_change_field_values(name):
    work = WORKLOADS[name]
    rng = np.random.default_rng(2)
    for graph in (work.optimized(work.small), work.naive(work.small)):
        ctx = FieldContext.from_rng(rng)
        inputs = [ctx.random(t.dims, rng) for t in graph.input_types]
        interp = FieldInterpretation(ctx)
        fused = run_kernel_graph(interp, graph.ops, graph.outputs, inputs)
        plain = _unfused_driver_results(graph, interp, inputs)
        assert all(x.equals(y) for x, y in zip(fused, plain, strict=True))
        floats = [rng.standard_normal(t.dims) for t in graph.input_types]
        fused_f = run_kernel_graph(reference.REFERENCE, graph.ops, graph.outputs, floats)
        plain_f = _unfused_driver_results(graph, reference.REFERENCE, floats)
        for x, y in zip(fused_f, plain_f, strict=True):
            np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-12)


def test_zero_q_components_skip_products_exactly():
    rng = np.random.default_rng(3)
    ctx = FieldContext.from_rng(rng)
    x = ctx.random((5, 7), rng, with_q=False)
    assert is_zero_view(x.q) and not x.q.flags.writeable and x.p.max() < ctx.p
    w = ctx.random((7, 3), rng)
    product = ctx.matmul(x, w)
    assert is_zero_view(product.q)
    np.testing.assert_array_equal(product.p, matmul_mod(x.p, w.p, ctx.p))
    assert q_inputs(WORKLOADS["rmsnorm_linear"].naive(WORKLOADS["rmsnorm_linear"].small)) == {0}


def test_large_random_inputs_do_not_depend_on_the_thread_count():
    from mugraph.semantics.field_arith import parallel_evaluation

    shape = (3, 1 << 19)  # more than one part
    ctx = FieldContext.from_rng(np.random.default_rng(5))
    serial = ctx.random(shape, np.random.default_rng(9))
    with parallel_evaluation(2):
        threaded = ctx.random(shape, np.random.default_rng(9))
        a = ctx.random((64, 1200), np.random.default_rng(1))
        b = ctx.random((1200, 512), np.random.default_rng(2))
        split = ctx.matmul(a, b)
    assert serial.equals(threaded)
    assert split.equals(ctx.matmul(a, b))


def _exp_program():
    g = mugraph.new_kernel_graph()
    g.mark_output(g.exp(g.new_input((4, 8))))
    return g


@pytest.mark.parametrize(("arguments", "error", "match"), [
    ({"max_rounds": 0}, mugraph.UnsupportedError, "max_rounds must be a positive integer, got 0"),
    ({"max_rounds": -1}, mugraph.UnsupportedError, "max_rounds must be a positive integer"),
    ({"max_rounds": 2.0}, mugraph.UnsupportedError, "max_rounds must be a positive integer"),
    ({"max_redraws": -1}, mugraph.UnsupportedError, "max_redraws must be an integer >= 0"),
    ({"delta": "a"}, mugraph.UnsupportedError, "delta must be in (0, 1), got 'a'"),
    ({"delta": True}, mugraph.UnsupportedError, "delta must be in (0, 1), got True"),
    ({"seed": "x"}, mugraph.UnsupportedError, "seed must be None or an integer, got 'x'"),
])
def test_verify_refuses_arguments_that_test_nothing_or_cannot_be_used(arguments, error, match):
    """No round answered "equivalent" with a false-pass bound of 1 (or 1e9 for -1 rounds);
    the others failed inside with a TypeError."""
    with pytest.raises(error, match=re.escape(match)):
        mugraph.verify(_exp_program(), _exp_program(), **arguments)
    assert mugraph.verify(_exp_program(), _exp_program(), seed=np.int64(3)).passed


def test_public_entry_points_refuse_what_is_not_a_kernel_graph(tmp_path):
    """Each failed inside with an AttributeError on the object it was given."""
    from mugraph.cache import ResultCache
    from mugraph.errors import GraphStructureError
    from mugraph.visualize import to_svg

    calls = [
        (lambda: mugraph.verify(_exp_program(), 3), "verify (the program): expected a mugraph "
         "KernelGraph, got int"),
        (lambda: mugraph.verify("best.json", _exp_program()), "verify (the candidate)"),
        (lambda: mugraph.compile({"ops": []}), "compile_graph: expected a mugraph KernelGraph, "
         "got dict"),
        (lambda: mugraph.to_text(3), "to_text: expected a mugraph KernelGraph, got int"),
        (lambda: to_svg("g"), "visualize: expected a mugraph KernelGraph, got str"),
        (lambda: ResultCache(tmp_path).get("abc"), "ResultCache.get (the program)"),
        (lambda: ResultCache(tmp_path).put(_exp_program(), None, "best"),
         "ResultCache.put (the best μGraph): expected a mugraph KernelGraph, got str"),
    ]
    for call, message in calls:
        with pytest.raises(GraphStructureError, match=re.escape(message)):
            call()
