"""Operator kinds, the levels they live at, and the property groups code consults.

Code asks ``kind in Group.ELEMENTWISE`` (or ``kind.is_elementwise``) rather than comparing
against lists of kinds; every interpretation of the operators (reference floats, finite
field, abstract expressions, cost, Triton) is a table keyed by :class:`OpKind`.
"""

from __future__ import annotations

import enum


class Level(enum.Enum):
    """The three levels of a μGraph."""

    KERNEL = "kernel"
    BLOCK = "block"
    THREAD = "thread"


K, B, T = Level.KERNEL, Level.BLOCK, Level.THREAD


class OpKind(enum.Enum):
    """Every operator mugraph knows, at any level. The value is the name used in JSON."""

    INPUT = "input"  # kernel graph input (a device tensor)
    BLOCK_INPUT = "block_input"  # input iterator: imap + forloop_dim
    BLOCK_OUTPUT = "block_output"  # output saver: omap + forloop_dim
    CUSTOMIZED = "customized"  # graph-defined kernel operator
    THREAD_GRAPH = "thread_graph"  # fused chain of elementwise operators

    MATMUL = "matmul"
    # elementwise unary
    EXP = "exp"
    SQUARE = "square"
    SQRT = "sqrt"
    SILU = "silu"
    GELU = "gelu"
    RELU = "relu"
    CLAMP = "clamp"
    MUL_SCALAR = "mul_scalar"
    POW = "pow"
    # elementwise binary (size-1 dims broadcast)
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    # reductions and normalisation
    REDUCTION = "reduction"
    REDUCTION_MAX = "reduction_max"
    RMS_NORM = "rms_norm"
    # data movement
    CONCAT = "concat"
    RESHAPE = "reshape"
    PERMUTE = "permute"  # a kernel-level view: dims reordered, no data moved
    # for-loop accumulators (block level)
    FORLOOP_ACCUM = "forloop_accum"
    FORLOOP_ACCUM_MAX = "forloop_accum_max"
    FORLOOP_ACCUM_RESCALE = "forloop_accum_rescale"

    @property
    def levels(self) -> frozenset[Level]:
        return _LEVELS[self]

    @property
    def is_elementwise(self) -> bool:
        return self in Group.ELEMENTWISE

    @property
    def is_accumulator(self) -> bool:
        return self in Group.ACCUMULATOR

    def __repr__(self) -> str:
        return f"OpKind.{self.name}"


_LEVELS: dict[OpKind, frozenset[Level]] = {
    OpKind.INPUT: frozenset({K}),
    OpKind.BLOCK_INPUT: frozenset({B}),
    OpKind.BLOCK_OUTPUT: frozenset({B}),
    OpKind.CUSTOMIZED: frozenset({K}),
    OpKind.THREAD_GRAPH: frozenset({B}),
    OpKind.MATMUL: frozenset({K, B}),
    OpKind.EXP: frozenset({K, B, T}),
    OpKind.SQUARE: frozenset({K, B, T}),
    OpKind.SQRT: frozenset({K, B, T}),
    OpKind.SILU: frozenset({K, B, T}),
    OpKind.GELU: frozenset({K, B, T}),
    OpKind.RELU: frozenset({K, B, T}),
    OpKind.CLAMP: frozenset({K, B, T}),
    OpKind.MUL_SCALAR: frozenset({K, B, T}),
    OpKind.POW: frozenset({K, B, T}),
    OpKind.ADD: frozenset({K, B, T}),
    OpKind.SUB: frozenset({K, B, T}),
    OpKind.MUL: frozenset({K, B, T}),
    OpKind.DIV: frozenset({K, B, T}),
    OpKind.REDUCTION: frozenset({K, B}),
    OpKind.REDUCTION_MAX: frozenset({B}),
    OpKind.RMS_NORM: frozenset({K, B}),
    OpKind.CONCAT: frozenset({K, B}),
    OpKind.RESHAPE: frozenset({K, B}),
    OpKind.PERMUTE: frozenset({K}),
    OpKind.FORLOOP_ACCUM: frozenset({B}),
    OpKind.FORLOOP_ACCUM_MAX: frozenset({B}),
    OpKind.FORLOOP_ACCUM_RESCALE: frozenset({B}),
}


