"""Inputs with NaN and ±inf reach the user as the reference semantics define, never as a crash:
through the reference evaluation, through the result of ``superoptimize`` called on CPU tensors,
and through compiled programs (under Triton's interpreter here, on the GPU where there is one)."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():  # no GPU: generated kernels run on Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import mugraph  # noqa: E402
from mugraph.codegen.check import compare  # noqa: E402
from mugraph.codegen.loader import interpreter_active  # noqa: E402
from mugraph.ir.ops import Group, OpKind  # noqa: E402
from mugraph.library import WORKLOADS  # noqa: E402
from mugraph.semantics.reference import evaluate  # noqa: E402

F32 = mugraph.float32
NONE = (-1, -1, -1)
SPECIALS = (float("nan"), float("inf"), float("-inf"), 0.0, -0.0)
DEVICE = torch.device("cpu" if interpreter_active() else "cuda")


def with_specials(dims, seed: int, dtype=torch.float32, specials=SPECIALS) -> torch.Tensor:
    """Uniform(-1, 1) values with each special value at a spread-out position."""
    gen = torch.Generator().manual_seed(seed)
    values = torch.rand(dims, generator=gen, dtype=torch.float64) * 2 - 1
    flat = values.view(-1)
    for i, special in enumerate(specials):
        flat[(7 * i + 3 * seed) % flat.numel()] = special
    return values.to(dtype)


def numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu").double().numpy()


# ---- one graph per operator, at the kernel level (PyTorch) and in a block graph (Triton) -----

UNARY_ARGS = {
    OpKind.CLAMP: (-0.5, 0.5),
    OpKind.MUL_SCALAR: (2.0,),
    OpKind.POW: (1.5,),
}


def kernel_op(kind: OpKind, *args):
    g = mugraph.new_kernel_graph()
    xs = [g.new_input((4, 16), dtype=F32) for _ in range(1 if kind in Group.ELEMENTWISE_UNARY
                                                         else 2)]
    g.mark_output(getattr(g, kind.value)(*xs, *args))
    return g


def block_op(build, inputs=((4, 16),), forloop_range=1, fdims=(-1,)):
    """One customized kernel: ``build(tb, tiles)`` gives the value it writes."""
    g = mugraph.new_kernel_graph()
    xs = [g.new_input(dims, dtype=F32) for dims in inputs]
    tb = mugraph.new_threadblock_graph((1,), (128, 1, 1), forloop_range, 2)
    tiles = [tb.new_input(x, NONE, f) for x, f in zip(xs, fdims, strict=True)]
    tb.new_output(build(tb, tiles), NONE)
    g.mark_output(g.customized(xs, tb)[0])
    return g


def _unary_block(kind, args):
    return lambda: block_op(lambda tb, t: getattr(tb, kind.value)(t[0], *args))


def _binary_block(kind):
    return lambda: block_op(lambda tb, t: getattr(tb, kind.value)(t[0], t[1]),
                            inputs=((4, 16), (4, 16)), fdims=(-1, -1))


GRAPHS = {
    **{f"kernel_{k.value}": (lambda k=k: kernel_op(k, *UNARY_ARGS.get(k, ())))
       for k in Group.ELEMENTWISE},
    **{f"block_{k.value}": _unary_block(k, UNARY_ARGS.get(k, ()))
       for k in Group.ELEMENTWISE_UNARY},
    **{f"block_{k.value}": _binary_block(k) for k in Group.ELEMENTWISE_BINARY},
    "block_pow_negative_exponent": _unary_block(OpKind.POW, (-1.5,)),
    "kernel_matmul": lambda: _kernel_matmul(),
    "kernel_reduction": lambda: _kernel_unary_graph(lambda g, x: g.reduction(x, 1)),
    "kernel_rms_norm": lambda: _kernel_unary_graph(lambda g, x: g.rms_norm(x, 16)),
    "kernel_softmax": lambda: _kernel_unary_graph(lambda g, x: g.softmax(x, 1)),
    "block_matmul": lambda: block_op(lambda tb, t: tb.matmul(t[0], t[1]),
                                     inputs=((16, 16), (16, 16)), fdims=(-1, -1)),
    "block_reduction": lambda: block_op(lambda tb, t: tb.reduction(t[0], 1)),
    "block_reduction_max": lambda: block_op(lambda tb, t: tb.reduction_max(t[0], 1)),
    "block_rms_norm": lambda: block_op(lambda tb, t: tb.rms_norm(t[0])),
    **{f"block_forloop_accum_{acc}": (
        lambda acc=acc: block_op(lambda tb, t: tb.forloop_accum(t[0], acc),
                                 forloop_range=4, fdims=(1,)))
       for acc in ("sum", "mean", "rms", "sum_todimx")},
    "block_forloop_accum_none": lambda: block_op(
        lambda tb, t: tb.forloop_accum(tb.reduction(t[0], 1)), forloop_range=4, fdims=(1,)),
    "block_forloop_accum_max": lambda: block_op(
        lambda tb, t: tb.forloop_accum_max(tb.reduction_max(t[0], 1)), forloop_range=4,
        fdims=(1,)),
}


def _kernel_matmul():
    g = mugraph.new_kernel_graph()
    a, b = g.new_input((16, 16), dtype=F32), g.new_input((16, 16), dtype=F32)
    g.mark_output(g.matmul(a, b))
    return g


def _kernel_unary_graph(build):
    g = mugraph.new_kernel_graph()
    x = g.new_input((4, 16), dtype=F32)
    g.mark_output(build(g, x))
    return g


def special_inputs(graph, device="cpu") -> list[torch.Tensor]:
    return [with_specials(t.dims, seed).to(device) for seed, t in enumerate(graph.input_types)]


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_reference_semantics_keep_nan_without_warnings(name):
    """Every operator evaluates NaN / ±inf / ±0 inputs silently (warnings are errors here),
    and an elementwise operator gives NaN wherever its input is NaN."""
    graph = GRAPHS[name]()
    inputs = special_inputs(graph)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (out,) = graph(inputs=inputs)  # CPU tensors: the reference semantics
        (from_numpy,) = graph(inputs=[x.numpy() for x in inputs])
    assert out.dtype == torch.float32 and tuple(out.shape) == graph.output_types[0].dims
    np.testing.assert_array_equal(numpy(out), from_numpy)  # NaN where NaN
    kind = graph.ops[-1].kind
    if kind in Group.ELEMENTWISE:
        nan_in = np.zeros(out.shape, bool)
        for x in inputs:
            nan_in |= np.isnan(x.numpy())
        assert np.isnan(numpy(out)[nan_in]).all()


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_compiled_programs_agree_with_the_reference_on_nonfinite_inputs(name):
    graph = GRAPHS[name]()
    program = mugraph.compile(graph, check=False, cache=False)
    inputs = special_inputs(graph, DEVICE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the interpreter computes with NumPy
        (got,) = program(inputs=inputs)
    want = evaluate(graph, [numpy(x) for x in inputs])[0]
    cmp = compare(numpy(got), want, 1e-4, 1e-4)
    assert cmp.ok, (cmp, numpy(got).ravel()[:16], want.ravel()[:16])


LIBRARY = ["rmsnorm_linear", "gated_mlp", "attention_flash", "attention_mirage_gqa"]


@pytest.mark.parametrize("form", ["naive", "optimized"])
@pytest.mark.parametrize("name", LIBRARY)
def test_library_programs_on_a_nonfinite_input(name, form):
    """One NaN, inf or -inf in one input: the compiled program (float16, online softmax
    included) gives the reference's non-finite values exactly and the finite ones closely."""
    w = WORKLOADS[name]
    graph = getattr(w, form)(w.small, mugraph.float16)
    program = mugraph.compile(graph, check=False)
    for which, special in enumerate((float("nan"), float("inf"), float("-inf"))):
        inputs = [with_specials(t.dims, seed, torch.float16, specials=())
                  for seed, t in enumerate(graph.input_types)]
        target = inputs[which % len(inputs)].view(-1)
        target[5 % target.numel()] = special
        inputs = [x.to(DEVICE) for x in inputs]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            got = program(inputs=inputs)
        want = graph(inputs=[x.cpu() for x in inputs])
        for a, b in zip(got, want, strict=True):
            cmp = compare(numpy(a), numpy(b), 2e-2, 2e-2)
            assert cmp.ok, (which, special, cmp)


def test_superoptimize_result_on_cpu_tensors_with_nonfinite_inputs():
    g = mugraph.new_kernel_graph()
    x = g.new_input((4, 64), dtype=F32)
    w = g.new_input((64, 32), dtype=F32)
    g.mark_output(g.matmul(g.rms_norm(x, 64), w))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "found no better" is not this test's
        best = g.superoptimize(time_limit=30, workers=1, max_custom_kernels=1, max_block_ops=5)
    for special in SPECIALS[:3]:
        xs = with_specials((4, 64), 1, specials=()), with_specials((64, 32), 2, specials=())
        xs[0][2, 5] = special
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            (got,) = best(inputs=list(xs))
        (want,) = g(inputs=list(xs))
        assert compare(numpy(got), numpy(want), 1e-5, 1e-5).ok
        assert np.isnan(numpy(got)[2]).all() and np.isfinite(numpy(got)[[0, 1, 3]]).all()
