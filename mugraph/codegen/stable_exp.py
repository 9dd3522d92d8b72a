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

**Across kernels** (split-KV attention: FlashDecoding, the paper's Fig 4b/4c forms). A first
kernel may instead *store* such accumulators (through reshapes) as partial sums that a later
kernel combines. Then each partial carries its row maximum with it: the producer stores the
rescaled partial (in float32) and, beside it, a float32 *scale tensor*: the partial's shape
with its last dim divided by the width ``w`` of one block's tile along it, holding for every
row of every block the log of the factor its values were scaled by (``m_final``); element
``[..., i]`` of the partial has scale ``[..., i // w]``. A consumer kernel that only sums such
partials over its for-loop (``forloop_accum`` none or sum), reading tiles that never straddle
two producer blocks (its tile width divides ``w``), and divides those sums by one another keeps
beside every accumulator a running maximum ``R`` of the scales it has seen, per row, and
merges each iteration's terms as ``acc * exp(R_old - R_new) + x * exp(s - R_new)`` (the
log-sum-exp merge); a ratio of two such accumulators is ``a / b * exp(R_a - R_b)``. Every
value then equals the μGraph's exactly in real arithmetic and no exp of a raw logit is ever
formed. :func:`softmax_carry_plan` finds the producer/consumer pairs of a
kernel graph for which every rule holds; any other use of a partial (a program output, a
PyTorch operator, a consumer of another shape) leaves that producer's exp as it is.
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
    """The exp whose argument gets its running row maximum subtracted, the accumulators
    rescaled each iteration by ``exp(m_old - m_new)``, and the block outputs (positions among
    the block graph's outputs) that store such an accumulator, rescaled, for a later kernel
    (each with a scale tensor beside it)."""

    exp_op: int
    accumulators: frozenset[int]
    carried_outputs: frozenset[int] = frozenset()


def stable_exp_plan(block: BlockGraph, carry: bool = False) -> StableExp | None:
    """The plan for ``block``, or None when its exp does not have the shape above. With
    ``carry``, accumulators may also be stored (through reshapes) as block outputs."""
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
    if not accumulators:
        return None
    carried = _uses_after_loop(block, users, accumulators, carry)
    if carried is None:
        return None
    return StableExp(exp_op, frozenset(accumulators), frozenset(carried))


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


def _uses_after_loop(block, users, accumulators: set[int], carry: bool) -> set[int] | None:
    """The block-output positions that store a rescaled accumulator, or None when some use
    of an accumulator is neither a ratio of two of them nor (with ``carry``) a store."""
    outputs = {i: j for j, i in enumerate(
        i for i, op in enumerate(block.ops) if op.kind is OpKind.BLOCK_OUTPUT)}
    carried: set[int] = set()
    for acc in accumulators:
        todo = [acc]
        while todo:
            producer = todo.pop()
            for consumer, _ in users.get(producer, []):
                op = block.ops[consumer]
                if op.kind is OpKind.DIV and producer == acc:
                    if any(r.op not in accumulators for r in op.inputs):
                        return None
                elif carry and op.kind is OpKind.RESHAPE and _keeps_last_dim(block, op):
                    todo.append(consumer)
                elif carry and op.kind is OpKind.BLOCK_OUTPUT:
                    carried.add(outputs[consumer])
                else:
                    return None
    return carried


def _keeps_last_dim(block: BlockGraph, op: Op) -> bool:
    """A reshape that only regroups the rows of a tile (its row maxima reshape with it)."""
    return block.tensor_type(op.inputs[0]).dims[-1] == op.outputs[0].dims[-1]


# ---- across kernels -------------------------------------------------------------------------

# accumulators a consumer kernel may run over rescaled partials (elementwise, or summing the
# last dim: then each iteration's terms are first brought to their own row maximum)
MERGED_ACCUMULATORS = frozenset({AccumKind.NONE, AccumKind.SUM})


@dataclass(frozen=True)
class ScaledInputs:
    """A consumer kernel's side of the carry: its block inputs (kernel-input index -> the
    width of one producer block's tile along the last dim) that arrive rescaled with a scale
    tensor, and the accumulators merging them."""

    widths: dict[int, int]
    accumulators: frozenset[int]

    @property
    def inputs(self) -> frozenset[int]:
        return frozenset(self.widths)


def scaled_input_plan(block: BlockGraph, widths: dict[int, int]) -> ScaledInputs | None:
    """How ``block`` consumes the rescaled kernel inputs ``widths`` (index -> producer block
    width), or None when it does anything with them but sum them over its for-loop (in tiles
    within one producer block) and divide those sums by one another."""
    if stable_exp_plan(block) is not None:
        return None  # one rescaling scheme per kernel
    users = block.uses()
    accumulators: set[int] = set()
    for i, op in enumerate(block.ops):
        if op.kind is not OpKind.BLOCK_INPUT or op.attr("index") not in widths:
            continue
        if op.attr("forloop_dim") < 0 and block.forloop_range > 1:
            return None  # the same partial added in every iteration
        if widths[op.attr("index")] % op.outputs[0].dims[-1]:
            return None  # a tile would straddle two producer blocks: scales vary along it
        for consumer, _ in users.get(i, []):
            acc = block.ops[consumer]
            if acc.kind is not OpKind.FORLOOP_ACCUM or acc.attr("acc") not in MERGED_ACCUMULATORS:
                return None
            accumulators.add(consumer)
    if not accumulators:
        return None
    for acc in accumulators:
        for consumer, _ in users.get(acc, []):
            op = block.ops[consumer]
            if op.kind is not OpKind.DIV or any(r.op not in accumulators for r in op.inputs):
                return None
    return ScaledInputs(dict(widths), frozenset(accumulators))


@dataclass(frozen=True)
class KernelCarry:
    """What one custom kernel does in the carry: block outputs it stores rescaled (positions)
    and kernel inputs it receives rescaled, as (position, producer block width) pairs."""

    carried_outputs: frozenset[int] = frozenset()
    scaled_inputs: tuple[tuple[int, int], ...] = ()

    @property
    def input_widths(self) -> dict[int, int]:
        return dict(self.scaled_inputs)


@dataclass(frozen=True)
class CarryPlan:
    """The kernels of a graph that take part in the carry, and the kernel-level tensors
    ((op, index) positions) stored as rescaled float32 partials with a scale tensor, each
    with the width of one producer block's tile along its last dim."""

    kernels: dict[int, KernelCarry]
    widths: dict[tuple[int, int], int]

    @property
    def partials(self) -> frozenset[tuple[int, int]]:
        return frozenset(self.widths)

    def of(self, op_index: int) -> KernelCarry:
        return self.kernels.get(op_index, KernelCarry())

    def scale_dims(self, graph, key: tuple[int, int]) -> tuple[int, ...]:
        """The dims of the scale tensor of partial ``key``: its last dim per producer block."""
        dims = graph.ops[key[0]].outputs[key[1]].dims
        return (*dims[:-1], dims[-1] // self.widths[key])


NO_CARRY = CarryPlan({}, {})


def softmax_carry_plan(graph) -> CarryPlan:
    """The producer/consumer kernel pairs of ``graph`` whose softmax partial sums travel with
    their row maxima (see the module docstring); an empty plan when there are none."""
    blocks = {i: op.attr("graph") for i, op in enumerate(graph.ops)
              if op.kind is OpKind.CUSTOMIZED}
    producers: dict[int, dict[int, int]] = {}  # op -> {block output j: its tile width}
    for i, block in blocks.items():
        plan = stable_exp_plan(block, carry=True)
        if plan is not None and plan.carried_outputs:
            outs = block.output_ops
            producers[i] = {j: block.tensor_type(outs[j].inputs[0]).dims[-1]
                            for j in plan.carried_outputs}
    uses = _kernel_uses(graph)
    program_outputs = {(r.op, r.index) for r in graph.outputs}
    while producers:
        wanted: dict[int, dict[int, int]] = {}  # consumer -> {kernel input k: width}
        bad = set()
        for i, outputs in producers.items():
            for j, width in outputs.items():
                if (i, j) in program_outputs:
                    bad.add(i)
                for consumer, position in uses.get((i, j), []):
                    if consumer not in blocks or consumer in producers:
                        bad.add(i)
                    wanted.setdefault(consumer, {})[position] = width
        for consumer, positions in wanted.items():
            if consumer in blocks and consumer not in producers:
                if scaled_input_plan(blocks[consumer], positions) is None:
                    bad |= {r.op for k, r in enumerate(graph.ops[consumer].inputs)
                            if k in positions}
        if not bad:
            kernels = {i: KernelCarry(carried_outputs=frozenset(js))
                       for i, js in producers.items()}
            for consumer, positions in wanted.items():
                kernels[consumer] = KernelCarry(scaled_inputs=tuple(sorted(positions.items())))
            widths = {(i, j): w for i, js in producers.items() for j, w in js.items()}
            return CarryPlan(kernels, widths)
        producers = {i: js for i, js in producers.items() if i not in bad}
    return NO_CARRY


def _kernel_uses(graph) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """For each kernel-level tensor (op, index): (consumer op, input position) of its uses."""
    found: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for i, op in enumerate(graph.ops):
        for k, r in enumerate(op.inputs):
            found.setdefault((r.op, r.index), []).append((i, k))
    return found
