"""Probabilistic equivalence verification (paper §5): random tests over Z_p × Z_q.

``verify(candidate, program, delta)`` evaluates both graphs on fresh uniform inputs with a
fresh root of unity ω per round (Table 3 arithmetic, :mod:`mugraph.semantics.field`) and
compares every output element.

How many rounds, and what they guarantee
----------------------------------------
Each graph is analysed first (:func:`analyse`): every output element is summarised in the
normal form (2) of the paper with its denominators kept apart, ``N / (G·M)``: ``N`` a sum of
``n`` terms ``F_i·e^{E_i}``, ``M`` a sum of ``m`` such terms (``m = 1``: no exponential in the
denominator), ``G`` a polynomial, exponents ``E = H/U``, with bounds on every polynomial's degree
(:class:`Form`). A path with two exponentials is refused with :class:`NotVerifiableError`
(LAX allows one). The two programs' outputs are then compared as Theorem 3 needs it
(:func:`difference`): ``A = B`` at a point where the denominators are not zero exactly when
``N_A·G_B·M_B − N_B·G_A·M_A = 0`` there, an expression of form (2) with no denominators,
``k = n_A·m_B + n_B·m_A`` exponential terms and polynomials of degree ``d``. Both are upper
bounds, as Theorem 3 allows (terms with equal exponents merge into fewer).

* No exponential anywhere (k = 1): the difference is a polynomial of degree ≤ d; by
  Schwartz–Zippel a non-equivalent pair agrees on a round with probability ≤ d/p, so
  ``ceil(ln δ / ln(d/p))`` rounds reach δ (one or two with p ≈ 2^31).
* Exponentials, with Theorem 3's condition ``d·k⁴ < q`` met: a round passes a
  non-equivalent pair with probability ≤ 1 − 1/k (Theorem 3's o(1/k) dropped, as Theorem 4
  does), so ``≈ k·ln(1/δ)`` rounds reach δ. Note that k ≥ 2 as soon as either side has an
  exponential (silu alone is x/(1 + e^{-x}): k = 4 for silu against silu), so this is many
  rounds: Theorem 3's bound is weak, and it is the one claimed.
* Condition not met (long softmax rows: k grows with the row length, and k⁴ > q ≈ 2^30 for
  k > 181), or a sum of fractions whose exponential denominators differ term by term (their
  common denominator has too many terms): Theorem 3 gives no bound. The rounds still run
  (``max_rounds``) and the result says ``bound=None`` with the reason — reported, never
  claimed.

Non-LAX operators (relu, clamp, sqrt, non-integer pow) are uninterpreted functions of their
field value; the bound then treats each distinct application as a fresh variable (as Mirage
cuts programs into LAX pieces at such operators), and a note says so. Max is modelled as the
maximum under a keyed random order and is analysed as the element it returns.

``max_rounds`` caps the work; when the cap stops short of δ the result's ``bound`` is what was
achieved and ``meets_delta`` is False. A division by zero in a round is Theorem 3's event 𝓔
failing: the round is redrawn, not counted as a pass or a failure; after ``max_redraws``
draws in a row divide by zero the result is a failure that names the graph at fault (a graph
that divides by an expression that is zero everywhere has no value to compare).

Which primes: p ≈ 2^31 (``field_arith.P``, ``Q``) or the small pair p ≈ 2^21, whose products
take one float64 GEMM instead of two (``field_arith.P_SMALL``). :func:`choose_primes` takes the
small pair only where it needs as many rounds as the large one to reach δ: low-degree
polynomials, Theorems 3-4 with ``d·k⁴ < 2^20``. Heuristic rounds keep the large field. A run
over the small pair that only met zero divisors (1024 times likelier there) is run again over
the large one.

Speed: every input whose Z_q component cannot reach an exponent, a divisor or an
uninterpreted function gets a zero Z_q component, which the products skip
(:func:`q_inputs`); the inputs' memory is reused from round to round and from one call to
the next (:class:`InputBuffers`; never while a value in it is alive), as is the memory of large
results (``field_arith.recycled_empty``);
the rounds run under ``field_arith.parallel_evaluation``; and each round evaluates both graphs
in one fast :class:`~mugraph.semantics.field_arith.FieldContext` (candidate first): components
are computed only when read, the two graphs share their products (also of operands equal in
value in other memory), exponentials, squares and identical kernel operators (in any tiling),
large elementwise results are computed block by block in cache, and large inputs are drawn as
float64 for the products. None
of it changes a value (``tests/test_verify_fast.py`` compares it with the straightforward
evaluation). A search verifies its candidates with :class:`ProgramRounds`, which keeps the
program's side of each round for the next candidate.
"""

from __future__ import annotations

import functools
import math
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from mugraph.errors import GraphInputError, UnsupportedError
from mugraph.ir.builder import expect_kernel_graph
from mugraph.ir.graph import BlockGraph, Op
from mugraph.ir.ops import AccumKind, Group, OpKind
from mugraph.semantics.field import FieldInterpretation
from mugraph.semantics.field_arith import (
    P_SMALL,
    Q_SMALL,
    FieldContext,
    FieldDivisionByZero,
    KeptProducts,
    P,
    Q,
    parallel_evaluation,
    theorem4_rounds,
)
from mugraph.semantics.field_arith import release_memory as release_field_memory
from mugraph.semantics.interpret import run_kernel_graph
from mugraph.semantics.partition import LEAD


class NotVerifiableError(UnsupportedError):
    """The program is outside what the verifier can decide (e.g. two exps on one path)."""


# ---- the normal form of one output element -----------------------------------------------------

_CAP = 1 << 62  # counts and degrees saturate here (far beyond any bound Theorem 3 gives)


def _cap(x: int) -> int:
    return min(int(x), _CAP)


