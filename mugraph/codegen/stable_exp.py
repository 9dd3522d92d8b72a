"""Softmax without overflow: running-max subtraction for the exp of a for-loop.

A μGraph computes softmax as the paper does, ``exp(S) / sum(exp(S))``; with float16 tiles (or
logits above 88, even in float32) ``exp(S)`` overflows although the ratio is moderate. When a
kernel's for-loop computes ``E = exp(S)`` and every use of ``E`` is *homogeneous of degree one
in E, row by row* and ends in accumulators that are only ever divided by one another after the
loop, the kernel may compute ``exp(S - m)`` instead, with ``m`` the running maximum of each row
of ``S`` over the iterations so far, and rescale those accumulators by ``exp(m_old - m_new)``
each iteration (the online softmax of FlashAttention). Every accumulator then holds its exact
value times ``exp(-m_final)`` per row, which the divisions cancel: the kernel computes the same
real function, and the μGraph (what the verifier proved) is unchanged.

:func:`stable_exp_plan` decides whether a block graph has that shape; the code generator
(:mod:`mugraph.codegen.triton_gen`) does the rest. The shape, as rules on the block graph:

- one ``exp`` in the loop phase, of a tile ``S`` of rank >= 2 whose rows are all dims but the
  last;
- uses of ``E``, transitively until accumulators: matmul with the E-side as the left operand
  (rows kept, the right operand free of E), ``reduction`` over the last dim, ``mul_scalar``;
- every accumulator reached is a sum over iterations (``acc`` none or sum) whose result keeps
  the rows of ``S``;
- after the loop each such accumulator is used only by ``div`` whose numerator and denominator
  are both such accumulators.
"""

from __future__ import annotations

from dataclasses import dataclass

from mugraph.ir.graph import BlockGraph, Op
from mugraph.ir.ops import AccumKind, OpKind
from mugraph.ir.phase import Phase, block_phases

# operators through which E's row scale passes unchanged (degree one, rows kept)
ROW_HOMOGENEOUS = frozenset({OpKind.MATMUL, OpKind.REDUCTION, OpKind.MUL_SCALAR})
RESCALED_ACCUMULATORS = frozenset({AccumKind.NONE, AccumKind.SUM})


@dataclass(frozen=True)
class StableExp:
    """The exp whose argument gets its running row maximum subtracted, and the accumulators
    rescaled each iteration by ``exp(m_old - m_new)``."""

    exp_op: int
    accumulators: frozenset[int]


def stable_exp_plan(block: BlockGraph) -> StableExp | None:
    """The plan for ``block``, or None when its exp does not have the shape above."""
    phases = block_phases(block)
    exps = [i for i, op in enumerate(block.ops)
            if op.kind is OpKind.EXP and phases[i] is Phase.LOOP]
    if len(exps) != 1 or block.forloop_range < 1:
        return None
    exp_op = exps[0]
    rows = block.ops[exp_op].outputs[0].dims[:-1]
    if not rows:
        return None
    users = block.uses()
    accumulators = _accumulators_reached(block, users, exp_op, rows)
    if not accumulators or not _only_divided(block, users, accumulators):
        return None
    return StableExp(exp_op, frozenset(accumulators))


def _accumulators_reached(block, users, exp_op: int, rows) -> set[int] | None:
    """The accumulators E's scale reaches, or None when some use breaks homogeneity."""
    scaled, todo, found = {exp_op}, [exp_op], set()
    while todo:
        for consumer, operand in users.get(todo.pop(), []):
            op = block.ops[consumer]
            if op.kind is OpKind.FORLOOP_ACCUM:
                if op.attr("acc") not in RESCALED_ACCUMULATORS:
                    return None
                if op.outputs[0].dims[:-1] != rows:
                    return None
                found.add(consumer)
                continue
            if not _passes_scale(block, op, operand, scaled, rows):
                return None
            if consumer not in scaled:
                scaled.add(consumer)
                todo.append(consumer)
    return found


def _passes_scale(block, op: Op, operand: int, scaled: set[int], rows) -> bool:
    if op.kind not in ROW_HOMOGENEOUS or op.outputs[0].dims[:-1] != rows:
        return False
    if op.kind is OpKind.MATMUL:
        # E-side on the left only; the right operand must not carry the scale too
        return operand == 0 and op.inputs[1].op not in scaled
    if op.kind is OpKind.REDUCTION:
        return op.attr("dim") in (-1, len(op.outputs[0].dims) - 1)
    return True


def _only_divided(block, users, accumulators: set[int]) -> bool:
    for acc in accumulators:
        for consumer, _ in users.get(acc, []):
            op = block.ops[consumer]
            if op.kind is not OpKind.DIV:
                return False
            if any(r.op not in accumulators for r in op.inputs):
                return False
    return True
