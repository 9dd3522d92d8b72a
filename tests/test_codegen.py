"""Triton code generation and the compiled runtime, under Triton's CPU interpreter.

Every graph is compiled, run on random inputs and compared with the reference semantics by
``check_against_reference`` (operator by operator, then end to end).
"""

from __future__ import annotations

import os
import re
import tempfile
import warnings

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():  # no GPU: generated kernels run on Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

from known_graphs import one_kernel  # noqa: E402 - tests/known_graphs.py

import mugraph  # noqa: E402
from mugraph.codegen.check import (  # noqa: E402
    CodegenMismatchError,
    check_against_reference,
    compare,
    random_inputs,
)
from mugraph.codegen.elementwise import FORMULAS  # noqa: E402
from mugraph.codegen.loader import interpreter_active  # noqa: E402
from mugraph.codegen.padding import padded_shapes  # noqa: E402
from mugraph.codegen.torch_ops import TORCH_KERNELS  # noqa: E402
from mugraph.codegen.triton_gen import (  # noqa: E402
    TRITON_EMITTERS,
    reshape_groups,
    reshape_is_reinterpretation,
    squeezed_lead,
)
from mugraph.errors import GraphInputError, UnsupportedError  # noqa: E402
from mugraph.ir.ops import Group, OpKind  # noqa: E402
from mugraph.ir.tensor import TensorRef  # noqa: E402
from mugraph.runtime.compiled import compile_graph  # noqa: E402

CACHE = os.path.join(tempfile.gettempdir(), "mugraph-test-cache")
os.environ.setdefault("MUGRAPH_CACHE_DIR", CACHE)
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")
F16, F32 = mugraph.float16, mugraph.float32
# on a GPU machine (without TRITON_INTERPRET) the same checks run on the GPU
DEVICE = torch.device("cpu" if interpreter_active() else "cuda")