@dataclass(frozen=True)
class Form:
    """Bounds on one element of a value written as ``N / (G·M)`` (paper eq. (2)).

    ``N = Σ_{i<n} F_i·e^{E_i}`` and ``M = Σ_{j<m} F'_j·e^{E'_j}`` with polynomials ``F_i`` of
    degree ≤ ``deg`` and ``F'_j`` ≤ ``mdeg``, a polynomial ``G`` of degree ≤ ``gdeg`` and
    exponents ``E = H/U`` with ``deg H ≤ eh``, ``deg U ≤ eu``. ``depth`` counts exponentials on
    the worst path; ``axes`` (negative, counted from the last) are the axes along which the
    denominator ``G·M`` may vary — a sum along any other axis keeps one common denominator.
    """

    depth: int = 0
    n: int = 1
    m: int = 1
    deg: int = 1
    mdeg: int = 0
    gdeg: int = 0
    eh: int = 0
    eu: int = 0
    axes: frozenset[int] = frozenset()

    @property
    def has_den(self) -> bool:
        return self.gdeg > 0 or self.m > 1 or self.mdeg > 0

    def normal(self) -> Form:
        """Saturated counts; without an exponential every term is e^0 and they merge. (A
        function of the form's fields: computed once per distinct form, as a search's
        candidates repeat a few forms many times.)"""
        return _normal(self)

    def _normal(self) -> Form:
        f = replace(self, **{k: _cap(getattr(self, k)) for k in _COUNTS})
        if f.depth == 0:
            f = replace(f, n=1, m=1, gdeg=_cap(f.gdeg + f.mdeg), mdeg=0, eh=0, eu=0)
        return f if f.has_den else replace(f, axes=frozenset())


_COUNTS = ("n", "m", "deg", "mdeg", "gdeg", "eh", "eu")
_normal = functools.lru_cache(maxsize=1 << 16)(Form._normal)  # (counts saturate: forms are few)
CONSTANT = Form(deg=0)
VARIABLE = Form()


def _exponents(a: Form, b: Form) -> tuple[int, int]:
    """Degrees of E_a + E_b = (H_a·U_b + H_b·U_a) / (U_a·U_b)."""
    if a.depth == 0:
        return b.eh, b.eu
    if b.depth == 0:
        return a.eh, a.eu
    return max(a.eh + b.eu, b.eh + a.eu), a.eu + b.eu


def _mul(a: Form, b: Form) -> Form:
    eh, eu = _exponents(a, b)
    return Form(
        max(a.depth, b.depth),
        a.n * b.n,
        a.m * b.m,
        a.deg + b.deg,
        a.mdeg + b.mdeg,
        a.gdeg + b.gdeg,
        eh,
        eu,
        a.axes | b.axes,
    ).normal()


def _add(a: Form, b: Form) -> Form:
    """N_a/(G_a M_a) + N_b/(G_b M_b) = (N_a G_b M_b + N_b G_a M_a) / (G_a G_b M_a M_b)."""
    eh, eu = _exponents(a, b)
    depth = max(a.depth, b.depth)
    if not a.has_den and not b.has_den:
        return Form(depth, a.n + b.n, 1, max(a.deg, b.deg), 0, 0, eh, eu).normal()
    return Form(
        depth,
        a.n * b.m + b.n * a.m,
        a.m * b.m,
        max(a.deg + b.gdeg + b.mdeg, b.deg + a.gdeg + a.mdeg),
        a.mdeg + b.mdeg,
        a.gdeg + b.gdeg,
        eh,
        eu,
        a.axes | b.axes,
    ).normal()


def _div(a: Form, b: Form, varying: frozenset[int]) -> Form:
    """a / b = N_a G_b M_b / (G_a M_a N_b); a one-term N_b = F·e^E becomes e^{-E} / F."""
    depth = max(a.depth, b.depth)
    axes = a.axes | b.axes | varying
    num = a.deg + b.gdeg + b.mdeg
    if b.n == 1:
        # numerator exponents E_a + E'_b − E_b: two of b's exponents when M_b has terms
        two = replace(b, eh=b.eh + b.eu, eu=2 * b.eu) if b.m > 1 and b.eu else b
        eh, eu = _exponents(a, two)
        return Form(depth, a.n * b.m, a.m, num, a.mdeg, a.gdeg + b.deg, eh, eu, axes).normal()
    eh, eu = _exponents(a, b)
    return Form(depth, a.n * b.m, a.m * b.n, num, a.mdeg + b.deg, a.gdeg, eh, eu, axes).normal()


def _power(a: Form, e: int) -> Form:
    """a^e for an integer e >= 0 (closed form of e - 1 products)."""
    if e == 0:
        return CONSTANT
    eh, eu = (a.eh + (e - 1) * a.eu, e * a.eu) if a.eu else (a.eh, 0)
    return Form(
        a.depth,
        a.n ** min(e, 64),
        a.m ** min(e, 64),
        e * a.deg,
        e * a.mdeg,
        e * a.gdeg,
        eh,
        eu,
        a.axes,
    ).normal()


def _sum(a: Form, axis: int, length: int, shared_den: bool | None = None) -> Form:
    """The sum of ``length`` elements of ``a`` along ``axis`` (kept as a size-1 axis)."""
    if length <= 1:
        return a
    axes = a.axes - {axis}
    shared = (axis not in a.axes) if shared_den is None else shared_den
    if not a.has_den or shared:
        # Σ N_j / (G·M): one denominator; terms of equal exponent merge, degrees stay
        return replace(a, n=_cap(a.n * length), axes=axes).normal()
    extra = length - 1  # the closed form of length - 1 additions of fractions
    eh, eu = (a.eh + extra * a.eu, length * a.eu) if a.eu else (a.eh, 0)
    return Form(
        a.depth,
        length * a.n * _big_power(a.m, extra),
        _big_power(a.m, length),
        a.deg + extra * (a.gdeg + a.mdeg),
        length * a.mdeg,
        length * a.gdeg,
        eh,
        eu,
        axes,
    ).normal()


def _big_power(base: int, e: int) -> int:
    if base <= 1:
        return 1
    return _CAP if e * math.log2(base) >= 62 else base**e


def _fresh(a: Form) -> Form:
    """An uninterpreted function's value: a fresh variable (the path keeps its exp count)."""
    return Form(depth=a.depth)


def _exp_of(a: Form, what: str) -> tuple[int, int]:
    if a.depth:
        raise NotVerifiableError(
            f"{what}: a second exponential on one path (exp of a value that already contains "
            "exp, silu or gelu) is outside LAX; the verifier cannot decide it"
        )
    return a.deg, a.gdeg  # the exponent F / G


# ---- rules: the form of an operator's result, keyed by OpKind -----------------------------------

Shape = tuple[int, ...]


@dataclass(frozen=True)
class _Site:
    """Where an operator is analysed: its name for messages and its block graph, if any."""

    name: str
    block: BlockGraph | None = None


def _varying(shape: Shape) -> frozenset[int]:
    """Axes (negative) along which a value of ``shape`` may vary: those longer than 1."""
    return frozenset(-(i + 1) for i, s in enumerate(reversed(shape)) if s > 1)


