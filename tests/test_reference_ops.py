"""Reference semantics of every operator, checked against PyTorch (float32) as the oracle.

Kernel level: each operator alone in a kernel graph. Block level: each operator inside a
custom kernel, first on one block with one iteration, then split over several blocks and
iterations, compared with the same operator applied by PyTorch to the whole tensor (or with an
explicit torch expression where the split changes what the operator sees). Then the
accumulators, the imap / omap / forloop_dim partitioning, and table coverage.
"""

from __future__ import annotations

import itertools
import math
import warnings
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import mugraph
from mugraph.ir.ops import Group, OpKind
from mugraph.ir.shapes import SHAPE_RULES
from mugraph.semantics import reference
from mugraph.semantics.partition import LEAD, split_input

F32 = mugraph.float32
ONE_BLOCK = dict(grid=(1,), forloop=1)


def _gen(case: str) -> torch.Generator:
    """A generator seeded from the test case's name: a different seed per case."""
    return torch.Generator().manual_seed(zlib.crc32(case.encode()))


def rand(gen: torch.Generator, *dims: int, positive: bool = False) -> torch.Tensor:
    x = torch.randn(dims, generator=gen, dtype=torch.float32)
    return x.abs() + 0.5 if positive else x


def close(actual, expected, rtol=1e-5, atol=1e-6) -> None:
    torch.testing.assert_close(actual, expected.to(torch.float32), rtol=rtol, atol=atol)


def kernel_call(arrays, body):
    """Build a kernel graph over float32 inputs shaped like ``arrays``, run it on them."""
    g = mugraph.new_kernel_graph()
    xs = [g.new_input(tuple(a.shape), dtype=F32) for a in arrays]
    outs = body(g, *xs)
    for o in outs if isinstance(outs, (tuple, list)) else (outs,):
        g.mark_output(o)
    return g(inputs=list(arrays))


def block_call(arrays, in_specs, body, out_specs, grid=(1,), forloop=1, dimx=64):
    """One custom kernel: ``in_specs`` = (imap, forloop_dim) per input, ``body`` builds the
    block computation, ``out_specs`` = (omap, forloop_dim) per output."""
    g = mugraph.new_kernel_graph()
    xs = [g.new_input(tuple(a.shape), dtype=F32) for a in arrays]
    tb = mugraph.new_threadblock_graph(grid, (128, 1, 1), forloop, dimx)
    ts = [tb.new_input(x, imap, fdim) for x, (imap, fdim) in zip(xs, in_specs, strict=True)]
    outs = body(tb, *ts)
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    for o, (omap, fdim) in zip(outs, out_specs, strict=True):
        tb.new_output(o, omap, fdim)
    results = g.customized(xs, tb)
    for r in results:
        g.mark_output(r)
    return g(inputs=list(arrays))


NONE = (-1, -1, -1)
WHOLE = (NONE, -1)  # one block sees the whole tensor, every iteration


# ---- kernel level ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sa, sb",
    [
        ((8, 16), (16, 12)),  # 2-D
        ((3, 8, 16), (3, 16, 5)),  # batched 3-D
        ((2, 1, 4, 8), (1, 3, 8, 6)),  # broadcast batch 4-D @ 4-D with size-1 batch dims
        ((2, 3, 4, 8), (2, 1, 8, 6)),
        ((3, 8, 16), (16, 5)),  # 3-D @ 2-D
    ],
)
def test_kernel_matmul(sa, sb):
    gen = _gen(f"matmul{sa}{sb}")
    a, b = rand(gen, *sa), rand(gen, *sb)
    (out,) = kernel_call([a, b], lambda g, x, y: g.matmul(x, y))
    assert tuple(out.shape) == tuple(torch.matmul(a, b).shape)
    close(out, torch.matmul(a.double(), b.double()))
    close(out, a @ b, rtol=1e-5, atol=1e-5)


UNARY_CASES = {
    "exp": (lambda g, t: g.exp(t), torch.exp, False),
    "square": (lambda g, t: g.square(t), torch.square, False),
    "sqrt": (lambda g, t: g.sqrt(t), torch.sqrt, True),
    "silu": (lambda g, t: g.silu(t), F.silu, False),
    "gelu": (lambda g, t: g.gelu(t), lambda x: F.gelu(x, approximate="tanh"), False),
    "relu": (lambda g, t: g.relu(t), torch.relu, False),
    "clamp": (lambda g, t: g.clamp(t, -0.3, 0.7), lambda x: torch.clamp(x, -0.3, 0.7), False),
    "mul_scalar": (lambda g, t: g.mul_scalar(t, -1.37), lambda x: x * -1.37, False),
    "mul_scalar_int": (lambda g, t: g.mul_scalar(t, 3), lambda x: x * 3, False),
    "pow": (lambda g, t: g.pow(t, 1.7), lambda x: torch.pow(x, 1.7), True),
    "pow_int": (lambda g, t: g.pow(t, 3), lambda x: torch.pow(x, 3), False),
    "pow_neg": (lambda g, t: g.pow(t, -0.5), lambda x: torch.pow(x, -0.5), True),
}


