"""Shape inference: one rule per operator kind, shared by the kernel and block levels.

Each rule takes the input types and the operator's attributes and returns the output dims,
raising :class:`ShapeError` (or another MugraphError) with a message that names the operator
and the offending dims. The builders add the surrounding graph to the message.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mugraph.errors import DTypeError, GraphStructureError, ShapeError, UnsupportedError
from mugraph.ir.ops import AccumKind, Group, Level, OpKind
from mugraph.ir.tensor import TensorType, contiguous_strides

Dims = tuple[int, ...]


@dataclass(frozen=True)
class ShapeContext:
    """What a rule may need beyond its inputs: the level and the block graph's loop figures."""

    level: Level
    forloop_range: int = 1
    reduction_dimx: int = 1


def fmt(dims: Dims) -> str:
    return "[" + ", ".join(map(str, dims)) + "]"


def normalize_dim(op: str, dim: int, rank: int) -> int:
    """Accept a negative dim as in PyTorch; reject one outside the tensor."""
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise ShapeError(f"{op}: dim must be an int, got {dim!r}")
    if not -rank <= dim < rank:
        raise ShapeError(f"{op}: dim {dim} does not exist in a {rank}-d tensor")
    return dim % rank


def broadcast_dims(op: str, a: Dims, b: Dims) -> Dims:
    """Elementwise broadcast: equal ranks, each dim equal or one of them 1."""
    if len(a) != len(b):
        raise ShapeError(
            f"{op}: operands must have the same number of dims, got {fmt(a)} and {fmt(b)}"
        )
    out = []
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y and 1 not in (x, y):
            raise ShapeError(
                f"{op}: dims {fmt(a)} and {fmt(b)} do not broadcast (dim {i}: {x} vs {y})"
            )
        out.append(max(x, y))
    return tuple(out)


def _same_dtype(op: str, types: list[TensorType]) -> None:
    dtypes = {t.dtype for t in types}
    if len(dtypes) > 1:
        names = ", ".join(sorted(d.value for d in dtypes))
        raise DTypeError(f"{op}: operands have different dtypes ({names})")


def _elementwise_unary(types: list[TensorType], attrs: dict, ctx: ShapeContext) -> list[Dims]:
    return [types[0].dims]


def _scalar_unary(types: list[TensorType], attrs: dict, ctx: ShapeContext) -> list[Dims]:
    """clamp, mul_scalar, pow: their scalars must be finite numbers."""
    for name in _SCALARS[attrs["_name"]]:
        value = attrs.get(name)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value):
            op = attrs["_name"]
            raise UnsupportedError(f"{op}: {name} must be a finite number, got {value!r}")
    return [types[0].dims]


_SCALARS = {"clamp": ("min_val", "max_val"), "mul_scalar": ("scalar",), "pow": ("exponent",)}


def _check_dim(op: str, dim: object, dims: Dims) -> int:
    """A stored dim attribute: already normalized (0 <= dim < rank) by the builder."""
    if not isinstance(dim, int) or isinstance(dim, bool) or not 0 <= dim < len(dims):
        raise ShapeError(f"{op}: dim {dim!r} does not exist in {fmt(dims)}")
    return dim


def _elementwise_binary(types: list[TensorType], attrs: dict, ctx: ShapeContext) -> list[Dims]:
    return [broadcast_dims(attrs["_name"], types[0].dims, types[1].dims)]


def _matmul(types: list[TensorType], attrs: dict, ctx: ShapeContext) -> list[Dims]:
    a, b = types[0].dims, types[1].dims
    if len(a) < 2 or len(b) < 2:
        raise ShapeError(f"matmul: operands need at least 2 dims, got {fmt(a)} @ {fmt(b)}")
    if a[-1] != b[-2]:
        raise ShapeError(f"matmul: inner dims differ: {fmt(a)} @ {fmt(b)} ({a[-1]} != {b[-2]})")
    batch_a, batch_b = a[:-2], b[:-2]
    if ctx.level is not Level.KERNEL and len(batch_a) != len(batch_b):
        raise ShapeError(
            f"matmul: block operands must have the same number of dims, got {fmt(a)} @ {fmt(b)}"
        )
    width = max(len(batch_a), len(batch_b))
    pa = (1,) * (width - len(batch_a)) + batch_a
    pb = (1,) * (width - len(batch_b)) + batch_b
    batch = []
    for x, y in zip(pa, pb, strict=True):
        if x != y and 1 not in (x, y):
            raise ShapeError(f"matmul: batch dims of {fmt(a)} and {fmt(b)} do not broadcast")
        batch.append(max(x, y))
    return [(*batch, a[-2], b[-1])]


