"""Triton expressions for the elementwise operators (block and thread level).

Each entry turns operand expressions (float32 register tiles) into one Triton expression with
the meaning of :mod:`mugraph.semantics.reference`. Only the core ``tl`` API is used, so the text
runs on Triton 3.6 and 3.9 and under the interpreter (which rejects fp16 in tl.exp / tl.sqrt:
operands are float32 by construction).

``ZERO_PRESERVING`` tells the padding logic of :mod:`mugraph.codegen.triton_gen` whether an
operator maps zeros to zeros, so padded lanes known to be zero stay zero without a mask.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from mugraph.ir.ops import Group, OpKind

_GELU_C = math.sqrt(2.0 / math.pi)
_POW_INT_LIMIT = 16  # integer exponents up to this magnitude use repeated multiplication

Formula = Callable[[list[str], Mapping[str, Any]], str]


def lit(value: float) -> str:
    """A float literal Triton's frontend parses (the builder guarantees finiteness)."""
    return repr(float(value))


def _int_power(x: str, n: int) -> str:
    """x**n for a positive int n by binary exponentiation, as one expression."""
    result: str | None = None
    base = x
    while n:
        if n & 1:
            result = base if result is None else f"({result} * {base})"
        n >>= 1
        if n:
            base = f"({base} * {base})"
    assert result is not None
    return result


def _pow(args: list[str], attrs: Mapping[str, Any]) -> str:
    x, e = args[0], float(attrs["exponent"])
    if e == 0.0:
        return f"(tl.zeros_like({x}) + 1.0)"
    if e.is_integer() and abs(e) <= _POW_INT_LIMIT:
        power = _int_power(f"({x})", int(abs(e)))
        return power if e > 0 else f"(1.0 / {power})"
    if e == 0.5:
        return f"tl.sqrt({x})"
    # x**e = 2**(e·log2 x): NaN for x < 0 and a non-integer e, as NumPy gives; but
    # (-inf)**e is +inf for e > 0 and 0 for e < 0 there, where log2 gives NaN
    at_minus_inf = "float('inf')" if e > 0 else "0.0"
    return (f"tl.where({x} == float('-inf'), {at_minus_inf}, "
            f"tl.exp2({lit(e)} * tl.log2({x})))")


def _gelu(args: list[str], attrs: Mapping[str, Any]) -> str:
    # 0.5·x·(1 + tanh(z)) = x·sigmoid(2z) with z = √(2/π)·(x + 0.044715·x³)
    x = args[0]
    z2 = f"{lit(2 * _GELU_C)} * ({x} + 0.044715 * {x} * {x} * {x})"
    return f"({x} / (1.0 + tl.exp(-({z2}))))"


def _clamp(args: list[str], attrs: Mapping[str, Any]) -> str:
    x, lo, hi = args[0], lit(attrs["min_val"]), lit(attrs["max_val"])
    return f"tl.where({x} < {lo}, {lo}, tl.where({x} > {hi}, {hi}, {x}))"


FORMULAS: dict[OpKind, Formula] = {
    OpKind.EXP: lambda a, at: f"tl.exp({a[0]})",
    OpKind.SQUARE: lambda a, at: f"({a[0]} * {a[0]})",
    OpKind.SQRT: lambda a, at: f"tl.sqrt({a[0]})",
    OpKind.SILU: lambda a, at: f"({a[0]} / (1.0 + tl.exp(-({a[0]}))))",
    OpKind.GELU: _gelu,
    # where(x < 0) keeps NaN as NaN, as np.maximum / np.clip do
    OpKind.RELU: lambda a, at: f"tl.where({a[0]} < 0.0, 0.0, {a[0]})",
    OpKind.CLAMP: _clamp,
    OpKind.MUL_SCALAR: lambda a, at: f"({a[0]} * {lit(at['scalar'])})",
    OpKind.POW: _pow,
    OpKind.ADD: lambda a, at: f"({a[0]} + {a[1]})",
    OpKind.SUB: lambda a, at: f"({a[0]} - {a[1]})",
    OpKind.MUL: lambda a, at: f"({a[0]} * {a[1]})",
    OpKind.DIV: lambda a, at: f"({a[0]} / {a[1]})",
}

assert set(FORMULAS) == Group.ELEMENTWISE, "every elementwise operator needs a Triton formula"


def zero_preserving(kind: OpKind, attrs: Mapping[str, Any]) -> bool:
    """Whether f(0) == 0 (unary) or f(0, 0) == 0 (binary), so zero padding survives."""
    if kind is OpKind.CLAMP:
        return attrs["min_val"] <= 0.0 <= attrs["max_val"]
    if kind is OpKind.POW:
        return float(attrs["exponent"]) > 0.0
    return kind in _ZERO_TO_ZERO


_ZERO_TO_ZERO = frozenset(
    {
        OpKind.SQUARE,
        OpKind.SQRT,
        OpKind.SILU,
        OpKind.GELU,
        OpKind.RELU,
        OpKind.MUL_SCALAR,
        OpKind.ADD,
        OpKind.SUB,
        OpKind.MUL,
    }
)


def formula(kind: OpKind, args: list[str], attrs: Mapping[str, Any]) -> str:
    """The Triton expression of elementwise ``kind`` applied to ``args``."""
    return FORMULAS[kind](args, attrs)