@pytest.mark.parametrize("name", sorted(UNARY_CASES))
@pytest.mark.parametrize("shape", [(7,), (4, 9), (2, 3, 5)])
def test_kernel_unary(name, shape):
    build, oracle, positive = UNARY_CASES[name]
    x = rand(_gen(f"unary-{name}-{shape}"), *shape, positive=positive)
    (out,) = kernel_call([x], build)
    close(out, oracle(x))


def test_kernel_relu_and_clamp_hit_both_sides():
    x = torch.tensor([[-2.0, -0.3, 0.0, 0.2, 0.7, 3.0]])
    (r,) = kernel_call([x], lambda g, t: g.relu(t))
    (c,) = kernel_call([x], lambda g, t: g.clamp(t, -0.3, 0.7))
    close(r, torch.tensor([[0.0, 0.0, 0.0, 0.2, 0.7, 3.0]]))
    close(c, torch.tensor([[-0.3, -0.3, 0.0, 0.2, 0.7, 0.7]]))


BINARY_CASES = {
    "add": (lambda g, a, b: g.add(a, b), torch.add),
    "sub": (lambda g, a, b: g.sub(a, b), torch.sub),
    "mul": (lambda g, a, b: g.mul(a, b), torch.mul),
    "div": (lambda g, a, b: g.div(a, b), torch.div),
}


@pytest.mark.parametrize("name", sorted(BINARY_CASES))
@pytest.mark.parametrize(
    "sa, sb",
    [
        ((4, 6), (4, 6)),
        ((4, 6), (4, 1)),
        ((1, 6), (4, 6)),
        ((4, 1, 8), (1, 6, 8)),
        ((3, 4, 5), (1, 1, 1)),
        ((2, 1, 4, 1), (1, 3, 1, 5)),
    ],
)
def test_kernel_binary_broadcast(name, sa, sb):
    build, oracle = BINARY_CASES[name]
    gen = _gen(f"binary-{name}-{sa}-{sb}")
    a = rand(gen, *sa)
    b = rand(gen, *sb, positive=name == "div")
    (out,) = kernel_call([a, b], build)
    close(out, oracle(a, b))


@pytest.mark.parametrize("dim", [0, 1, 2, -1, -3])
def test_kernel_reduction(dim):
    x = rand(_gen(f"reduction{dim}"), 3, 5, 7)
    (out,) = kernel_call([x], lambda g, t: g.reduction(t, dim))
    close(out, x.double().sum(dim, keepdim=True))


@pytest.mark.parametrize("shape, norm", [((6, 16), 16), ((2, 4, 8), (8,)), ((2, 4, 8), (4, 8))])
def test_kernel_rms_norm(shape, norm):
    x = rand(_gen(f"rms{shape}{norm}"), *shape)
    (out,) = kernel_call([x], lambda g, t: g.rms_norm(t, norm))
    dims = tuple(range(-(1 if isinstance(norm, int) else len(norm)), 0))
    x64 = x.double()
    close(out, x64 / torch.sqrt((x64 * x64).mean(dim=dims, keepdim=True)))


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_kernel_softmax(dim):
    x = rand(_gen(f"softmax{dim}"), 3, 4, 6)
    (out,) = kernel_call([x], lambda g, t: g.softmax(t, dim))
    close(out, torch.softmax(x, dim))


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_kernel_concat(dim):
    gen = _gen(f"concat{dim}")
    sa, sb = [2, 3, 4], [2, 3, 4]
    sb[dim] = 5
    a, b = rand(gen, *sa), rand(gen, *sb)
    (out,) = kernel_call([a, b], lambda g, x, y: g.concat(x, y, dim))
    close(out, torch.cat([a, b], dim), rtol=0, atol=0)


@pytest.mark.parametrize(
    "shape, new", [((4, 6), (24,)), ((4, 6), (2, 12)), ((2, 3, 4), (4, 3, 2)), ((6,), (1, 6, 1))]
)
def test_kernel_reshape(shape, new):
    x = rand(_gen(f"reshape{shape}{new}"), *shape)
    (out,) = kernel_call([x], lambda g, t: g.reshape(t, new))
    close(out, x.reshape(new), rtol=0, atol=0)


