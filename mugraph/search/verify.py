"""Probabilistic equivalence verification (paper §5): random tests over Z_p × Z_q.

``verify(candidate, program, delta)`` evaluates both graphs on fresh uniform inputs with a
fresh root of unity ω per round (Table 3 arithmetic, :mod:`mugraph.semantics.field`) and
compares every output element.

How many rounds, and what they guarantee
----------------------------------------
Each graph is analysed first (:func:`analyse`): the most exponentials on one path (LAX allows
one; two is refused with :class:`NotVerifiableError`), an estimate ``d`` of the polynomial
degrees and an estimate ``k`` of the number of exponential terms one output element sums.

* No exponential (k = 1): the difference is a rational function of degree ≤ 2d; by
  Schwartz–Zippel a non-equivalent pair agrees on a round with probability ≤ 2d/p, so
  ``ceil(ln δ / ln(2d/p))`` rounds reach δ (usually 1 or 2 with p ≈ 2^31).
* Exponentials with Theorem 3's condition ``d·k⁴ < q`` met: a round passes a non-equivalent
  pair with probability ≤ 1 - 1/k, so Theorem 4's ``≈ k·ln(1/δ)`` rounds reach δ.
* Condition not met (long softmax rows: k is the row length, 4096 in the suite, and
  k⁴ > q ≈ 2^30 for k > 181): Theorem 3 gives no bound. The rounds still run (``max_rounds``)
  and the result says ``bound=None`` with the reason — it is reported, never claimed.

``max_rounds`` caps the work; when the cap stops short of δ the result's ``bound`` is what was
achieved and ``meets_delta`` is False. A division by zero in a round is Theorem 3's event 𝓔
failing: the round is redrawn (up to ``max_redraws`` times), not counted as a pass or failure.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from mugraph.errors import GraphInputError, MugraphError, UnsupportedError
from mugraph.ir.graph import BlockGraph
from mugraph.ir.ops import AccumKind, Group, OpKind
from mugraph.semantics.field import FieldInterpretation
from mugraph.semantics.field_arith import (
    P,
    Q,
    FieldContext,
    FieldDivisionByZero,
    theorem4_rounds,
)
from mugraph.semantics.interpret import run_kernel_graph


class NotVerifiableError(UnsupportedError):
    """The program is outside what the verifier can decide (e.g. two exps on one path)."""


@dataclass(frozen=True)
class Analysis:
    """What the verifier needs to know about a graph: exps per path, degree, exp terms."""

    max_exp_depth: int
    degree: int
    terms: int
    uninterpreted: tuple[str, ...]


@dataclass
class VerificationResult:
    passed: bool
    rounds: int
    bound: float | None
    delta: float
    guarantee: str
    terms: int
    degree: int
    redraws: int = 0
    elapsed: float = 0.0
    failure: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def meets_delta(self) -> bool:
        return self.passed and self.bound is not None and self.bound <= self.delta

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        verdict = "equivalent" if self.passed else f"NOT equivalent ({self.failure})"
        bound = "no bound" if self.bound is None else f"false-pass probability <= {self.bound:.3g}"
        return (
            f"{verdict}: {self.rounds} round(s) over Z_{P} x Z_{Q}, {bound} "
            f"({self.guarantee}; k={self.terms}, d={self.degree}, {self.elapsed * 1e3:.0f} ms)"
        )


# ---- structural analysis -----------------------------------------------------------------------

_Info = tuple[int, int, int]  # (exps on the worst path, degree, exponential terms)


def _combine(kind: OpKind, ins: list[_Info], reduce_size: int, op_name: str) -> _Info:
    depth = max((i[0] for i in ins), default=0)
    if kind in Group.EXPONENTIAL:
        depth += 1
        if depth > 1:
            raise NotVerifiableError(
                f"{op_name}: a second exponential on one path (exp of a value that already "
                "contains exp, silu or gelu) is outside LAX; the verifier cannot decide it"
            )
    if kind in Group.NON_LAX:
        return depth, 1, 1  # an uninterpreted function's value is a fresh variable
    degs = [i[1] for i in ins] or [1]
    terms = [max(1, i[2]) for i in ins] or [1]
    if depth == 0:
        terms = [1] * len(terms)  # only exponential terms are counted
    if kind is OpKind.DIV:
        degree, count = sum(degs), terms[0]  # the divisor goes into the denominators g_i
    elif kind is OpKind.MATMUL or kind is OpKind.MUL:
        degree = sum(degs)
        count = math.prod(terms) * (reduce_size if depth else 1)
    elif kind is OpKind.POW:
        degree = degs[0] * 4
        count = terms[0] ** 2
    elif kind is OpKind.SQUARE:
        degree, count = degs[0] * 2, terms[0] ** 2
    elif kind in Group.EXPONENTIAL:
        degree, count = degs[0] + (3 if kind is OpKind.GELU else 1), 1
    else:  # add, sub, reductions, accumulators, data movement
        degree = max(degs)
        count = sum(terms) if kind in (OpKind.ADD, OpKind.SUB, OpKind.CONCAT) else max(terms)
        count *= reduce_size if depth else 1
    return depth, degree, count if depth else 1


def _is_sqrt_accumulator(op) -> bool:
    return op.kind is OpKind.FORLOOP_ACCUM and op.attr("acc") is AccumKind.RMS


def _reduce_size(op, dims, block: BlockGraph | None) -> int:
    kind = op.kind
    if kind is OpKind.MATMUL:
        return dims[0][-1]
    if kind is OpKind.REDUCTION:
        return dims[0][op.attr("dim")]
    if kind is OpKind.RMS_NORM:
        return math.prod(op.attr("normalized_shape"))
    if kind in Group.ACCUMULATOR and block is not None:
        acc = op.attr("acc", AccumKind.NONE)
        last = 1 if acc is AccumKind.NONE else dims[0][-1]
        return block.forloop_range * last
    return 1


def _analyse_ops(ops, tensor_dims, inputs: list[_Info], block: BlockGraph | None,
                 uninterpreted: set[str]) -> tuple[list[list[_Info]], list[_Info]]:
    values: list[list[_Info]] = []
    outs: list[_Info] = []
    for i, op in enumerate(ops):
        ins = [values[r.op][r.index] for r in op.inputs]
        dims = [tensor_dims(r) for r in op.inputs]
        name = f"{op.kind.value} (operator {i}{' of a block graph' if block else ''})"
        if op.kind is OpKind.INPUT:
            values.append([inputs[op.attr("index")]])
        elif op.kind is OpKind.BLOCK_INPUT:
            values.append([inputs[op.attr("index")]])
        elif op.kind is OpKind.BLOCK_OUTPUT:
            outs.append(ins[0])
            values.append([])
        elif op.kind is OpKind.CUSTOMIZED:
            inner: BlockGraph = op.attr("graph")
            _, inner_outs = _analyse_ops(inner.ops, inner.tensor_type_dims, ins, inner, uninterpreted)
            values.append(inner_outs)
        elif op.kind is OpKind.THREAD_GRAPH:
            info = ins
            for kind, operands, _ in op.attr("program"):
                info = info + [_combine(kind, [info[j] for j in operands], 1, name)]
                if kind in Group.NON_LAX:
                    uninterpreted.add(kind.value)
            values.append([info[-1]])
        elif _is_sqrt_accumulator(op):
            uninterpreted.add("sqrt")
            depth = max(i[0] for i in ins)
            values.append([(depth, 1, 1)])
        else:
            if op.kind in Group.NON_LAX or op.kind is OpKind.RMS_NORM:
                uninterpreted.add(op.kind.value)
            values.append([_combine(op.kind, ins, _reduce_size(op, dims, block), name)])
    return values, outs


def analyse(graph) -> Analysis:
    """Exponentials per path, degree and exponential-term estimates of a kernel graph."""
    uninterpreted: set[str] = set()
    inputs = [(0, 1, 1)] * len(graph.input_ops)
    values, _ = _analyse_ops(graph.ops, lambda r: graph.tensor_type(r).dims, inputs, None, uninterpreted)
    outs = [values[r.op][r.index] for r in graph.outputs]
    return Analysis(
        max_exp_depth=max(o[0] for o in outs),
        degree=max(o[1] for o in outs),
        terms=max(o[2] for o in outs),
        uninterpreted=tuple(sorted(uninterpreted)),
    )


def _block_dims(self: BlockGraph, ref) -> tuple[int, ...]:
    return self.ops[ref.op].outputs[ref.index].dims


BlockGraph.tensor_type_dims = _block_dims  # type: ignore[attr-defined]


def check_verifiable(graph) -> Analysis:
    """Raise NotVerifiableError when ``graph`` is outside what the verifier decides."""
    return analyse(graph)


# ---- the test ----------------------------------------------------------------------------------


def plan_rounds(a: Analysis, delta: float, max_rounds: int) -> tuple[int, float | None, str]:
    """Rounds to run, the false-pass bound they achieve (None: no bound), and why."""
    if a.terms <= 1:
        # one exponential term at most: Schwartz-Zippel in Z_p (and in Z_q for the exponent)
        modulus = P if a.max_exp_depth == 0 else Q
        per_round = min(1.0, 2 * a.degree / modulus)
        wanted = max(1, math.ceil(math.log(delta) / math.log(per_round))) if per_round < 1 else max_rounds
        rounds = min(wanted, max_rounds)
        kind = "no exponential" if a.max_exp_depth == 0 else "one exponential term"
        return rounds, per_round**rounds, f"Schwartz-Zippel ({kind})"
    if a.degree * a.terms**4 < Q:
        rounds = min(theorem4_rounds(a.terms, delta), max_rounds)
        return rounds, (1 - 1 / a.terms) ** rounds, "Theorems 3-4"
    return (
        max_rounds,
        None,
        f"Theorem 3 does not apply: d*k^4 = {a.degree}*{a.terms}^4 >= q; rounds are a heuristic",
    )


def _check_same_interface(candidate, program) -> None:
    a = [(t.dims, t.dtype) for t in candidate.input_types]
    b = [(t.dims, t.dtype) for t in program.input_types]
    if a != b:
        raise GraphInputError(f"verify: the graphs take different inputs: {a} vs {b}")
    oa = [t.dims for t in candidate.output_types]
    ob = [t.dims for t in program.output_types]
    if oa != ob:
        raise GraphInputError(f"verify: the graphs have different outputs: {oa} vs {ob}")


def verify(candidate, program, delta: float = 1e-9, *, max_rounds: int = 64,
           seed: int | None = None, max_redraws: int = 8) -> VerificationResult:
    """Test ``candidate`` against ``program`` over finite fields (see the module docstring)."""
    if not 0 < delta < 1:
        raise MugraphError(f"verify: delta must be in (0, 1), got {delta}")
    candidate.check()
    program.check()
    _check_same_interface(candidate, program)
    ca, pa = analyse(candidate), analyse(program)
    merged = Analysis(max(ca.max_exp_depth, pa.max_exp_depth), max(ca.degree, pa.degree),
                      max(ca.terms, pa.terms), tuple(sorted(set(ca.uninterpreted) | set(pa.uninterpreted))))
    rounds, bound, guarantee = plan_rounds(merged, delta, max_rounds)
    rng = np.random.default_rng(seed)
    started = time.perf_counter()
    result = VerificationResult(True, 0, bound, delta, guarantee, merged.terms, merged.degree)
    if merged.uninterpreted:
        result.notes.append(f"uninterpreted functions: {', '.join(merged.uninterpreted)}")
    while result.rounds < rounds:
        failure = _one_round(candidate, program, rng)
        if failure == "redraw":
            result.redraws += 1
            if result.redraws > max_redraws:
                raise MugraphError("verify: division by zero in every redraw; the graphs divide by zero")
            continue
        result.rounds += 1
        if failure is not None:
            result.passed, result.failure, result.bound = False, failure, None
            break
    result.elapsed = time.perf_counter() - started
    return result


def _one_round(candidate, program, rng) -> str | None:
    ctx = FieldContext.from_rng(rng)
    inputs = [ctx.random(t.dims, rng) for t in program.input_types]
    interp = FieldInterpretation(ctx)
    try:
        got = run_kernel_graph(interp, candidate.ops, candidate.outputs, inputs)
        want = run_kernel_graph(interp, program.ops, program.outputs, inputs)
    except FieldDivisionByZero:
        return "redraw"
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        a = a.broadcast_to(b.shape) if a.shape != b.shape else a
        if not a.equals(b):
            bad = int(np.count_nonzero((a.p != b.p) | (a.q != b.q)))
            return f"output {i} differs in {bad} of {b.size} elements"
    return None
