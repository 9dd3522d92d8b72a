"""Softmax partial sums that travel between kernels with their row maxima, accumulators that
reduce after the loop, and the chained-dot warp rule — under Triton's CPU interpreter.

The μGraphs here are the library's split-KV attention forms (FlashDecoding, the paper's
Fig 4c GQA): the first kernel stores partial sums of exp(QK)·V and exp(QK) per KV chunk, the
second sums and divides them. Their code generator stores each partial rescaled by its
chunk's row maximum, with the maximum beside it, and merges them with the log-sum-exp rule
(mugraph.codegen.stable_exp), so logits of ±100 and more do not overflow.
"""

from __future__ import annotations

import os
import tempfile
import warnings

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import mugraph  # noqa: E402
from mugraph.codegen.check import check_against_reference, random_inputs  # noqa: E402
from mugraph.codegen.loader import interpreter_active  # noqa: E402
from mugraph.codegen.stable_exp import (  # noqa: E402
    NO_CARRY,
    scaled_input_plan,
    softmax_carry_plan,
    stable_exp_plan,
)
from mugraph.codegen.triton_gen import wide_chained_dots  # noqa: E402
from mugraph.ir.ops import OpKind  # noqa: E402
from mugraph.library import WORKLOADS  # noqa: E402
from mugraph.runtime.compiled import compile_graph, default_launch  # noqa: E402

os.environ.setdefault("MUGRAPH_CACHE_DIR", os.path.join(tempfile.gettempdir(), "mugraph-test"))
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
DEVICE = torch.device("cpu" if interpreter_active() else "cuda")
SPLIT_FORMS = ["attention_flashdecoding", "attention_mirage_gqa"]


def _kernels(graph) -> dict[int, object]:
    return {i: op.attr("graph") for i, op in enumerate(graph.ops)
            if op.kind is OpKind.CUSTOMIZED}


def _softmax_attention(q, k, v):
    return torch.softmax(q.double() @ k.double(), dim=-1) @ v.double()


