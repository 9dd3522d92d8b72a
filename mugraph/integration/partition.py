"""Partitioning: cut an fx graph into the largest convex subgraphs mugraph captures.

Nodes are visited in graph order. A node joins the partition of one of its inputs (or the
union of several), or starts a new one, when the result

* is convex: no path leaves the partition and comes back (it must run as one call),
* stays within ``max_ops`` mugraph operators and ``max_inputs`` kernel-graph inputs (the
  search is exponential in both),
* still captures: :func:`~mugraph.integration.capture.build_program` lowers it and the
  verifier accepts it (LAX: at most one exponential on a path).

Data-movement nodes (views, transposes, no-op casts) of a tensor computed outside every
partition stay in PyTorch: their result reaches mugraph as a strided input. Every node left to
PyTorch gets a reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.fx import Graph, Node

from mugraph.integration.capture import CapturedProgram, Unsupported, build_program
from mugraph.integration.lowering import VIEW_OPS, op_name, target_name

DEFAULT_MAX_OPS = 8
DEFAULT_MAX_INPUTS = 4


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
    value = node.meta.get("val")
    if value is not None and not isinstance(value, torch.Tensor):
        return f"{target_name(node)} gives {type(value).__name__}, not a tensor (stays in PyTorch)"
    if op_name(node) is None:
        return f"{target_name(node)} has no mugraph equivalent"
    return None


class Partitioner:
    """Greedy growth of partitions in graph order (see the module docstring)."""

    def __init__(self, graph: Graph, max_ops: int = DEFAULT_MAX_OPS,
                 max_inputs: int = DEFAULT_MAX_INPUTS) -> None:
        self.nodes = list(graph.nodes)
        self.reach = _Reach(self.nodes)
        self.max_ops = max_ops
        self.max_inputs = max_inputs
        self.groups: list[list[Node]] = []
        self.group_of: dict[Node, int] = {}
        self.fallbacks: dict[Node, str] = {}

    def run(self) -> Partitioning:
        for node in self.nodes:
            reason = _reason_unsupported(node)
            if reason is not None:
                self.fallbacks[node] = reason
            elif _is_call(node):
                self._place(node)
        return self._finish()

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
        groups = self._input_groups(node)
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
                    max_inputs: int = DEFAULT_MAX_INPUTS) -> Partitioning:
    """Partition ``graph`` (whose nodes carry propagated shapes) into captured programs."""
    return Partitioner(graph, max_ops, max_inputs).run()
