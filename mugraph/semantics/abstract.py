"""Abstract expressions (paper §4.3, Table 1) and their axioms (Table 2), as data.

An abstract expression abstracts the function computed by a tensor of a μGraph: it forgets
which elements of an input tensor are combined, and keeps only *which* inputs are combined by
*which* operators, and over *how many* elements each reduction runs (the ``k`` of ``sum(k, x)``;
the paper insists on keeping it: it is what makes the pruning effective).

Terms are hash-consed and immutable: building the same term twice returns the same object, so
``is``, ``==`` and ``hash`` are O(1), and a term can key a cache.  Use the constructors below;
they also put a term in a canonical form where an axiom of ``A_eq`` (or a definition) makes
two spellings equal, so that more queries hit the same cache entry:

- ``sum(1, x)`` is ``x`` and ``sum(i, sum(j, x))`` is ``sum(i*j, x)`` (likewise ``max``);
- ``square(x)`` is ``mul(x, x)``, ``pow(x, 2)`` too, ``pow(x, 0.5)`` is ``sqrt(x)``, ``pow(x, 1)``
  is ``x``;
- ``sub(a, b)`` is ``add(a, b)``: abstract expressions keep no signs or constants (a - b is
  a + (-1)·b, and a scalar factor is abstracted away, see next line), so a difference combines
  the same inputs in the same way as a sum, and every ``A_eq`` law of add applies to it;
- ``mul_scalar(a)`` is ``a``: multiplying by a constant changes no input, no reduction size and
  no nesting, so the abstraction (which has no constants, as in the paper) ignores it.  This also
  makes a scaled attention (1/sqrt(d)) and an unscaled one the same target;
- ``rms(k, x)`` is ``sqrt(sum(k, mul(x, x)))`` (the 1/k of the mean is a constant, dropped), and
  ``rms_norm(k, x)`` is ``div(x, rms(k, x))``.  Spelling rms out (rather than an opaque
  ``rms(k, x)`` head as upstream Mirage does) lets a μGraph that computes the norm from a square,
  a reduction (possibly split across a for-loop: ``sum(F, sum(k/F, ..))`` is ``sum(k, ..)``) and a
  sqrt reach the same expression as the fused operator;
- ``reshape(x)`` (and the repeat of Table 1) is ``x``.

Concatenation.  ``concat(dim, ka, kb, a, b)`` keeps its own head (so that a matmul can
recognise its operands), but the axiom ``concat-as-add`` of ``A_eq`` makes it equal to
``add(a, b)``, and the oracle applies it by translating every concat to an add.  Rationale: a
concatenation holds the elements of both inputs, and abstract expressions forget *which*
element comes from which input, exactly as for an elementwise add; for a concat along a dim
that a later linear operator does not reduce, every such operator distributes over it, as it
does over add (``sum(k, mul(add(W, X), Y)) = add(sum(k, mul(W, Y)), sum(k, mul(X, Y)))``), so
the abstraction is exact there.  A matmul whose two operands are concatenated along the
*reduction* dim is the paper's §7.2 operator, ``(W||X) x (Y||Z) = W x Y + X x Z``, whose
abstract expression is ``add(sum(k1, mul(W, Y)), sum(k2, mul(X, Z)))``: :func:`matmul` builds
that form when it sees such operands (it reads the sizes ``ka``, ``kb`` that concat keeps).
For Theorem 1 to keep the concat prefixes of that μGraph, ``A_sub`` gets the extension
``sub-concat-operands`` (see :data:`A_SUB`; the oracle applies it after saturation).

Patterns.  The axioms are terms with pattern variables (:func:`pvar`) and symbolic sizes
(:class:`SizeVar`, products ``i * j``).  Constructors do not normalise non-ground terms, so a
pattern such as ``sum(i, sum(j, x))`` keeps its shape.

The table :data:`ABSTRACT_SEMANTICS` maps every :class:`~mugraph.ir.ops.OpKind` to a function
``(input_terms, input_dims, attrs) -> term`` giving the abstract expression of the operator's
(first) output, for the search (phase 2).
"""

from __future__ import annotations

import math
import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from mugraph.ir.ops import AccumKind, OpKind, as_accum_kind

__all__ = [
    "A_EQ",
    "A_SUB",
    "ABSTRACT_SEMANTICS",
    "AXIOMS",
    "HEADS",
    "AbstractSemanticsError",
    "Axiom",
    "HeadSpec",
    "SizeMul",
    "SizeVar",
    "Term",
    "add",
    "clamp",
    "concat",
    "concat_matmul",
    "div",
    "exp",
    "gelu",
    "matmul",
    "max",
    "mul",
    "mul_scalar",
    "parse_term",
    "pow",
    "pvar",
    "relu",
    "reshape",
    "rms",
    "rms_norm",
    "silu",
    "sqrt",
    "square",
    "sub",
    "subterms",
    "sum",
    "var",
    "with_args",
]


