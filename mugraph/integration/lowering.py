"""The lowering table: which PyTorch operators map onto mugraph operators, and how.

``op_name(node)`` names the PyTorch operator a call node performs (the same name for
``torch.add``, ``operator.add`` and ``Tensor.add``), or None when mugraph has no rule for it.
Each rule gets the lowering context, the node and its arguments (mugraph tensors, outside
tensors, numbers) and returns a mugraph tensor, or raises :class:`Unsupported` with the reason.

The rules are exact: a PyTorch operator whose function differs from every mugraph form
(``F.gelu`` with the erf form, an ``alpha`` on ``add``, a softmax in another dtype) is
unsupported, never approximated. ``rms_norm`` (and the canonical ``rms_norm_f32`` of
:mod:`mugraph.integration.canonicalize`) is mugraph's ``rms_norm`` with its epsilon; a
weight is a ``mul`` after it. ``scaled_dot_product_attention`` becomes
``exp(Q K) * M / sum(exp(Q K) * M) @ V`` with grouped heads as views (see :func:`_sdpa`).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx import Node

from mugraph.integration.capture import External, LowerContext, Unsupported, meta_value
from mugraph.integration.torch_ops import rms_norm_f32

Rule = Callable[[LowerContext, Node, tuple, dict], Any]

# ---- naming the operator of a node ---------------------------------------------------------------

_FUNCTIONS: dict[Any, str] = {
    operator.matmul: "matmul", torch.matmul: "matmul", torch.mm: "matmul", torch.bmm: "matmul",
    F.linear: "linear",
    operator.add: "add", torch.add: "add",
    operator.sub: "sub", torch.sub: "sub", torch.subtract: "sub",
    operator.mul: "mul", torch.mul: "mul", torch.multiply: "mul",
    operator.truediv: "div", torch.div: "div", torch.divide: "div", torch.true_divide: "div",
    operator.neg: "neg", torch.neg: "neg", torch.negative: "neg",
    operator.pow: "pow", torch.pow: "pow",
    torch.exp: "exp", torch.sqrt: "sqrt", torch.rsqrt: "rsqrt", torch.square: "square",
    F.silu: "silu", F.gelu: "gelu", F.relu: "relu", torch.relu: "relu",
    torch.sigmoid: "sigmoid", F.sigmoid: "sigmoid",
    torch.softmax: "softmax", F.softmax: "softmax",
    torch.sum: "sum", torch.mean: "mean",
    torch.rms_norm: "rms_norm", F.rms_norm: "rms_norm", rms_norm_f32: "rms_norm_f32",
    torch.clamp: "clamp", torch.clip: "clamp",
    torch.reshape: "reshape", torch.flatten: "reshape", torch.unsqueeze: "reshape",
    torch.squeeze: "reshape",
    torch.transpose: "transpose", torch.permute: "permute", torch.t: "t",
    F.dropout: "dropout",
    F.scaled_dot_product_attention: "sdpa",
    operator.getitem: "slice", torch.narrow: "slice",
}

_METHODS: dict[str, str] = {
    "matmul": "matmul", "mm": "matmul", "bmm": "matmul", "__matmul__": "matmul",
    "add": "add", "__add__": "add", "__radd__": "add",
    "sub": "sub", "__sub__": "sub", "subtract": "sub",
    "mul": "mul", "__mul__": "mul", "__rmul__": "mul", "multiply": "mul",
    "div": "div", "__truediv__": "div", "true_divide": "div", "divide": "div",
    "neg": "neg", "__neg__": "neg", "negative": "neg",
    "pow": "pow", "__pow__": "pow",
    "exp": "exp", "sqrt": "sqrt", "rsqrt": "rsqrt", "square": "square", "relu": "relu",
    "sigmoid": "sigmoid",
    "softmax": "softmax", "sum": "sum", "mean": "mean", "clamp": "clamp", "clip": "clamp",
    "view": "reshape", "reshape": "reshape", "flatten": "reshape", "unsqueeze": "reshape",
    "squeeze": "reshape",
    "transpose": "transpose", "permute": "permute", "t": "t", "narrow": "slice",
    "__getitem__": "slice",
    "contiguous": "identity", "float": "cast", "half": "cast", "bfloat16": "cast",
    "to": "cast", "type_as": "cast",
}

# Operators that only move data: left to PyTorch when they read an outside tensor (the view
# then reaches mugraph as a strided input), lowered when they read a mugraph value.
VIEW_OPS = frozenset({"reshape", "transpose", "permute", "t", "slice", "identity", "cast",
                      "dropout"})


def op_name(node: Node) -> str | None:
    """The mugraph-known name of the operator ``node`` calls, or None."""
    if node.op == "call_function":
        if node.target is operator.getitem and not _indexes_a_tensor(node):
            return None  # an element of a tuple (an operator's several results)
        try:
            return _FUNCTIONS.get(node.target)
        except TypeError:  # an unhashable target
            return None
    if node.op == "call_method":
        return _METHODS.get(node.target)
    return None


def _indexes_a_tensor(node: Node) -> bool:
    source = node.args[0] if node.args else None
    if not isinstance(source, Node):
        return False
    value = source.meta.get("val", source.meta.get("example_value"))
    return isinstance(value, torch.Tensor)


def target_name(node: Node) -> str:
    """A readable name of what ``node`` calls."""
    target = node.target
    if node.op == "call_method":
        return f"Tensor.{target}"
    if node.op == "call_module":
        return f"module {target}"
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", None) or str(target)
    module = {"_operator": "operator", "torch._C._nn": "F", "torch.nn.functional": "F"}.get(
        module, module
    )
    return f"{module}.{name}" if module else name


def lowering_rule(node: Node) -> Rule:
    name = op_name(node)
    if name is None:
        raise Unsupported(f"{node.name}: {target_name(node)} has no mugraph equivalent")
    if "out" in node.kwargs:
        raise Unsupported(f"{node.name}: {target_name(node)} with out= (writes a given tensor)")
    return RULES[name]


# ---- argument helpers ----------------------------------------------------------------------------


def _arg(args: tuple, kwargs: dict, index: int, name: str, default: Any = None) -> Any:
    if len(args) > index:
        return args[index]
    return kwargs.get(name, default)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _dims_arg(args: tuple, start: int) -> tuple:
    rest = args[start:]
    if len(rest) == 1 and isinstance(rest[0], (tuple, list, torch.Size)):
        return tuple(rest[0])
    return tuple(rest)


def _same_dtype(cx: LowerContext, what: str, *values: Any) -> torch.dtype:
    dtypes = {cx.dtype(v) for v in values if cx.is_tensor(v)}
    if len(dtypes) != 1:
        raise Unsupported(f"{what}: operands of different dtypes {sorted(map(str, dtypes))}")
    return dtypes.pop()


# ---- elementwise ---------------------------------------------------------------------------------


def _broadcast_pair(cx: LowerContext, a: Any, b: Any) -> tuple:
    rank = max(len(cx.dims(a)), len(cx.dims(b)))
    return cx.tensor(cx.with_rank(a, rank)), cx.tensor(cx.with_rank(b, rank))


def _binary(kind: str) -> Rule:
    """add / sub / mul / div of two tensors, or of a tensor and a number."""

    def rule(cx: LowerContext, node: Node, args: tuple, kwargs: dict) -> Any:
        a, b = args[0], _arg(args, kwargs, 1, "other")
        if "alpha" in kwargs and kwargs["alpha"] != 1:
            raise Unsupported(f"{node.name}: {kind} with alpha={kwargs['alpha']}")
        if kwargs.get("rounding_mode") is not None:
            raise Unsupported(f"{node.name}: div with rounding_mode={kwargs['rounding_mode']!r}")
        if cx.is_tensor(a) and cx.is_tensor(b):
            _same_dtype(cx, node.name, a, b)
            x, y = _broadcast_pair(cx, a, b)
            return getattr(cx.graph, kind)(x, y)
        if cx.is_tensor(a) and _number(b):
            return _with_scalar(cx, kind, a, float(b), scalar_first=False)
        if _number(a) and cx.is_tensor(b):
            return _with_scalar(cx, kind, b, float(a), scalar_first=True)
        raise Unsupported(f"{node.name}: {kind} of {type(a).__name__} and {type(b).__name__}")

    return rule


def _with_scalar(cx: LowerContext, kind: str, t: Any, c: float, scalar_first: bool) -> Any:
    """``t (op) c`` or ``c (op) t``: mul_scalar where it is one, else a constant input."""
    x = cx.tensor(t)
    if kind == "mul":
        return cx.graph.mul_scalar(x, c)
    if kind == "div" and not scalar_first:
        if c == 0 or not math.isfinite(1.0 / c):
            raise Unsupported(f"division by {c}")
        return cx.graph.mul_scalar(x, 1.0 / c)
    const = cx.const(c, x.num_dims, cx.dtype(x))
    a, b = (const, x) if scalar_first else (x, const)
    return getattr(cx.graph, kind)(a, b)


def _unary(kind: str) -> Rule:
    def rule(cx: LowerContext, node: Node, args: tuple, kwargs: dict) -> Any:
        if _arg(args, kwargs, 1, "inplace", False) is not False:
            raise Unsupported(f"{node.name}: an in-place {kind}")
        return getattr(cx.graph, kind)(cx.tensor(args[0]))

    return rule


def _neg(cx: LowerContext, node: Node, args: tuple, kwargs: dict) -> Any:
    return cx.graph.mul_scalar(cx.tensor(args[0]), -1.0)


def _rsqrt(cx: LowerContext, node: Node, args: tuple, kwargs: dict) -> Any:
    return cx.graph.pow(cx.tensor(args[0]), -0.5)


def _pow(cx: LowerContext, node: Node, args: tuple, kwargs: dict) -> Any:
    base, exponent = args[0], _arg(args, kwargs, 1, "exponent")
    if not cx.is_tensor(base) or not _number(exponent):
        raise Unsupported(f"{node.name}: pow needs a tensor base and a number exponent")
    x = cx.tensor(base)
    if exponent == 1:
        return x
    if exponent == 2:
        return cx.graph.square(x)
    return cx.graph.pow(x, float(exponent))


def _sigmoid(cx: LowerContext, node: Node, args: tuple, kwargs: dict) -> Any:
    """1 / (1 + exp(-x)), with the 1 held in a constant input (x * sigmoid(x) is silu)."""
    x = cx.tensor(args[0])
    one = cx.const(1.0, x.num_dims, cx.dtype(x))
    denominator = cx.graph.add(one, cx.graph.exp(cx.graph.mul_scalar(x, -1.0)))
    return cx.graph.div(one, denominator)


def _gelu(cx: LowerContext, node: Node, args: tuple, kwargs: dict) -> Any:
    approximate = _arg(args, kwargs, 1, "approximate", "none")
    if approximate != "tanh":
        raise Unsupported(
            f"{node.name}: gelu with approximate={approximate!r} (the erf form) is not mugraph's "
            "tanh-form gelu"
        )
    return cx.graph.gelu(cx.tensor(args[0]))


def _clamp(cx: LowerContext, node: Node, args: tuple, kwargs: dict) -> Any:
    lo, hi = _arg(args, kwargs, 1, "min"), _arg(args, kwargs, 2, "max")
    x = cx.tensor(args[0])
    if lo == 0 and hi is None:
        return cx.graph.relu(x)
    if _number(lo) and _number(hi):
        return cx.graph.clamp(x, float(lo), float(hi))
    raise Unsupported(f"{node.name}: clamp with min={lo!r}, max={hi!r} (both bounds needed)")


# ---- matmul --------------------------------------------------------------------------------------


def _matmul(cx: LowerContext, node: Node, args: tuple, kwargs: dict) -> Any:
    a, b = args[0], _arg(args, kwargs, 1, "other", kwargs.get("mat2"))
    if not (cx.is_tensor(a) and cx.is_tensor(b)):
        raise Unsupported(f"{node.name}: matmul of non-tensors")
    if len(cx.dims(a)) < 2 or len(cx.dims(b)) < 2:
        raise Unsupported(f"{node.name}: matmul of a 1-d tensor")
    _same_dtype(cx, node.name, a, b)
    rank = max(len(cx.dims(a)), len(cx.dims(b)))
    return cx.graph.matmul(cx.tensor(cx.with_rank(a, rank)), cx.tensor(cx.with_rank(b, rank)))


def _linear(cx: LowerContext, node: Node, args: tuple, kwargs: dict) -> Any:
    """x @ W.T (+ b): W.T is a strided view of the outside weight."""
    x, weight, bias = args[0], _arg(args, kwargs, 1, "weight"), _arg(args, kwargs, 2, "bias")
    if not isinstance(weight, External):
        raise Unsupported(f"{node.name}: linear with a weight computed in the partition")
    if len(cx.dims(weight)) != 2 or len(cx.dims(x)) < 2:
        raise Unsupported(f"{node.name}: linear needs a 2-d weight and an input of rank >= 2")
    _same_dtype(cx, node.name, x, weight, *([bias] if bias is not None else []))
    weight_t = cx.with_rank(cx.permute(weight, (1, 0)), len(cx.dims(x)))
    out = cx.graph.matmul(cx.tensor(x), cx.tensor(weight_t))
    if bias is None:
        return out
    return cx.graph.add(out, cx.tensor(cx.with_rank(bias, out.num_dims)))


# ---- reductions and normalization ------------------------------------------------------------


def _reduce_dims(cx: LowerContext, node: Node, x: Any, dim: Any) -> list[int]:
    rank = len(cx.dims(x))
    if dim is None or dim == [] or dim == ():
        raise Unsupported(f"{node.name}: a reduction over all dims (a 0-d result)")
    dims = [dim] if isinstance(dim, int) else list(dim)
    if any(not isinstance(d, int) or not -rank <= d < rank for d in dims):
        raise Unsupported(f"{node.name}: reduction dims {dim!r}")
    return sorted({d % rank for d in dims})


def _sum_over(cx: LowerContext, x: Any, dims: list[int]) -> Any:
    t = cx.tensor(x)
    for d in dims:
        t = cx.graph.reduction(t, d)
    return t


def _reduction(mean: bool) -> Rule:
    def rule(cx: LowerContext, node: Node, args: tuple, kwargs: dict) -> Any:
        x = args[0]
        if _arg(args, kwargs, 3, "dtype") is not None:
            raise Unsupported(f"{node.name}: a reduction with a dtype")
        dims = _reduce_dims(cx, node, x, _arg(args, kwargs, 1, "dim"))
        keepdim = bool(_arg(args, kwargs, 2, "keepdim", False))
        out = _sum_over(cx, x, dims)
        if mean:
            out = cx.graph.mul_scalar(out, 1.0 / math.prod(cx.dims(x)[d] for d in dims))
        return out if keepdim else cx.reshape(out, tuple(meta_value(node).shape))

    return rule


def _softmax(cx: LowerContext, node: Node, args: tuple, kwargs: dict) -> Any:
    x, dim = cx.tensor(args[0]), _arg(args, kwargs, 1, "dim")
    dtypes = [a for a in args[2:] if isinstance(a, torch.dtype)]
    dtype = kwargs.get("dtype", dtypes[0] if dtypes else None)
    if dim is None:
        raise Unsupported(f"{node.name}: softmax without a dim")
    if dtype is not None and dtype != cx.dtype(x):
        raise Unsupported(f"{node.name}: softmax in dtype {dtype}")
    return cx.graph.softmax(x, dim)


def rms(cx: LowerContext, x: Any, ndims: int, eps: float) -> Any:
    """``x / sqrt(mean(x²) + eps)`` over the last ``ndims`` dims: mugraph's rms_norm."""
    t = cx.tensor(x)
    return cx.graph.rms_norm(t, t.dims[t.num_dims - ndims:], eps=float(eps))