def test_kernel_chain_and_numpy_inputs():
    """A chain of operators, called on NumPy arrays (the result comes back as NumPy)."""
    rng = np.random.default_rng(1234)
    a = rng.standard_normal((4, 8)).astype(np.float32)
    w = rng.standard_normal((8, 6)).astype(np.float32)
    g = mugraph.new_kernel_graph()
    x, y = g.new_input((4, 8), dtype=F32), g.new_input((8, 6), dtype=F32)
    g.mark_output(g.mul_scalar(g.gelu(g.matmul(x, y)), 0.5))
    (out,) = g(inputs=[a, w])
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    ta, tw = torch.from_numpy(a), torch.from_numpy(w)
    close(torch.from_numpy(out), 0.5 * F.gelu(ta @ tw, approximate="tanh"), atol=1e-5)


def test_kernel_mixed_torch_and_numpy_inputs():
    """Inputs may mix torch tensors and NumPy arrays; the first decides the result type."""
    gen = _gen("mixed-inputs")
    a, b = rand(gen, 4, 8), rand(gen, 8, 3)
    g = mugraph.new_kernel_graph()
    x, y = g.new_input((4, 8), dtype=F32), g.new_input((8, 3), dtype=F32)
    g.mark_output(g.matmul(x, y))
    (t,) = g(inputs=[a, b.numpy()])
    (n,) = g(inputs=[a.numpy(), b])
    assert isinstance(t, torch.Tensor) and isinstance(n, np.ndarray)
    close(t, a.double() @ b.double())
    close(torch.from_numpy(n), a.double() @ b.double())


def test_outputs_are_fresh_writable_tensors():
    """An output that is a broadcast view inside the evaluator still comes back writable,
    without PyTorch's non-writable-array warning, and detached from the inputs."""
    x = rand(_gen("fresh-outputs"), 2, 3)
    g = mugraph.new_kernel_graph()
    t = g.new_input((2, 3), dtype=F32)
    tb = mugraph.new_threadblock_graph((1,), (128, 1, 1), 2)
    tb.new_output(tb.new_input(t, NONE, -1), NONE)  # a loop-invariant copy
    (o,) = g.customized([t], tb)
    g.mark_output(o)
    g.mark_output(t)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        outs = g(inputs=[x])
    for out in outs:
        close(out, x, rtol=0, atol=0)
        out.add_(1.0)
    close(x, rand(_gen("fresh-outputs"), 2, 3), rtol=0, atol=0)


def test_kernel_float16_rounds_like_torch():
    """A float16 graph returns float16 tensors: the float64 result rounded once."""
    x = rand(_gen("f16"), 4, 8).half()
    g = mugraph.new_kernel_graph()
    t = g.new_input((4, 8))
    g.mark_output(g.exp(t))
    (out,) = g(inputs=[x])
    assert out.dtype == torch.float16
    torch.testing.assert_close(out, torch.exp(x.double()).half(), rtol=0, atol=0)


# ---- block level: each operator inside a custom kernel ------------------------------------

# A [8, 12, 16] tensor split over a (2, 4) grid (dims 0 and 2) and 3 iterations (dim 1).
SPLIT = dict(grid=(2, 4), forloop=3)
SPLIT_IN = ((0, 2, -1), 1)
SPLIT_OUT = ((0, 2, -1), 1)


@pytest.mark.parametrize("layout", ["one_block", "split"])
@pytest.mark.parametrize("name", sorted(UNARY_CASES))
def test_block_unary(name, layout):
    build, oracle, positive = UNARY_CASES[name]
    x = rand(_gen(f"block-unary-{name}-{layout}"), 8, 12, 16, positive=positive)
    if layout == "one_block":
        (out,) = block_call([x], [WHOLE], build, [WHOLE], **ONE_BLOCK)
    else:
        (out,) = block_call([x], [SPLIT_IN], build, [SPLIT_OUT], **SPLIT)
    close(out, oracle(x))