class AbstractSemanticsError(ValueError):
    """An operator's abstract expression cannot be formed (bad attrs, inlined operator...)."""


# --------------------------------------------------------------------------- sizes in patterns


@dataclass(frozen=True, slots=True)
class SizeVar:
    """A symbolic size (or other integer/text parameter) in an axiom pattern."""

    name: str

    def __mul__(self, other: SizeVar) -> SizeMul:
        return SizeMul(self, other)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class SizeMul:
    """The product of two symbolic sizes, ``i * j`` (right-hand side of ``sum-sum``)."""

    left: SizeVar
    right: SizeVar

    def __str__(self) -> str:
        return f"{self.left}*{self.right}"


Size = int | SizeVar | SizeMul
Param = None | str | int | float | SizeVar | SizeMul | tuple


# --------------------------------------------------------------------------- heads


@dataclass(frozen=True, slots=True)
class HeadSpec:
    """What a term head looks like: its arity and the kind of its parameter."""

    name: str
    arity: int
    param: Literal["none", "name", "size", "exponent", "concat"]
    doc: str


HEADS: dict[str, HeadSpec] = {
    h.name: h
    for h in (
        HeadSpec("var", 0, "name", "an input tensor of the program"),
        HeadSpec("?", 0, "name", "a pattern variable (axioms only)"),
        HeadSpec("add", 2, "none", "elementwise add (also sub, concat)"),
        HeadSpec("mul", 2, "none", "elementwise mul (and the product inside a matmul)"),
        HeadSpec("div", 2, "none", "elementwise div"),
        HeadSpec("exp", 1, "none", "elementwise exp"),
        HeadSpec("sqrt", 1, "none", "elementwise sqrt (rms_norm's denominator)"),
        HeadSpec("silu", 1, "none", "elementwise silu"),
        HeadSpec("gelu", 1, "none", "elementwise gelu"),
        HeadSpec("relu", 1, "none", "elementwise relu"),
        HeadSpec("clamp", 1, "none", "elementwise clamp (bounds abstracted away)"),
        HeadSpec("pow", 1, "exponent", "elementwise power by a constant exponent"),
        HeadSpec("sum", 1, "size", "sum over k elements (reduction, matmul, accumulators)"),
        HeadSpec("max", 1, "size", "max over k elements (reduction_max, forloop_accum_max)"),
        HeadSpec("concat", 2, "concat", "concatenation (dim, ka, kb): equal to add by A_eq"),
    )
}


# --------------------------------------------------------------------------- terms