def _rms_norm_f32(cx: LowerContext, node: Node, args: tuple, kwargs: dict) -> Any:
    """The canonical RMSNorm (computed in float32 by PyTorch, in the input dtype here)."""
    x, eps = args[0], _arg(args, kwargs, 1, "eps")
    if not _number(eps) or eps < 0:
        raise Unsupported(f"{node.name}: rms_norm with eps={eps!r}")
    return rms(cx, x, 1, float(eps))


def _rms_norm(cx: LowerContext, node: Node, args: tuple, kwargs: dict) -> Any:
    x, shape = args[0], _arg(args, kwargs, 1, "normalized_shape")
    weight, eps = _arg(args, kwargs, 2, "weight"), _arg(args, kwargs, 3, "eps")
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if eps is None:
        eps = torch.finfo(cx.dtype(x)).eps  # PyTorch's default for eps=None
    if not _number(eps) or eps < 0:
        raise Unsupported(f"{node.name}: rms_norm with eps={eps!r}")
    if tuple(cx.dims(x)[-len(shape):]) != shape:
        raise Unsupported(f"{node.name}: normalized_shape {shape} is not the trailing dims")
    out = rms(cx, x, len(shape), float(eps))
    if weight is None:
        return out
    _same_dtype(cx, node.name, x, weight)
    return cx.graph.mul(out, cx.tensor(cx.with_rank(weight, out.num_dims)))