@pytest.mark.parametrize("layout", ["one_block", "split"])
@pytest.mark.parametrize("name", sorted(BINARY_CASES))
@pytest.mark.parametrize("sb", [(8, 12, 16), (8, 1, 16), (1, 12, 1), (1, 1, 1)])
def test_block_binary_broadcast(name, sb, layout):
    build, oracle = BINARY_CASES[name]
    gen = _gen(f"block-binary-{name}-{sb}-{layout}")
    a = rand(gen, 8, 12, 16)
    b = rand(gen, *sb, positive=name == "div")
    if layout == "one_block":
        (out,) = block_call([a, b], [WHOLE, WHOLE], build, [WHOLE], **ONE_BLOCK)
    else:
        # b follows a's split along the dims it has; its size-1 dims are replicated.
        imap = tuple(d if d >= 0 and sb[d] > 1 else -1 for d in SPLIT_IN[0])
        fdim = 1 if sb[1] > 1 else -1
        (out,) = block_call([a, b], [SPLIT_IN, (imap, fdim)], build, [SPLIT_OUT], **SPLIT)
    close(out, oracle(a, b))


def test_block_matmul_one_block():
    gen = _gen("block-matmul-one")
    a, b = rand(gen, 16, 32), rand(gen, 32, 24)
    (out,) = block_call([a, b], [WHOLE, WHOLE], lambda tb, x, y: tb.matmul(x, y), [WHOLE])
    close(out, a.double() @ b.double())


def test_block_matmul_split_k_loop():
    """Grid over rows and columns, for-loop over k with an accumulator: the tiled GEMM."""
    gen = _gen("block-matmul-split")
    a, b = rand(gen, 16, 32), rand(gen, 32, 24)
    (out,) = block_call(
        [a, b],
        [((0, -1, -1), 1), ((-1, 1, -1), 0)],
        lambda tb, x, y: tb.forloop_accum(tb.matmul(x, y)),
        [((0, 1, -1), -1)],
        grid=(2, 3),
        forloop=4,
    )
    close(out, a.double() @ b.double())


def test_block_matmul_batched_split():
    gen = _gen("block-matmul-batched")
    a, b = rand(gen, 4, 8, 16), rand(gen, 4, 16, 12)
    (out,) = block_call(
        [a, b],
        [((0, -1, 1), 2), ((0, 2, -1), 1)],
        lambda tb, x, y: tb.forloop_accum(tb.matmul(x, y)),
        [((0, 2, 1), -1)],
        grid=(2, 3, 2),
        forloop=2,
    )
    close(out, a.double() @ b.double())


def test_block_matmul_concat_over_iterations():
    """The for-loop over rows of A, each iteration's product concatenated (forloop_dim)."""
    gen = _gen("block-matmul-rows")
    a, b = rand(gen, 16, 8), rand(gen, 8, 6)
    (out,) = block_call(
        [a, b], [((0, -1, -1), 0), WHOLE], lambda tb, x, y: tb.matmul(x, y),
        [((0, -1, -1), 0)], grid=(2,), forloop=4,
    )
    close(out, a.double() @ b.double())


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_block_reduction(dim):
    """Reduce one dim of an [8, 12, 16] tensor split over a grid and a for-loop."""
    x = rand(_gen(f"block-reduction-{dim}"), 8, 12, 16)
    x64 = x.double()
    (whole,) = block_call([x], [WHOLE], lambda tb, t: tb.reduction(t, dim), [WHOLE])
    close(whole, x64.sum(dim, keepdim=True))
    if dim == 2:  # not split: per tile, tiles concatenated back
        (out,) = block_call(
            [x], [((0, -1, -1), 1)], lambda tb, t: tb.reduction(t, 2),
            [((0, -1, -1), 1)], grid=(2,), forloop=3,
        )
        close(out, x64.sum(2, keepdim=True))
    elif dim == 1:  # split over iterations: sum the per-iteration partial sums
        (out,) = block_call(
            [x], [((0, 2, -1), 1)], lambda tb, t: tb.forloop_accum(tb.reduction(t, 1)),
            [((0, 2, -1), -1)], grid=(2, 4), forloop=3,
        )
        close(out, x64.sum(1, keepdim=True))
    else:  # split over the grid: each block writes its partial sum side by side
        (out,) = block_call(
            [x], [((0, -1, -1), -1)], lambda tb, t: tb.reduction(t, 0),
            [((0, -1, -1), -1)], grid=(2,), forloop=1,
        )
        close(out, x64.reshape(2, 4, 12, 16).sum(1))


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_block_reduction_max(dim):
    x = rand(_gen(f"block-rmax-{dim}"), 8, 12, 16)
    (whole,) = block_call([x], [WHOLE], lambda tb, t: tb.reduction_max(t, dim), [WHOLE])
    close(whole, x.amax(dim, keepdim=True))
    if dim == 1:  # split over iterations: the running max of the per-iteration maxima
        (out,) = block_call(
            [x], [((0, 2, -1), 1)],
            lambda tb, t: tb.forloop_accum_max(tb.reduction_max(t, 1)),
            [((0, 2, -1), -1)], grid=(2, 4), forloop=3,
        )
        close(out, x.amax(1, keepdim=True))
    else:  # dim not split by the for-loop: per tile, tiles put back together
        other = 2 if dim == 0 else 0
        (out,) = block_call(
            [x], [((other, -1, -1), 1)], lambda tb, t: tb.reduction_max(t, dim),
            [((other, -1, -1), 1)], grid=(2,), forloop=3,
        )
        close(out, x.amax(dim, keepdim=True))


