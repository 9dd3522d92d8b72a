"""Canonicalization: rewrite the idioms real models are written in to the forms mugraph
searches well, before partitioning. Every rewrite is exact (the same real function); each is
a named rule with the law it relies on (:data:`RULES`), applied to a copy of the graph whose
nodes carry propagated shapes.

* ``rms_norm``: ``h = x.to(float32); h * rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)``, cast
  back to x's dtype (the Llama / Qwen / Mistral / Gemma form; ``x * x``, ``square``, ``1 /
  sqrt``, ``torch.rsqrt`` and ``F.rms_norm`` spellings too) becomes one
  :func:`~mugraph.integration.torch_ops.rms_norm_f32` node, which the lowering maps onto
  mugraph's ``rms_norm`` with that epsilon.
* ``fold_norm_weight``: ``linear(rms_norm(x) * w, W_i, b_i)`` for the projections reading a
  norm becomes ``linear(rms_norm(x), W_i * w, b_i)`` (``(n * w) @ W.T == n @ (W * w).T``); the
  folded weight is computed once (``mugraph::fold_weights``). Only when every use of the
  weighted norm is such a projection.
* ``grouped_kv_heads``: ``scaled_dot_product_attention`` on keys and values whose heads were
  repeated for grouped-query attention (transformers' ``repeat_kv``: a new dim, ``expand``,
  ``reshape``, a copy g times the cache's size) reads the un-repeated heads with
  ``enable_gqa=True``: the lowering then maps query heads onto key heads by views, and no
  copy is made.
* ``stack_projections``: sibling projections of one input whose results never meet in one
  elementwise operator (Q, K and V) become one projection over the stacked weights, its result
  sliced (views): one matmul instead of three, one partition instead of three.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx import GraphModule, Node

from mugraph.integration.lowering import op_name
from mugraph.integration.torch_ops import new_site, rms_norm_f32


@dataclass(frozen=True)
class Rule:
    name: str
    law: str


RULES: tuple[Rule, ...] = (
    Rule("rms_norm", "x * rsqrt(mean(x^2) + eps) computed in float32 and cast back is "
         "rms_norm(x, eps) in x's dtype"),
    Rule("fold_norm_weight", "(n * w) @ W.T == n @ (W * w).T for a weight w over n's last dim"),
    Rule("unfold_norm_weight", "n @ (W * w).T == (n * w) @ W.T: fold_norm_weight undone where "
         "PyTorch runs the projection (Inductor fuses n * w into the norm, no prepared copy)"),
    Rule("stack_projections", "[x @ A.T, x @ B.T] == x @ cat([A, B]).T, sliced"),
    Rule("noop_index", "x[:, 0:, :] (full slices) is x"),
    Rule("grouped_kv_heads", "attention over key/value heads each repeated g times "
         "(x[:, :, None].expand(b, hk, g, s, d).reshape(b, hk * g, s, d)) is attention with "
         "enable_gqa over the hk heads themselves: query head h reads key head h // g"),
)

ELEMENTWISE = frozenset({"add", "sub", "mul", "div", "neg", "exp", "silu", "sigmoid", "relu",
                         "gelu", "pow", "sqrt", "rsqrt", "square", "clamp"})


def _val(node: Any):
    return node.meta.get("val") if isinstance(node, Node) else None


def _name(node: Any) -> str | None:
    if not isinstance(node, Node) or node.op not in ("call_function", "call_method"):
        return None
    return op_name(node)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _other(node: Node, one: Any) -> Any:
    """The operand of binary ``node`` that is not ``one`` (None if neither or both are)."""
    a, b = node.args[0], node.args[1] if len(node.args) > 1 else node.kwargs.get("other")
    if a is one and b is not one:
        return b
    if b is one and a is not one:
        return a
    return None


def _single_user(node: Node) -> Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _cast_dtype(node: Node) -> torch.dtype | None:
    """The dtype a cast node converts to (None when it is not a pure dtype cast)."""
    if _name(node) != "cast":
        return None
    value = _val(node)
    return value.dtype if isinstance(value, torch.Tensor) else None


# ---- the RMSNorm idiom --------------------------------------------------------------------------


@dataclass
class _RmsMatch:
    base: Node  # the input rms_norm reads
    eps: float
    out: Node  # the node the rms_norm replaces


def _square_of(node: Node) -> Node | None:
    name = _name(node)
    if name == "pow" and len(node.args) > 1 and node.args[1] == 2:
        return node.args[0]
    if name == "square":
        return node.args[0]
    if name == "mul" and len(node.args) == 2 and node.args[0] is node.args[1]:
        return node.args[0]
    return None


def _mean_last(node: Node) -> Node | None:
    """The input of ``mean(t, -1, keepdim=True)`` (None otherwise)."""
    if _name(node) != "mean" or not isinstance(node.args[0], Node):
        return None
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    keep = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    rank = _val(node.args[0]).dim() if isinstance(_val(node.args[0]), torch.Tensor) else None
    dims = [dim] if isinstance(dim, int) else list(dim or [])
    if not keep or len(dims) != 1 or rank is None or dims[0] % rank != rank - 1:
        return None
    if node.kwargs.get("dtype") is not None:
        return None
    return node.args[0]


def _inverse_root(node: Node) -> Node | None:
    """The argument a of ``rsqrt(a)`` / ``a ** -0.5`` (None otherwise)."""
    name = _name(node)
    if name == "rsqrt":
        return node.args[0]
    if name == "pow" and len(node.args) > 1 and node.args[1] == -0.5:
        return node.args[0]
    return None


def _plus_eps(node: Node) -> tuple[Node, float] | None:
    if _name(node) != "add" or len(node.args) != 2 or node.kwargs:
        return None
    a, b = node.args
    if isinstance(a, Node) and _number(b):
        return a, float(b)
    if isinstance(b, Node) and _number(a):
        return b, float(a)
    return None


def _match_rms(root: Node) -> _RmsMatch | None:
    """Match the idiom around ``root`` = rsqrt(mean(h²) + eps)."""
    arg = _inverse_root(root)
    shifted = _plus_eps(arg) if isinstance(arg, Node) else None
    if shifted is None or shifted[1] < 0:
        return None
    mean_of, eps = shifted
    squared = _mean_last(mean_of)
    h = _square_of(squared) if isinstance(squared, Node) else None
    product = _single_user(root)
    if h is None or product is None or _name(product) != "mul" or _other(product, root) is not h:
        return None
    if any(len(n.users) != 1 for n in (arg, mean_of, squared)):
        return None
    return _rms_ends(h, eps, product)


def _rms_ends(h: Node, eps: float, product: Node) -> _RmsMatch | None:
    """Absorb the up-cast before and the cast back after, when they are there."""
    value = _val(product)
    if not isinstance(value, torch.Tensor) or value.dtype != torch.float32:
        return None
    base, out = h, product
    source = h.args[0] if _cast_dtype(h) == torch.float32 else None
    back = _single_user(product)
    if isinstance(source, Node) and isinstance(_val(source), torch.Tensor):
        if back is not None and _cast_dtype(back) == _val(source).dtype:
            base, out = source, back
        elif _val(source).dtype == torch.float32:
            base = source
    return _RmsMatch(base, eps, out)


def canonicalize_rms_norm(gm: GraphModule) -> int:
    """Rewrite each RMSNorm idiom (module docstring); return how many."""
    count = 0
    for node in list(gm.graph.nodes):
        match = _match_rms(node) if node.op != "placeholder" else None
        if match is None and _name(node) == "rms_norm":
            count += _split_functional_rms_norm(gm, node)
            continue
        if match is None:
            continue
        with gm.graph.inserting_before(match.out):
            new = gm.graph.call_function(rms_norm_f32, (match.base, match.eps))
        new.meta = dict(match.out.meta)
        match.out.replace_all_uses_with(new)
        count += 1
    if count:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return count


def _split_functional_rms_norm(gm: GraphModule, node: Node) -> int:
    """``F.rms_norm(x, (d,), weight, eps)`` as ``rms_norm_f32(x, eps) * weight``."""
    x = node.args[0]
    shape = node.args[1] if len(node.args) > 1 else node.kwargs.get("normalized_shape")
    weight = node.args[2] if len(node.args) > 2 else node.kwargs.get("weight")
    eps = node.args[3] if len(node.args) > 3 else node.kwargs.get("eps")
    value = _val(x)
    shape = (shape,) if isinstance(shape, int) else tuple(shape or ())
    if not isinstance(value, torch.Tensor) or len(shape) != 1 or value.shape[-1] != shape[0]:
        return 0
    if eps is None:
        eps = torch.finfo(value.dtype).eps
    with gm.graph.inserting_before(node):
        new = gm.graph.call_function(rms_norm_f32, (x, float(eps)))
        if weight is not None:
            new = gm.graph.call_function(operator.mul, (new, weight))
    node.replace_all_uses_with(new)
    gm.graph.erase_node(node)
    return 1


# ---- folding the norm's weight into the projections, stacking siblings ---------------------------


def _linear_parts(node: Node) -> tuple[Any, Any, Any] | None:
    """(input, weight, bias) of an ``F.linear`` node."""
    if _name(node) != "linear":
        return None
    args = list(node.args) + [None] * (3 - len(node.args))
    x = args[0]
    weight = args[1] if args[1] is not None else node.kwargs.get("weight")
    bias = args[2] if args[2] is not None else node.kwargs.get("bias")
    return x, weight, bias


def _weight_of(product: Node, normed: Node) -> Node | None:
    """``w`` of ``normed * w`` when w is a vector over normed's last dim."""
    if _name(product) != "mul" or len(product.args) != 2:
        return None
    w = _other(product, normed)
    wv, nv = _val(w), _val(normed)
    if not (isinstance(wv, torch.Tensor) and isinstance(nv, torch.Tensor)):
        return None
    if wv.dim() != 1 or wv.shape[0] != nv.shape[-1] or wv.dtype != nv.dtype:
        return None
    return w