def _axis(op: Op, shape: Shape) -> int:
    """An operator's ``dim`` attribute as a negative axis of its (lead + tile) input shape."""
    rank = len(op.outputs[0].dims)
    return op.attr("dim") % rank - rank if rank else -1


def _matmul_rule(op, ins, shapes, out, site) -> Form:
    a, b = ins
    shared = -1 not in a.axes and -2 not in b.axes
    axes = {x for x in a.axes | b.axes if x <= -3} | ({-2} & a.axes) | ({-1} & b.axes)
    product = replace(_mul(a, b), axes=frozenset(axes))
    return _sum(product, 0, shapes[0][-1], shared_den=shared)


def _reduction_rule(op, ins, shapes, out, site) -> Form:
    axis = _axis(op, shapes[0])
    return _sum(ins[0], axis, shapes[0][axis])


def _reduction_max_rule(op, ins, shapes, out, site) -> Form:
    return replace(ins[0], axes=ins[0].axes - {_axis(op, shapes[0])})


def _rms_norm_rule(op, ins, shapes, out, site) -> Form:
    count = len(op.attr("normalized_shape"))
    rows = frozenset(x for x in _varying(shapes[0]) if x < -count)
    return _div(ins[0], _fresh(ins[0]), rows)


def _concat_rule(op, ins, shapes, out, site) -> Form:
    a, b = ins
    joined = {k: max(getattr(a, k), getattr(b, k)) for k in ("depth", *_COUNTS)}
    seam = {_axis(op, shapes[0])} if a.has_den or b.has_den else set()
    return Form(**joined, axes=a.axes | b.axes | frozenset(seam)).normal()


def _reshape_rule(op, ins, shapes, out, site) -> Form:
    return replace(ins[0], axes=_varying(out)).normal()


def _permute_rule(op, ins, shapes, out, site) -> Form:
    """The denominator varies along the same dims, now at their new places."""
    perm = op.attr("perm")
    rank = len(perm)
    moved = {perm.index(rank + axis) - rank for axis in ins[0].axes if -rank <= axis}
    return replace(ins[0], axes=frozenset(moved | {a for a in ins[0].axes if a < -rank}))


def _loop_axis(shape: Shape) -> int:
    return -len(shape)  # the for-loop axis F leads every block value


def _accum_rule(op, ins, shapes, out, site) -> Form:
    acc, shape = op.attr("acc"), shapes[0]
    total = _sum(ins[0], _loop_axis(shape), shape[0])
    if acc is AccumKind.NONE:
        return total
    if acc is AccumKind.RMS:
        return _fresh(total)
    dimx = site.block.reduction_dimx if site.block else 1
    length = shape[-1] // dimx if acc is AccumKind.SUM_TODIMX else shape[-1]
    return _sum(total, -1, length)


def _accum_max_rule(op, ins, shapes, out, site) -> Form:
    return replace(ins[0], axes=ins[0].axes - {_loop_axis(shapes[0])})


def _accum_rescale_rule(op, ins, shapes, out, site) -> Form:
    """Σ_f x_f·Π_{g>f} s_g: each iteration's term carries its own product of scales."""
    x, scale = ins
    if op.attr("acc") is AccumKind.SUM:
        x = _sum(x, -1, shapes[0][-1])
    loops = site.block.forloop_range if site.block else 1
    term = _mul(x, _power(scale, loops - 1))
    return _sum(term, _loop_axis(shapes[0]), loops, shared_den=not term.has_den)


def _exp_rule(op, ins, shapes, out, site) -> Form:
    eh, eu = _exp_of(ins[0], site.name)
    return Form(depth=1, deg=0, eh=eh, eu=eu)


def _silu_rule(op, ins, shapes, out, site) -> Form:
    """x / (1 + e^{-x}): one numerator term, two denominator terms."""
    a = ins[0]
    eh, eu = _exp_of(a, site.name)
    return Form(1, 1, 2, a.deg, 0, a.gdeg, eh, eu, a.axes | _varying(shapes[0])).normal()


def _gelu_rule(op, ins, shapes, out, site) -> Form:
    """x·e^{2z} / (e^{2z} + 1) with z = c·(x + 0.044715·x³) (degree 3 in x)."""
    a = ins[0]
    _exp_of(a, site.name)
    eh, eu = 3 * max(a.deg, a.gdeg), 3 * a.gdeg
    return Form(1, 1, 2, a.deg, 0, a.gdeg, eh, eu, a.axes | _varying(shapes[0])).normal()


def _integral(e) -> bool:
    """Whether pow's exponent is a non-negative integer (else pow is uninterpreted)."""
    return float(e).is_integer() and e >= 0


def _pow_rule(op, ins, shapes, out, site) -> Form:
    e = op.attr("exponent")
    return _power(ins[0], int(e)) if _integral(e) else _fresh(ins[0])


def _div_rule(op, ins, shapes, out, site) -> Form:
    a, b = ins
    return _div(a, b, _varying(shapes[1]) if b.deg or b.depth or b.has_den else frozenset())


_Rule = Callable[[Op, list[Form], list[Shape], Shape, _Site], Form]

RULES: dict[OpKind, _Rule] = {
    OpKind.MATMUL: _matmul_rule,
    OpKind.EXP: _exp_rule,
    OpKind.SQUARE: lambda op, ins, shapes, out, site: _mul(ins[0], ins[0]),
    OpKind.SQRT: lambda op, ins, shapes, out, site: _fresh(ins[0]),
    OpKind.SILU: _silu_rule,
    OpKind.GELU: _gelu_rule,
    OpKind.RELU: lambda op, ins, shapes, out, site: _fresh(ins[0]),
    OpKind.CLAMP: lambda op, ins, shapes, out, site: _fresh(ins[0]),
    OpKind.MUL_SCALAR: lambda op, ins, shapes, out, site: ins[0],
    OpKind.POW: _pow_rule,
    OpKind.ADD: lambda op, ins, shapes, out, site: _add(*ins),
    OpKind.SUB: lambda op, ins, shapes, out, site: _add(*ins),
    OpKind.MUL: lambda op, ins, shapes, out, site: _mul(*ins),
    OpKind.DIV: _div_rule,
    OpKind.REDUCTION: _reduction_rule,
    OpKind.REDUCTION_MAX: _reduction_max_rule,
    OpKind.RMS_NORM: _rms_norm_rule,
    OpKind.CONCAT: _concat_rule,
    OpKind.RESHAPE: _reshape_rule,
    OpKind.PERMUTE: _permute_rule,
    OpKind.FORLOOP_ACCUM: _accum_rule,
    OpKind.FORLOOP_ACCUM_MAX: _accum_max_rule,
    OpKind.FORLOOP_ACCUM_RESCALE: _accum_rescale_rule,
}