# ---- attention -----------------------------------------------------------------------------------


def _is_power_of_two(value: float) -> bool:
    mantissa, _ = math.frexp(value)
    return value > 0 and mantissa == 0.5


def _sdpa(cx: LowerContext, node: Node, args: tuple, kwargs: dict) -> Any:
    """softmax(q @ k.T * scale, masked) @ v as ``exp(S) * M / sum(exp(S) * M) @ V``.

    * Grouped heads (``enable_gqa``, hk key heads for h = hk * g query heads): views
      ``q [b, hk, g, s, d]``, ``k.T [b, hk, 1, d, n]``, ``v [b, hk, 1, n, d]``; the batch dim
      is dropped when it is 1. The result has PyTorch's elements in another shape (a view).
    * ``scale``: a power of two multiplies q on the way in (exact); another scale is a
      ``mul_scalar`` of the scores.
    * A boolean mask becomes a 0/1 multiplier M of exp(S) (``masked_fill(-inf)`` then softmax
      is exactly that), ``is_causal`` the constant lower-triangular M; a float mask is added
      to the scores before exp.
    """
    q, k, v = args[0], _arg(args, kwargs, 1, "key"), _arg(args, kwargs, 2, "value")
    mask = _arg(args, kwargs, 3, "attn_mask")
    causal = _arg(args, kwargs, 5, "is_causal", False)
    if _arg(args, kwargs, 4, "dropout_p", 0.0) != 0:
        raise Unsupported(f"{node.name}: attention with dropout")
    if not all(isinstance(t, External) for t in (q, k, v)):
        raise Unsupported(f"{node.name}: attention on values computed in the partition")
    if causal and mask is not None:
        raise Unsupported(f"{node.name}: attention with both is_causal and a mask")
    _same_dtype(cx, node.name, q, k, v)
    qd, kd, vd = cx.dims(q), cx.dims(k), cx.dims(v)
    if not len(qd) == len(kd) == len(vd) or len(qd) not in (3, 4):
        raise Unsupported(f"{node.name}: attention on tensors of rank {len(qd)}")
    *lead, heads, rows, head_dim = ((1, *qd) if len(qd) == 3 else qd)
    kv_heads, cols = kd[-3], kd[-2]
    if heads % kv_heads or (heads != kv_heads and not _arg(args, kwargs, 7, "enable_gqa", False)):
        raise Unsupported(f"{node.name}: {heads} query heads for {kv_heads} key heads")
    group = heads // kv_heads
    batch = (lead[0],) if lead and lead[0] > 1 else ()
    scale = _arg(args, kwargs, 6, "scale")
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    q = cx.reshape(q, (*batch, kv_heads, group, rows, head_dim))
    if scale != 1.0 and _is_power_of_two(scale):
        q, scale = cx.adapted(q, ("scale", scale)), 1.0
    rank = len(batch) + 4
    perm = (*range(len(kd) - 2), len(kd) - 1, len(kd) - 2)
    kt = cx.reshape(cx.permute(k, perm), (*batch, kv_heads, 1, head_dim, cols))
    vv = cx.reshape(v, (*batch, kv_heads, 1, cols, vd[-1]))
    scores = cx.graph.matmul(cx.tensor(q), cx.tensor(kt))
    if scale != 1.0:
        scores = cx.graph.mul_scalar(scores, scale)
    weights = _masked_exp(cx, node, scores, mask, causal, (*batch, kv_heads, group), rank)
    total = cx.graph.reduction(weights, rank - 1)
    out = cx.graph.matmul(cx.graph.div(weights, total), cx.tensor(vv))
    cx.reshaped.add(node)
    return out