def _reduction(types: list[TensorType], attrs: dict, ctx: ShapeContext) -> list[Dims]:
    dims = types[0].dims
    dim = _check_dim(attrs["_name"], attrs.get("dim"), dims)
    return [dims[:dim] + (1,) + dims[dim + 1 :]]


def _rms_norm(types: list[TensorType], attrs: dict, ctx: ShapeContext) -> list[Dims]:
    dims = types[0].dims
    shape = attrs.get("normalized_shape")
    if not isinstance(shape, tuple) or not shape:
        raise ShapeError(f"rms_norm: normalized_shape must be a non-empty tuple, got {shape!r}")
    if len(shape) > len(dims) or tuple(dims[len(dims) - len(shape) :]) != shape:
        raise ShapeError(
            f"rms_norm: normalized_shape {fmt(shape)} is not the trailing dims of {fmt(dims)}"
        )
    return [dims]


def _concat(types: list[TensorType], attrs: dict, ctx: ShapeContext) -> list[Dims]:
    a, b = types[0].dims, types[1].dims
    dim = _check_dim("concat", attrs.get("dim"), a)
    if len(a) != len(b) or any(
        x != y for i, (x, y) in enumerate(zip(a, b, strict=True)) if i != dim
    ):
        raise ShapeError(f"concat: {fmt(a)} and {fmt(b)} differ outside dim {dim}")
    return [a[:dim] + (a[dim] + b[dim],) + a[dim + 1 :]]


def _reshape(types: list[TensorType], attrs: dict, ctx: ShapeContext) -> list[Dims]:
    dims, new = types[0].dims, attrs.get("dims")
    if not isinstance(new, tuple) or not new or any(not isinstance(d, int) for d in new):
        raise ShapeError(f"reshape: dims must be a non-empty tuple of ints, got {new!r}")
    if math.prod(dims) != math.prod(new):
        raise ShapeError(
            f"reshape: cannot reshape {fmt(dims)} ({math.prod(dims)} elements) "
            f"to {fmt(new)} ({math.prod(new)} elements)"
        )
    return [new]


def _permute(types: list[TensorType], attrs: dict, ctx: ShapeContext) -> list[Dims]:
    dims, perm = types[0].dims, attrs.get("perm")
    if (not isinstance(perm, tuple) or any(not isinstance(p, int) for p in perm)
            or sorted(perm) != list(range(len(dims)))):
        raise ShapeError(
            f"permute: perm must order all {len(dims)} dims of {fmt(dims)} (a permutation of "
            f"0..{len(dims) - 1}), got {perm!r}"
        )
    return [tuple(dims[p] for p in perm)]


def permuted_strides(t: TensorType, perm: tuple[int, ...]) -> tuple[int, ...]:
    """The strides of ``t`` viewed with its dims in the order ``perm`` (a permute's output)."""
    strides = t.strides if t.strides is not None else contiguous_strides(t.dims)
    return tuple(strides[p] for p in perm)


def _forloop_accum(types: list[TensorType], attrs: dict, ctx: ShapeContext) -> list[Dims]:
    dims = types[0].dims
    acc = attrs.get("acc")
    if not isinstance(acc, AccumKind):
        raise UnsupportedError(f"forloop_accum: unsupported accumulator {acc!r}")
    if acc is AccumKind.NONE:
        return [dims]
    if acc is AccumKind.SUM_TODIMX:
        dimx = ctx.reduction_dimx
        if dims[-1] % dimx:
            raise ShapeError(
                f"forloop_accum: sum_todimx needs reduction_dimx={dimx} to divide the last "
                f"dim of {fmt(dims)}"
            )
        return [dims[:-1] + (dimx,)]
    return [dims[:-1] + (1,)]


def _forloop_accum_rescale(types: list[TensorType], attrs: dict, ctx: ShapeContext) -> list[Dims]:
    value, scale = types[0].dims, types[1].dims
    if attrs.get("acc") not in (AccumKind.NONE, AccumKind.SUM):
        raise UnsupportedError(
            f"forloop_accum_rescale: unsupported accumulator {attrs.get('acc')!r} (None or sum)"
        )
    out = value if attrs["acc"] is AccumKind.NONE else value[:-1] + (1,)
    if broadcast_dims("forloop_accum_rescale", out, scale) != out:
        raise ShapeError(
            f"forloop_accum_rescale: rescale factor {fmt(scale)} must broadcast to the "
            f"accumulator {fmt(out)}"
        )
    return [out]


