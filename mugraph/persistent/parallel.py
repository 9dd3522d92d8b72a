"""Tensor parallelism for persistent kernels: the plan, and what the task graph needs of it.

The plan (Megatron-style, one persistent kernel per rank, all ranks built by the same code so
their kernel graphs and task graphs have the same structure):

- column-parallel: the q / k / v projections (whole heads per rank) and the MLP's gate / up
  projections (a slice of the intermediate size per rank) — no communication;
- row-parallel: the attention output and MLP down projections: each rank computes a partial
  sum over its slice of K (``linear_layer``), then an **all-reduce** adds the shares of every
  rank and the residual once (``all_reduce_sum``, a block graph: tile t of the result is the sum
  of tile t of every share);
- the embedding and the LM head are replicated.

In the task graph an all-reduce block depends on the local tasks that produce its tile of the
share (ordinary events) and on the same tasks of every other rank (*remote producers*): those
tasks trigger the all-reduce's event on each rank (on a real run, an atomic on the peer's
event array through a peer pointer, as NVSHMEM signals do in MPK). The other ranks' shares are
inputs bound to :class:`Peer`; executing them needs peer memory, which the runtime does not
implement: the construction is what this module and its tests cover, and
:func:`simulate_ranks` checks the arithmetic of the sharded μGraphs on the CPU with mugraph's
reference semantics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mugraph.errors import ShapeError


@dataclass(frozen=True)
class Peer:
    """Tensor ``source`` of rank ``rank`` (the same name on every rank)."""

    rank: int
    source: str


def shard(weight: Any, rank: int, world_size: int, dim: int, what: str) -> Any:
    """Rank ``rank``'s contiguous slice of ``weight`` along ``dim`` (a contiguous copy)."""
    import torch

    size = weight.shape[dim]
    if size % world_size:
        raise ShapeError(f"{what}: dim {dim} ({size}) does not split over {world_size} ranks")
    part = size // world_size
    return weight.narrow(dim, rank * part, part).clone(memory_format=torch.contiguous_format)


def simulate_ranks(kernels: list, inputs: list[dict[str, Any]]) -> list[dict[tuple[int, int], Any]]:
    """Evaluate the kernel graphs of all ranks with the reference semantics (NumPy floats),
    operator by operator in lockstep; a :class:`Peer` input takes its value from the other
    rank. ``inputs[r]`` maps each input tensor's name on rank r to a NumPy array. Returns, per
    rank, the value of every (operator, output) position."""
    from mugraph.ir.ops import OpKind
    from mugraph.semantics.interpret import run_block_graph
    from mugraph.semantics.reference import REFERENCE

    values: list[dict[tuple[int, int], Any]] = [{} for _ in kernels]
    names = [
        {
            (t.dtensor.ref.op, t.dtensor.ref.index): t
            for t in k.tensors.values()
            if t.dtensor is not None
        }
        for k in kernels
    ]
    first = kernels[0].graph
    for pos, op in enumerate(first.ops):
        for r, k in enumerate(kernels):
            mine = k.graph.ops[pos]
            if mine.kind is not op.kind:
                raise ShapeError(f"rank {r}: operator %{pos} differs from rank 0's")
            if op.kind is OpKind.INPUT:
                handle = names[r][(pos, 0)]
                if isinstance(handle.binding, Peer):
                    continue  # filled below, once the source's rank has computed it
                values[r][(pos, 0)] = inputs[r][handle.name]
        for r, k in enumerate(kernels):
            mine = k.graph.ops[pos]
            if mine.kind is OpKind.INPUT:
                handle = names[r][(pos, 0)]
                if isinstance(handle.binding, Peer):
                    src = kernels[handle.binding.rank].tensor(handle.binding.source).dtensor.ref
                    values[r][(pos, 0)] = values[handle.binding.rank][(src.op, src.index)]
                continue
            args = [values[r][(ref.op, ref.index)] for ref in mine.inputs]
            outs = run_block_graph(REFERENCE, mine.attr("graph"), args)
            for j, v in enumerate(outs):
                values[r][(pos, j)] = v
    return values