class Term:
    """An interned, immutable abstract expression (or axiom pattern).

    Attributes: ``op`` (a key of :data:`HEADS`), ``args`` (sub-terms), ``param`` (the name of a
    var, the size of a sum/max, the exponent of a pow, ``(dim, ka, kb)`` of a concat, or None),
    ``ground`` (no pattern variable and no symbolic size).  Equality is identity.
    """

    __slots__ = ("op", "args", "param", "ground", "_hash", "__weakref__")

    op: str
    args: tuple[Term, ...]
    param: Param
    ground: bool
    _hash: int

    def __init__(self) -> None:  # pragma: no cover - guarded
        raise TypeError("use the constructors of mugraph.semantics.abstract (var, add, sum, ...)")

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("abstract expressions are immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("abstract expressions are immutable")

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[Callable[..., Term], tuple[str, tuple[Term, ...], Param]]:
        # Unpickling re-interns, so identity still means structural equality in the new process.
        return (_make, (self.op, self.args, self.param))

    def __str__(self) -> str:
        return _render(self, {})

    def __repr__(self) -> str:
        return f"<Term {self}>"


_TABLE: weakref.WeakValueDictionary[tuple, Term] = weakref.WeakValueDictionary()


def _param_ground(param: Param) -> bool:
    if isinstance(param, SizeVar | SizeMul):
        return False
    if isinstance(param, tuple):
        return all(_param_ground(p) for p in param)
    return True


def _make(op: str, args: tuple[Term, ...], param: Param = None) -> Term:
    """The interning constructor: no validation, no normalisation."""
    key = (op, param, args)
    term = _TABLE.get(key)
    if term is not None:
        return term
    term = object.__new__(Term)
    ground = op != "?" and _param_ground(param) and all(a.ground for a in args)
    setter = object.__setattr__
    setter(term, "op", op)
    setter(term, "args", args)
    setter(term, "param", param)
    setter(term, "ground", ground)
    setter(term, "_hash", hash((op, param, tuple(a._hash for a in args))))
    _TABLE[key] = term
    return term


def _render(term: Term, memo: dict[Term, str]) -> str:
    text = memo.get(term)
    if text is not None:
        return text
    op = term.op
    if op == "var":
        text = str(term.param)
    elif op == "?":
        text = f"?{term.param}"
    else:
        inner = [_render(a, memo) for a in term.args]
        if op in ("sum", "max"):
            inner.insert(0, str(term.param))
        elif op == "pow":
            inner.append(str(term.param))
        elif op == "concat":
            inner[:0] = [str(p) for p in term.param]  # type: ignore[union-attr]
        text = f"{op}({', '.join(inner)})"
    memo[term] = text
    return text


def subterms(term: Term) -> list[Term]:
    """Every distinct sub-term of ``term`` (itself included), children before parents."""
    seen: set[Term] = set()
    order: list[Term] = []
    stack: list[tuple[Term, bool]] = [(term, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if node in seen:
            continue
        seen.add(node)
        stack.append((node, True))
        stack.extend((a, False) for a in reversed(node.args) if a not in seen)
    return order


# --------------------------------------------------------------------------- constructors


def _check_term(value: object, what: str) -> Term:
    if not isinstance(value, Term):
        raise TypeError(f"{what}: expected a Term, got {type(value).__name__}")
    return value


def _check_size(k: object, what: str) -> Size:
    if isinstance(k, SizeVar | SizeMul):
        return k
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"{what}: the reduced size must be a positive int, got {k!r}")
    return k


def var(name: str) -> Term:
    """An input tensor of the program."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"var: a non-empty name is required, got {name!r}")
    return _make("var", (), name)


def pvar(name: str) -> Term:
    """A pattern variable, for axioms: matches any term."""
    return _make("?", (), name)


def add(a: Term, b: Term) -> Term:
    """Elementwise addition."""
    return _make("add", (_check_term(a, "add"), _check_term(b, "add")))


def mul(a: Term, b: Term) -> Term:
    """Elementwise multiplication."""
    return _make("mul", (_check_term(a, "mul"), _check_term(b, "mul")))


def div(a: Term, b: Term) -> Term:
    """Elementwise division."""
    return _make("div", (_check_term(a, "div"), _check_term(b, "div")))


def _unary(op: str) -> Callable[[Term], Term]:
    def build(a: Term) -> Term:
        return _make(op, (_check_term(a, op),))

    build.__name__ = op
    build.__qualname__ = op
    build.__doc__ = f"Elementwise {op} (an uninterpreted unary head)."
    return build


exp = _unary("exp")
sqrt = _unary("sqrt")
silu = _unary("silu")
gelu = _unary("gelu")
relu = _unary("relu")


def clamp(a: Term, low: float | None = None, high: float | None = None) -> Term:
    """Elementwise clamp; the bounds are abstracted away (any clamp of ``a`` is one term)."""
    del low, high
    return _make("clamp", (_check_term(a, "clamp"),))


def _reduction(op: str, k: Size, a: Term) -> Term:
    k = _check_size(k, op)
    a = _check_term(a, op)
    if isinstance(k, int) and a.ground:
        if k == 1:  # sum-identity / max-identity
            return a
        if a.op == op and isinstance(a.param, int):  # sum-sum / max-max
            return _make(op, a.args, k * a.param)
    return _make(op, (a,), k)


def sum(k: Size, a: Term) -> Term:  # noqa: A001 - the paper's name
    """``sum(k, a)``: a sum over ``k`` elements of ``a`` (k is kept: it drives the pruning)."""
    return _reduction("sum", k, a)


def max(k: Size, a: Term) -> Term:  # noqa: A001 - mirrors sum
    """``max(k, a)``: a max over ``k`` elements (reduction_max, forloop_accum_max)."""
    return _reduction("max", k, a)


def mul_scalar(a: Term, scalar: float | None = None) -> Term:
    """Multiplication by a constant: abstractly the identity (no constants in the abstraction)."""
    del scalar
    return _check_term(a, "mul_scalar")


def square(a: Term) -> Term:
    """``a * a``."""
    return mul(a, a)


def sub(a: Term, b: Term) -> Term:
    """``a - b``: abstractly ``add(a, b)`` (signs are constants, abstracted away)."""
    return add(a, b)


def _exponent_text(exponent: float | str | SizeVar | None) -> str | SizeVar | None:
    if exponent is None or isinstance(exponent, SizeVar):
        return exponent
    value = float(exponent)
    if value.is_integer():
        return str(int(value))
    return repr(value)


def pow(a: Term, exponent: float | str | SizeVar | None = None) -> Term:  # noqa: A001
    """``a ** exponent`` for a constant exponent (kept, so pow(x, 3) is not pow(x, 2))."""
    a = _check_term(a, "pow")
    text = _exponent_text(exponent)
    if a.ground and isinstance(text, str):
        if text == "1":
            return a
        if text == "2":
            return mul(a, a)
        if text == "0.5":
            return sqrt(a)
    return _make("pow", (a,), text)


def rms(k: int, a: Term, eps: float = 0.0) -> Term:
    """Root mean square over ``k`` elements: ``sqrt(sum(k, mul(a, a)))`` (1/k dropped); with
    an epsilon ``sqrt(add(sum(k, mul(a, a)), eps))``, the constant a leaf of its own."""
    total = sum(k, mul(a, a))
    return sqrt(add(total, eps_leaf(eps)) if eps else total)


def eps_leaf(eps: float) -> Term:
    """The constant ``eps`` of an rms as a named leaf (equal epsilons give the same leaf; the
    name is an identifier spelling the float's exact binary value)."""
    text = float(eps).hex().replace(".", "_").replace("-", "m").replace("+", "p")
    return var(f"eps_{text}")


def rms_norm(k: int, a: Term, eps: float = 0.0) -> Term:
    """RMS normalisation over the last ``k`` elements: ``div(a, rms(k, a, eps))``."""
    return div(a, rms(k, a, eps))


def reshape(a: Term) -> Term:
    """Reshape (and repeat): the identity on abstract expressions (Table 1)."""
    return _check_term(a, "reshape")


def concat(
    a: Term,
    b: Term,
    dim: int | SizeVar = -1,
    ka: int | SizeVar = 1,
    kb: int | SizeVar = 1,
) -> Term:
    """Concatenation of ``a`` (``ka`` long along ``dim``) and ``b`` (``kb`` long).

    ``dim`` is counted from the end (-1 is the last dim), so a matmul can tell whether a concat
    runs along its reduction dim.  Equal to ``add(a, b)`` under ``A_eq`` (``concat-as-add``).
    """
    a, b = _check_term(a, "concat"), _check_term(b, "concat")
    for size, what in ((ka, "ka"), (kb, "kb")):
        _check_size(size, f"concat {what}")
    if isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0:
        raise ValueError(f"concat: dim must be counted from the end (negative), got {dim}")
    return _make("concat", (a, b), (dim, ka, kb))


def concat_matmul(ka: int, w: Term, x: Term, kb: int, y: Term, z: Term) -> Term:
    """The §7.2 operator ``(W||X) x (Y||Z)``: ``add(sum(ka, mul(W, Y)), sum(kb, mul(X, Z)))``."""
    return add(sum(ka, mul(w, y)), sum(kb, mul(x, z)))


def matmul(a: Term, b: Term, k: int) -> Term:
    """A (batched) matmul reducing ``k`` elements: ``sum(k, mul(a, b))`` (Table 1).

    When ``a`` is a concat along its last dim and ``b`` a concat along its second-to-last dim
    with the same split, the result is the §7.2 form :func:`concat_matmul` instead.
    """
    if a.op == "concat" and b.op == "concat" and a.ground and b.ground:
        dim_a, ka, kb = a.param  # type: ignore[misc]
        dim_b, kc, kd = b.param  # type: ignore[misc]
        if dim_a == -1 and dim_b == -2 and (ka, kb) == (kc, kd) and ka + kb == k:
            return concat_matmul(ka, a.args[0], a.args[1], kb, b.args[0], b.args[1])
    return sum(k, mul(a, b))


def with_args(term: Term, args: Sequence[Term]) -> Term:
    """``term``'s head and parameter over new arguments (normalised like the constructors)."""
    args = tuple(args)
    if len(args) != len(term.args):
        raise ValueError(f"with_args: {term.op} takes {len(term.args)} argument(s)")
    if args == term.args:
        return term
    if term.op in ("sum", "max"):
        return _reduction(term.op, term.param, args[0])  # type: ignore[arg-type]
    if term.op == "pow":
        return pow(args[0], term.param)  # type: ignore[arg-type]
    return _make(term.op, args, term.param)


# --------------------------------------------------------------------------- parsing


def parse_term(text: str) -> Term:
    """Parse the printed form, e.g. ``"sum(64, mul(Q, K))"`` (``?x`` is a pattern variable).

    Parameters come first for sum/max (size) and concat (dim, ka, kb) and last for pow.
    """
    parser = _Parser(text)
    term = parser.term()
    parser.expect_end()
    return term


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokenize(text)
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise ValueError("parse_term: unexpected end of input")
        self.pos += 1
        return token

    def expect(self, token: str) -> None:
        got = self.take()
        if got != token:
            raise ValueError(f"parse_term: expected {token!r}, got {got!r}")

    def expect_end(self) -> None:
        if self.peek() is not None:
            raise ValueError(f"parse_term: trailing input at {self.peek()!r}")

    def arguments(self) -> list[str | Term]:
        self.expect("(")
        items: list[str | Term] = []
        while True:
            token = self.peek()
            if token is not None and _is_number(token):
                items.append(self.take())
            else:
                items.append(self.term())
            if self.take() == ")":
                return items

    def term(self) -> Term:
        token = self.take()
        if token.startswith("?"):
            return pvar(token[1:])
        if self.peek() != "(":
            return var(token)
        items = self.arguments()
        numbers = [int(t) if t.lstrip("-").isdigit() else t for t in items if isinstance(t, str)]
        terms = [t for t in items if isinstance(t, Term)]
        return _build_parsed(token, numbers, terms)


def _build_parsed(head: str, numbers: list, terms: list[Term]) -> Term:
    if head in ("sum", "max") and len(numbers) == 1 and len(terms) == 1:
        return _reduction(head, int(numbers[0]), terms[0])
    if head == "pow" and len(terms) == 1 and len(numbers) <= 1:
        return pow(terms[0], numbers[0] if numbers else None)
    if head == "concat" and len(numbers) == 3 and len(terms) == 2:
        return concat(terms[0], terms[1], int(numbers[0]), int(numbers[1]), int(numbers[2]))
    builders: dict[str, Callable[..., Term]] = {
        "add": add, "mul": mul, "div": div, "exp": exp, "sqrt": sqrt, "silu": silu,
        "gelu": gelu, "relu": relu, "clamp": clamp, "square": square, "sub": sub,
    }  # fmt: skip
    if head in builders and not numbers:
        return builders[head](*terms)
    raise ValueError(f"parse_term: cannot build {head} from {numbers} and {len(terms)} terms")


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    for token in _TOKEN.findall(text):
        if not token.isspace():
            tokens.append(token)
    return tokens


_TOKEN = re.compile(r"[(),]|[^(),\s]+|\s+")


# --------------------------------------------------------------------------- axioms as data


@dataclass(frozen=True, slots=True)
class Axiom:
    """One law of Table 2 (or an extension).

    ``kind == "eq"``: ``lhs = rhs`` for all values of the variables (A_eq).
    ``kind == "sub"``: ``premises -> subexpr(lhs, rhs)`` (A_sub); ``premises`` are pairs
    ``(a, b)`` meaning ``subexpr(a, b)`` (only transitivity has any).
    ``law`` states the law in words; ``source`` is "Table 2" or "extension".
    """

    name: str
    kind: Literal["eq", "sub"]
    lhs: Term
    rhs: Term
    law: str
    source: str = "Table 2"
    premises: tuple[tuple[Term, Term], ...] = ()


_x, _y, _z, _w = pvar("x"), pvar("y"), pvar("z"), pvar("w")
_i, _j, _d, _e = SizeVar("i"), SizeVar("j"), SizeVar("d"), SizeVar("e")
_EXT = "extension"

A_EQ: tuple[Axiom, ...] = (
    Axiom("add-comm", "eq", add(_x, _y), add(_y, _x), "x + y = y + x"),
    Axiom("mul-comm", "eq", mul(_x, _y), mul(_y, _x), "x * y = y * x"),
    Axiom("add-assoc", "eq", add(_x, add(_y, _z)), add(add(_x, _y), _z), "associativity of +"),
    Axiom("mul-assoc", "eq", mul(_x, mul(_y, _z)), mul(mul(_x, _y), _z), "associativity of *"),
    Axiom(
        "mul-add-distrib", "eq", add(mul(_x, _z), mul(_y, _z)), mul(add(_x, _y), _z),
        "x*z + y*z = (x + y)*z",
    ),
    Axiom(
        "div-add", "eq", add(div(_x, _z), div(_y, _z)), div(add(_x, _y), _z),
        "x/z + y/z = (x + y)/z",
    ),
    Axiom("mul-div", "eq", mul(_x, div(_y, _z)), div(mul(_x, _y), _z), "x * (y/z) = (x*y)/z"),
    Axiom("div-div", "eq", div(div(_x, _y), _z), div(_x, mul(_y, _z)), "(x/y)/z = x/(y*z)"),
    Axiom("sum-identity", "eq", _x, sum(1, _x), "a sum over one element is the element"),
    Axiom(
        "sum-sum", "eq", sum(_i, sum(_j, _x)), sum(_i * _j, _x),
        "summing i sums of j elements sums i*j elements",
    ),
    Axiom("sum-add", "eq", sum(_i, add(_x, _y)), add(sum(_i, _x), sum(_i, _y)), "sum is linear"),
    Axiom(
        "sum-mul", "eq", sum(_i, mul(_x, _y)), mul(sum(_i, _x), _y),
        "a factor moves out of a sum (abstractly: elements are not told apart)",
    ),
    Axiom("sum-div", "eq", sum(_i, div(_x, _y)), div(sum(_i, _x), _y), "a divisor moves out"),
    # ---- extensions for the operators beyond the paper's Table 1 ----
    Axiom(
        "max-identity", "eq", _x, max(1, _x),
        "a max over one element is the element (sound); mirrors sum-identity",
        _EXT,
    ),
    Axiom(
        "max-max", "eq", max(_i, max(_j, _x)), max(_i * _j, _x),
        "the max of i maxes of j elements is the max of the i*j elements (sound): a max split "
        "across blocks or for-loop iterations (online softmax) equals the whole max",
        _EXT,
    ),
    Axiom(
        "concat-as-add", "eq", concat(_x, _y, _d, _i, _j), add(_x, _y),
        "a concatenation combines the elements of both inputs, which is all that add says "
        "abstractly; linear operators distribute over both alike (see the module docstring)",
        _EXT,
    ),
)  # fmt: skip
"""Equivalence axioms.  No cancellation (``div(mul(x, y), y) = x``): the paper explains that
it would make everything a subexpression of everything and null the pruning."""

A_SUB: tuple[Axiom, ...] = (
    Axiom("sub-add", "sub", _x, add(_x, _y), "an addend is a subexpression of the sum"),
    Axiom("sub-mul", "sub", _x, mul(_x, _y), "a factor is a subexpression of the product"),
    Axiom("sub-div-num", "sub", _x, div(_x, _y), "the numerator is a subexpression"),
    Axiom("sub-div-den", "sub", _y, div(_x, _y), "the denominator is a subexpression"),
    Axiom("sub-exp", "sub", _x, exp(_x), "the argument of exp is a subexpression"),
    Axiom("sub-sum", "sub", _x, sum(_i, _x), "the summand is a subexpression of the sum"),
    Axiom("sub-refl", "sub", _x, _x, "reflexivity"),
    Axiom(
        "sub-trans", "sub", _x, _z, "transitivity",
        premises=((_x, _y), (_y, _z)),
    ),
    # ---- extensions: Theorem 1 needs every operator input to be a subexpression of its output
    Axiom("sub-sqrt", "sub", _x, sqrt(_x), "the argument of sqrt (rms_norm) is a subexpression",
          _EXT),
    Axiom("sub-silu", "sub", _x, silu(_x), "the argument of silu is a subexpression", _EXT),
    Axiom("sub-gelu", "sub", _x, gelu(_x), "the argument of gelu is a subexpression", _EXT),
    Axiom("sub-relu", "sub", _x, relu(_x), "the argument of relu is a subexpression", _EXT),
    Axiom("sub-clamp", "sub", _x, clamp(_x), "the argument of clamp is a subexpression", _EXT),
    Axiom("sub-pow", "sub", _x, pow(_x, _e), "the base of pow is a subexpression", _EXT),
    Axiom("sub-max", "sub", _x, max(_i, _x), "the argument of a max reduction is a "
          "subexpression (reduction_max, forloop_accum_max)", _EXT),
    Axiom("sub-concat-left", "sub", _x, concat(_x, _y, _d, _i, _j),
          "the first part of a concat is a subexpression", _EXT),
    Axiom("sub-concat-right", "sub", _y, concat(_x, _y, _d, _i, _j),
          "the second part of a concat is a subexpression", _EXT),
    Axiom(
        "sub-concat-operands", "sub", add(_x, _y),
        add(sum(_i, mul(_x, _z)), sum(_j, mul(_y, _w))),
        "the concatenation of two matmul operands (abstractly add(x, y), concat-as-add) is a "
        "subexpression of the sum of the two matmuls: it is the input of the §7.2 operator "
        "(x||y) x (z||w), whose output is that sum, and Theorem 1 needs every operator input to "
        "be a subexpression of its output; by mul-comm it also covers the right operands z, w",
        _EXT,
    ),
)  # fmt: skip
"""Subexpression axioms (``subexpr(lhs, rhs)``), extended for the new operators."""

AXIOMS: tuple[Axiom, ...] = A_EQ + A_SUB


# --------------------------------------------------------------------------- Table 1 by OpKind

Dims = Sequence[int]
Semantics = Callable[[Sequence[Term], Sequence[Dims], Mapping[str, Any]], Term]


def _positive_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise AbstractSemanticsError(f"{what}: expected a positive int, got {value!r}")
    return value


def _attr(attrs: Mapping[str, Any], key: str, op: str) -> Any:
    if key not in attrs:
        raise AbstractSemanticsError(f"{op}: attribute {key!r} is required")
    return attrs[key]


def _only(inputs: Sequence[Term], count: int, op: str) -> Sequence[Term]:
    if len(inputs) != count:
        raise AbstractSemanticsError(f"{op}: expected {count} input(s), got {len(inputs)}")
    return inputs


def _input(inputs: Sequence[Term], dims: Sequence[Dims], attrs: Mapping[str, Any]) -> Term:
    del inputs, dims
    return var(str(_attr(attrs, "name", "input")))


def _identity(inputs: Sequence[Term], dims: Sequence[Dims], attrs: Mapping[str, Any]) -> Term:
    del dims, attrs
    return _only(inputs, 1, "identity")[0]


def _block_output(
    inputs: Sequence[Term], dims: Sequence[Dims], attrs: Mapping[str, Any]
) -> Term:
    """Saving a tile (or concatenating iterations) changes nothing; an accumulating output's
    sum over blocks would need the grid, which an operator's attributes do not carry."""
    if attrs.get("accumulate"):
        raise AbstractSemanticsError(
            "block_output: an accumulating output (a sum over the blocks its omap leaves out) "
            "has no abstract expression: the search neither prunes nor builds such graphs"
        )
    return _identity(inputs, dims, attrs)


def _inlined(inputs: Sequence[Term], dims: Sequence[Dims], attrs: Mapping[str, Any]) -> Term:
    raise AbstractSemanticsError(
        "graph-defined operators (customized, thread_graph) are inlined: their outputs' abstract "
        "expressions are those of the inner graph's outputs (paper §4.3)"
    )


def _unary_kind(build: Callable[[Term], Term]) -> Semantics:
    def semantics(inputs: Sequence[Term], dims: Sequence[Dims], attrs: Mapping[str, Any]) -> Term:
        del dims, attrs
        return build(_only(inputs, 1, build.__name__)[0])

    return semantics


def _binary_kind(build: Callable[[Term, Term], Term]) -> Semantics:
    def semantics(inputs: Sequence[Term], dims: Sequence[Dims], attrs: Mapping[str, Any]) -> Term:
        del dims, attrs
        a, b = _only(inputs, 2, build.__name__)
        return build(a, b)

    return semantics


def _pow(inputs: Sequence[Term], dims: Sequence[Dims], attrs: Mapping[str, Any]) -> Term:
    return pow(_only(inputs, 1, "pow")[0], attrs.get("exponent"))


def _matmul(inputs: Sequence[Term], dims: Sequence[Dims], attrs: Mapping[str, Any]) -> Term:
    a, b = _only(inputs, 2, "matmul")
    return matmul(a, b, _positive_int(dims[0][-1], "matmul reduction size"))


def _reduced_size(dims: Sequence[Dims], attrs: Mapping[str, Any], op: str) -> int:
    dim = int(_attr(attrs, "dim", op))
    size = _positive_int(dims[0][dim], f"{op} size")
    dimx = attrs.get("reduction_dimx") if attrs.get("to_dimx") else None
    if dimx:
        if size % int(dimx):
            raise AbstractSemanticsError(f"{op}: {size} is not a multiple of {dimx}")
        size //= int(dimx)
    return size


def _reduction_kind(inputs: Sequence[Term], dims: Sequence[Dims], attrs: Mapping[str, Any]) -> Term:
    return sum(_reduced_size(dims, attrs, "reduction"), _only(inputs, 1, "reduction")[0])


def _reduction_max(inputs: Sequence[Term], dims: Sequence[Dims], attrs: Mapping[str, Any]) -> Term:
    return max(_reduced_size(dims, attrs, "reduction_max"), _only(inputs, 1, "reduction_max")[0])


def _rms_norm(inputs: Sequence[Term], dims: Sequence[Dims], attrs: Mapping[str, Any]) -> Term:
    x = _only(inputs, 1, "rms_norm")[0]
    shape = attrs.get("normalized_shape")
    k = math.prod(shape) if shape else dims[0][-1]
    return rms_norm(_positive_int(k, "rms_norm size"), x, float(attrs.get("eps", 0.0)))


def _concat(inputs: Sequence[Term], dims: Sequence[Dims], attrs: Mapping[str, Any]) -> Term:
    a, b = _only(inputs, 2, "concat")
    rank = len(dims[0])
    dim = int(_attr(attrs, "dim", "concat"))
    dim = dim - rank if dim >= 0 else dim
    return concat(a, b, dim, dims[0][dim], dims[1][dim])


def _accum_size(dims: Sequence[Dims], attrs: Mapping[str, Any], acc: AccumKind) -> int:
    loops = _positive_int(_attr(attrs, "forloop_range", "forloop_accum"), "forloop_range")
    if acc is AccumKind.NONE:
        return loops
    last = loops * _positive_int(dims[0][-1], "forloop_accum last dim")
    if acc is AccumKind.SUM_TODIMX:
        dimx = _positive_int(_attr(attrs, "reduction_dimx", "forloop_accum"), "reduction_dimx")
        if last % dimx:
            raise AbstractSemanticsError(f"forloop_accum: {last} is not a multiple of {dimx}")
        return last // dimx
    return last


def _forloop_accum(inputs: Sequence[Term], dims: Sequence[Dims], attrs: Mapping[str, Any]) -> Term:
    x = _only(inputs, 1, "forloop_accum")[0]
    acc = as_accum_kind(attrs.get("acc"))
    size = _accum_size(dims, attrs, acc)
    if acc is AccumKind.RMS:
        return rms(size, x, float(attrs.get("eps", 0.0)))
    return sum(size, x)  # NONE, SUM, MEAN (1/n dropped), SUM_TODIMX


def _forloop_accum_max(
    inputs: Sequence[Term], dims: Sequence[Dims], attrs: Mapping[str, Any]
) -> Term:
    x = _only(inputs, 1, "forloop_accum_max")[0]
    loops = _positive_int(_attr(attrs, "forloop_range", "forloop_accum_max"), "forloop_range")
    return max(loops, x)


def _forloop_accum_rescale(
    inputs: Sequence[Term], dims: Sequence[Dims], attrs: Mapping[str, Any]
) -> Term:
    # acc <- acc * rescale + x at every iteration: every tile of x ends up multiplied by
    # rescale factors, which the abstraction (no element or iteration told apart) writes as
    # one mul before the sum over the iterations.
    x, rescale = _only(inputs, 2, "forloop_accum_rescale")
    acc = as_accum_kind(attrs.get("acc"))
    return sum(_accum_size(dims, attrs, acc), mul(x, rescale))


ABSTRACT_SEMANTICS: dict[OpKind, Semantics] = {
    OpKind.INPUT: _input,
    OpKind.BLOCK_INPUT: _identity,  # E(InIter(X)) = E(X)
    OpKind.BLOCK_OUTPUT: _block_output,
    OpKind.CUSTOMIZED: _inlined,
    OpKind.THREAD_GRAPH: _inlined,
    OpKind.MATMUL: _matmul,
    OpKind.EXP: _unary_kind(exp),
    OpKind.SQUARE: _unary_kind(square),
    OpKind.SQRT: _unary_kind(sqrt),
    OpKind.SILU: _unary_kind(silu),
    OpKind.GELU: _unary_kind(gelu),
    OpKind.RELU: _unary_kind(relu),
    OpKind.CLAMP: _unary_kind(clamp),
    OpKind.MUL_SCALAR: _unary_kind(mul_scalar),
    OpKind.POW: _pow,
    OpKind.ADD: _binary_kind(add),
    OpKind.SUB: _binary_kind(sub),
    OpKind.MUL: _binary_kind(mul),
    OpKind.DIV: _binary_kind(div),
    OpKind.REDUCTION: _reduction_kind,
    OpKind.REDUCTION_MAX: _reduction_max,
    OpKind.RMS_NORM: _rms_norm,
    OpKind.CONCAT: _concat,
    OpKind.RESHAPE: _identity,
    OpKind.PERMUTE: _identity,  # which elements combine is unchanged by their order
    OpKind.FORLOOP_ACCUM: _forloop_accum,
    OpKind.FORLOOP_ACCUM_MAX: _forloop_accum_max,
    OpKind.FORLOOP_ACCUM_RESCALE: _forloop_accum_rescale,
}
"""Abstract expression of an operator's output from its inputs' (Table 1, extended).

Each entry takes ``(input_terms, input_dims, attrs)``.  Attributes read: ``name`` (input),
``exponent`` (pow), ``dim`` and optionally ``to_dimx`` + ``reduction_dimx`` (reductions),
``normalized_shape`` (rms_norm; default: the last dim), ``dim`` (concat), ``forloop_range``,
``acc`` and ``reduction_dimx`` (accumulators).  Notes:

- block inputs and outputs are the identity (Table 1: the grid / for-loop partition of a tensor
  does not change which elements it combines); the sum over the iterations is the accumulator's
  (``forloop_accum``: ``sum(F, x)``, or ``sum(F*t, x)`` when it also reduces the last dim of
  size ``t``; ``rms``: ``rms(F*t, x)``; ``sum_todimx``: ``sum(F*t/dimx, x)``);
- graph-defined operators (customized, thread_graph) raise: they are inlined, their outputs'
  expressions are those of their inner graph's outputs (paper §4.3);
- ``forloop_accum_max`` is ``max(F, x)``; ``forloop_accum_rescale(x, r)`` (acc <- acc * r + x)
  is ``sum(F, mul(x, r))``: every tile ends up multiplied by rescale factors.  An online
  softmax built from them (exp(s - max)) is *not* A_eq-equal to a plain softmax target: that
  needs cancellation, which the paper leaves out of A_eq on purpose.
"""