@pytest.mark.parametrize("layout", ["one_block", "split"])
def test_block_rms_norm(layout):
    x = rand(_gen(f"block-rms-{layout}"), 8, 12, 16)
    x64 = x.double()
    expected = x64 / torch.sqrt((x64 * x64).mean(-1, keepdim=True))
    if layout == "one_block":
        (out,) = block_call([x], [WHOLE], lambda tb, t: tb.rms_norm(t), [WHOLE])
    else:
        (out,) = block_call(
            [x], [((0, 1, -1), 1)], lambda tb, t: tb.rms_norm(t), [((0, 1, -1), 1)],
            grid=(2, 3), forloop=2,
        )
    close(out, expected)


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_block_concat(dim):
    gen = _gen(f"block-concat-{dim}")
    sa, sb = [4, 6, 8], [4, 6, 8]
    sb[dim] = 2 * sa[dim] if dim else 8
    a, b = rand(gen, *sa), rand(gen, *sb)
    body = lambda tb, x, y: tb.concat(x, y, dim)  # noqa: E731
    (whole,) = block_call([a, b], [WHOLE, WHOLE], body, [WHOLE])
    close(whole, torch.cat([a, b], dim), rtol=0, atol=0)
    # split the two other dims over the grid and the loop: still the whole concatenation
    g_dim, f_dim = [d for d in range(3) if d != dim]
    spec = ((g_dim, -1, -1), f_dim)
    (out,) = block_call([a, b], [spec, spec], body, [spec], grid=(2,), forloop=2)
    close(out, torch.cat([a, b], dim), rtol=0, atol=0)
    # split the concatenated dim itself over the grid: each block concatenates its chunks
    spec = ((dim, -1, -1), f_dim)
    (out,) = block_call([a, b], [spec, spec], body, [spec], grid=(2,), forloop=2)
    pairs = zip(a.chunk(2, dim), b.chunk(2, dim), strict=True)
    chunks = [torch.cat([ca, cb], dim) for ca, cb in pairs]
    close(out, torch.cat(chunks, dim), rtol=0, atol=0)


@pytest.mark.parametrize("layout", ["one_block", "split"])
def test_block_reshape(layout):
    x = rand(_gen(f"block-reshape-{layout}"), 4, 6, 8)
    if layout == "one_block":
        (out,) = block_call([x], [WHOLE], lambda tb, t: tb.reshape(t, (6, 32)), [WHOLE])
        close(out, x.reshape(6, 32), rtol=0, atol=0)
    else:
        # row r of the grid, iteration i: x[r, 2i:2i+2, :] flattened → row r, columns 16i..
        (out,) = block_call(
            [x], [((0, -1, -1), 1)], lambda tb, t: tb.reshape(t, (1, 16)),
            [((0, -1, -1), 1)], grid=(4,), forloop=3,
        )
        close(out, x.reshape(4, 48), rtol=0, atol=0)


@pytest.mark.parametrize("layout", ["one_block", "split"])
def test_block_thread_graph(layout):
    """A fused elementwise chain: (exp(a) * b - a) * 0.25, clamped."""
    gen = _gen(f"block-thread-{layout}")
    a, b = rand(gen, 8, 12, 16), rand(gen, 8, 1, 16)
    program = [
        (OpKind.EXP, (0,), ()),
        (OpKind.MUL, (2, 1), ()),
        (OpKind.SUB, (3, 0), ()),
        (OpKind.MUL_SCALAR, (4,), (("scalar", 0.25),)),
        (OpKind.CLAMP, (5,), (("max_val", 1.5), ("min_val", -0.5))),
    ]
    body = lambda tb, x, y: tb.thread_graph([x, y], program)  # noqa: E731
    if layout == "one_block":
        (out,) = block_call([a, b], [WHOLE, WHOLE], body, [WHOLE])
    else:
        (out,) = block_call(
            [a, b], [SPLIT_IN, ((0, 2, -1), -1)], body, [SPLIT_OUT], **SPLIT
        )
    close(out, torch.clamp((torch.exp(a) * b - a) * 0.25, -0.5, 1.5))