def _uninterpreted_name(kind: OpKind, attrs: dict) -> str | None:
    """The uninterpreted function an operator applies, if any (the field semantics' names)."""
    if kind in Group.NON_LAX:
        return "max" if kind in (OpKind.REDUCTION_MAX, OpKind.FORLOOP_ACCUM_MAX) else kind.value
    if kind is OpKind.RMS_NORM or (
        kind is OpKind.FORLOOP_ACCUM and attrs.get("acc") is AccumKind.RMS
    ):
        return "sqrt"
    if kind is OpKind.POW and not _integral(attrs["exponent"]):
        return "pow"
    return None


# ---- walking graphs ----------------------------------------------------------------------------

_Value = tuple[Form, Shape]


def _lead(op: Op, block: BlockGraph) -> Shape:
    """Lead sizes (F, gx, gy, gz) of a block input: the axes its imap / forloop_dim split."""
    imap, fdim = op.attr("imap"), op.attr("forloop_dim")
    grid = tuple(g if mapped >= 0 else 1 for g, mapped in zip(block.grid_dim, imap, strict=True))
    return (block.forloop_range if fdim >= 0 else 1, *grid)


def _with_axes(form: Form, shape: Shape) -> Form:
    """A value moved across a kernel boundary: its denominator may vary along any axis."""
    return replace(form, axes=_varying(shape)).normal()


class _Walker:
    """Computes the :class:`Form` of every value of a kernel graph and its block graphs."""

    def __init__(self) -> None:
        self.uninterpreted: set[str] = set()

    def kernel(self, graph) -> list[Form]:
        inputs = [(VARIABLE, op.outputs[0].dims) for op in graph.input_ops]
        values: list[list[_Value]] = []
        for i, op in enumerate(graph.ops):
            args = [values[r.op][r.index] for r in op.inputs]
            if op.kind is OpKind.INPUT:
                values.append([inputs[op.attr("index")]])
            elif op.kind is OpKind.CUSTOMIZED:
                values.append(self.block(op, args, i))
            else:
                out = op.outputs[0].dims
                values.append(
                    [(self.apply(op, args, out, _Site(f"{op.kind.value} (operator {i})")), out)]
                )
        return [values[r.op][r.index][0] for r in graph.outputs]

    def block(self, kernel_op: Op, args: list[_Value], at: int) -> list[_Value]:
        block: BlockGraph = kernel_op.attr("graph")
        values: list[list[_Value]] = []
        outs: list[_Value] = []
        for i, op in enumerate(block.ops):
            ins = [values[r.op][r.index] for r in op.inputs]
            if op.kind is OpKind.BLOCK_INPUT:
                shape = _lead(op, block) + op.outputs[0].dims
                values.append([(_with_axes(args[op.attr("index")][0], shape), shape)])
            elif op.kind is OpKind.BLOCK_OUTPUT:
                kernel_shape = kernel_op.outputs[len(outs)].dims
                outs.append((_with_axes(ins[0][0], kernel_shape), kernel_shape))
                values.append([])
            else:
                lead = np.broadcast_shapes(*(s[:LEAD] for _, s in ins))
                if op.kind in Group.ACCUMULATOR:
                    lead = (1, *lead[1:])
                out = tuple(lead) + op.outputs[0].dims
                site = _Site(
                    f"{op.kind.value} (operator {i} of the block graph of operator {at})", block
                )
                values.append([(self.apply(op, ins, out, site), out)])
        return outs

    def apply(self, op: Op, args: list[_Value], out: Shape, site: _Site) -> Form:
        if op.kind is OpKind.THREAD_GRAPH:
            return self.thread_graph(op, args, site)
        self._note(op.kind, dict(op.attrs))
        rule = RULES.get(op.kind)
        if rule is None:
            raise NotVerifiableError(f"{site.name}: the verifier does not know this operator")
        return rule(op, [f for f, _ in args], [s for _, s in args], out, site)

    def thread_graph(self, op: Op, args: list[_Value], site: _Site) -> Form:
        values = list(args)
        for kind, operands, attrs in op.attr("program"):
            step = Op(kind, (), attrs, ())
            ins = [values[j] for j in operands]
            shape = tuple(np.broadcast_shapes(*(s for _, s in ins)))
            self._note(kind, dict(attrs))
            form = RULES[kind](step, [f for f, _ in ins], [s for _, s in ins], shape, site)
            values.append((form, shape))
        return values[-1][0]

    def _note(self, kind: OpKind, attrs: dict) -> None:
        name = _uninterpreted_name(kind, attrs)
        if name:
            self.uninterpreted.add(name)


# ---- analysis and round planning --------------------------------------------------------------


@dataclass(frozen=True)
class Analysis:
    """What the verifier knows about a graph (or, from :func:`difference`, about a pair).

    ``max_exp_depth``: exponentials on the worst path. ``degree``: the largest polynomial
    degree of the normal form. ``terms``: the most exponential terms of a numerator or
    denominator (for a pair: Theorem 3's k of the difference). ``outputs``: one
    :class:`Form` per output (empty for a pair).
    """

    max_exp_depth: int
    degree: int
    terms: int
    uninterpreted: tuple[str, ...]
    outputs: tuple[Form, ...] = ()


def _degree(f: Form) -> int:
    return max(f.deg, f.gdeg, f.mdeg, f.eh, f.eu)


def analyse(graph) -> Analysis:
    """The normal-form bounds of every output of ``graph`` (raises NotVerifiableError for a
    path with two exponentials)."""
    walker = _Walker()
    outs = tuple(walker.kernel(graph))
    return Analysis(
        max_exp_depth=max(f.depth for f in outs),
        degree=max(_degree(f) for f in outs),
        terms=max(max(f.n, f.m) for f in outs),
        uninterpreted=tuple(sorted(walker.uninterpreted)),
        outputs=outs,
    )


def check_verifiable(graph) -> Analysis:
    """Raise NotVerifiableError when ``graph`` is outside what the verifier decides."""
    return analyse(graph)


def _pair(a: Form, b: Form) -> tuple[int, int]:
    """(k, d) of N_a·G_b·M_b − N_b·G_a·M_a, the cleared difference of two outputs."""
    d = max(a.deg + b.gdeg + b.mdeg, b.deg + a.gdeg + a.mdeg)
    if a.depth == 0 and b.depth == 0:
        return 1, d
    eh, eu = _exponents(a, b)
    return _cap(a.n * b.m + b.n * a.m), max(d, eh, eu)


