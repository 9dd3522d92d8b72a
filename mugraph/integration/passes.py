"""Graph passes run before partitioning: copying, module inlining, pattern rewrites, shapes.

All passes work on a copy of the fx graph; the module the user (or Dynamo) handed over is
never changed.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.fx import Graph, GraphModule, Node

# ---- copying ---------------------------------------------------------------------------------


def copy_graph_module(gm: GraphModule) -> GraphModule:
    """A GraphModule with a copy of ``gm``'s graph, sharing its parameters and submodules."""
    graph = Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    return GraphModule(gm, graph)


def fetch_attr(module: nn.Module, target: str) -> Any:
    """``module.a.b`` for the qualified name ``"a.b"``."""
    value: Any = module
    for part in target.split("."):
        value = getattr(value, part)
    return value


# ---- leaf modules of symbolic_trace as functional calls ----------------------------------------


def _inline_linear(graph: Graph, node: Node, mod: nn.Linear) -> Node:
    weight = graph.get_attr(f"{node.target}.weight")
    bias = graph.get_attr(f"{node.target}.bias") if mod.bias is not None else None
    return graph.call_function(F.linear, (node.args[0], weight, bias))


def _inline_rms_norm(graph: Graph, node: Node, mod: nn.RMSNorm) -> Node:
    weight = graph.get_attr(f"{node.target}.weight") if mod.weight is not None else None
    shape = tuple(mod.normalized_shape)
    return graph.call_function(F.rms_norm, (node.args[0], shape, weight, mod.eps))


def _inline_simple(fn, **fixed):
    def inline(graph: Graph, node: Node, mod: nn.Module) -> Node:
        kwargs = {name: getattr(mod, attr) for name, attr in fixed.items()}
        return graph.call_function(fn, (node.args[0],), kwargs)

    return inline


_MODULES = {
    nn.Linear: _inline_linear,
    nn.RMSNorm: _inline_rms_norm,
    nn.SiLU: _inline_simple(F.silu),
    nn.ReLU: _inline_simple(F.relu),
    nn.GELU: _inline_simple(F.gelu, approximate="approximate"),
    nn.Softmax: _inline_simple(F.softmax, dim="dim"),
    nn.Dropout: _inline_simple(F.dropout, p="p", training="training"),
    nn.Identity: lambda graph, node, mod: node.args[0],
}


def inline_known_modules(gm: GraphModule) -> None:
    """Replace calls of plain nn.Linear, nn.RMSNorm, activations... by functional calls."""
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or node.kwargs or len(node.args) != 1:
            continue
        mod = fetch_attr(gm, node.target)
        inline = _MODULES.get(type(mod))
        if inline is None or getattr(mod, "inplace", False):
            continue
        with gm.graph.inserting_before(node):
            new = inline(gm.graph, node, mod)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
    gm.recompile()


# ---- x * sigmoid(x) → silu(x) ----------------------------------------------------------------


def _is_sigmoid(node: Any) -> bool:
    if not isinstance(node, Node):
        return False
    if node.op == "call_function":
        return node.target in (torch.sigmoid, F.sigmoid) and not node.kwargs
    return node.op == "call_method" and node.target == "sigmoid" and not node.kwargs


def _is_mul(node: Node) -> bool:
    if node.op == "call_function":
        return node.target in (operator.mul, torch.mul) and not node.kwargs
    return node.op == "call_method" and node.target == "mul" and not node.kwargs


def fuse_silu(gm: GraphModule) -> int:
    """Rewrite ``x * sigmoid(x)`` (either order) to ``F.silu(x)``; return how many."""
    count = 0
    for node in list(gm.graph.nodes):
        if not _is_mul(node) or len(node.args) != 2:
            continue
        a, b = node.args
        sig, x = (b, a) if _is_sigmoid(b) else (a, b) if _is_sigmoid(a) else (None, None)
        if sig is None or sig.args[0] is not x:
            continue
        with gm.graph.inserting_before(node):
            silu = gm.graph.call_function(F.silu, (x,))
        silu.meta = dict(node.meta)
        node.replace_all_uses_with(silu)
        gm.graph.erase_node(node)
        if not sig.users:
            gm.graph.erase_node(sig)
        count += 1
    if count:
        gm.recompile()
    return count


# ---- mutation ---------------------------------------------------------------------------------

_INPLACE_OPERATORS = {
    operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.imatmul,
    operator.ipow, operator.setitem,
}


def mutating_node(graph: Graph) -> Node | None:
    """The first node that writes a tensor in place (None when there is none)."""
    for node in graph.nodes:
        name = node.target if node.op == "call_method" else ""
        if name.endswith("_") and not name.endswith("__"):
            return node
        if node.op == "call_function" and node.target in _INPLACE_OPERATORS:
            return node
        if node.op in ("call_function", "call_method"):
            if node.kwargs.get("inplace") or "out" in node.kwargs:
                return node
    return None


# ---- shapes -----------------------------------------------------------------------------------


def propagate_shapes(gm: GraphModule, args: list) -> None:
    """Store each node's value on concrete inputs ``args`` as fake tensors in ``meta["val"]``.

    Runs on fake tensors: nothing is computed and nothing is written.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    FakeTensorProp(gm, mode).propagate(*args)