def test_block_replicated_input_and_loop_invariant_output():
    """imap -1 replicates: every block sees all of b; a loop-invariant value concatenated
    over iterations repeats."""
    gen = _gen("block-replicated")
    a, b = rand(gen, 8, 6), rand(gen, 6, 4)
    (out,) = block_call(
        [a, b], [((0, -1, -1), -1), WHOLE], lambda tb, x, y: tb.matmul(x, y),
        [((0, -1, -1), 1)], grid=(4,), forloop=3,
    )
    close(out, (a.double() @ b.double()).repeat(1, 3))


def test_block_two_outputs():
    gen = _gen("block-two-outputs")
    x = rand(gen, 8, 16)
    (s, e) = block_call(
        [x], [((0, -1, -1), 1)],
        lambda tb, t: (tb.forloop_accum(t, "sum"), tb.exp(t)),
        [((0, -1, -1), -1), ((0, -1, -1), 1)], grid=(2,), forloop=4,
    )
    close(s, x.double().sum(-1, keepdim=True))
    close(e, torch.exp(x))


# ---- accumulators ------------------------------------------------------------------------

# x [4, 32] split over 2 blocks (rows) and 4 iterations (columns): iteration i of block b
# sees x[2b:2b+2, 8i:8i+8].
ACC_IN = ((0, -1, -1), 1)
ACC_OUT = ((0, -1, -1), -1)
ACC_GRID = dict(grid=(2,), forloop=4)


def accum(x, acc, dimx=64):
    (out,) = block_call(
        [x], [ACC_IN], lambda tb, t: tb.forloop_accum(t, acc), [ACC_OUT], dimx=dimx, **ACC_GRID
    )
    return out


def test_accum_none_adds_tiles():
    x = rand(_gen("acc-none"), 4, 32)
    close(accum(x, None), x.double().reshape(4, 4, 8).sum(1))


def test_accum_sum():
    x = rand(_gen("acc-sum"), 4, 32)
    close(accum(x, "sum"), x.double().sum(-1, keepdim=True))


def test_accum_mean():
    x = rand(_gen("acc-mean"), 4, 32)
    close(accum(x, "mean"), x.double().mean(-1, keepdim=True))


def test_accum_rms():
    x = rand(_gen("acc-rms"), 4, 32)
    close(accum(x, "rms"), torch.sqrt((x.double() ** 2).mean(-1, keepdim=True)))


def test_accum_sum_todimx():
    """Each iteration's last dim (8) becomes dimx=2 partial sums of contiguous 4-chunks."""
    x = rand(_gen("acc-todimx"), 4, 32)
    expected = x.double().reshape(4, 4, 2, 4).sum(-1).sum(1)
    close(accum(x, "sum_todimx", dimx=2), expected)
    explicit = torch.zeros(4, 2, dtype=torch.float64)
    for i in range(4):
        for j in range(2):
            explicit[:, j] += x.double()[:, 8 * i + 4 * j : 8 * i + 4 * j + 4].sum(-1)
    close(accum(x, "sum_todimx", dimx=2), explicit)


def test_accum_max():
    x = rand(_gen("acc-max"), 4, 32)
    (out,) = block_call(
        [x], [ACC_IN], lambda tb, t: tb.forloop_accum_max(t), [ACC_OUT], **ACC_GRID
    )
    close(out, x.reshape(4, 4, 8).amax(1))


def test_accum_mean_rms_over_a_non_last_loop_dim():
    """With the loop over dim 1 and the last dim whole: mean / rms over the last dim of every
    iteration's tile, pooled over the iterations (so over the chunk of dim 1 too)."""
    x = rand(_gen("acc-mean-dim1"), 4, 12, 8)
    for acc, expected in [
        ("mean", x.double().reshape(4, 3, 4, 8).sum((1, 3)) / 24),
        ("rms", torch.sqrt((x.double() ** 2).reshape(4, 3, 4, 8).sum((1, 3)) / 24)),
        ("sum", x.double().reshape(4, 3, 4, 8).sum((1, 3))),
    ]:
        (out,) = block_call(
            [x], [((0, -1, -1), 1)], lambda tb, t, acc=acc: tb.forloop_accum(t, acc),
            [((0, -1, -1), -1)], grid=(2,), forloop=3,
        )
        close(out, expected.unsqueeze(-1))


def test_accum_invariant_value_is_added_every_iteration():
    x = rand(_gen("acc-invariant"), 4, 8)
    (out,) = block_call(
        [x], [((0, -1, -1), -1)], lambda tb, t: tb.forloop_accum(t), [ACC_OUT], **ACC_GRID
    )
    close(out, 4 * x.double())