def _mask_view(cx: LowerContext, node: Node, mask: Any, heads: tuple, rank: int) -> Any:
    """The mask as ``[*heads-or-1, rows, cols]`` of the scores' rank (views)."""
    dims = cx.dims(mask)
    rows_cols = dims[-2:]
    lead = dims[:-2]
    want_heads = math.prod(heads[-2:])  # hk * g
    if len(lead) > 2 or math.prod(lead[1:] if len(lead) == 2 else lead) not in (1, want_heads):
        raise Unsupported(f"{node.name}: an attention mask of shape {list(dims)}")
    if len(lead) == 2 and lead[0] != 1 and (len(heads) == 2 or lead[0] != heads[0]):
        raise Unsupported(f"{node.name}: a per-batch mask of shape {list(dims)}")
    mask_heads = math.prod(lead[-1:]) if lead else 1
    batch = heads[:-2]
    batch_dims = tuple(lead[0] if len(lead) == 2 else 1 for _ in batch)
    head_dims = heads[-2:] if mask_heads == want_heads else (1, 1)
    return cx.reshape(mask, (*batch_dims, *head_dims, *rows_cols))


def _masked_exp(cx: LowerContext, node: Node, scores, mask: Any, causal: bool, heads: tuple,
                rank: int):
    """exp(scores) with the mask applied exactly (see _sdpa)."""
    rows, cols = scores.dims[-2:]
    dtype = cx.dtype(scores)
    if causal:
        return cx.graph.mul(cx.graph.exp(scores), cx.causal_mask(rows, cols, rank, dtype))
    if mask is None:
        return cx.graph.exp(scores)
    if not isinstance(mask, External):
        raise Unsupported(f"{node.name}: an attention mask computed in the partition")
    view = _mask_view(cx, node, mask, heads, rank)
    if cx.dtype(mask) is torch.bool:
        ones = cx.tensor(cx.adapted(view, ("cast", dtype)))
        return cx.graph.mul(cx.graph.exp(scores), ones)
    if cx.dtype(mask) != dtype:
        raise Unsupported(f"{node.name}: an attention mask of dtype {cx.dtype(mask)}")
    return cx.graph.exp(cx.graph.add(scores, cx.tensor(view)))