def difference(candidate: Analysis, program: Analysis) -> Analysis:
    """The bounds Theorem 3 needs for the pair: the worst output's k and d."""
    pairs = [_pair(a, b) for a, b in zip(candidate.outputs, program.outputs, strict=True)]
    return Analysis(
        max_exp_depth=max(candidate.max_exp_depth, program.max_exp_depth),
        degree=max(d for _, d in pairs),
        terms=max(k for k, _ in pairs),
        uninterpreted=tuple(sorted(set(candidate.uninterpreted) | set(program.uninterpreted))),
    )


def plan_rounds(
    a: Analysis, delta: float, max_rounds: int, *, p: int = P, q: int = Q
) -> tuple[int, float | None, str]:
    """Rounds to run, the false-pass bound they achieve (None: no bound), and why.

    ``a`` describes a pair (:func:`difference`); ``p``, ``q`` are the primes of the test.
    """
    if a.max_exp_depth == 0:
        per_round = min(1.0, max(1, a.degree) / p)
        if per_round >= 1:
            return max_rounds, None, f"Schwartz-Zippel gives nothing: degree {a.degree} >= p"
        rounds = min(max(1, math.ceil(math.log(delta) / math.log(per_round))), max_rounds)
        return rounds, per_round**rounds, f"Schwartz-Zippel: no exponential, degree {a.degree}"
    if a.terms < _CAP and a.degree * a.terms**4 < q:
        rounds = min(theorem4_rounds(a.terms, delta), max_rounds)
        why = f"Theorems 3-4: k={a.terms}, d={a.degree}, d*k^4 < q; per round 1-1/k"
        return rounds, (1 - 1 / a.terms) ** rounds, why
    k = f"{a.terms}" if a.terms < _CAP else ">= 2^62"
    return (
        max_rounds,
        None,
        f"Theorem 3 does not apply: d*k^4 >= q (k={k}, d={a.degree}); rounds are a heuristic",
    )


LARGE_PRIMES = (P, Q)
SMALL_PRIMES = (P_SMALL, Q_SMALL)
_UNCAPPED = 1 << 62  # max_rounds of a plan made without a cap


def choose_primes(pair: Analysis, delta: float) -> tuple[int, int]:
    """The small primes (a single float64 GEMM per product, see
    :mod:`mugraph.semantics.field_arith`) where they give ``pair`` the plan the large ones
    give for ``delta`` — as many rounds, with a bound within ``delta`` — else the large ones
    (always where no bound exists: the heuristic rounds keep the larger field). Plans are
    compared uncapped, so the choice does not depend on a caller's ``max_rounds``."""
    rounds, bound, _ = plan_rounds(pair, delta, _UNCAPPED, p=P, q=Q)
    small_rounds, small_bound, _ = plan_rounds(pair, delta, _UNCAPPED, p=P_SMALL, q=Q_SMALL)
    if bound is None or small_bound is None or small_rounds != rounds or small_bound > delta:
        return LARGE_PRIMES
    return SMALL_PRIMES


def rounds_for(candidate, program, delta: float) -> tuple[int, float | None, str]:
    """The rounds :func:`verify` plans for ``delta`` without a cap (for reports)."""
    pair = difference(analyse(candidate), analyse(program))
    return plan_rounds(pair, delta, _UNCAPPED)


# ---- which inputs need a Z_q component ----------------------------------------------------------

_Q_ALL_OPERANDS = Group.EXPONENTIAL | Group.NON_LAX | {OpKind.RMS_NORM, OpKind.POW}


def _q_operands(kind: OpKind, attrs: dict, count: int) -> tuple[int, ...]:
    """Operands whose Z_q component can change the Z_p component of the result (exponents,
    uninterpreted functions, the max order), or that are divisors."""
    if kind in _Q_ALL_OPERANDS:
        return tuple(range(count))
    if kind is OpKind.FORLOOP_ACCUM and attrs.get("acc") is AccumKind.RMS:
        return (0,)
    if kind is OpKind.DIV:
        return (1,)
    return ()


def q_inputs(graph) -> frozenset[int]:
    """Kernel inputs whose Z_q component matters: those that reach an exponent, a divisor or an
    uninterpreted function. The others can take a zero Z_q component: a Z_q value then only
    flows through sums and products into outputs, where both graphs compute it alike."""
    needed = 0

    def visit(kind: OpKind, attrs: dict, masks: list[int]) -> int:
        nonlocal needed
        for j in _q_operands(kind, attrs, len(masks)):
            needed |= masks[j]
        return _union(masks)

    def walk(ops, inputs: list[int]) -> list[int]:
        values: list[list[int]] = []
        outs: list[int] = []
        for op in ops:
            ins = [values[r.op][r.index] for r in op.inputs]
            if op.kind in (OpKind.INPUT, OpKind.BLOCK_INPUT):
                values.append([inputs[op.attr("index")]])
            elif op.kind is OpKind.BLOCK_OUTPUT:
                outs.append(ins[0])
                values.append([])
            elif op.kind is OpKind.CUSTOMIZED:
                values.append(walk(op.attr("graph").ops, ins))
            elif op.kind is OpKind.THREAD_GRAPH:
                steps = list(ins)
                for kind, operands, attrs in op.attr("program"):
                    steps.append(visit(kind, dict(attrs), [steps[j] for j in operands]))
                values.append([steps[-1]])
            else:
                values.append([visit(op.kind, dict(op.attrs), ins)] * len(op.outputs))
        return outs

    walk(graph.ops, [1 << i for i in range(len(graph.input_ops))])
    return frozenset(i for i in range(len(graph.input_ops)) if needed >> i & 1)


def _union(masks: Sequence[int]) -> int:
    out = 0
    for m in masks:
        out |= m
    return out


# ---- the test ----------------------------------------------------------------------------------