@pytest.mark.parametrize("acc", [None, "sum"])
def test_accum_rescale(acc):
    """acc ← acc · s_i + t_i over the iterations, t_i's last dim summed first with "sum"."""
    gen = _gen(f"acc-rescale-{acc}")
    x, s = rand(gen, 4, 32), rand(gen, 4, 4)
    (out,) = block_call(
        [x, s], [ACC_IN, ((0, -1, -1), 1)],
        lambda tb, t, r: tb.forloop_accum_rescale(t, r, acc), [ACC_OUT], **ACC_GRID,
    )
    x64, s64 = x.double(), s.double()
    total = torch.zeros(4, 8 if acc is None else 1, dtype=torch.float64)
    for i in range(4):
        tile = x64[:, 8 * i : 8 * i + 8]
        if acc == "sum":
            tile = tile.sum(-1, keepdim=True)
        total = total * s64[:, i : i + 1] + tile
    close(out, total)


def test_online_softmax_with_rescale_matches_softmax_matmul():
    """Online softmax: running max m, rescale factor exp(m_old - m_new), then divide."""
    gen = _gen("online-softmax")
    q, k, v = rand(gen, 8, 16) * 0.5, rand(gen, 16, 64) * 0.5, rand(gen, 64, 16)
    # Blocks split query rows; the loop walks KV in 4 chunks of 16. Each iteration's scores
    # use their own chunk max, so the exact softmax is recovered by scaling with exp(-max).
    def body(tb, tq, tk, tv, tm):
        e = tb.exp(tb.sub(tb.matmul(tq, tk), tm))
        num = tb.forloop_accum(tb.matmul(e, tv))
        den = tb.forloop_accum(e, "sum")
        return tb.div(num, den)

    scores = q.double() @ k.double()
    m = scores.amax(-1, keepdim=True)  # a global max per row, given as an input
    (out,) = block_call(
        [q, k, v, m.float()],
        [((0, -1, -1), -1), ((-1, -1, -1), 1), ((-1, -1, -1), 0), ((0, -1, -1), -1)],
        body, [((0, -1, -1), -1)], grid=(2,), forloop=4,
    )
    close(out, torch.softmax(scores, -1) @ v.double(), atol=1e-5)


# ---- imap / omap / forloop_dim partitioning ----------------------------------------------


def _random_partition(rng: np.random.Generator, rank: int):
    """A random valid (dims, grid, imap, forloop_range, forloop_dim) for a copy block graph
    whose output map equals its input map (every grid axis > 1 mapped to a distinct dim)."""
    naxes = int(rng.integers(1, 4))
    grid = [int(g) for g in rng.choice([1, 2, 3], size=naxes)] + [1] * (3 - naxes)
    dims_pool = [int(d) for d in rng.permutation(rank)]
    imap = [
        dims_pool.pop() if dims_pool and (g > 1 or rng.random() < 0.5) else -1 for g in grid
    ]
    # an axis > 1 left without a dim could not be written back: make it 1
    grid = [g if m >= 0 else 1 for g, m in zip(grid, imap, strict=True)]
    forloop_dim = int(rng.integers(-1, rank))
    # with forloop_dim -1 the tile is loop-invariant and written once, even with 2 iterations
    forloop_range = int(rng.choice([1, 2, 3] if forloop_dim >= 0 else [1, 2]))
    dims = []
    for d in range(rank):
        size = int(rng.integers(1, 3))
        size *= math.prod(g for g, m in zip(grid, imap, strict=True) if m == d)
        size *= forloop_range if d == forloop_dim else 1
        dims.append(size)
    return tuple(dims), tuple(grid[:naxes]), tuple(imap), forloop_range, forloop_dim


@pytest.mark.parametrize("rank", [2, 3, 4])
def test_copy_block_graph_is_identity(rank):
    rng = np.random.default_rng(100 + rank)
    seen = set()
    for trial in range(60):
        dims, grid, imap, loops, fdim = _random_partition(rng, rank)
        seen.add((grid, imap, fdim))
        g = mugraph.new_kernel_graph()
        x = g.new_input(dims, dtype=F32)
        tb = mugraph.new_threadblock_graph(grid, (128, 1, 1), loops)
        t = tb.new_input(x, imap, fdim)
        tb.new_output(t, imap, fdim)
        (y,) = g.customized([x], tb)
        assert y.dims == dims, (dims, grid, imap, loops, fdim)
        g.mark_output(y)
        data = rand(_gen(f"copy-{rank}-{trial}"), *dims)
        (out,) = g(inputs=[data])
        where = f"copy with dims={dims} grid={grid} imap={imap} loops={loops} fdim={fdim}"
        torch.testing.assert_close(out, data, rtol=0, atol=0, msg=where)
    assert len(seen) > 20  # the trials did explore many combinations