# ---- data movement -------------------------------------------------------------------------------


def _reshape(cx: LowerContext, node: Node, args: tuple, kwargs: dict) -> Any:
    if meta_value(node).dtype != cx.dtype(args[0]):
        raise Unsupported(f"{node.name}: a view as another dtype")
    return cx.reshape(args[0], tuple(meta_value(node).shape))


def _moves_only_unit_dims(dims: tuple[int, ...], perm: tuple[int, ...]) -> bool:
    """A permutation that keeps the order of the dims larger than 1 is a reshape."""
    big = [d for d in perm if dims[d] != 1]
    return big == sorted(big)


def _permutation(node: Node, name: str, args: tuple, rank: int) -> tuple[int, ...]:
    if name == "t":
        return (1, 0) if rank == 2 else tuple(range(rank))
    if name == "transpose":
        a, b = args[1] % rank, args[2] % rank
        perm = list(range(rank))
        perm[a], perm[b] = perm[b], perm[a]
        return tuple(perm)
    perm = _dims_arg(args, 1)
    return tuple(p % rank for p in perm)


def _permute_rule(name: str) -> Rule:
    def rule(cx: LowerContext, node: Node, args: tuple, kwargs: dict) -> Any:
        if kwargs:
            args = (*args, *kwargs.values())
        dims = cx.dims(args[0])
        perm = _permutation(node, name, args, len(dims))
        if isinstance(args[0], External) or not _moves_only_unit_dims(dims, perm):
            return cx.permute(args[0], perm)  # a view: an adapter, or a kernel-level permute
        return cx.reshape(args[0], tuple(dims[p] for p in perm))

    return rule