@dataclass
class VerificationResult:
    """The verdict, the rounds run and the false-pass bound they give (None: no bound)."""

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
    primes: tuple[int, int] = (P, Q)

    @property
    def meets_delta(self) -> bool:
        return self.passed and self.bound is not None and self.bound <= self.delta

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        verdict = "equivalent" if self.passed else f"NOT equivalent ({self.failure})"
        bound = "no bound" if self.bound is None else f"false-pass probability <= {self.bound:.3g}"
        return (
            f"{verdict}: {self.rounds} round(s) over Z_{self.primes[0]} x Z_{self.primes[1]}, "
            f"{bound} "
            f"({self.guarantee}; k={self.terms}, d={self.degree}, {self.elapsed * 1e3:.0f} ms)"
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


def verify(
    candidate,
    program,
    delta: float = 1e-9,
    *,
    max_rounds: int = 64,
    seed: int | None = None,
    max_redraws: int = 8,
    primes: tuple[int, int] | None = None,
) -> VerificationResult:
    """Test ``candidate`` against ``program`` over finite fields (see the module docstring).

    ``primes``: (p, q) with q | p - 1 and p < 2^31 (the bound is computed for the primes
    used); None: :func:`choose_primes` (the small pair where it plans the same rounds, and the
    large pair again, on fresh rounds, if the small one met a zero divisor in every draw)."""
    _check_arguments(candidate, program, delta, max_rounds, seed, max_redraws)
    candidate.check()
    program.check()
    _check_same_interface(candidate, program)
    pair = difference(analyse(candidate), analyse(program))
    chosen = primes or choose_primes(pair, delta)
    q_needed = q_inputs(candidate) | q_inputs(program)
    with input_buffers() as buffers:
        fresh = _FreshRounds(program, q_needed, seed, chosen, buffers)
        return _run_fresh(candidate, pair, fresh, delta, max_rounds, max_redraws,
                          fallback=primes is None)


def _run_fresh(candidate, pair, fresh, delta, max_rounds, max_redraws, *, fallback: bool):
    """:func:`_run_rounds` on ``fresh`` rounds, and (``fallback``) again on rounds of the same
    seed over the large primes when the small ones were voided by zero divisors."""
    result = _run_rounds(candidate, pair, fresh, delta, max_rounds, max_redraws)
    if fallback and voided_in_small_field(result):
        fresh = fresh.over(LARGE_PRIMES)
        result = _run_rounds(candidate, pair, fresh, delta, max_rounds, max_redraws)
    return result


def voided_in_small_field(result: VerificationResult) -> bool:
    """A run over the small primes that ended in zero divisors alone (they are 1024 times
    likelier there): it decides nothing, the large primes are tried."""
    return result.primes == SMALL_PRIMES and result.failure is not None and (
        result.failure.startswith(_VOIDED)
    )


def _check_delta(delta: float) -> None:
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0 < delta < 1:
        raise UnsupportedError(f"verify: delta must be in (0, 1), got {delta!r}")


def _check_arguments(candidate, program, delta, max_rounds, seed, max_redraws) -> None:
    """What :func:`verify` is given: two kernel graphs, δ in (0, 1), at least one round (no
    round tests nothing: it would call any pair equivalent), a whole-number seed."""
    expect_kernel_graph(candidate, "verify (the candidate)")
    expect_kernel_graph(program, "verify (the program)")
    _check_delta(delta)
    if not _integer(max_rounds) or max_rounds < 1:
        raise UnsupportedError(f"verify: max_rounds must be a positive integer, got {max_rounds!r}")
    if not _integer(max_redraws) or max_redraws < 0:
        raise UnsupportedError(f"verify: max_redraws must be an integer >= 0, got {max_redraws!r}")
    if seed is not None and not _integer(seed):
        raise UnsupportedError(f"verify: seed must be None or an integer, got {seed!r}")


def _integer(value) -> bool:
    """An int (or NumPy integer), not a bool."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


_VOIDED = "division by zero"


def _run_rounds(candidate, pair: Analysis, rounds, delta, max_rounds, max_redraws):
    """The rounds :func:`plan_rounds` asks for, drawn from ``rounds`` (its ``compare(candidate,
    attempt)`` answers as :func:`_one_round` does), until one differs."""
    p, q = rounds.primes
    planned, bound, guarantee = plan_rounds(pair, delta, max_rounds, p=p, q=q)
    result = VerificationResult(
        True, 0, bound, delta, guarantee, pair.terms, pair.degree, primes=(p, q)
    )
    if pair.uninterpreted:
        result.notes.append(
            f"uninterpreted functions ({', '.join(pair.uninterpreted)}): the bound treats each "
            "distinct application as a fresh variable (max as the element it returns)"
        )
    started = time.perf_counter()
    in_a_row = attempt = 0
    while result.rounds < planned:
        with parallel_evaluation():
            failure = rounds.compare(candidate, attempt)
        attempt += 1
        if isinstance(failure, _Redraw):
            result.redraws += 1
            in_a_row += 1
            if in_a_row > max_redraws:
                result.passed, result.bound = False, None
                result.failure = f"{_VOIDED} in {in_a_row} draws in a row ({failure})"
                break
            continue
        in_a_row = 0
        result.rounds += 1
        if failure is not None:
            result.passed, result.failure, result.bound = False, failure, None
            break
    result.elapsed = time.perf_counter() - started
    return result


class _Redraw(str):
    """_one_round's answer when a division by zero voids the round (Theorem 3's event 𝓔)."""


def _evaluate(graph, interp, inputs) -> list[Any] | FieldDivisionByZero:
    """The graph's outputs with both components computed (a deferred value is computed here),
    or the division by zero that voids the round."""
    try:
        outputs = run_kernel_graph(interp, graph.ops, graph.outputs, inputs)
        for value in outputs:
            value.p, value.q  # noqa: B018 - computes the deferred components
        return outputs
    except FieldDivisionByZero as error:
        return error


class InputBuffers:
    """Memory for the random inputs, reused round after round (fresh memory for tens of
    millions of elements costs more in page faults than drawing the values).

    A buffer is handed out again only when nothing but this object refers to it: no value,
    view or memo entry of an earlier round is alive (NumPy views keep their owner alive, so
    its reference count tells).  Otherwise fresh memory is taken, so reuse can never
    overwrite a value still in use.  :func:`input_buffers` keeps one set from one
    :func:`verify` call to the next."""

    def __init__(self) -> None:
        self._held: dict[tuple, tuple[np.ndarray, np.ndarray | None]] = {}
        self._used: set[tuple] = set()

    def get(
        self, index: int, size: int, with_q: bool, dtype: Any = np.int64
    ) -> tuple[np.ndarray, np.ndarray | None]:
        key = (index, size, with_q, np.dtype(dtype).str)
        held = self._held.get(key)
        if held is None or not all(_unreferenced(held, i) for i in range(2)):
            q = np.empty(size, dtype=dtype) if with_q else None
            held = self._held[key] = (np.empty(size, dtype=dtype), q)
        self._used.add(key)
        return held

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for pair in self._held.values() for a in pair if a is not None)

    def keep_used(self, max_bytes: int) -> None:
        """Drop the buffers not asked for since the last call, and all of them when more
        than ``max_bytes`` would stay."""
        self._held = {k: v for k, v in self._held.items() if k in self._used}
        self._used = set()
        if self.nbytes > max_bytes:
            self._held = {}


def _unreferenced(pair: tuple, i: int) -> bool:
    """Whether ``pair[i]`` (an array or None) is referred to by nothing but ``pair``."""
    return pair[i] is None or sys.getrefcount(pair[i]) <= _ALONE


def _alone_count() -> int:
    """sys.getrefcount of an array that only a tuple holds (the call's own reference counted)."""
    pair = (np.empty(0), None)
    return sys.getrefcount(pair[0])


_ALONE = _alone_count()

_SHARED_BUFFERS = InputBuffers()
_SHARED_LOCK = threading.Lock()


def _fresh_shared_buffers() -> None:
    """In a forked child: its own buffers and an unlocked lock (the parent may have held it)."""
    global _SHARED_BUFFERS, _SHARED_LOCK
    _SHARED_BUFFERS, _SHARED_LOCK = InputBuffers(), threading.Lock()


os.register_at_fork(after_in_child=_fresh_shared_buffers)
# input memory kept from one verify call to the next (field_arith keeps large results' memory)
KEEP_INPUT_BYTES = int(os.environ.get("MUGRAPH_VERIFY_KEEP_INPUT_BYTES", 1 << 30))


@contextmanager
def input_buffers() -> Iterator[InputBuffers]:
    """The process's input buffers for one verification (kept for the next one, up to
    ``KEEP_INPUT_BYTES``), or a private set when another thread is verifying now."""
    if not _SHARED_LOCK.acquire(blocking=False):
        yield InputBuffers()
        return
    try:
        yield _SHARED_BUFFERS
    finally:
        _SHARED_BUFFERS.keep_used(KEEP_INPUT_BYTES)
        _SHARED_LOCK.release()


def release_memory() -> None:
    """Give back the memory kept between verify calls: the inputs' and the large results'
    (:func:`~mugraph.semantics.field_arith.release_memory`); it is taken again when needed."""
    with _SHARED_LOCK:
        _SHARED_BUFFERS.keep_used(0)
    release_field_memory()


def _draw_round(
    program,
    rng,
    q_needed: frozenset[int] | None,
    primes: tuple[int, int],
    buffers: InputBuffers | None,
    fast: bool,
):
    """A round's context (ω, key) and uniform inputs: Z_q components for ``q_needed``
    (None: all), zero views for the others."""
    ctx = FieldContext.from_rng(rng, p=primes[0], q=primes[1], fast=fast)
    inputs = []
    for i, t in enumerate(program.input_types):
        with_q = q_needed is None or i in q_needed
        size = math.prod(t.dims)
        mirror = ctx.fast and size >= _MIRROR_MIN  # large inputs are mostly matmul operands
        dtype = np.float64 if mirror else np.int64
        out = buffers.get(i, size, with_q, dtype) if buffers is not None else None
        inputs.append(ctx.random(t.dims, rng, with_q=with_q, out=out, mirror=mirror))
    return ctx, inputs


_MIRROR_MIN = 1 << 18  # inputs of this many elements are drawn as float64 (FieldArray.mirrors)


def _compare(got, want) -> str | None:
    """None when the outputs agree, a _Redraw when a division by zero voided either side,
    else a description of the first difference."""
    errors = [
        (name, v)
        for name, v in (("candidate", got), ("program", want))
        if isinstance(v, FieldDivisionByZero)
    ]
    if errors:
        return _Redraw("; ".join(f"the {name}: {error}" for name, error in errors))
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        a = a.broadcast_to(b.shape) if a.shape != b.shape else a
        if not a.equals(b):
            bad = int(np.count_nonzero((a.p != b.p) | (a.q != b.q)))
            return f"output {i} differs in {bad} of {b.size} elements"
    return None


def _one_round(
    candidate,
    program,
    rng,
    q_needed: frozenset[int] | None = None,
    *,
    primes: tuple[int, int] = (P, Q),
    buffers: InputBuffers | None = None,
    fast: bool = True,
) -> str | None:
    """One random test: None when every output agrees, a _Redraw (a str) when a division by
    zero voids the round, else a description of the first difference. ``q_needed``: the
    inputs that get a random Z_q component (None: all). ``fast``: deferred, shared
    evaluation (:class:`FieldContext`); False evaluates every operation as it comes."""
    ctx, inputs = _draw_round(program, rng, q_needed, primes, buffers, fast)
    interp = FieldInterpretation(ctx)
    try:
        got = _evaluate(candidate, interp, inputs)
        return _compare(got, _evaluate(program, interp, inputs))
    finally:
        ctx.memo.clear()  # deferred values refer to the context: let the round's memory go


class _FreshRounds:
    """Rounds drawn one after the other from one random stream (what :func:`verify` does):
    nothing is kept from one round to the next but the inputs' memory."""

    def __init__(self, program, q_needed, seed, primes, buffers: InputBuffers | None = None):
        self.program, self.q_needed, self.primes = program, q_needed, primes
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.buffers = InputBuffers() if buffers is None else buffers

    def over(self, primes: tuple[int, int]) -> _FreshRounds:
        """The same rounds' stream from its start, over other primes."""
        return _FreshRounds(self.program, self.q_needed, self.seed, primes, self.buffers)

    def compare(self, candidate, attempt: int) -> str | None:
        return _one_round(candidate, self.program, self.rng, self.q_needed,
                          primes=self.primes, buffers=self.buffers)


# ---- the search's candidates: the program's side of each round kept ---------------------------


@dataclass
class _ProgramRound:
    """One round: its context, its inputs and the program's outputs (or its division by
    zero), with the context's memo holding the program's products and exponentials."""

    ctx: FieldContext
    inputs: list[Any]
    outputs: list[Any] | FieldDivisionByZero
    nbytes: int
    kept: KeptProducts | None = None  # candidates' products on the round's memory
    maker: int = field(default_factory=os.getpid)  # the process that drew it
    scope: str = field(default_factory=lambda: secrets.token_hex(8))  # its name in a store


# the share of a ProgramRounds' memory (max_bytes) that each round may spend on candidates'
# products of the round's own memory (KeptProducts)
KEPT_PRODUCTS_SHARE = 8
# ... and on sums of it (the for-loop's tiles of a weight summed, which candidates of one
# tiling ask again and again: a quarter of the weight for a loop of four)
KEPT_SUMS_SHARE = 2


class ProgramRounds:
    """Verification rounds of one program, kept for the candidates of a search.

    A search verifies many candidates against one program. Each round here is drawn once
    (uniform inputs, ω and a key from its own seed) and the program is evaluated once on it;
    every candidate is then evaluated on the same rounds — and its products and
    exponentials of the same memory as the program's (the tiles of Q @ K, X @ W...) come
    from the round's memo instead of being computed again. For one candidate this is the
    same test as :func:`verify`: its rounds are independent uniform draws made without
    looking at it, so the per-round bound and the plan are the same; only different
    candidates see the same draws (the search's final check draws fresh rounds).

    ``max_bytes`` bounds the memory kept (inputs, the program's memo, and products that
    candidates computed on the round's memory, :class:`KeptProducts`); rounds past it are
    drawn again from their seeds when asked and evaluated as :func:`verify` does. A candidate
    that needs a Z_q component for an input the program does not (:func:`q_inputs`) gets
    fresh rounds drawn for it.

    ``shared``: a store (:class:`~mugraph.search.memo.SharedArrays`) through which the
    processes forked after a round was made (a search's workers, forked by its zygote)
    share the products and sums that candidates compute from that round's memory
    (:meth:`KeptProducts.share_through`). A round a process drew itself is not shared.
    """

    def __init__(
        self,
        program,
        *,
        seed: int | None = None,
        primes: tuple[int, int] | None = None,
        max_bytes: int = 1 << 30,
        shared: Any = None,
    ) -> None:
        program.check()
        self.program = program
        self.shared = shared
        self.analysis = analyse(program)
        # None: the primes :func:`choose_primes` gives the program against itself at the
        # default delta; a candidate they do not suit gets fresh rounds (as verify draws)
        self.primes = primes or choose_primes(difference(self.analysis, self.analysis), 1e-9)
        self.q_needed = q_inputs(program)
        self.max_bytes = max_bytes
        self._seeds = np.random.SeedSequence(seed)
        self._round_seeds: list[np.random.SeedSequence] = []
        self._rounds: list[_ProgramRound] = []
        self._kept = 0
        self._full = False
        self._buffers = InputBuffers()  # for the rounds not kept

    def verify(
        self, candidate, delta: float = 1e-9, *, max_rounds: int = 64, max_redraws: int = 8
    ) -> VerificationResult:
        """:func:`verify` of ``candidate`` against the program, on the kept rounds."""
        _check_delta(delta)
        candidate.check()
        _check_same_interface(candidate, self.program)
        pair = difference(analyse(candidate), self.analysis)
        primes = self.primes
        if primes == SMALL_PRIMES and choose_primes(pair, delta) != SMALL_PRIMES:
            primes = LARGE_PRIMES  # the small field would weaken this candidate's plan
        q_needed = q_inputs(candidate) | self.q_needed
        if primes == self.primes and q_needed == self.q_needed:
            result = _run_rounds(candidate, pair, self, delta, max_rounds, max_redraws)
            if not voided_in_small_field(result):
                return result
            primes = LARGE_PRIMES
        fresh = _FreshRounds(self.program, q_needed, self._seeds.spawn(1)[0], primes)
        return _run_fresh(candidate, pair, fresh, delta, max_rounds, max_redraws, fallback=True)

    def compare(self, candidate, attempt: int) -> str | None:
        state = self._round(attempt)
        if state is None:  # not kept: the same round drawn again, evaluated as verify does
            return _one_round(candidate, self.program, self._rng(attempt), self.q_needed,
                              primes=self.primes, buffers=self._buffers)
        if isinstance(state.outputs, FieldDivisionByZero):
            return _Redraw(f"the program: {state.outputs}")
        if state.kept is None:
            state.kept = self._kept_products(state)
        if self.shared is not None and state.maker != os.getpid() and not state.kept.shares:
            # inherited from the process that drew it: the other workers hold it too
            state.kept.share_through(self.shared, state.scope)
        # the candidate works in a copy of the memo: what it computes is dropped after,
        # but for products of the round's own memory (kept for the next candidates)
        ctx = state.ctx.with_memo_of(state.ctx).keeping(state.kept)
        ctx.memo.update(state.kept.entries)
        try:
            got = _evaluate(candidate, FieldInterpretation(ctx), state.inputs)
            return _compare(got, state.outputs)
        finally:
            self._kept += state.kept.keep(ctx.memo, state.ctx.memo, self.max_bytes - self._kept)
            ctx.memo.clear()

    def _rng(self, index: int) -> np.random.Generator:
        """The random stream of round ``index`` (the same every time it is asked)."""
        while len(self._round_seeds) <= index:
            self._round_seeds.extend(self._seeds.spawn(16))
        return np.random.default_rng(self._round_seeds[index])

    def prepare(self, count: int) -> int:
        """Draw and evaluate the first ``count`` rounds now, as many as ``max_bytes`` keeps
        (a process that forks workers after this shares them); returns how many are kept."""
        while len(self._rounds) < count and not self._full:
            self._round(len(self._rounds))
        return len(self._rounds)

    def prepared(self) -> int:
        """How many rounds are drawn, evaluated and kept."""
        return len(self._rounds)

    def _round(self, index: int) -> _ProgramRound | None:
        """Round ``index`` with the program's side, kept while ``max_bytes`` allows; None
        for a round past the memory kept."""
        if index < len(self._rounds):
            return self._rounds[index]
        if self._full:
            return None
        state = self._draw(self._rng(index))
        if self._kept + state.nbytes <= self.max_bytes:
            # the round's own memory is what its KeptProducts holds when made
            state.kept = self._kept_products(state)
            self._rounds.append(state)
            self._kept += state.nbytes
        else:
            self._full = True  # this one is used once, the next ones are not kept
        return state

    def _kept_products(self, state: _ProgramRound) -> KeptProducts:
        return KeptProducts(state.ctx.memo, state.inputs, state.outputs,
                            max_bytes=self.max_bytes // KEPT_PRODUCTS_SHARE,
                            max_sum_bytes=self.max_bytes // KEPT_SUMS_SHARE)

    def _draw(self, rng: np.random.Generator) -> _ProgramRound:
        with parallel_evaluation():
            ctx, inputs = _draw_round(self.program, rng, self.q_needed, self.primes, None, True)
            outputs = _evaluate(self.program, FieldInterpretation(ctx), inputs)
        return _ProgramRound(ctx, inputs, outputs, ctx.memo_nbytes(inputs))