def _expected_slice(dims, grid, imap, loops, fdim, block, it):
    """The docstring of mugraph/ir/maps.py: within a dim, block b takes the b-th contiguous
    chunk, iteration i the i-th contiguous sub-chunk of it."""
    index = []
    for d, size in enumerate(dims):
        start = 0
        for axis in range(3):
            if imap[axis] == d:
                size //= grid[axis]
                start += block[axis] * size
        if fdim == d:
            size //= loops
            start += it * size
        index.append(slice(start, start + size))
    return tuple(index)


@pytest.mark.parametrize("rank", [1, 2, 3, 4])
def test_split_input_slices(rank):
    rng = np.random.default_rng(7 + rank)
    for _ in range(40):
        naxes = int(rng.integers(1, 4))
        grid = tuple(int(g) for g in rng.choice([1, 2, 3], size=naxes)) + (1,) * (3 - naxes)
        choices = list(range(rank))
        rng.shuffle(choices)
        imap = tuple(
            int(choices.pop()) if choices and rng.random() < 0.7 else -1 for _ in range(3)
        )
        loops = int(rng.choice([1, 2, 4]))
        fdim = int(rng.integers(-1, rank))
        dims = []
        for d in range(rank):
            size = int(rng.integers(1, 4))
            size *= math.prod(g for g, m in zip(grid, imap, strict=True) if m == d)
            size *= loops if d == fdim else 1
            dims.append(size)
        array = np.arange(math.prod(dims), dtype=np.float64).reshape(dims)
        tiles = split_input(array, grid, imap, loops, fdim)
        assert tiles.ndim == LEAD + rank
        for it, bx, by, bz in itertools.product(range(loops), *(range(g) for g in grid)):
            lead = [it, bx, by, bz]
            pick = tuple(min(i, n - 1) for i, n in zip(lead, tiles.shape[:LEAD], strict=True))
            got = tiles[pick]
            want = array[_expected_slice(dims, grid, imap, loops, fdim, (bx, by, bz), it)]
            np.testing.assert_array_equal(
                got, want, err_msg=f"dims={dims} grid={grid} imap={imap} loops={loops} "
                f"fdim={fdim} block={(bx, by, bz)} iteration={it}"
            )
        # lead axes are size 1 exactly where the tile does not depend on them
        assert tiles.shape[0] == (loops if fdim >= 0 else 1)
        for axis in range(3):
            assert tiles.shape[1 + axis] == (grid[axis] if imap[axis] >= 0 else 1)


def test_split_input_docstring_example():
    """dim 1 of size 12 over 2 blocks then 3 iterations: block 1 iteration 2 → columns 10:12."""
    array = np.arange(4 * 12).reshape(4, 12)
    tiles = split_input(array, (2, 1, 1), (1, -1, -1), 3, 1)
    np.testing.assert_array_equal(tiles[2, 1, 0, 0], array[:, 10:12])
    np.testing.assert_array_equal(tiles[0, 1, 0, 0], array[:, 6:8])
    np.testing.assert_array_equal(tiles[1, 0, 0, 0], array[:, 2:4])


def test_output_map_transposes_blocks():
    """Reading dim 0 by grid x and writing blocks along dim 1 moves the row chunks."""
    x = rand(_gen("omap-transpose"), 4, 3)
    (out,) = block_call([x], [((0, -1, -1), -1)], lambda tb, t: tb.mul_scalar(t, 1.0),
                        [((1, -1, -1), -1)], grid=(2,))
    close(out, torch.cat([x[:2], x[2:]], 1), rtol=0, atol=0)


# ---- every operator kind has a meaning ---------------------------------------------------


def test_every_kind_has_reference_semantics_and_shape_rule():
    for kind in OpKind:
        assert kind in reference.TABLE or kind in reference.DRIVER_KINDS, kind
        assert kind in SHAPE_RULES, kind
        assert not (kind in reference.TABLE and kind in reference.DRIVER_KINDS), kind


def test_every_unary_and_binary_kind_is_tested_here():
    names = {n.removesuffix("_int").removesuffix("_neg") for n in UNARY_CASES}
    assert {k.value for k in Group.ELEMENTWISE_UNARY} == names
    assert {k.value for k in Group.ELEMENTWISE_BINARY} == set(BINARY_CASES)