class Group:
    """Property sets over :class:`OpKind`; each states what its members have in common."""

    # One input, one output of the same shape, computed element by element.
    ELEMENTWISE_UNARY = frozenset(
        {
            OpKind.EXP,
            OpKind.SQUARE,
            OpKind.SQRT,
            OpKind.SILU,
            OpKind.GELU,
            OpKind.RELU,
            OpKind.CLAMP,
            OpKind.MUL_SCALAR,
            OpKind.POW,
        }
    )
    # Two inputs broadcast against each other (size-1 dims), element by element.
    ELEMENTWISE_BINARY = frozenset({OpKind.ADD, OpKind.SUB, OpKind.MUL, OpKind.DIV})
    ELEMENTWISE = ELEMENTWISE_UNARY | ELEMENTWISE_BINARY
    # Linear in each input separately (the "L" of LAX).
    MULTILINEAR = frozenset(
        {
            OpKind.MATMUL,
            OpKind.ADD,
            OpKind.SUB,
            OpKind.MUL,
            OpKind.MUL_SCALAR,
            OpKind.REDUCTION,
            OpKind.CONCAT,
            OpKind.RESHAPE,
            OpKind.PERMUTE,
        }
    )
    # Contain exactly one exponential of their input (silu = x / (1 + e^-x), tanh-form gelu).
    EXPONENTIAL = frozenset({OpKind.EXP, OpKind.SILU, OpKind.GELU})
    # Outside LAX: the verifier treats them as uninterpreted functions of their inputs.
    NON_LAX = frozenset(
        {
            OpKind.SQRT,
            OpKind.RELU,
            OpKind.CLAMP,
            OpKind.REDUCTION_MAX,
            OpKind.FORLOOP_ACCUM_MAX,
        }
    )
    # Combine the tiles of all for-loop iterations; their results live after the loop.
    ACCUMULATOR = frozenset(
        {OpKind.FORLOOP_ACCUM, OpKind.FORLOOP_ACCUM_MAX, OpKind.FORLOOP_ACCUM_RESCALE}
    )
    # Sum away one dim (kept with size 1).
    REDUCING = frozenset({OpKind.REDUCTION, OpKind.REDUCTION_MAX})
    # Kernel-level operators that only re-index a device tensor (new dims and strides over the
    # same memory): the runtime makes a view, no kernel runs and nothing is copied; a search
    # never puts them inside a kernel and cuts a program at them.
    VIEW = frozenset({OpKind.PERMUTE})
    # Operators that are neither computation nor data: graph boundaries.
    BOUNDARY = frozenset({OpKind.INPUT, OpKind.BLOCK_INPUT, OpKind.BLOCK_OUTPUT})
    # Operators a user may call at the kernel level / block level through the builders.
    KERNEL = frozenset(k for k, lv in _LEVELS.items() if K in lv)
    BLOCK = frozenset(k for k, lv in _LEVELS.items() if B in lv)
    THREAD = frozenset(k for k, lv in _LEVELS.items() if T in lv)


class AccumKind(enum.Enum):
    """How ``forloop_accum`` combines the tiles of the for-loop iterations.

    NONE adds the tiles elementwise.  SUM, MEAN and RMS also reduce the last dim to size 1,
    over the whole last dim of the input across all iterations (RMS is sqrt(mean(x²))).
    SUM_TODIMX reduces the last dim to ``reduction_dimx`` partial sums of contiguous chunks.
    """

    NONE = "none"
    SUM = "sum"
    MEAN = "mean"
    RMS = "rms"
    SUM_TODIMX = "sum_todimx"


def as_accum_kind(value: object, *, operator: str = "forloop_accum") -> AccumKind:
    """Parse the ``acc`` argument of the accumulators (None means elementwise sum)."""
    from mugraph.errors import UnsupportedError

    if value is None:
        return AccumKind.NONE
    if isinstance(value, AccumKind):
        return value
    try:
        return AccumKind(str(value).lower())
    except ValueError:
        allowed = ", ".join(["None"] + [a.value for a in AccumKind if a is not AccumKind.NONE])
        raise UnsupportedError(
            f"{operator}: unsupported accumulator {value!r}; expected one of {allowed}"
        ) from None
