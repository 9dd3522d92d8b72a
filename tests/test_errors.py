"""A corpus of programs mugraph must reject, each with the right error class and a message
that names the operator, the offending dims or maps, and shows the surrounding graph."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import mugraph
from mugraph import (
    DTypeError,
    GraphInputError,
    GraphStructureError,
    MapError,
    MugraphError,
    ShapeError,
    SharedMemoryError,
    UnsupportedError,
)
from mugraph.gpu import DEFAULT_GPU, GPUSpec

F16, F32 = mugraph.float16, mugraph.float32
NONE = (-1, -1, -1)


def rejects(cls, match, fn, level="kernel"):
    """``fn()`` raises ``cls`` whose message matches ``match``; with ``level`` the message
    also shows the surrounding graph of that level and the rejected operator."""
    with pytest.raises(cls, match=match) as info:
        fn()
    assert isinstance(info.value, MugraphError)
    text = str(info.value)
    if level is not None:
        assert f"in {level} graph:" in text, text
        assert "<- rejected" in text, text
        assert re.search(r">>> \S", text), text
    return text


def kgraph(*shapes, dtype=F16):
    g = mugraph.new_kernel_graph()
    return (g, *[g.new_input(s, dtype=dtype) for s in shapes])


def test_error_classes_derive_from_mugraph_error():
    for cls in (DTypeError, GraphInputError, GraphStructureError, MapError, ShapeError,
                SharedMemoryError, UnsupportedError, mugraph.SerializationError):
        assert issubclass(cls, MugraphError)
    assert issubclass(MugraphError, Exception)


# ---- shapes ------------------------------------------------------------------------------


def test_matmul_inner_dim_mismatch():
    g, a, b = kgraph((4, 8), (6, 3))
    text = rejects(ShapeError, r"matmul: inner dims differ: \[4, 8\] @ \[6, 3\] \(8 != 6\)",
                   lambda: g.matmul(a, b))
    assert "%0 = input() -> [4, 8] float16" in text  # the graph so far
    assert ">>> matmul(%0, %1)" in text


def test_matmul_inner_dim_mismatch_in_block():
    g, a, b = kgraph((4, 8), (6, 3))
    tb = mugraph.new_threadblock_graph((1,))
    ta, tb_ = tb.new_input(a, NONE, -1), tb.new_input(b, NONE, -1)
    text = rejects(ShapeError, r"matmul: inner dims differ: \[4, 8\] @ \[6, 3\]",
                   lambda: tb.matmul(ta, tb_), level="block")
    assert "block graph grid=(1, 1, 1)" in text
    assert ">>> matmul(b0, b1)" in text


def test_matmul_batch_dims_do_not_broadcast():
    g, a, b = kgraph((2, 4, 8), (3, 8, 5))
    rejects(ShapeError, r"matmul: batch dims of \[2, 4, 8\] and \[3, 8, 5\] do not broadcast",
            lambda: g.matmul(a, b))


def test_matmul_needs_two_dims():
    g, a, b = kgraph((8,), (8, 5))
    rejects(ShapeError, r"matmul: operands need at least 2 dims, got \[8\] @ \[8, 5\]",
            lambda: g.matmul(a, b))


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_broadcast_mismatch(op):
    g, a, b = kgraph((4, 6), (4, 5))
    rejects(ShapeError, rf"{op}: dims \[4, 6\] and \[4, 5\] do not broadcast \(dim 1: 6 vs 5\)",
            lambda: getattr(g, op)(a, b))


def test_broadcast_rank_mismatch():
    g, a, b = kgraph((4, 6), (6,))
    rejects(ShapeError, r"add: operands must have the same number of dims, got \[4, 6\] and \[6\]",
            lambda: g.add(a, b))


def test_reshape_element_count_mismatch():
    g, a = kgraph((4, 6))
    rejects(ShapeError, r"reshape: cannot reshape \[4, 6\] \(24 elements\) to \[5, 5\] "
            r"\(25 elements\)", lambda: g.reshape(a, (5, 5)))


@pytest.mark.parametrize("dims", [(0, 24), (-4, -6), (), "24"])
def test_reshape_bad_dims(dims):
    g, a = kgraph((4, 6))
    rejects(ShapeError, r"reshape: dims must be a non-empty sequence of positive ints",
            lambda: g.reshape(a, dims))


def test_concat_mismatch():
    g, a, b = kgraph((4, 6), (5, 7))
    rejects(ShapeError, r"concat: \[4, 6\] and \[5, 7\] differ outside dim 1",
            lambda: g.concat(a, b, 1))


def test_concat_rank_mismatch_in_block():
    g, a, b = kgraph((4, 6), (4, 6))
    tb = mugraph.new_threadblock_graph((1,))
    ta = tb.new_input(a, NONE, -1)
    tr = tb.reduction(tb.new_input(b, NONE, -1), 0)
    rejects(ShapeError, r"concat: \[4, 6\] and \[1, 6\] differ outside dim 1",
            lambda: tb.concat(ta, tr, 1), level="block")


@pytest.mark.parametrize("dim", [2, -3, 7])
def test_reduction_dim_out_of_range(dim):
    g, a = kgraph((4, 6))
    rejects(ShapeError, rf"reduction: dim {dim} does not exist in a 2-d tensor",
            lambda: g.reduction(a, dim))


def test_reduction_max_dim_out_of_range():
    g, a = kgraph((4, 6))
    tb = mugraph.new_threadblock_graph((1,))
    t = tb.new_input(a, NONE, -1)
    rejects(ShapeError, r"reduction_max: dim 3 does not exist in a 2-d tensor",
            lambda: tb.reduction_max(t, 3), level="block")


def test_softmax_dim_out_of_range_shows_the_exp_before_it():
    g, a = kgraph((4, 6))
    text = rejects(ShapeError, r"reduction: dim 5 does not exist", lambda: g.softmax(a, 5))
    assert "exp(%0)" in text


def test_rms_norm_shape_not_trailing():
    g, a = kgraph((4, 6))
    rejects(ShapeError, r"rms_norm: normalized_shape \[4\] is not the trailing dims of \[4, 6\]",
            lambda: g.rms_norm(a, 4))


def test_clamp_bounds_reversed():
    g, a = kgraph((4, 6))
    rejects(ShapeError, r"clamp: min_val 1.0 exceeds max_val -1.0", lambda: g.clamp(a, 1, -1))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda g, a: g.mul_scalar(a, "2"), r"mul_scalar: expected a number, got '2'"),
        (lambda g, a: g.mul_scalar(a, True), r"mul_scalar: expected a number, got True"),
        (lambda g, a: g.pow(a, float("nan")), r"pow: the scalar must be finite, got nan"),
        (lambda g, a: g.clamp(a, float("-inf"), 1.0), r"clamp: the scalar must be finite"),
    ],
)
def test_bad_scalars(call, match):
    g, a = kgraph((4, 6))
    rejects(UnsupportedError, match, lambda: call(g, a))


# ---- imap / omap / forloop_dim -----------------------------------------------------------


def test_imap_names_a_missing_dim():
    g, a = kgraph((4, 6))
    tb = mugraph.new_threadblock_graph((2,))
    rejects(MapError, r"new_input: input_map maps grid axis x to dim 2, which does not exist "
            r"in a 2-d tensor", lambda: tb.new_input(a, (2, -1, -1), -1), level="block")


def test_imap_grid_axis_does_not_divide_dim():
    g, a = kgraph((4, 6))
    tb = mugraph.new_threadblock_graph((2, 4))
    rejects(MapError, r"new_input: imap splits dim 1 \(size 6\) over grid axis y of size 4, "
            r"which does not divide it", lambda: tb.new_input(a, (0, 1, -1), -1), level="block")


def test_forloop_range_does_not_divide_forloop_dim():
    g, a = kgraph((4, 12))
    tb = mugraph.new_threadblock_graph((2,), forloop_range=4)
    rejects(MapError, r"new_input: forloop_range 4 does not divide dim 1 of the block's part "
            r"\(size 6 of 12\)", lambda: tb.new_input(a, (1, -1, -1), 1), level="block")


@pytest.mark.parametrize("fdim", [2, -2, 1.0, True])
def test_forloop_dim_does_not_exist(fdim):
    g, a = kgraph((4, 12))
    tb = mugraph.new_threadblock_graph((1,), forloop_range=2)
    rejects(MapError, rf"new_input: forloop_dim {re.escape(repr(fdim))} does not exist in a "
            r"2-d tensor", lambda: tb.new_input(a, NONE, fdim), level="block")


def test_omap_does_not_cover_the_output():
    g, a = kgraph((4, 6))
    tb = mugraph.new_threadblock_graph((2, 3))
    t = tb.new_input(a, (0, 1, -1), -1)
    rejects(MapError, r"new_output: omap \(0, -1, -1\) does not cover the output: grid axis y "
            r"has 3 blocks", lambda: tb.new_output(t, (0, -1, -1)), level="block")


def test_omap_maps_two_axes_to_one_dim():
    g, a = kgraph((4, 6))
    tb = mugraph.new_threadblock_graph((2, 3))
    t = tb.new_input(a, (0, 1, -1), -1)
    rejects(MapError, r"new_output: output_map \(1, 1, -1\) maps two grid axes to the same dim",
            lambda: tb.new_output(t, (1, 1, -1)), level="block")


def test_imap_maps_two_axes_to_one_dim():
    g, a = kgraph((4, 6))
    tb = mugraph.new_threadblock_graph((2, 3))
    rejects(MapError, r"new_input: input_map \(0, 0, -1\) maps two grid axes to the same dim",
            lambda: tb.new_input(a, (0, 0, -1), -1), level="block")


@pytest.mark.parametrize("imap", [(0, -1), (0, -1, -1, -1), 0, (0.0, -1, -1), None, "0-1"])
def test_imap_not_a_3_tuple(imap):
    g, a = kgraph((4, 6))
    tb = mugraph.new_threadblock_graph((2,))
    rejects(MapError, rf"new_input: input_map must be a 3-tuple of ints \(x, y, z\), got "
            rf"{re.escape(repr(imap))}", lambda: tb.new_input(a, imap, -1), level="block")


def test_omap_not_a_3_tuple():
    g, a = kgraph((4, 6))
    tb = mugraph.new_threadblock_graph((1,))
    t = tb.new_input(a, NONE, -1)
    rejects(MapError, r"new_output: output_map must be a 3-tuple of ints \(x, y, z\), got "
            r"\(-1,\)", lambda: tb.new_output(t, (-1,)), level="block")


# ---- memory, dtypes, accumulators --------------------------------------------------------


def test_default_gpu_is_h100():
    assert DEFAULT_GPU is mugraph.H100
    assert mugraph.H100.shared_memory_per_block == 227 * 1024
    assert mugraph.H100.max_threads_per_block == 1024
    assert mugraph.new_threadblock_graph((1,)).gpu is mugraph.H100


def test_block_graph_exceeding_shared_memory():
    budget = mugraph.H100.shared_memory_per_block
    g, a = kgraph((227, 512))  # float16: exactly the budget in one tile
    tb = mugraph.new_threadblock_graph((1,))
    t = tb.new_input(a, NONE, -1)
    assert tb.shared_memory_bytes() == budget
    text = rejects(SharedMemoryError, rf"exp: shared memory of the block graph would reach "
                   rf"{2 * budget} bytes, over the NVIDIA H100 80GB HBM3 budget of {budget} "
                   r"bytes", lambda: tb.exp(t), level="block")
    assert ">>> exp(b0)" in text


def test_block_input_exceeding_shared_memory():
    g, a = kgraph((1024, 1024), dtype=F32)
    tb = mugraph.new_threadblock_graph((2,))
    rejects(SharedMemoryError, r"block_input: shared memory of the block graph would reach "
            r"2097152 bytes", lambda: tb.new_input(a, (0, -1, -1), -1), level="block")


def test_shared_memory_budget_comes_from_the_gpu_spec():
    small = GPUSpec(name="tiny", shared_memory_per_block=1024, device_memory=1 << 30,
                    multiprocessors=1)
    g, a = kgraph((16, 64))
    tb = mugraph.new_threadblock_graph((2,), gpu=small)
    t = tb.new_input(a, (0, -1, -1), -1)  # 8 * 64 * 2 = 1024 bytes: fits exactly
    rejects(SharedMemoryError, r"the tiny budget of 1024 bytes", lambda: tb.exp(t), level="block")


@pytest.mark.parametrize("dtype", ["int8", "float64", torch.float64, torch.int32, np.float64])
def test_unsupported_dtype(dtype):
    g = mugraph.new_kernel_graph()
    rejects(DTypeError, r"unsupported dtype .*: mugraph supports float16, bfloat16, float32",
            lambda: g.new_input((4, 6), dtype=dtype))


def test_supported_dtypes_by_name():
    g = mugraph.new_kernel_graph()
    for name, want in [("float16", F16), (torch.bfloat16, mugraph.bfloat16), ("float32", F32)]:
        assert g.new_input((2, 2), dtype=name).dtype is want


@pytest.mark.parametrize("op", ["add", "matmul", "concat"])
def test_dtype_mismatch(op):
    g = mugraph.new_kernel_graph()
    a, b = g.new_input((4, 4), dtype=F16), g.new_input((4, 4), dtype=F32)
    args = (a, b, 0) if op == "concat" else (a, b)
    rejects(DTypeError, rf"{op}: operands have different dtypes \(float16, float32\)",
            lambda: getattr(g, op)(*args))


def test_dtype_mismatch_in_block():
    g = mugraph.new_kernel_graph()
    a, b = g.new_input((4, 4), dtype=F16), g.new_input((4, 4), dtype=mugraph.bfloat16)
    tb = mugraph.new_threadblock_graph((1,))
    ta, tb_ = tb.new_input(a, NONE, -1), tb.new_input(b, NONE, -1)
    rejects(DTypeError, r"mul: operands have different dtypes \(bfloat16, float16\)",
            lambda: tb.mul(ta, tb_), level="block")


@pytest.mark.parametrize("acc", ["prod", "max", 3, "SUMX"])
def test_unsupported_accumulator(acc):
    g, a = kgraph((4, 8))
    tb = mugraph.new_threadblock_graph((1,), forloop_range=2)
    t = tb.new_input(a, NONE, 1)
    rejects(UnsupportedError, rf"forloop_accum: unsupported accumulator {re.escape(repr(acc))}; "
            r"expected one of None, sum, mean, rms, sum_todimx",
            lambda: tb.forloop_accum(t, acc), level="block")


@pytest.mark.parametrize("acc", ["mean", "rms", "sum_todimx"])
def test_unsupported_rescale_accumulator(acc):
    g, a, s = kgraph((4, 8), (4, 2))
    tb = mugraph.new_threadblock_graph((1,), forloop_range=2)
    t, r = tb.new_input(a, NONE, 1), tb.new_input(s, NONE, 1)
    rejects(UnsupportedError, rf"forloop_accum_rescale: accumulator '{acc}' is not supported",
            lambda: tb.forloop_accum_rescale(t, r, acc), level="block")


def test_sum_todimx_must_divide_last_dim():
    g, a = kgraph((4, 8))
    tb = mugraph.new_threadblock_graph((1,), forloop_range=2, reduction_dimx=3)
    t = tb.new_input(a, NONE, 1)
    rejects(ShapeError, r"forloop_accum: sum_todimx needs reduction_dimx=3 to divide the last "
            r"dim of \[4, 4\]", lambda: tb.forloop_accum(t, "sum_todimx"), level="block")


def test_rescale_factor_must_broadcast():
    g, a, s = kgraph((4, 8), (4, 6))
    tb = mugraph.new_threadblock_graph((1,), forloop_range=2)
    t, r = tb.new_input(a, NONE, 1), tb.new_input(s, NONE, 1)
    rejects(ShapeError, r"forloop_accum_rescale: .*\[4, 4\] and \[4, 3\] do not broadcast",
            lambda: tb.forloop_accum_rescale(t, r), level="block")


# ---- phases of the for-loop --------------------------------------------------------------


def test_mixing_in_loop_and_post_loop_values():
    g, a = kgraph((4, 8))
    tb = mugraph.new_threadblock_graph((1,), forloop_range=2)
    t = tb.new_input(a, NONE, 1)
    total = tb.forloop_accum(t, "sum")
    rejects(GraphStructureError, r"sub: mixes a value computed inside the for-loop with one "
            r"computed after it", lambda: tb.sub(t, total), level="block")


def test_accumulating_an_accumulated_value():
    g, a = kgraph((4, 8))
    tb = mugraph.new_threadblock_graph((1,), forloop_range=2)
    total = tb.forloop_accum(tb.new_input(a, NONE, 1))
    rejects(GraphStructureError, r"forloop_accum: its input is already accumulated",
            lambda: tb.forloop_accum(total), level="block")


def test_output_of_in_loop_value_without_forloop_dim():
    g, a = kgraph((4, 8))
    tb = mugraph.new_threadblock_graph((1,), forloop_range=2)
    t = tb.exp(tb.new_input(a, NONE, 1))
    text = rejects(GraphStructureError, r"new_output: the tensor changes every for-loop "
                   r"iteration; accumulate it", lambda: tb.new_output(t, NONE, -1), level="block")
    assert ">>> new_output(b1)" in text


def test_output_of_accumulator_with_forloop_dim():
    g, a = kgraph((4, 8))
    tb = mugraph.new_threadblock_graph((1,), forloop_range=2)
    total = tb.forloop_accum(tb.new_input(a, NONE, 1))
    rejects(GraphStructureError, r"new_output: an accumulator's result is written once; .*"
            r"\(forloop_dim=1\)", lambda: tb.new_output(total, NONE, 1), level="block")


# ---- graph structure ---------------------------------------------------------------------


def _copy_block(x, imap=NONE):
    tb = mugraph.new_threadblock_graph((1,))
    tb.new_output(tb.new_input(x, imap, -1), NONE)
    return tb


def test_customized_with_wrong_number_of_inputs():
    g, a, b = kgraph((4, 8), (4, 8))
    tb = _copy_block(a)
    rejects(GraphStructureError, r"customized: 2 inputs given, but the block graph has 1 input "
            r"iterators", lambda: g.customized([a, b], tb))


def test_customized_with_other_inputs_than_the_block_graph_reads():
    g, a, b = kgraph((4, 8), (4, 8))
    tb = _copy_block(a)
    rejects(GraphStructureError, r"customized: input 0 is %1: \[4, 8\] float16, but the block "
            r"graph's input iterator 0 was made from %0", lambda: g.customized([b], tb))


def test_customized_with_swapped_inputs():
    g, a, b = kgraph((4, 8), (8, 4))
    tb = mugraph.new_threadblock_graph((1,))
    tb.new_output(tb.matmul(tb.new_input(a, NONE, -1), tb.new_input(b, NONE, -1)), NONE)
    rejects(GraphStructureError, r"customized: input 0 is %1", lambda: g.customized([b, a], tb))


def test_customized_with_something_else_than_a_block_graph():
    g, a = kgraph((4, 8))
    rejects(GraphStructureError, r"customized: expected a ThreadBlockGraph, got KernelGraph",
            lambda: g.customized([a], g))


def test_block_graph_with_no_output():
    g, a = kgraph((4, 8))
    tb = mugraph.new_threadblock_graph((1,))
    tb.exp(tb.new_input(a, NONE, -1))
    rejects(GraphStructureError, r"block graph has no output \(call new_output\)",
            lambda: g.customized([a], tb))


def test_block_graph_from_another_kernel_graph():
    g, a = kgraph((4, 8))
    h, b = kgraph((4, 8))
    tb = _copy_block(b)
    rejects(GraphStructureError, r"customized: tensor %0 belongs to another graph",
            lambda: g.customized([b], tb))
    rejects(GraphStructureError, r"customized: input 0 is %0.*was made from %0",
            lambda: g.customized([a], tb))


def test_tensor_from_another_kernel_graph():
    g, a = kgraph((4, 8))
    h, b = kgraph((4, 8))
    rejects(GraphStructureError, r"add: tensor %0 belongs to another graph", lambda: g.add(a, b))
    rejects(GraphStructureError, r"reduction: tensor %0 belongs to another graph",
            lambda: g.reduction(b, 0))
    rejects(GraphStructureError, r"mark_output: tensor %0 belongs to another graph",
            lambda: g.mark_output(b))


def test_tensor_from_another_block_graph():
    g, a = kgraph((4, 8))
    tb1, tb2 = mugraph.new_threadblock_graph((1,)), mugraph.new_threadblock_graph((1,))
    t1, t2 = tb1.new_input(a, NONE, -1), tb2.new_input(a, NONE, -1)
    rejects(GraphStructureError, r"mul: tensor %0 belongs to another graph",
            lambda: tb1.mul(t1, t2), level="block")
    rejects(GraphStructureError, r"new_output: tensor %0 belongs to another graph",
            lambda: tb1.new_output(t2, NONE), level="block")


def test_wrong_kind_of_tensor():
    g, a = kgraph((4, 8))
    tb = mugraph.new_threadblock_graph((1,))
    t = tb.new_input(a, NONE, -1)
    rejects(GraphStructureError, r"exp: expected a DTensor of this graph", lambda: g.exp(t))
    rejects(GraphStructureError, r"exp: expected a STensor of this graph",
            lambda: tb.exp(a), level="block")
    rejects(GraphStructureError, r"new_input: expected a DTensor, got", lambda: tb.new_input(
        t, NONE, -1), level="block")
    rejects(GraphStructureError, r"exp: expected a DTensor of this graph, got 3",
            lambda: g.exp(3))


def test_graph_with_no_marked_output():
    g, a = kgraph((4, 8))
    g.exp(a)
    with pytest.raises(GraphStructureError, match=r"kernel graph has no marked output"):
        g(inputs=[torch.zeros(4, 8, dtype=torch.float16)])


@pytest.mark.parametrize(
    "strides, match",
    [
        ((1, 1), r"strides \(1, 1\) make elements of \[4, 8\] overlap"),
        ((4, 1), r"strides \(4, 1\) make elements of \[4, 8\] overlap"),
        ((8,), r"strides \(8,\) do not fit dims \[4, 8\]"),
        ((8, 0), r"strides \(8, 0\) do not fit dims \[4, 8\]"),
        ((8, -1), r"strides \(8, -1\) do not fit dims \[4, 8\]"),
    ],
)
def test_bad_strides(strides, match):
    g = mugraph.new_kernel_graph()
    rejects(ShapeError, rf"new_input: {match}", lambda: g.new_input((4, 8), strides=strides))


def test_good_strides():
    g = mugraph.new_kernel_graph()
    assert g.new_input((4, 8), strides=(1, 4)).strides == (1, 4)  # column-major
    assert g.new_input((4, 8), strides=(16, 1)).strides == (16, 1)  # padded rows
    assert g.new_input((4, 1), strides=(1, 1)).strides == (1, 1)  # size-1 dims are free


def test_bad_output_strides():
    g, a = kgraph((4, 8))
    e = g.exp(a)
    rejects(ShapeError, r"mark_output: strides \(2, 1\) make elements of \[4, 8\] overlap",
            lambda: g.mark_output(e, strides=(2, 1)))


@pytest.mark.parametrize(
    "dims, match",
    [((), r"got \(\)"), ((0, 4), r"got \(0, 4\)"), ((4, -1), r"got \(4, -1\)"),
     ((4, 2.0), r"got \(4, 2.0\)")],
)
def test_bad_input_dims(dims, match):
    g = mugraph.new_kernel_graph()
    rejects(ShapeError, rf"new_input: dims must be a non-empty sequence of positive ints, {match}",
            lambda: g.new_input(dims))


@pytest.mark.parametrize("grid", [(), (1, 1, 1, 1), (2, 0), (-1,), 4, (2.0,)])
def test_grid_dim_axes(grid):
    rejects(MapError, rf"new_threadblock_graph: grid_dim must be 1 to 3 positive ints, got "
            rf"{re.escape(repr(grid))}", lambda: mugraph.new_threadblock_graph(grid), level=None)


@pytest.mark.parametrize("block", [(1025,), (32, 33), (16, 16, 8), (2048, 1, 1)])
def test_block_dim_over_1024_threads(block):
    threads = int(np.prod(block))
    rejects(MapError, rf"new_threadblock_graph: block_dim .* has {threads} threads, over the "
            r"limit of 1024", lambda: mugraph.new_threadblock_graph((1,), block), level=None)


@pytest.mark.parametrize("block", [(), (0, 1, 1), (1, 1, 1, 1), 128])
def test_block_dim_malformed(block):
    rejects(MapError, r"new_threadblock_graph: block_dim must be 1 to 3 positive ints",
            lambda: mugraph.new_threadblock_graph((1,), block), level=None)


@pytest.mark.parametrize("name, value", [("forloop_range", 0), ("reduction_dimx", -2),
                                         ("forloop_range", 1.5)])
def test_bad_loop_figures(name, value):
    rejects(MapError, rf"new_threadblock_graph: {name} must be a positive int",
            lambda: mugraph.new_threadblock_graph((1,), **{name: value}), level=None)


def test_block_dim_limit_comes_from_the_gpu_spec():
    small = GPUSpec(name="small", shared_memory_per_block=1 << 16, device_memory=1 << 30,
                    multiprocessors=1, max_threads_per_block=256)
    mugraph.new_threadblock_graph((1,), (256, 1, 1), gpu=small)
    rejects(MapError, r"has 512 threads, over the limit of 256",
            lambda: mugraph.new_threadblock_graph((1,), (512, 1, 1), gpu=small), level=None)


# ---- calling a graph ---------------------------------------------------------------------


def _callable_graph():
    g, a, b = kgraph((4, 8), (8, 2), dtype=F32)
    g.mark_output(g.matmul(a, b))
    return g


def test_call_with_wrong_number_of_inputs():
    g = _callable_graph()
    x = torch.zeros(4, 8)
    with pytest.raises(GraphInputError, match=r"graph takes 2 inputs, got 1"):
        g(inputs=[x])
    with pytest.raises(GraphInputError, match=r"graph takes 2 inputs, got 3"):
        g(inputs=[x, torch.zeros(8, 2), x])
    with pytest.raises(GraphInputError, match=r"graph takes 2 inputs, got no"):
        g()


def test_call_with_wrong_shapes():
    g = _callable_graph()
    with pytest.raises(GraphInputError, match=r"input 1: expected shape \[8, 2\], got Tensor "
                       r"\(8, 3\) torch.float32"):
        g(inputs=[torch.zeros(4, 8), torch.zeros(8, 3)])
    with pytest.raises(GraphInputError, match=r"input 0: expected shape \[4, 8\], got ndarray "
                       r"\(32,\) float32"):
        g(inputs=[np.zeros(32, np.float32), np.zeros((8, 2), np.float32)])


def test_call_with_wrong_dtypes():
    g = _callable_graph()
    with pytest.raises(GraphInputError, match=r"input 0: expected dtype float32, got Tensor "
                       r"\(4, 8\) torch.float16"):
        g(inputs=[torch.zeros(4, 8, dtype=torch.float16), torch.zeros(8, 2)])
    with pytest.raises(GraphInputError, match=r"input 1: expected dtype float32, got ndarray "
                       r"\(8, 2\) float64"):
        g(inputs=[np.zeros((4, 8), np.float32), np.zeros((8, 2))])
    with pytest.raises(GraphInputError, match=r"input 0: expected shape \[4, 8\]"):
        g(inputs=[[[0.0] * 8] * 4, torch.zeros(8, 2)])  # a nested list has no shape


def test_every_error_in_this_corpus_is_a_mugraph_error():
    """The catch-all users write: except mugraph.MugraphError."""
    g, a, b = kgraph((4, 8), (6, 3))
    for fn in (lambda: g.matmul(a, b), lambda: g.new_input((2,), dtype="int8"),
               lambda: mugraph.new_threadblock_graph(()), lambda: g(inputs=[])):
        with pytest.raises(MugraphError):
            fn()