def _meet(nodes: list[Node]) -> bool:
    """Do two of ``nodes`` meet in one elementwise operator (following elementwise and
    view operators)? Then their stacked projection would have to be sliced in between."""
    reach: dict[Node, set[int]] = {}
    todo = [(n, i) for i, n in enumerate(nodes)]
    while todo:
        node, i = todo.pop()
        for user in node.users:
            name = _name(user)
            if name not in ELEMENTWISE and name not in ("reshape", "identity", "cast"):
                continue
            seen = reach.setdefault(user, set())
            if i not in seen:
                seen.add(i)
                if len(seen) > 1:
                    return True
                todo.append((user, i))
    return False


def fold_norm_weights(gm: GraphModule) -> int:
    """Fold the weights of weighted norms into their projections and stack siblings."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is rms_norm_f32:
            count += _fold_one(gm, node)
    if count:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return count


def _fold_one(gm: GraphModule, normed: Node) -> int:
    product = _single_user(normed)
    weight = _weight_of(product, normed) if product is not None else None
    linears = list(product.users) if weight is not None else list(normed.users)
    parts = [_linear_parts(u) for u in linears]
    source = product if weight is not None else normed
    if not linears or any(p is None or p[0] is not source for p in parts):
        return 0
    if any(not isinstance(p[1], Node) or _val(p[1]) is None for p in parts):
        return 0
    if weight is None and len(linears) == 1:
        return 0
    groups = [linears] if not _meet(linears) else [[u] for u in linears]
    for group in groups:
        _replace_group(gm, normed, weight, group)
    return 1


def _replace_group(gm: GraphModule, normed: Node, scale: Node | None, group: list[Node]) -> None:
    graph = gm.graph
    parts = [_linear_parts(u) for u in group]
    weights = [p[1] for p in parts]
    biases = [p[2] for p in parts]
    if len(group) == 1 and scale is None:
        return
    first = min(group, key=lambda n: list(graph.nodes).index(n))
    with graph.inserting_before(first):
        if scale is not None:
            stacked = graph.call_function(torch.ops.mugraph.fold_weights.default,
                                          (scale, weights, new_site()))
        else:
            stacked = graph.call_function(torch.ops.mugraph.concat.default,
                                          (weights, new_site()))
        bias = None
        if any(b is not None for b in biases):
            if any(b is None for b in biases):
                return
            bias = biases[0] if len(biases) == 1 else graph.call_function(
                torch.ops.mugraph.concat.default, (biases, new_site()))
        new = graph.call_function(F.linear, (normed, stacked, bias))
        offset = 0
        for node, w in zip(group, weights, strict=True):
            rows = _val(w).shape[0]
            piece = new if len(group) == 1 else graph.call_function(
                operator.getitem, (new, (Ellipsis, slice(offset, offset + rows))))
            offset += rows
            node.replace_all_uses_with(piece)


def unfold_norm_weights(gm: GraphModule, keep: set[Node]) -> int:
    """Undo ``fold_norm_weight`` for the projections left to PyTorch: a
    ``linear(n, fold_weights(w, [W_1..W_k]))`` that no node of ``keep`` (the nodes mugraph
    runs) reads becomes ``linear(n * w, W_i)`` per weight (its slices' users read those), so
    Inductor fuses ``n * w`` into the norm and no folded copy is prepared at every call.
    Projections with a bias, or whose stacked result is read other than by its weights'
    slices, stay folded. Returns how many projections were unfolded."""
    count = 0
    weighted: dict[tuple[Node, Node], Node] = {}
    for fold in list(gm.graph.nodes):
        if fold.op != "call_function" or fold.target is not torch.ops.mugraph.fold_weights.default:
            continue
        for linear in list(fold.users):
            if linear not in keep and _unfold_one(gm.graph, fold, linear, weighted):
                count += 1
        if not fold.users:
            gm.graph.erase_node(fold)
    if count:
        gm.recompile()
    return count


def _unfold_one(graph, fold: Node, linear: Node, weighted: dict) -> bool:
    parts = _linear_parts(linear)
    if parts is None or parts[1] is not fold or parts[2] is not None:
        return False
    normed, (scale, weights) = parts[0], fold.args[:2]
    pieces = _weight_slices(linear, list(weights))
    if pieces is None:
        return False
    key = (normed, scale)
    with graph.inserting_before(linear):  # after the norm and its weight, before every reader
        if key not in weighted:
            weighted[key] = graph.call_function(operator.mul, (normed, scale))
        for node, weight in pieces.items():
            node.replace_all_uses_with(graph.call_function(F.linear, (weighted[key], weight)))
    for node in pieces:
        if node is not linear:
            graph.erase_node(node)
    graph.erase_node(linear)
    return True


def _weight_slices(linear: Node, weights: list) -> dict[Node, Node] | None:
    """{node reading one weight's rows of ``linear``'s stacked result: that weight}, or None
    when some user of ``linear`` is not such a slice."""
    if len(weights) == 1:
        return {linear: weights[0]}
    ranges, offset = {}, 0
    for w in weights:
        value = _val(w)
        if not isinstance(value, torch.Tensor):
            return None
        ranges[(offset, offset + value.shape[0])] = w
        offset += value.shape[0]
    pieces = {}
    for user in linear.users:
        index = user.args[1] if user.target is operator.getitem and len(user.args) == 2 else None
        if not (isinstance(index, tuple) and len(index) == 2 and index[0] is Ellipsis
                and isinstance(index[1], slice) and index[1].step in (None, 1)):
            return None
        weight = ranges.get((index[1].start, index[1].stop))
        if weight is None:
            return None
        pieces[user] = weight
    return pieces


def _full_slice(index: Any, size: int) -> bool:
    if index is Ellipsis:
        return True
    if not isinstance(index, slice) or index.step not in (None, 1):
        return False
    return index.start in (None, 0) and (index.stop is None or index.stop >= size)


def drop_noop_indexing(gm: GraphModule) -> int:
    """Replace ``x[full slices]`` (a view equal to x) by x; return how many."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not operator.getitem:
            continue
        source, index = node.args
        value = _val(source)
        if not isinstance(value, torch.Tensor) or not isinstance(index, tuple):
            continue
        if Ellipsis in index or len(index) > value.dim():
            continue
        if all(_full_slice(i, value.shape[d]) for d, i in enumerate(index)):
            node.replace_all_uses_with(source)
            gm.graph.erase_node(node)
            count += 1
    if count:
        gm.recompile()
    return count


# ---- grouped-query attention: repeated key/value heads -------------------------------------------


def _repeated_heads(node: Any) -> tuple[Node, int] | None:
    """(x, g) when ``node`` is ``x [b, hk, s, d]`` with every head repeated g times in place:
    ``x[:, :, None]`` (or ``x.unsqueeze(2)``), ``expand(b, hk, g, s, d)``, ``reshape(b, hk *
    g, s, d)`` (shapes checked on the propagated values); None otherwise."""
    if _name(node) not in ("reshape", "view") or not node.args:
        return None
    expanded = node.args[0]
    if not isinstance(expanded, Node) or expanded.op != "call_method" or (
        expanded.target != "expand"
    ):
        return None
    inserted = expanded.args[0]
    if not isinstance(inserted, Node) or not inserted.args:
        return None
    x = inserted.args[0]
    if not _inserts_dim_2(inserted) or not isinstance(x, Node):
        return None
    values = [_val(n) for n in (x, inserted, expanded, node)]
    if not all(isinstance(v, torch.Tensor) for v in values):
        return None
    base, one, wide, out = (tuple(v.shape) for v in values)
    if len(base) != 4:
        return None
    b, hk, length, d = base
    g = wide[2]
    if one != (b, hk, 1, length, d) or wide != (b, hk, g, length, d):
        return None
    return (x, g) if out == (b, hk * g, length, d) else None


def _inserts_dim_2(node: Node) -> bool:
    """``node`` is ``x[:, :, None]`` (full slices around the new dim) or ``x.unsqueeze(2)``."""
    if node.op == "call_method" and node.target == "unsqueeze":
        return node.args[1:] == (2,) and not node.kwargs
    if node.op != "call_function" or node.target is not operator.getitem:
        return False
    index = node.args[1]
    if not isinstance(index, tuple) or len(index) < 3 or index[2] is not None:
        return False
    rest = [i for k, i in enumerate(index) if k != 2]
    return all(i is Ellipsis or i == slice(None) for i in rest) and rest.count(Ellipsis) <= 1 and (
        Ellipsis not in index[:2])


def ungroup_kv_heads(gm: GraphModule) -> int:
    """Attention on repeated key/value heads reads the heads themselves with
    ``enable_gqa=True`` (rule ``grouped_kv_heads``); returns how many attentions."""
    count = 0
    for node in list(gm.graph.nodes):
        if _name(node) != "sdpa" or len(node.args) < 3:
            continue
        k, v = _repeated_heads(node.args[1]), _repeated_heads(node.args[2])
        if k is None or v is None or k[1] != v[1]:
            continue
        args = [node.args[0], k[0], v[0], *node.args[3:]]
        if len(args) > 7:  # enable_gqa passed by position
            args[7] = True
        else:
            node.kwargs = {**node.kwargs, "enable_gqa": True}
        node.args = tuple(args)
        count += 1
    if count:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return count


def canonicalize(gm: GraphModule, propagate=None) -> dict[str, int]:
    """Apply every rule (the graph's nodes must carry propagated shapes; ``propagate()``
    propagates them again after a rule changed the graph); counts per rule."""
    counts = {}
    for name, rule in (("noop_index", drop_noop_indexing), ("rms_norm", canonicalize_rms_norm),
                       ("fold_norm_weight", fold_norm_weights),
                       ("grouped_kv_heads", ungroup_kv_heads)):
        counts[name] = rule(gm)
        if counts[name] and propagate is not None:
            propagate()
    return counts