@pytest.mark.parametrize("name", SPLIT_FORMS)
def test_split_kv_forms_carry_their_row_maxima(name):
    graph = WORKLOADS[name].optimized(WORKLOADS[name].small)
    plan = softmax_carry_plan(graph)
    first, second = sorted(_kernels(graph))
    assert plan.of(first).carried_outputs == {0, 1}  # numerators and denominators
    assert set(plan.of(second).input_widths) == {0, 1}
    assert plan.partials == {(first, 0), (first, 1)}
    # one scale per row of every producer block: the partial's last dim over its tile width
    num = graph.ops[first].outputs[0].dims
    assert plan.scale_dims(graph, (first, 0)) == (*num[:-1], num[-1] // plan.widths[first, 0])
    source = compile_graph(graph, check=False).source
    assert "sout0_ptr" in source and "sin1_ptr" in source and "tl.exp(r" in source


@pytest.mark.parametrize("name", SPLIT_FORMS)
@pytest.mark.parametrize("scale", [1.0, 4.0, 6.0])
def test_split_kv_kernels_stay_finite_and_right_at_large_logits(name, scale):
    graph = WORKLOADS[name].optimized(WORKLOADS[name].small)
    program = compile_graph(graph, check=False)
    q, k, v = random_inputs(graph, DEVICE, seed=11, scale=scale)
    want = _softmax_attention(q, k, v)
    logits = (q.double() @ k.double()).abs().max().item()
    got = program(inputs=[q, k, v])[0].double()
    assert torch.isfinite(got).all()
    assert ((got - want).norm() / want.norm()).item() < 3e-3
    if scale >= 4.0:
        assert logits > 60  # the program's own exp(QK) overflows float16 (e^11 > 65504)
        plain = compile_graph(graph, check=False, stable_exp=False)
        assert not torch.isfinite(plain(inputs=[q, k, v])[0]).all()


@pytest.mark.parametrize("name", SPLIT_FORMS)
def test_split_kv_kernels_pass_the_reference_check(name):
    """check_against_reference compares every kernel's outputs: the rescaled partials are
    multiplied back by their scales (CompiledProgram.true_value) before the comparison."""
    graph = WORKLOADS[name].optimized(WORKLOADS[name].small)
    program = compile_graph(graph, check=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = check_against_reference(graph, program, device=DEVICE)
    assert max(report.values()) <= 1.0


def test_qknorm_rows_run_the_split_form_at_large_logits():
    """QK-norm attention: the logits after the norms reach the head dim, where the split-KV
    partial sums of exp overflowed float16 before the carry."""
    from benchmarks.suite import select
    from benchmarks.suite.mugraphs import hand_written

    row = select(["qknorm_gqa_b1"])[0]
    graph = hand_written(row, small=True)
    assert softmax_carry_plan(graph).partials
    program = compile_graph(graph, check=False)
    q, k, v = random_inputs(graph, DEVICE, seed=2, scale=1.0)
    qn = q.double() / q.double().pow(2).mean(-1, keepdim=True).sqrt()
    kn = k.double() / k.double().pow(2).mean(1, keepdim=True).sqrt()
    assert (qn @ kn).abs().max().item() > 11  # exp(11) > 65504: float16 overflows
    want = _softmax_attention(qn, kn, v)
    got = program(inputs=[q, k, v])[0].double()
    assert torch.isfinite(got).all()
    assert ((got - want).norm() / want.norm()).item() < 5e-3


def _split_attention(consumer_op: str = "div", partial_is_output: bool = False):
    """Kernel 1: per-chunk partial sums of exp(QK)V and exp(QK); kernel 2 combines them with
    ``consumer_op`` (div is the softmax; mul is not scale-free)."""
    g = mugraph.new_kernel_graph()
    q = g.new_input((16, 16))
    k = g.new_input((16, 128))
    v = g.new_input((128, 16))
    tb = mugraph.new_threadblock_graph((1, 2, 1), (128, 1, 1), 2)
    tq = tb.new_input(q, (-1, -1, -1), forloop_dim=-1)
    tk = tb.new_input(k, (-1, 1, -1), forloop_dim=1)
    tv = tb.new_input(v, (-1, 0, -1), forloop_dim=0)
    e = tb.exp(tb.matmul(tq, tk))
    tb.new_output(tb.forloop_accum(tb.matmul(e, tv)), (-1, 1, -1))
    tb.new_output(tb.forloop_accum(e, "sum"), (-1, 1, -1))
    num, den = g.customized([q, k, v], tb)
    tb2 = mugraph.new_threadblock_graph((1, 1, 1), (128, 1, 1), 2)
    tn = tb2.new_input(num, (-1, -1, -1), forloop_dim=1)
    td = tb2.new_input(den, (-1, -1, -1), forloop_dim=1)
    combine = getattr(tb2, consumer_op)
    tb2.new_output(combine(tb2.forloop_accum(tn), tb2.forloop_accum(td)), (-1, -1, -1))
    (out,) = g.customized([num, den], tb2)
    g.mark_output(out)
    if partial_is_output:
        g.mark_output(den)
    return g


def test_carry_needs_a_scale_free_consumer():
    assert softmax_carry_plan(_split_attention()).partials
    # a product of partial sums is not scale-free, a partial that is a program output must
    # be its true value: neither producer gets the carry (its exp stays as the μGraph says)
    assert softmax_carry_plan(_split_attention("mul")) == NO_CARRY
    assert softmax_carry_plan(_split_attention(partial_is_output=True)) == NO_CARRY
    for graph in (_split_attention("mul"), _split_attention(partial_is_output=True)):
        program = compile_graph(graph, check=False)
        assert "sout" not in program.source and "alpha" not in program.source
    run = compile_graph(_split_attention(), check=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_against_reference(_split_attention(), run, device=DEVICE)


def test_block_level_rules():
    graph = _split_attention()
    first, second = (_kernels(graph)[i] for i in sorted(_kernels(graph)))
    assert stable_exp_plan(first) is None  # stored accumulators: no carry, no plan
    plan = stable_exp_plan(first, carry=True)
    assert plan is not None and plan.carried_outputs == {0, 1}
    assert scaled_input_plan(second, {0: 16, 1: 1}) is not None
    assert scaled_input_plan(second, {0: 32, 1: 1}) is not None  # half a block per tile
    assert scaled_input_plan(first, {0: 16}) is None  # exp of a partial: not a sum
    # a consumer tile of 16 columns over producer blocks 8 wide would straddle two blocks
    assert scaled_input_plan(second, {0: 8, 1: 1}) is None


# ---- accumulators that reduce after the loop ----------------------------------------------


def test_reducing_accumulators_add_whole_tiles_in_the_loop():
    w = WORKLOADS["rmsnorm_linear"]
    graph = w.optimized(w.small)
    deferred = compile_graph(graph, check=False)
    assert "tl.sum" not in _loop_body(deferred.source)  # no cross-thread reduction per iteration
    inline = compile_graph(graph, check=False, defer_reductions=False)
    assert "tl.sum" in _loop_body(inline.source)
    inputs = random_inputs(graph, DEVICE, seed=4)
    a, b = deferred(inputs=inputs)[0].double(), inline(inputs=inputs)[0].double()
    assert ((a - b).norm() / b.norm()).item() < 1e-3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_against_reference(graph, deferred, device=DEVICE)


def _loop_body(source: str) -> str:
    lines = source.split("for it in", 1)[1].splitlines()[1:]
    return "\n".join(line for line in lines if line.startswith(" " * 8))


# ---- the chained-dot warp rule ------------------------------------------------------------


def test_attention_chains_keep_four_warps_narrow_chains_get_two():
    flash = WORKLOADS["attention_flash"].optimized(
        {"h": 1, "h_kv": 1, "s": 128, "d": 64, "n": 512, "h_tile": 1, "s_parts": 1,
         "d_parts": 1, "n_tile": 64})
    block = next(iter(_kernels(flash).values()))
    assert not wide_chained_dots(block)  # 128 rows, inner dim 64: right with 4 and 8 warps
    assert default_launch(block).num_warps >= 4
    lora = WORKLOADS["lora"].optimized(
        {"m": 64, "k": 256, "n": 1024, "r": 16, "k_tile": 256, "n_tile": 64})
    block = next(iter(_kernels(lora).values()))
    assert wide_chained_dots(block)  # 64 rows over an inner dim of 16: faulted with 4 warps
    assert default_launch(block).num_warps == 2