def _thread_graph(types: list[TensorType], attrs: dict, ctx: ShapeContext) -> list[Dims]:
    from mugraph.ir.thread import check_program

    check_program(attrs.get("program", ()), len(types))
    dims = types[0].dims
    for t in types[1:]:
        dims = broadcast_dims("thread_graph", dims, t.dims)
    return [dims]


def _boundary(types: list[TensorType], attrs: dict, ctx: ShapeContext) -> list[Dims]:
    raise GraphStructureError("boundary operators are built by their builder methods")


ShapeRule = Callable[[list[TensorType], dict, ShapeContext], list[Dims]]

SHAPE_RULES: dict[OpKind, ShapeRule] = {
    **{k: _elementwise_unary for k in Group.ELEMENTWISE_UNARY},
    OpKind.CLAMP: _scalar_unary,
    OpKind.MUL_SCALAR: _scalar_unary,
    OpKind.POW: _scalar_unary,
    **{k: _elementwise_binary for k in Group.ELEMENTWISE_BINARY},
    OpKind.MATMUL: _matmul,
    OpKind.REDUCTION: _reduction,
    OpKind.REDUCTION_MAX: _reduction,
    OpKind.RMS_NORM: _rms_norm,
    OpKind.CONCAT: _concat,
    OpKind.RESHAPE: _reshape,
    OpKind.PERMUTE: _permute,
    OpKind.FORLOOP_ACCUM: _forloop_accum,
    OpKind.FORLOOP_ACCUM_MAX: _elementwise_unary,
    OpKind.FORLOOP_ACCUM_RESCALE: _forloop_accum_rescale,
    OpKind.THREAD_GRAPH: _thread_graph,
    OpKind.INPUT: _boundary,
    OpKind.BLOCK_INPUT: _boundary,
    OpKind.BLOCK_OUTPUT: _boundary,
    OpKind.CUSTOMIZED: _boundary,
}


# The strides of a view's output (kernel level): its input's memory seen through new dims.
VIEW_STRIDES: dict[OpKind, Callable[[TensorType, dict], tuple[int, ...]]] = {
    OpKind.PERMUTE: lambda t, attrs: permuted_strides(t, attrs["perm"]),
}

# How many inputs each operator takes (thread graphs take any positive number).
ARITY: dict[OpKind, int] = {
    **{k: 1 for k in Group.ELEMENTWISE_UNARY | Group.REDUCING},
    **{k: 2 for k in Group.ELEMENTWISE_BINARY},
    OpKind.MATMUL: 2,
    OpKind.RMS_NORM: 1,
    OpKind.CONCAT: 2,
    OpKind.RESHAPE: 1,
    OpKind.PERMUTE: 1,
    OpKind.FORLOOP_ACCUM: 1,
    OpKind.FORLOOP_ACCUM_MAX: 1,
    OpKind.FORLOOP_ACCUM_RESCALE: 2,
}


def infer_output_types(
    kind: OpKind, types: list[TensorType], attrs: dict[str, Any], ctx: ShapeContext
) -> list[TensorType]:
    """Output types of ``kind`` applied to ``types``; raises a MugraphError when invalid."""
    if ctx.level not in kind.levels:
        raise UnsupportedError(f"{kind.value}: not available in a {ctx.level.value} graph")
    arity = ARITY.get(kind)
    if arity is not None and len(types) != arity:
        raise GraphStructureError(f"{kind.value}: takes {arity} inputs, got {len(types)}")
    if not types:
        raise GraphStructureError(f"{kind.value}: takes at least one input, got none")
    _same_dtype(kind.value, types)
    dims_list = SHAPE_RULES[kind](types, {"_name": kind.value, **attrs}, ctx)
    dtype = types[0].dtype
    for dims in dims_list:
        if any(d <= 0 for d in dims):
            raise ShapeError(f"{kind.value}: produces an empty tensor {fmt(dims)}")
    if ctx.level is Level.KERNEL:
        from mugraph.ir.tensor import contiguous_strides

        if kind in Group.VIEW:
            return [TensorType(dims_list[0], dtype, VIEW_STRIDES[kind](types[0], attrs))]
        return [TensorType(d, dtype, contiguous_strides(d)) for d in dims_list]
    return [TensorType(d, dtype) for d in dims_list]
