"""Partitioning: cut an fx graph into convex subgraphs mugraph captures, around what pays.

Anchors first. Each matmul, projection (``linear``) and attention call anchors a partition,
grown to the fusion opportunity around it: the sibling projections of the same input (gate
and up of a gated MLP), the RMSNorm producing that input when nothing else reads it, and the
elementwise operators consuming the results (the gate ``silu(a) * b``, a bias, a residual
add), up to the next anchor. What no anchor takes runs on PyTorch (``elementwise="pytorch"``,
the default: elementwise chains are what Inductor fuses well) or, with
``elementwise="mugraph"``, is grown greedily as below.

Greedy growth (``elementwise="mugraph"``): nodes are visited in graph order. A node joins the
partition of one of its inputs (or the union of several), or starts a new one, when the result

* is convex: no path leaves the partition and comes back (it must run as one call),
* stays within ``max_ops`` mugraph operators and ``max_inputs`` kernel-graph inputs (the
  search is exponential in both),
* still captures: :func:`~mugraph.integration.capture.build_program` lowers it and the
  verifier accepts it (LAX: at most one exponential on a path).

Data-movement nodes (views, transposes, no-op casts) of a tensor computed outside every
partition stay in PyTorch: their result reaches mugraph as a strided input. A transpose of a
value a partition computes stays in it (a kernel-level ``permute``: a view, the next kernel
reads through its strides). Every node left to PyTorch gets a reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.fx import Graph, Node

from mugraph.integration.capture import CapturedProgram, Unsupported, build_program
from mugraph.integration.lowering import VIEW_OPS, op_name, target_name
from mugraph.integration.torch_ops import WEIGHT_PREPARATION

DEFAULT_MAX_OPS = 8
DEFAULT_MAX_INPUTS = 4
ANCHORS = frozenset({"linear", "matmul", "sdpa"})
NORMS = frozenset({"rms_norm", "rms_norm_f32"})
EPILOGUE = frozenset({"add", "sub", "mul", "div", "neg", "exp", "silu", "sigmoid", "relu",
                      "gelu", "pow", "sqrt", "rsqrt", "square", "clamp", "reshape", "identity",
                      "cast", "transpose", "permute", "t"})
LEFT_TO_PYTORCH = (
    "elementwise operators without a matmul or attention anchor run on PyTorch "
    "(elementwise='mugraph' captures them)"
)


@dataclass
class Partitioning:
    """The partitions found (as captured programs) and why the other nodes stay in PyTorch."""

    partitions: list[CapturedProgram] = field(default_factory=list)
    fallbacks: dict[Node, str] = field(default_factory=dict)


class _Reach:
    """Ancestor / descendant bitmasks of every node, for convexity checks."""

    def __init__(self, nodes: list[Node]) -> None:
        self.index = {n: i for i, n in enumerate(nodes)}
        self.nodes = nodes
        self.anc = [0] * len(nodes)
        for i, n in enumerate(nodes):
            mask = 0
            for a in n.all_input_nodes:
                j = self.index[a]
                mask |= self.anc[j] | (1 << j)
            self.anc[i] = mask
        self.desc = [0] * len(nodes)
        for i in range(len(nodes) - 1, -1, -1):
            mask = 0
            for u in nodes[i].users:
                j = self.index[u]
                mask |= self.desc[j] | (1 << j)
            self.desc[i] = mask

    def mask(self, members) -> int:
        out = 0
        for n in members:
            out |= 1 << self.index[n]
        return out

    def convex(self, members) -> bool:
        """No node outside ``members`` is both after one member and before another."""
        mask = self.mask(members)
        below = 0  # everything that some member depends on
        above = 0  # everything that depends on some member
        for n in members:
            i = self.index[n]
            below |= self.anc[i]
            above |= self.desc[i]
        return (below & above & ~mask) == 0


def _is_call(node: Node) -> bool:
    return node.op in ("call_function", "call_method")


def _reason_unsupported(node: Node) -> str | None:
    """Why ``node`` can never be captured (None: it may be)."""
    if node.op == "call_module":
        return f"module call {node.target!r} (not a module mugraph knows)"
    if not _is_call(node):
        return None
    if node.target in WEIGHT_PREPARATION:
        return "weight preparation, computed once and cached (PyTorch)"
    value = node.meta.get("val")
    if value is not None and not isinstance(value, torch.Tensor):
        return f"{target_name(node)} gives {type(value).__name__}, not a tensor (stays in PyTorch)"
    if op_name(node) is None:
        return f"{target_name(node)} has no mugraph equivalent"
    return None


class Partitioner:
    """Greedy growth of partitions in graph order (see the module docstring)."""

    def __init__(self, graph: Graph, max_ops: int = DEFAULT_MAX_OPS,
                 max_inputs: int = DEFAULT_MAX_INPUTS, elementwise: str = "pytorch") -> None:
        if elementwise not in ("pytorch", "mugraph"):
            raise ValueError(f"elementwise must be 'pytorch' or 'mugraph', not {elementwise!r}")
        self.nodes = list(graph.nodes)
        self.reach = _Reach(self.nodes)
        self.max_ops = max_ops
        self.max_inputs = max_inputs
        self.elementwise = elementwise
        self.groups: list[list[Node]] = []
        self.group_of: dict[Node, int] = {}
        self.fallbacks: dict[Node, str] = {}

    def run(self) -> Partitioning:
        for node in self.nodes:
            reason = _reason_unsupported(node)
            if reason is not None:
                self.fallbacks[node] = reason
        for node in self.nodes:
            if op_name(node) in ANCHORS and _is_call(node) and node not in self.fallbacks:
                if node not in self.group_of:
                    self._grow_anchor(node)
        for node in self.nodes:
            if node in self.fallbacks or node in self.group_of or not _is_call(node):
                continue
            if self.elementwise == "mugraph":
                self._place(node)
            elif op_name(node) not in VIEW_OPS:
                self.fallbacks[node] = LEFT_TO_PYTORCH
            else:
                self.fallbacks[node] = "data movement (PyTorch; reaches mugraph as a view)"
        return self._finish()

    # ---- anchors -------------------------------------------------------------------------------

    def _free(self, node: Node) -> bool:
        return _is_call(node) and node not in self.group_of and node not in self.fallbacks

    def _grow_anchor(self, anchor: Node) -> None:
        why = self._try([anchor])
        if why is not None:
            self.fallbacks[anchor] = why
            return
        members = [anchor]
        if op_name(anchor) in ("linear", "matmul"):
            source = anchor.args[0] if anchor.args else None
            for sibling in list(source.users) if isinstance(source, Node) else []:
                if sibling is not anchor and op_name(sibling) == op_name(anchor):
                    members = self._extend(members, sibling)
            members = self._absorb_producers(members, source)
        grown = True
        while grown:
            grown = False
            for node in list(members):
                for user in node.users:
                    if user in members or not self._free(user):
                        continue
                    if op_name(user) not in EPILOGUE:
                        continue
                    extended = self._extend(members, user)
                    if extended is not members:
                        members, grown = extended, True
        self._assign_new(members)

    def _absorb_producers(self, members: list[Node], node) -> list[Node]:
        """Take the norm or elementwise chain producing a projection's input when nothing
        outside reads it (the prologue: RMSNorm, silu(x) @ W...)."""
        todo = [node]
        while todo:
            node = todo.pop()
            if not isinstance(node, Node) or not self._free(node):
                continue
            if op_name(node) not in NORMS | EPILOGUE or op_name(node) in VIEW_OPS:
                continue
            if not all(u in members for u in node.users):
                continue
            extended = self._extend(members, node)
            if extended is not members:
                members = extended
                todo.extend(a for a in node.all_input_nodes)
        return members

    def _extend(self, members: list[Node], node: Node) -> list[Node]:
        """``members`` with ``node`` when that is still a valid partition, else unchanged."""
        if not self._free(node):
            return members
        trial = sorted([*members, node], key=self.reach.index.get)
        return trial if self._try(trial) is None else members

    def _assign_new(self, members: list[Node]) -> None:
        self.groups.append(list(members))
        for node in members:
            self.group_of[node] = len(self.groups) - 1

    def _input_groups(self, node: Node) -> list[int]:
        groups = []
        for a in node.all_input_nodes:
            g = self.group_of.get(a)
            if g is not None and g not in groups:
                groups.append(g)
        return sorted(groups, key=lambda g: -max(self.reach.index[n] for n in self.groups[g]))

    def _options(self, node: Node, groups: list[int]) -> list[list[int]]:
        options: list[list[int]] = []
        if len(groups) > 1:
            options.append(groups)
        options += [[g] for g in groups]
        return options

    def _place(self, node: Node) -> None:
        groups = [g for g in self._input_groups(node) if not self._anchored(g)]
        is_view = op_name(node) in VIEW_OPS
        if is_view and not groups:
            self.fallbacks[node] = "data movement of a PyTorch value (reaches mugraph as a view)"
            return
        options = self._options(node, groups) + ([] if is_view else [[]])
        reasons = []
        for option in options:
            members = sorted(
                [n for g in option for n in self.groups[g]] + [node], key=self.reach.index.get
            )
            why = self._try(members)
            if why is None:
                self._assign(node, option)
                return
            reasons.append(why)
        # a view's reason is why it cannot join; another node's, why it cannot stand alone
        self.fallbacks[node] = reasons[0] if is_view else reasons[-1]

    def _anchored(self, group: int) -> bool:
        return any(op_name(n) in ANCHORS for n in self.groups[group])

    def _try(self, members: list[Node]) -> str | None:
        """None when ``members`` make a valid partition, else the reason they do not."""
        if not self.reach.convex(members):
            return "joining would make a non-convex partition"
        try:
            program = build_program(members)
        except Unsupported as error:
            return str(error)
        if len(members) == 1:
            return None  # one node cannot be split: the limits bound growth only
        if program.ops > self.max_ops:
            return f"partition size limit ({self.max_ops} mugraph operators) reached"
        if len(program.input_specs) > self.max_inputs:
            return f"partition input limit ({self.max_inputs} kernel-graph inputs) reached"
        return None

    def _assign(self, node: Node, option: list[int]) -> None:
        if not option:
            self.groups.append([node])
            self.group_of[node] = len(self.groups) - 1
            return
        keep = option[0]
        for g in option[1:]:
            for n in self.groups[g]:
                self.group_of[n] = keep
            self.groups[keep].extend(self.groups[g])
            self.groups[g] = []
        self.groups[keep].append(node)
        self.group_of[node] = keep

    def _finish(self) -> Partitioning:
        result = Partitioning(fallbacks=self.fallbacks)
        for members in self.groups:
            if not members:
                continue
            members = _trim_views(sorted(members, key=self.reach.index.get), result.fallbacks)
            program = build_program(members)
            if program.compute_ops == 0:
                for n in members:
                    result.fallbacks[n] = "a partition that only moves data (left to PyTorch)"
                continue
            result.partitions.append(program)
        return result


def _trim_views(members: list[Node], fallbacks: dict[Node, str]) -> list[Node]:
    """Drop trailing data movement (views only read outside): PyTorch does it for free."""
    members = list(members)
    changed = True
    while changed:
        changed = False
        inside = set(members)
        for node in reversed(members):
            if op_name(node) in VIEW_OPS and not any(u in inside for u in node.users):
                members.remove(node)
                fallbacks[node] = "data movement at the end of a partition (left to PyTorch)"
                changed = True
                break
    return members


def partition_graph(graph: Graph, max_ops: int = DEFAULT_MAX_OPS,
                    max_inputs: int = DEFAULT_MAX_INPUTS,
                    elementwise: str = "pytorch") -> Partitioning:
    """Partition ``graph`` (whose nodes carry propagated shapes) into captured programs."""
    return Partitioner(graph, max_ops, max_inputs, elementwise).run()