def run_check(g, scale: float = 1.0, **options):
    """Compile ``g`` and compare it with the reference; return the program."""
    program = compile_graph(g, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_against_reference(g, program, scale=scale, device=DEVICE)
    return program


# ---- tables -------------------------------------------------------------------------------


def test_every_op_kind_has_an_emission():
    covered = set(TRITON_EMITTERS) | set(TORCH_KERNELS)
    assert covered == set(OpKind)
    assert set(TRITON_EMITTERS) >= Group.BLOCK
    assert set(TORCH_KERNELS) == Group.KERNEL
    assert set(FORMULAS) == Group.ELEMENTWISE


# ---- kernel level (PyTorch) ----------------------------------------------------------------

KERNEL_UNARY = [
    ("exp", {}), ("square", {}), ("sqrt", {}), ("silu", {}), ("gelu", {}), ("relu", {}),
    ("clamp", {"min_val": -0.3, "max_val": 0.4}), ("mul_scalar", {"scalar": 1.7}),
    ("pow", {"exponent": 3}), ("pow", {"exponent": 2.5}),
]


@pytest.mark.parametrize("name,kw", KERNEL_UNARY, ids=[f"{n}{kw}" for n, kw in KERNEL_UNARY])
def test_kernel_unary(name, kw):
    g = mugraph.new_kernel_graph()
    x = g.new_input((6, 10), dtype=F16)
    g.mark_output(getattr(g, name)(x, **kw))
    run_check(g)


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div"])
def test_kernel_binary_broadcast(name):
    g = mugraph.new_kernel_graph()
    a = g.new_input((6, 10), dtype=F16)
    b = g.new_input((6, 1), dtype=F16)
    g.mark_output(getattr(g, name)(a, b))
    g.mark_output(getattr(g, name)(b, a))
    run_check(g)


def test_kernel_matmul_reduction_rms_concat_reshape_softmax():
    g = mugraph.new_kernel_graph()
    a = g.new_input((2, 6, 8), dtype=F16)
    b = g.new_input((8, 5), dtype=F16)
    c = g.new_input((2, 6, 8), strides=(1, 2, 12), dtype=F16)  # non-contiguous
    g.mark_output(g.matmul(a, b))
    g.mark_output(g.reduction(a, 1))
    g.mark_output(g.rms_norm(c, (6, 8)))
    g.mark_output(g.concat(a, c, 2))
    g.mark_output(g.reshape(a, (12, 8)))
    g.mark_output(g.softmax(c, dim=-1))
    run_check(g)


def test_kernel_pow_negative_exponent():
    g = mugraph.new_kernel_graph()
    x = g.new_input((4, 8), dtype=F32)
    g.mark_output(g.pow(g.exp(x), -2))
    run_check(g)


# ---- block level: elementwise ---------------------------------------------------------------

BLOCK_UNARY = KERNEL_UNARY + [("pow", {"exponent": -2}), ("pow", {"exponent": 0.5}),
                              ("pow", {"exponent": 0})]


@pytest.mark.parametrize("name,kw", BLOCK_UNARY, ids=[f"{n}{kw}" for n, kw in BLOCK_UNARY])
def test_block_unary(name, kw):
    def build(tb, t):
        x = t[0] if name != "pow" or kw["exponent"] >= 0 else tb.exp(t[0])
        return [(getattr(tb, name)(x, **kw), (0, -1, -1), -1)]

    # 12 x 24 rows split over 2 blocks: tiles [6, 24], padded to [8, 32]
    run_check(one_kernel([((12, 24), (0, -1, -1), -1)], build))


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div"])
def test_block_binary_broadcast(name):
    def build(tb, t):
        return [(getattr(tb, name)(t[0], t[1]), (0, -1, -1), -1),
                (getattr(tb, name)(t[2], t[0]), (0, -1, -1), -1)]

    ins = [((12, 24), (0, -1, -1), -1), ((12, 1), (0, -1, -1), -1), ((1, 24), (-1, -1, -1), -1)]
    run_check(one_kernel(ins, build))


def test_thread_graph():
    program = (
        (OpKind.MUL, (0, 1), ()),
        (OpKind.SILU, (2,), ()),
        (OpKind.MUL_SCALAR, (3,), (("scalar", 0.5),)),
        (OpKind.ADD, (4, 0), ()),
    )

    def build(tb, t):
        return [(tb.thread_graph([t[0], t[1]], program), (0, -1, -1), -1)]

    run_check(one_kernel([((12, 20), (0, -1, -1), -1), ((12, 1), (0, -1, -1), -1)], build))


# ---- block level: matmul ---------------------------------------------------------------------


def test_block_matmul_looped_dot():
    def build(tb, t):
        return [(tb.forloop_accum(tb.matmul(t[0], t[1])), (1, -1, -1), -1)]

    ins = [((24, 64), (-1, -1, -1), 1), ((64, 48), (1, -1, -1), 0)]
    run_check(one_kernel(ins, build, grid=(3, 1, 1), loops=2))


def test_block_matmul_vector_fallback():
    # M = 1 (decode-like) and N = 1: broadcast multiply + sum instead of tl.dot
    def build(tb, t):
        return [(tb.matmul(t[0], t[1]), (1, -1, -1), -1), (tb.matmul(t[1], t[2]), (-1, -1, -1), -1)]

    ins = [((1, 40), (-1, -1, -1), -1), ((40, 32), (1, -1, -1), -1), ((32, 1), (-1, -1, -1), -1)]
    g = one_kernel(ins, build, grid=(1, 1, 1))
    assert "tl.dot" not in run_check(g).source


@pytest.mark.parametrize("dtype", [F16, F32])
def test_gemv_forms_compute_the_same_sums(dtype):
    """A looped matrix-vector product (M = 1; K tile 24, padded to 32) in each GEMV form:
    every form agrees with the reference; ``defer`` reduces after the loop, ``dot`` uses
    tl.dot (not for float32 programs, where it stays a deferred broadcast product)."""
    def build(tb, t):
        acc = tb.forloop_accum(tb.matmul(t[0], t[1]))
        return [(tb.mul(acc, tb.forloop_accum(tb.matmul(t[0], t[2]))), (1, -1, -1), -1)]

    ins = [((1, 48), (-1, -1, -1), 1), ((48, 32), (1, -1, -1), 0), ((48, 32), (1, -1, -1), 0)]
    g = one_kernel(ins, build, grid=(2, 1, 1), loops=2, dtype=dtype)
    sources = {form: run_check(g, gemv_form=form).source for form in ("broadcast", "defer", "dot")}
    assert "tl.dot" not in sources["broadcast"] and "tl.dot" not in sources["defer"]
    assert ("tl.dot" in sources["dot"]) == (dtype is F16)
    assert "tl.zeros([1, 32, 16]" in sources["defer"]  # [1, K, N] products kept whole
    with pytest.raises(UnsupportedError, match="gemv_form"):
        compile_graph(g, gemv_form="fast")


def test_block_matmul_batched_3d_and_4d():
    def build(tb, t):
        return [(tb.matmul(t[0], t[1]), (0, -1, -1), -1), (tb.matmul(t[2], t[3]), (0, -1, -1), -1)]

    ins = [((4, 16, 24), (0, -1, -1), -1), ((4, 24, 20), (0, -1, -1), -1),
           ((2, 2, 16, 16), (0, -1, -1), -1), ((2, 1, 16, 32), (0, -1, -1), -1)]
    run_check(one_kernel(ins, build))


def test_block_matmul_of_computed_operands_fp32():
    def build(tb, t):
        return [(tb.matmul(tb.exp(t[0]), tb.relu(t[1])), (0, -1, -1), -1)]

    ins = [((32, 20), (0, -1, -1), -1), ((20, 18), (-1, -1, -1), -1)]
    run_check(one_kernel(ins, build, dtype=F32), scale=0.5)


# A tl.dot whose B operand is computed from another tl.dot's result is emitted transposed,
# ((B^T) A^T)^T, so that value is the A operand (Triton 3.6 miscompiled the direct form).
_LORA_INPUTS = [((16, 64), (-1, -1, -1), 1), ((64, 64), (1, -1, -1), 0),
                ((64, 16), (-1, -1, -1), 0), ((16, 64), (1, -1, -1), -1)]


def test_chained_dot_as_b_operand_is_emitted_transposed():
    def build(tb, t):  # X_k @ (A_k @ B), summed over k
        x, _, a, b = t
        return [(tb.forloop_accum(tb.matmul(x, tb.matmul(a, b))), (1, -1, -1), -1)]

    source = run_check(one_kernel(_LORA_INPUTS, build, loops=4), scale=0.5).source
    assert "T = tl.dot(tl.trans(" in source and "tl.trans(tl.dot(" in source


def test_sum_with_a_dot_as_b_operand_is_emitted_transposed():
    def build(tb, t):  # X_k @ (W_k + A_k @ B): the searched LoRA μGraph
        x, w, a, b = t
        return [(tb.forloop_accum(tb.matmul(x, tb.add(w, tb.matmul(a, b)))), (1, -1, -1), -1)]

    source = run_check(one_kernel(_LORA_INPUTS, build, loops=4), scale=0.5).source
    assert "tl.trans(tl.dot(" in source


def test_dot_of_dot_of_dot_falls_back_to_float32_operands():
    def build(tb, t):  # X @ (W @ (A @ B)): the middle product's operand is a dot result too
        x, w, a, b = t
        return [(tb.matmul(x, tb.matmul(w, tb.matmul(a, b))), (1, -1, -1), -1)]

    ins = [((16, 64), (-1, -1, -1), -1), ((64, 64), (-1, -1, -1), -1),
           ((64, 16), (-1, -1, -1), -1), ((16, 64), (1, -1, -1), -1)]
    source = run_check(one_kernel(ins, build), scale=0.25).source
    assert ".to(tl.float32)" in source and "tl.trans(tl.dot(" in source


def test_dot_of_two_dot_results_uses_float32_operands():
    def build(tb, t):  # (X @ W) @ (A @ B): both operands are dot results
        x, w, a, b = t
        return [(tb.matmul(tb.matmul(x, w), tb.matmul(a, b)), (1, -1, -1), -1)]

    ins = [((16, 32), (-1, -1, -1), -1), ((32, 64), (-1, -1, -1), -1),
           ((64, 16), (-1, -1, -1), -1), ((16, 64), (1, -1, -1), -1)]
    source = run_check(one_kernel(ins, build), scale=0.25).source
    assert "tl.trans(" not in source and ".to(tl.float16)" not in source.split("tl.store")[0]


def test_block_matmul_bfloat16():
    def build(tb, t):
        return [(tb.forloop_accum(tb.matmul(t[0], t[1])), (1, -1, -1), -1)]

    ins = [((16, 32), (-1, -1, -1), 1), ((32, 32), (1, -1, -1), 0)]
    run_check(one_kernel(ins, build, loops=2, dtype=mugraph.bfloat16))


# ---- block level: reductions, normalisation, data movement ------------------------------------


def test_block_reductions_and_rms_norm():
    def build(tb, t):
        x = t[0]
        return [
            (tb.reduction(x, 1), (0, -1, -1), -1),
            (tb.reduction_max(x, 1), (0, -1, -1), -1),
            (tb.rms_norm(x), (0, -1, -1), -1),
            (tb.reduction_max(tb.exp(x), 0), (0, -1, -1), -1),
            (tb.reduction(tb.exp(x), 0), (0, -1, -1), -1),
        ]

    run_check(one_kernel([((12, 20), (0, -1, -1), -1)], build))


def test_block_concat_of_loads_and_of_computed_values():
    def build(tb, t):
        a, b = t
        return [
            (tb.concat(a, b, 1), (0, -1, -1), -1),  # two loads: one tile, two address ranges
            (tb.concat(tb.exp(a), b, 1), (0, -1, -1), -1),  # scratch round trip
            (tb.concat(tb.square(a), tb.exp(a), 0), (0, -1, -1), -1),
        ]

    g = one_kernel([((12, 20), (0, -1, -1), -1), ((12, 12), (0, -1, -1), -1)], build)
    source = run_check(g).source
    assert "scratch_ptr" in source and "tl.debug_barrier()" in source


def test_block_concat_feeding_matmul_lora_style():
    def build(tb, t):
        x, w, a, b = t
        xa = tb.matmul(x, a)
        return [(tb.matmul(tb.concat(x, xa, 1), tb.concat(w, b, 0)), (1, -1, -1), -1)]

    ins = [((16, 32), (-1, -1, -1), -1), ((32, 64), (1, -1, -1), -1),
           ((32, 16), (-1, -1, -1), -1), ((16, 64), (1, -1, -1), -1)]
    source = run_check(one_kernel(ins, build), scale=0.5).source
    # split into one product per part: no concatenated tile, no scratch round trip
    assert "scratch_ptr" not in source and source.count("tl.dot(") == 3


def test_matmul_of_unaligned_concats_keeps_the_scratch_path():
    def build(tb, t):
        x, w, a, b = t
        return [(tb.matmul(tb.concat(x, tb.exp(a), 1), tb.concat(w, b, 0)), (1, -1, -1), -1)]

    # x: K part 32 against w's 16 rows: the split points differ (exp(a): no two-range load)
    ins = [((16, 32), (-1, -1, -1), -1), ((16, 64), (1, -1, -1), -1),
           ((16, 16), (-1, -1, -1), -1), ((32, 64), (1, -1, -1), -1)]
    assert "scratch_ptr" in run_check(one_kernel(ins, build), scale=0.5).source


def test_block_reshape_reinterpreted_and_through_scratch():
    def build(tb, t):
        x = t[0]  # tile [6, 16]
        return [
            (tb.reshape(x, (3, 32)), (0, -1, -1), -1),  # padded [8,16] -> [4,32]: tl.reshape
            (tb.reshape(tb.exp(x), (16, 6)), (0, -1, -1), -1),  # needs scratch
            (tb.reshape(x, (96,)), (0, -1, -1), -1),
        ]

    run_check(one_kernel([((12, 16), (0, -1, -1), -1)], build))


def test_reshape_dropping_unit_dims_is_a_reinterpretation():
    def build(tb, t):
        q = tb.reshape(t[0], (1, 6, 16))  # [1, 6, 1, 16] -> [1, 6, 16], padded to 16 rows
        return [(tb.reshape(tb.matmul(q, t[1]), (1, 6, 1, 16)), (0, -1, -1), -1)]

    ins = [((2, 6, 1, 16), (0, -1, -1), -1), ((2, 16, 16), (0, -1, -1), -1)]
    source = run_check(one_kernel(ins, build, grid=(2, 1, 1)), scale=0.5).source
    assert "scratch_ptr" not in source and "tl.reshape" in source


def _rope_like(rows: int = 2, d: int = 128, keys: int = 64):
    """A query row of ``rows`` heads (tile (1, rows * d)) viewed as (rows, d), its halves
    rotated by a (2 rows, 2 rows) product and viewed back, then multiplied by a key tile: the
    attention partials' RoPE, whose reshapes sit beside tl.dot padding."""
    def build(tb, t):
        x, pairs, k = t
        q = tb.reshape(x, (rows, d))
        halves = tb.reshape(q, (2 * rows, d // 2))
        rotated = tb.reshape(tb.matmul(pairs, halves), (rows, d))
        return [(tb.matmul(tb.add(q, rotated), k), (0, -1, -1), -1)]

    ins = [((1, 2 * rows * d), (1, -1, -1), -1), ((2 * rows, 2 * rows), (-1, -1, -1), -1),
           ((d, 2 * keys), (1, -1, -1), -1)]
    return one_kernel(ins, build)


def test_reshapes_beside_dot_padding_stay_in_registers():
    # q (2, 128) is padded to 16 rows for its tl.dot with the keys; its halves (4, 64) get 32
    # (RESHAPE_RULE), and the row (1, 256) becomes (2, 128) padded in registers
    g = _rope_like()
    source = run_check(g, scale=0.5).source
    assert "scratch_ptr" not in source
    assert "tl.reshape" in source and "tl.where(tl.arange(0, 8)[:, None, None] == 0" in source
    before = run_check(g, scale=0.5, align_reshapes=False).source
    assert before.count("tl.debug_barrier()") > 0


def test_reshape_alignment_keeps_fewer_scratch_reshapes():
    from mugraph.codegen.decisions import reshape_is_reinterpretation

    block = _rope_like().ops[3].attr("graph")
    reshapes = [i for i, op in enumerate(block.ops) if op.kind is OpKind.RESHAPE]

    def through_scratch(align):
        pads = padded_shapes(block, align_reshapes=align)
        return sum(not reshape_is_reinterpretation(
            block.tensor_type(block.ops[i].inputs[0]).dims, pads[block.ops[i].inputs[0]],
            block.tensor_type(TensorRef(i)).dims, pads[TensorRef(i)]) for i in reshapes)

    assert through_scratch(True) < through_scratch(False)
    largest = max(np.prod(p) for p in padded_shapes(block, align_reshapes=False).values())
    assert max(np.prod(p) for p in padded_shapes(block, align_reshapes=True).values()) <= largest


def test_tiny_products_are_broadcast_products():
    # RoPE of one key row: (2, 2) @ (2, 64), 256 multiplications, stays unpadded
    def build(tb, t):
        k, pairs = t
        rotated = tb.reshape(tb.matmul(pairs, tb.reshape(k, (2, 64))), (1, 128))
        return [(tb.add(k, rotated), (0, -1, -1), -1)]

    ins = [((2, 128), (0, -1, -1), -1), ((2, 2), (-1, -1, -1), -1)]
    source = run_check(one_kernel(ins, build), scale=0.5).source
    assert "tl.dot" not in source and "scratch_ptr" not in source


def test_unrolled_loop_variant():
    g = _rmsnorm_linear()
    program = run_check(g, unroll=True)
    assert "tl.static_range(0, 4)" in program.source
    assert "for it in range" in compile_graph(g).source


def test_short_loops_without_matmul_unroll_by_default():
    w = WORKLOADS["adapter_mlp"]
    program = run_check(w.optimized(w.small), scale=0.5)
    first, second = program.kernels
    assert "tl.static_range" not in first.source and "tl.static_range(0, 4)" in second.source
    assert program.launch_configs[4].num_stages == 1
    forced = compile_graph(w.optimized(w.small), unroll=False)
    assert "tl.static_range" not in forced.source


def test_default_launch_pipelines_loops():
    from mugraph.runtime.compiled import default_launch, loop_tile_bytes

    g = _rmsnorm_linear()
    block = g.ops[2].attr("graph")
    assert loop_tile_bytes(block) == (16 * 16 + 16 * 16) * 2
    assert default_launch(block).num_stages == 4 and default_launch(block).num_warps == 4
    w = WORKLOADS["lora"]
    unlooped = w.optimized(w.suite).ops[4].attr("graph")
    assert unlooped.forloop_range == 1 and default_launch(unlooped).num_stages == 1


def test_quick_tuning_tries_a_loop_without_pipelining():
    """Stage 1 is among the quick launch variants of a looped kernel: its loads are plain,
    and keep their evict-first hint (pipelined dot operands lose it)."""
    from mugraph.optimize.tune import launch_variants
    from mugraph.runtime.compiled import default_launch

    block = _rmsnorm_linear().ops[2].attr("graph")
    stages = {v.num_stages for v in launch_variants(block, default_launch(block))}
    assert {1, 2, 3} <= stages


def test_the_launch_grid_tries_warps_and_stages_together():
    """Tilings are compared over 4 and 8 warps times 2-4 stages for a pipelined loop (the
    default excluded, its GEMV form kept); without a pipelined loop only the warps vary; no
    setting exceeds ``max_warps``."""
    from dataclasses import replace

    from mugraph.optimize.tune import launch_grid
    from mugraph.runtime.compiled import LaunchConfig, default_launch

    block = _rmsnorm_linear().ops[2].attr("graph")
    base = default_launch(block)
    grid = launch_grid(block, base)
    assert base not in grid and len(grid) == 5
    assert {(c.num_warps, c.num_stages) for c in grid} | {(4, 4)} == {
        (w, s) for w in (4, 8) for s in (2, 3, 4)}
    with_form = replace(base, gemv_form="dot")
    assert {c.gemv_form for c in launch_grid(block, with_form)} == {"dot"}
    w = WORKLOADS["lora"]
    unlooped = w.optimized(w.suite).ops[4].attr("graph")
    assert launch_grid(unlooped, LaunchConfig(4, 1)) == [LaunchConfig(8, 1)]


def test_chained_launch_runs_partials_and_combination_in_one_launch():
    """Opt-in: the split form's two kernels in one launch compute what two launches do; an
    intermediate read by two kernels, or a graph output, is never chained."""
    from mugraph.runtime.compiled import chained_pairs

    w = WORKLOADS["adapter_mlp"]
    g = w.optimized(w.small)
    apart = compile_graph(g)
    assert apart.chains == {}
    chained = compile_graph(g, chain_launches=True)
    assert [(i, c.second.op_index) for i, c in chained.chains.items()] == [(3, 4)]
    wrapper = chained.chains[3].source
    assert wrapper.grid == (8, 1, 1) and "def mg_k3_body(blk" in wrapper.source
    assert 'sem="release"' in wrapper.source and 'sem="acquire"' in wrapper.source
    x = [t.to(DEVICE) for t in random_inputs(g, "cpu", seed=3)]
    for _ in range(2):  # the counters are back at zero after each launch
        assert torch.equal(chained(inputs=x)[0], apart(inputs=x)[0])
    g2 = _rmsnorm_linear()
    assert chained_pairs(g2, compile_graph(g2, chain_launches=True).steps) == {}


def test_cuda_graph_option_is_accepted_and_harmless_here():
    g = _rmsnorm_linear()
    program = compile_graph(g, cuda_graph=False)
    assert program is not compile_graph(g) and program.cuda_graph is False
    x, w = torch.randn(8, 64).half().to(DEVICE), torch.randn(64, 32).half().to(DEVICE)
    ref = compile_graph(g)(inputs=[x, w])[0]
    for _ in range(3):
        assert torch.equal(program(inputs=[x, w])[0], ref)
    if DEVICE.type == "cpu":
        assert program.fast_path_stats() == {"plans": 0, "graphs": 0, "graph_replays": 0}


def test_reshape_groups():
    expected = [(range(0, 2), range(0, 1)), (range(2, 3), range(1, 2))]
    assert reshape_groups((2, 3, 4), (6, 4)) == expected
    assert reshape_is_reinterpretation((6, 16), (8, 16), (3, 32), (4, 32))
    assert not reshape_is_reinterpretation((6, 16), (8, 16), (16, 6), (16, 8))


# ---- accumulators ----------------------------------------------------------------------------


@pytest.mark.parametrize("acc", [None, "sum", "mean", "rms", "sum_todimx"])
def test_forloop_accum(acc):
    def build(tb, t):
        return [(tb.forloop_accum(t[0], acc), (0, -1, -1), -1),
                (tb.forloop_accum(tb.exp(t[1]), acc), (0, -1, -1), -1)]

    # last dims per iteration: 24 (padded 32: general sum_todimx) and 16 (reshape path)
    ins = [((4, 96), (0, -1, -1), 1), ((4, 64), (0, -1, -1), 1)]
    run_check(one_kernel(ins, build, loops=4, dimx=4))


def test_forloop_accum_of_invariant_input():
    def build(tb, t):
        return [(tb.add(tb.forloop_accum(t[0]), tb.forloop_accum(t[1], "sum")), (0, -1, -1), -1)]

    run_check(one_kernel([((4, 12), (0, -1, -1), -1), ((4, 36), (0, -1, -1), 1)], build, loops=3))


def test_accum_max_and_rescale_online_softmax_shape():
    def build(tb, t):
        s = t[0]
        m = tb.reduction_max(s, 1)
        e = tb.exp(s)
        r = tb.exp(tb.mul_scalar(m, -0.1))
        return [
            (tb.forloop_accum_max(m), (0, -1, -1), -1),
            (tb.forloop_accum_rescale(e, r), (0, -1, -1), -1),
            (tb.forloop_accum_rescale(e, r, "sum"), (0, -1, -1), -1),
        ]

    run_check(one_kernel([((6, 60), (0, -1, -1), 1)], build, loops=3))


# ---- tiles without a leading unit dim ---------------------------------------------------------

_SUBSCRIPTS = re.compile(r"\)\[([^\[\]]*)\]")


def _tile_ranks(source: str) -> set[int]:
    """The ranks of the lane subscripts (``tl.arange(...)[None, :]``) in kernel source."""
    return {len(m.group(1).split(",")) for m in _SUBSCRIPTS.finditer(source)
            if "None" in m.group(1) or m.group(1) == ":"}


def _attention_heads_per_block(rows=71, heads=4, d=16, n=64, loops=2):
    """softmax(Q K) V with one head per block ([1, rows, d] tiles): rows padded to 128."""
    def build(tb, t):
        q, k, v = t
        e = tb.exp(tb.matmul(q, k))
        total = tb.forloop_accum(e, "sum")
        o = tb.forloop_accum(tb.matmul(e, v))
        return [(tb.div(o, total), (0, -1, -1), -1)]

    ins = [((heads, rows, d), (0, -1, -1), -1), ((heads, d, n), (0, -1, -1), 2),
           ((heads, n, d), (0, -1, -1), 1)]
    return one_kernel(ins, build, grid=(heads, 1, 1), loops=loops)


def test_tiles_with_a_leading_unit_dim_are_held_in_two_dims():
    g = _attention_heads_per_block()
    block = next(op for op in g.ops if op.kind is OpKind.CUSTOMIZED).attr("graph")
    assert squeezed_lead(block) == 1
    source = run_check(g, scale=0.5).source
    assert _tile_ranks(source) == {2}
    assert "tl.full([1," not in source and "pid_x * 1) * in0_s0" in source


def test_a_leading_unit_dim_walked_by_the_loop_and_strided_output():
    def build(tb, t):
        x = t[0]  # [1, 8, 16] per iteration: the loop walks dim 0, the grid dim 1
        return [(tb.exp(x), (1, -1, -1), 0),
                (tb.forloop_accum(tb.reduction(x, 2), "none"), (1, -1, -1), -1)]

    g = one_kernel([((3, 16, 16), (1, -1, -1), 0)], build, grid=(2, 1, 1), loops=3)
    block = next(op for op in g.ops if op.kind is OpKind.CUSTOMIZED).attr("graph")
    assert squeezed_lead(block) == 1
    assert _tile_ranks(run_check(g).source) == {2}


def test_kernels_that_work_along_the_leading_dim_keep_it():
    def reduce_dim0(tb, t):
        return [(tb.reduction(t[0], 0), (1, -1, -1), -1)]

    def reshaped(tb, t):
        return [(tb.reshape(t[0], (1, 8, 4, 4)), (1, -1, -1), -1)]

    for build in (reduce_dim0, reshaped):
        g = one_kernel([((1, 16, 16), (1, -1, -1), -1)], build)
        block = next(op for op in g.ops if op.kind is OpKind.CUSTOMIZED).attr("graph")
        assert squeezed_lead(block) == 0
        assert 2 not in _tile_ranks(run_check(g).source)


# ---- maps: imap, omap, forloop_dim ------------------------------------------------------------


def test_three_grid_axes_and_forloop_output():
    def build(tb, t):
        x = t[0]  # [2, 3, 4, 20] over grid (2, 3, 2) on dims 0, 1, 2 ... forloop over dim 3
        return [(tb.exp(x), (0, 1, 2), 3), (tb.forloop_accum(x, "sum"), (0, 1, 2), -1)]

    run_check(one_kernel([((2, 3, 4, 20), (0, 1, 2), 3)], build, grid=(2, 3, 2), loops=2))


def test_replicated_and_invariant_inputs_with_forloop_output():
    def build(tb, t):
        x, y = t  # x replicated over the grid and the loop, y split over both
        return [(tb.add(y, tb.reduction(x, 1)), (1, -1, -1), 1)]

    ins = [((10, 7), (-1, -1, -1), -1), ((10, 48), (1, -1, -1), 1)]
    run_check(one_kernel(ins, build, grid=(2, 1, 1), loops=3))


def test_strided_input_and_strided_output():
    g = mugraph.new_kernel_graph()
    x = g.new_input((16, 24), strides=(1, 16), dtype=F16)  # column-major
    w = g.new_input((24, 32), dtype=F16)
    tb = mugraph.new_threadblock_graph((2, 2, 1), (128, 1, 1), 3)
    tx = tb.new_input(x, (0, -1, -1), 1)
    tw = tb.new_input(w, (-1, 1, -1), 0)
    tb.new_output(tb.forloop_accum(tb.matmul(tx, tw)), (0, 1, -1))
    (o,) = g.customized([x, w], tb)
    g.mark_output(o, strides=(1, 16))
    prog = run_check(g)
    xs = [torch.randn(24, 16).half().to(DEVICE).t(), torch.randn(24, 32).half().to(DEVICE)]
    out = prog(inputs=xs)[0]
    assert out.stride() == (1, 16)
    torch.testing.assert_close(out.float(), xs[0].float() @ xs[1].float(), rtol=2e-2, atol=5e-2)


def test_no_hoisting_variant_and_launch_options():
    def build(tb, t):
        x, w = t
        return [(tb.forloop_accum(tb.matmul(tb.exp(x), w)), (1, -1, -1), -1)]

    ins = [((16, 32), (-1, -1, -1), -1), ((32, 64), (1, -1, -1), 1)]
    g = one_kernel(ins, build, loops=2)
    a = run_check(g, hoist_invariants=False, num_warps=2, num_stages=1)
    b = run_check(g)
    assert a is not b and a.launch_configs[2].num_warps == 2
    loop_a = a.source.split("for it in range")[1]
    loop_b = b.source.split("for it in range")[1]
    assert "in0_ptr" in loop_a and "in0_ptr" not in loop_b  # x reloaded / hoisted


def test_64bit_addressing_variant(monkeypatch):
    import mugraph.runtime.compiled as compiled

    g = _rmsnorm_linear()
    prog = compile_graph(g, cache=False)
    monkeypatch.setattr(compiled, "_INT32_SPAN", 16)  # every tensor counts as huge
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_against_reference(g, prog, device=DEVICE)
    step = prog.steps[2]
    assert "tl.int64" in step.kernel_source(True).source and True in step._kernels


def test_two_kernels_and_torch_ops_in_one_program():
    g = mugraph.new_kernel_graph()
    x = g.new_input((8, 32), dtype=F16)
    w = g.new_input((32, 32), dtype=F16)
    tb = mugraph.new_threadblock_graph((2, 1, 1), (128, 1, 1), 2)
    tb.new_output(tb.forloop_accum(tb.matmul(tb.new_input(x, (-1, -1, -1), 1),
                                             tb.new_input(w, (1, -1, -1), 0))), (1, -1, -1))
    (h,) = g.customized([x, w], tb)
    s = g.silu(h)
    tb2 = mugraph.new_threadblock_graph((4, 1, 1), (128, 1, 1), 1)
    tb2.new_output(tb2.rms_norm(tb2.new_input(s, (0, -1, -1), -1)), (0, -1, -1))
    (o,) = g.customized([s], tb2)
    g.mark_output(o)
    g.mark_output(h)
    prog = run_check(g)
    assert prog.source.count("@triton.jit") == 2


# ---- runtime -------------------------------------------------------------------------------


def _rmsnorm_linear(m=8, k=64, n=32, loops=4):
    g = mugraph.new_kernel_graph()
    x = g.new_input((m, k), dtype=F16)
    w = g.new_input((k, n), dtype=F16)
    tb = mugraph.new_threadblock_graph((2, 1, 1), (128, 1, 1), loops)
    tx = tb.new_input(x, (-1, -1, -1), 1)
    tw = tb.new_input(w, (1, -1, -1), 0)
    tb.new_output(tb.div(tb.forloop_accum(tb.matmul(tx, tw)), tb.forloop_accum(tx, "rms")),
                  (1, -1, -1))
    (o,) = g.customized([x, w], tb)
    g.mark_output(o)
    return g


def test_generated_source_structure(tmp_path):
    prog = compile_graph(_rmsnorm_linear())
    src = prog.source
    assert src.count("@triton.jit") == 1
    assert "tl.dot(" in src and "for it in range(0, 4):" in src
    assert "tl.program_id(0)" in src and "tl.sqrt(" in src
    paths = prog.save_codes(tmp_path)
    assert [p.name for p in paths] == ["mg_k2.py"]
    assert paths[0].read_text() == prog.kernels[0].source


def test_streamed_tiles_load_with_the_evict_first_hint():
    """The weight, split over the grid and walked by the loop, is read by one block once: it
    is loaded evict-first; X, which every block reads, keeps the default policy."""
    from mugraph.codegen.triton_gen import streamed_input

    g = _rmsnorm_linear()
    block = g.ops[2].attr("graph")
    x_in, w_in = block.input_ops
    assert streamed_input(block, w_in) and not streamed_input(block, x_in)
    source = compile_graph(g, split_mixed_loads=False).source
    loads = [line for line in source.splitlines() if "tl.load(" in line]
    hinted = [line for line in loads if 'eviction_policy="evict_first"' in line]
    assert len(loads) == 2 and len(hinted) == 1 and "in1_ptr" in hinted[0]
    plain = compile_graph(g, stream_loads=False, split_mixed_loads=False)
    assert "eviction_policy" not in plain.source
    x, w = torch.randn(8, 64).half().to(DEVICE), torch.randn(64, 32).half().to(DEVICE)
    assert torch.equal(plain(inputs=[x, w])[0], compile_graph(g)(inputs=[x, w])[0])


def test_a_loop_tile_read_by_a_dot_and_by_another_operator_is_loaded_twice():
    """X feeds both X @ W (a tl.dot) and RMSNorm's sum of squares in the loop: the sum of
    squares reads its own load of the tile (evict-last, so the two loads stay two), and W,
    read by the dot alone, is loaded once. (One shared load raced under Triton 3.6's
    pipelining on an H100.) The outputs are the same either way."""
    from mugraph.codegen.decisions import mixed_dot_loads

    g = _rmsnorm_linear()
    block = g.ops[2].attr("graph")
    assert mixed_dot_loads(block) == {0}
    loads = [line for line in compile_graph(g).source.splitlines() if "tl.load(" in line]
    assert len(loads) == 3 and sum("in0_ptr" in line for line in loads) == 2
    second = [line for line in loads if 'eviction_policy="evict_last"' in line]
    assert len(second) == 1 and "in0_ptr" in second[0] and ".to(tl.float32)" in second[0]
    x, w = torch.randn(8, 64).half().to(DEVICE), torch.randn(64, 32).half().to(DEVICE)
    one = compile_graph(g, split_mixed_loads=False)
    assert torch.equal(one(inputs=[x, w])[0], compile_graph(g)(inputs=[x, w])[0])
    # no loop, or no dot: nothing to split
    assert not mixed_dot_loads(_rmsnorm_linear(loops=1).ops[2].attr("graph"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU runs the kernels")
def test_compile_without_a_gpu_or_the_interpreter_exports_source(tmp_path, monkeypatch):
    """Exporting Triton source needs no GPU; running it on CPU tensors says what to set."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    g = _rmsnorm_linear()
    prog = mugraph.compile(g)  # the default check cannot run here: it is not an error
    assert prog.source.count("@triton.jit") == 1 and not prog.options.interpret
    assert [p.name for p in prog.save_codes(tmp_path)] == ["mg_k2.py"]
    assert [k.name for k in prog.kernels] == ["mg_k2"] and prog.launch_configs
    x, w = torch.randn(8, 64).half(), torch.randn(64, 32).half()
    with pytest.raises(GraphInputError, match=r"got tensors on cpu\. To run the kernels on CPU "
                       r"tensors, use Triton's interpreter: set TRITON_INTERPRET=1 .* before "
                       r"Python imports triton"):
        prog(inputs=[x, w])
    with pytest.raises(UnsupportedError, match=r"check=True.*needs a CUDA GPU or Triton's "
                       r"interpreter.*TRITON_INTERPRET=1"):
        mugraph.compile(g, check=True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # set later: this program stays source only
    with pytest.raises(GraphInputError, match=r"made without Triton's interpreter.*compile it "
                       r"again"):
        prog(inputs=[x, w])
    assert mugraph.compile(g) is not prog  # compiled again: for the interpreter


def test_compile_cache_check_and_inputs():
    g = _rmsnorm_linear()
    prog = compile_graph(g, check=True)
    assert compile_graph(_rmsnorm_linear()) is prog  # same structure: same program
    x, w = torch.randn(8, 64).half().to(DEVICE), torch.randn(64, 32).half().to(DEVICE)
    out1 = prog(inputs=[x, w])[0]
    out2 = prog(inputs=[x, w])[0]
    assert out1 is not out2 and torch.equal(out1, out2)
    with pytest.raises(GraphInputError):
        prog(inputs=[x])
    with pytest.raises(GraphInputError):
        prog(inputs=[x.float(), w])


def test_mismatch_is_reported_with_kernel_name(monkeypatch):
    g = _rmsnorm_linear()
    prog = compile_graph(g, cache=False)
    step = next(iter(prog.steps.values()))
    real = step.launch

    def broken(inputs, outputs, scratch, sides=()):
        real(inputs, outputs, scratch, sides)
        outputs[0].mul_(1.5)

    monkeypatch.setattr(step, "launch", broken)
    with pytest.raises(CodegenMismatchError, match="mg_k2"):
        check_against_reference(g, prog, device=DEVICE)


def test_compare_nonfinite():
    assert compare(np.array([np.nan, np.inf]), np.array([np.nan, np.inf]), 1e-2, 1e-2).ok
    assert not compare(np.array([1.0, np.inf]), np.array([1.0, 2.0]), 1e-2, 1e-2).ok


# ---- padding -----------------------------------------------------------------------------------
# (graphs code generation cannot handle are in the corpus, tests/corpus: codegen_*)


def test_padding_analysis_ties_dims():
    g = _rmsnorm_linear(m=8)
    block = g.ops[2].attr("graph")
    pads = padded_shapes(block)
    assert all(p >= 16 or p == 1 for shape in pads.values() for p in shape)


# ---- the hand-written μGraphs of mugraph.library ------------------------------------------------

try:
    from mugraph.library import WORKLOADS
except ImportError:  # pragma: no cover - the library lands separately
    WORKLOADS = {}


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_library_workloads(name):
    w = WORKLOADS[name]
    for build in (w.naive, w.optimized):
        run_check(build(w.small), scale=0.5)
    for sizes in w.extra.values():
        small = {k: (v if k not in ("k", "n") else min(v, 256)) for k, v in sizes.items()}
        try:
            g = w.optimized(small)
        except mugraph.MugraphError:
            continue
        run_check(g, scale=0.5)


# ---- the optimizer: cost model, profiler, tuner ------------------------------------------------


def test_cost_model_is_cheap_and_ranks_fusion_first():
    import time

    from mugraph.library import WORKLOADS as W  # noqa: I001
    from mugraph.optimize import estimate

    w = W["rmsnorm_linear"]
    naive, fused = w.naive(w.suite), w.optimized(w.suite)
    start = time.perf_counter()
    for _ in range(200):
        cost_fused = estimate(fused)
    assert (time.perf_counter() - start) / 200 < 2e-3
    cost_naive = estimate(naive)
    assert cost_fused.launches == 1 and cost_naive.launches > 1
    assert cost_fused.seconds < cost_naive.seconds
    assert cost_fused.tensor_core_flops > 0 and cost_fused.dram_bytes > 0
    assert cost_fused.kernels[0].blocks == fused.ops[2].attr("graph").num_blocks
    assert "launches" in cost_fused.summary()


def test_cost_model_charges_register_spills_of_broadcast_matmuls():
    from mugraph.gpu import DEFAULT_GPU
    from mugraph.optimize import estimate
    from mugraph.optimize.cost_model import spill_factor

    def gemv(k_tile):  # one row times W: a broadcast product of k_tile x 64 per iteration
        def build(tb, t):
            return [(tb.forloop_accum(tb.matmul(t[0], t[1])), (1, -1, -1), -1)]

        ins = [((1, 1024), (-1, -1, -1), 1), ((1024, 256), (1, -1, -1), 0)]
        return one_kernel(ins, build, grid=(4, 1, 1), loops=1024 // k_tile)

    small, large = gemv(64), gemv(1024)
    assert spill_factor(small.ops[2].attr("graph")) == 1.0
    # 1024 x 64 products over 128 threads: 512 values each, far over the register budget
    assert spill_factor(large.ops[2].attr("graph")) > 10.0
    launch = DEFAULT_GPU.launch_overhead
    assert estimate(large).seconds - launch > 1.5 * (estimate(small).seconds - launch)


def test_profiler_and_tuner_without_gpu_degrade_gracefully():
    from mugraph.optimize import candidate_variants, optimize_program, profile_program

    g = _rmsnorm_linear()
    if torch.cuda.is_available():
        pytest.skip("covered by tests/gpu")
    m = profile_program(compile_graph(g))
    assert m.seconds == float("inf") and "CUDA" in m.error
    result = optimize_program(g)
    assert result.program is compile_graph(g) and "no GPU" in result.note
    variants = candidate_variants(g.ops[2].attr("graph"))
    assert len(variants) >= 6 and len(set(variants)) == len(variants)
    assert any(v.unroll for v in variants) and {v.num_stages for v in variants} >= {2, 3, 4}
    from mugraph.optimize import optimize_graphs, precompile

    assert precompile([compile_graph(g), compile_graph(g, num_warps=2)]) == [None, None]
    result = optimize_graphs([("a", g), ("b", _rmsnorm_linear(loops=2))])
    assert result.label == "a" and "no GPU" in result.note


def test_check_retries_smaller_inputs_when_the_program_overflows():
    # exp of a 256-long dot product overflows float16 on Uniform(-1, 1) inputs: the program's
    # own overflow, not the kernel's; the check starts again on smaller inputs
    g = mugraph.new_kernel_graph()
    q, k = g.new_input((4, 256), dtype=F16), g.new_input((256, 8), dtype=F16)
    g.mark_output(g.exp(g.matmul(q, k)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_against_reference(g, compile_graph(g, check=False), device=DEVICE, seed=3)
        with pytest.raises(CodegenMismatchError, match="overflows float16"):
            check_against_reference(g, compile_graph(g, check=False), device=DEVICE, scale=8.0)


def test_check_retries_when_a_kernel_intermediate_overflows():
    # attention without max subtraction: exp of a 256-long dot product overflows float16 in
    # the reference semantics of the block graph, while the kernel computes it in float32
    def build(tb, t):
        q, k, v = t
        e = tb.exp(tb.matmul(q, k))
        out = tb.div(tb.forloop_accum(tb.matmul(e, v)), tb.forloop_accum(e, "sum"))
        return [(out, (-1, -1, -1), -1)]

    ins = [((16, 256), (-1, -1, -1), -1), ((256, 64), (-1, -1, -1), 1),
           ((64, 16), (-1, -1, -1), 0)]
    g = one_kernel(ins, build, grid=(1, 1, 1), loops=2)
    program = compile_graph(g, check=False, stable_exp=False)  # exp(S) itself in float16
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = check_against_reference(g, program, device=DEVICE)
    assert max(report.values()) <= 1.0


def _attention_kernel(head=64, rows=16, keys=256, loops=4, out_den=False):
    """O = (sum_k exp(Q K_k) V_k) / (sum_k rowsum exp(Q K_k)): softmax without a max."""
    def build(tb, t):
        q, k, v = t
        e = tb.exp(tb.matmul(q, k))
        num, den = tb.forloop_accum(tb.matmul(e, v)), tb.forloop_accum(e, "sum")
        outs = [(tb.div(num, den), (-1, -1, -1), -1)]
        return outs + ([(den, (-1, -1, -1), -1)] if out_den else [])

    ins = [((rows, head), (-1, -1, -1), -1), ((head, keys), (-1, -1, -1), 1),
           ((keys, 16), (-1, -1, -1), 0)]
    return one_kernel(ins, build, grid=(1, 1, 1), loops=loops)


def test_stable_exp_computes_softmax_without_overflow():

    g = _attention_kernel()
    stable = compile_graph(g, check=False)
    assert "tl.maximum(" in stable.source and "alpha" in stable.source
    plain = compile_graph(g, check=False, stable_exp=False)
    q, k, v = random_inputs(g, DEVICE, seed=5, scale=4.0)  # logits up to about 100
    s = q.double() @ k.double()
    want = torch.softmax(s, dim=-1) @ v.double()
    got = stable(inputs=[q, k, v])[0].double()
    assert torch.isfinite(got).all()
    assert ((got - want).norm() / want.norm()).item() < 2e-3
    assert not torch.isfinite(plain(inputs=[q, k, v])[0]).all()  # exp(S) overflowed float16
    run_check(g)  # unit-scale inputs: the same as the reference semantics


def test_stable_exp_plan_accepts_only_ratios_of_rescaled_accumulators():
    from mugraph.codegen.stable_exp import stable_exp_plan

    def block(g):
        return next(op.attr("graph") for op in g.ops if op.kind is OpKind.CUSTOMIZED)

    plan = stable_exp_plan(block(_attention_kernel()))
    assert plan is not None and len(plan.accumulators) == 2
    # the denominator is an output too: it is not scale-free, so exp stays as it is
    assert stable_exp_plan(block(_attention_kernel(out_den=True))) is None

    def build(tb, t):  # relu(exp(S)): the rules are syntactic, relu is not among them
        q, k, v = t
        e = tb.relu(tb.exp(tb.matmul(q, k)))
        out = tb.div(tb.forloop_accum(tb.matmul(e, v)), tb.forloop_accum(e, "sum"))
        return [(out, (-1, -1, -1), -1)]

    ins = [((16, 64), (-1, -1, -1), -1), ((64, 256), (-1, -1, -1), 1),
           ((256, 16), (-1, -1, -1), 0)]
    assert stable_exp_plan(block(one_kernel(ins, build, grid=(1, 1, 1), loops=4))) is None


def test_default_launch_uses_two_warps_for_a_wide_chained_dot():
    from mugraph.runtime.compiled import default_launch

    def build(rows):
        def inner(tb, t):  # X @ W + (X @ A) @ B: the product X @ A feeds a dot of `rows` rows
            x, w, a, b = t
            return [(tb.add(tb.matmul(x, w), tb.matmul(tb.matmul(x, a), b)), (1, -1, -1), -1)]

        ins = [((rows, 64), (-1, -1, -1), -1), ((64, 128), (1, -1, -1), -1),
               ((64, 16), (-1, -1, -1), -1), ((16, 128), (1, -1, -1), -1)]
        g = one_kernel(ins, inner)
        return g, next(op.attr("graph") for op in g.ops if op.kind is OpKind.CUSTOMIZED)

    wide, block = build(64)
    assert default_launch(block).num_warps == 2
    run_check(wide, scale=0.5)
    assert default_launch(build(32)[1]).num_warps == 4
    with pytest.warns(UserWarning, match="num_warps=8 lowered to 2"):
        program = compile_graph(wide, num_warps=8, check=False)
    assert program.launch_configs[4].num_warps == 2


def test_a_damaged_cached_kernel_file_is_reported_and_written_again(tmp_path, monkeypatch):
    from mugraph.codegen import loader

    monkeypatch.setenv("MUGRAPH_CACHE_DIR", str(tmp_path))
    source = compile_graph(_rmsnorm_linear(), check=False, cache=False).kernels[0].source
    source += f"# {tmp_path.name}\n"  # a text no earlier test loaded
    path = loader.cache_dir() / f"mg_k2_{loader.source_digest(source)}.py"
    path.write_bytes(b"\xff\xfe garbage, not the kernel")
    with pytest.warns(UserWarning, match=rf"cached kernel source {re.escape(str(path))} is "
                      r"damaged \(it cannot be read"):
        kernel = loader.load_kernel("mg_k2", source)
    assert path.read_text() == source and kernel is not None
    path.write_text(source.replace("tl.sqrt", "tl.exp"))  # valid text, but not this kernel's
    monkeypatch.setattr(loader, "_MODULES", {})
    with pytest.warns(UserWarning, match="does not match its name's digest"):
        loader.load_kernel("mg_k2", source)
    assert path.read_text() == source
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary files left