def _slice(cx: LowerContext, node: Node, args: tuple, kwargs: dict) -> Any:
    """``x[..., a:b]`` (basic slicing with step 1) and ``narrow`` of an outside tensor: a view
    (the program's input starts inside the caller's tensor, with its strides), no copy."""
    x = args[0]
    if not cx.is_tensor(x):
        raise Unsupported(f"{node.name}: indexing a {type(x).__name__}, not a tensor")
    dims = cx.dims(x)
    if node.target in (torch.narrow, "narrow"):
        dim = _arg(args, kwargs, 1, "dim") % len(dims)
        start = _arg(args, kwargs, 2, "start") % dims[dim]
        steps = [(dim, start, _arg(args, kwargs, 3, "length"))]
    else:
        steps = _slice_steps(node, args[1], dims)
    steps = [s for s in steps if (s[1], s[2]) != (0, dims[s[0]])]  # whole dims: nothing to do
    if not steps:
        return x
    if not isinstance(x, External):
        raise Unsupported(f"{node.name}: a slice of a value computed by mugraph (no slice view "
                          "at the kernel level; the partition ends here)")
    for step in steps:
        x = cx.adapted(x, ("slice", step))
    return x


def _slice_steps(node: Node, index: Any, dims: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """(dim, start, length) of each sliced dim of ``x[index]``; Unsupported for anything but
    slices of step 1 and an ellipsis."""
    index = index if isinstance(index, tuple) else (index,)
    if sum(1 for i in index if i is Ellipsis) > 1 or any(
            not (isinstance(i, slice) or i is Ellipsis) for i in index):
        raise Unsupported(f"{node.name}: indexing with {index!r} (only slices and ...)")
    if Ellipsis in index:
        at = index.index(Ellipsis)
        index = index[:at] + (slice(None),) * (len(dims) - len(index) + 1) + index[at + 1:]
    if len(index) > len(dims):
        raise Unsupported(f"{node.name}: {len(index)} indices for {len(dims)} dims")
    steps = []
    for dim, (part, size) in enumerate(zip(index, dims, strict=False)):
        if not all(v is None or isinstance(v, int) for v in (part.start, part.stop, part.step)):
            raise Unsupported(f"{node.name}: a slice with non-constant bounds {part!r}")
        start, stop, step = part.indices(size)
        if step != 1 or stop <= start:
            raise Unsupported(f"{node.name}: slice {part!r} of a dim of {size} (step 1, "
                              "non-empty only)")
        steps.append((dim, start, stop - start))
    return steps


def _identity(cx: LowerContext, node: Node, args: tuple, kwargs: dict) -> Any:
    return args[0]


def _cast(cx: LowerContext, node: Node, args: tuple, kwargs: dict) -> Any:
    """``.float()`` / ``.to(...)`` / ``type_as``: only when nothing changes."""
    x = args[0]
    want = meta_value(node)
    if want.dtype != cx.dtype(x):
        raise Unsupported(f"{node.name}: a dtype conversion to {want.dtype}")
    layout = kwargs.get("memory_format")
    if kwargs.get("copy", False) or layout not in (None, torch.preserve_format):
        raise Unsupported(f"{node.name}: a copying conversion")
    for arg in (*args[1:], *kwargs.values()):
        if isinstance(arg, torch.device | str) and torch.device(arg).type != want.device.type:
            raise Unsupported(f"{node.name}: a device transfer")
    return x


def _dropout(cx: LowerContext, node: Node, args: tuple, kwargs: dict) -> Any:
    p, training = _arg(args, kwargs, 1, "p", 0.5), _arg(args, kwargs, 2, "training", True)
    if training and p != 0:
        raise Unsupported(f"{node.name}: dropout in training mode")
    return args[0]


RULES: dict[str, Rule] = {
    "matmul": _matmul,
    "linear": _linear,
    "add": _binary("add"),
    "sub": _binary("sub"),
    "mul": _binary("mul"),
    "div": _binary("div"),
    "neg": _neg,
    "pow": _pow,
    "exp": _unary("exp"),
    "sqrt": _unary("sqrt"),
    "rsqrt": _rsqrt,
    "square": _unary("square"),
    "silu": _unary("silu"),
    "sigmoid": _sigmoid,
    "relu": _unary("relu"),
    "gelu": _gelu,
    "clamp": _clamp,
    "softmax": _softmax,
    "sum": _reduction(mean=False),
    "mean": _reduction(mean=True),
    "rms_norm": _rms_norm,
    "rms_norm_f32": _rms_norm_f32,
    "sdpa": _sdpa,
    "reshape": _reshape,
    "transpose": _permute_rule("transpose"),
    "permute": _permute_rule("permute"),
    "t": _permute_rule("t"),
    "slice": _slice,
    "identity": _identity,
    "cast": _cast,
    "dropout": _dropout,
}
