"""The hand-written μGraphs of mugraph.library compute what their naive programs compute.

Each naive program is written here again in PyTorch, independently of the library, and used
as the float32 oracle for both the optimized μGraph and the naive graph, evaluated by the
reference semantics on fresh random inputs at the ``small``, ``suite`` and every ``extra``
size.
"""

from __future__ import annotations

import zlib

import pytest
import torch
import torch.nn.functional as F

import mugraph
from mugraph.library import WORKLOADS

F32 = mugraph.float32


def rmsnorm_linear(x, w):
    return (x / torch.sqrt((x * x).mean(-1, keepdim=True))) @ w


def gated_mlp(x, w1, w3):
    return F.silu(x @ w1) * (x @ w3)


def lora(x, w, a, b):
    return x @ w + (x @ a) @ b


def adapter_mlp(x, w1, w2):
    return torch.relu(x @ w1) @ w2


def attention(q, k, v):
    """K is given transposed ([.., d, n]); grouped heads broadcast K and V over the group."""
    return torch.softmax(q @ k, -1) @ v


TORCH_PROGRAMS = {
    "rmsnorm_linear": rmsnorm_linear,
    "gated_mlp": gated_mlp,
    "lora": lora,
    "adapter_mlp": adapter_mlp,
    "attention_flashdecoding": attention,
    "attention_flash": attention,
    "attention_mirage_gqa": attention,
}
ATTENTION = {"attention_flashdecoding", "attention_flash", "attention_mirage_gqa"}


def _cases():
    for name, work in WORKLOADS.items():
        yield pytest.param(name, "small", work.small, id=f"{name}-small")
        yield pytest.param(name, "suite", work.suite, id=f"{name}-suite", marks=pytest.mark.slow)
        for label, sizes in work.extra.items():
            yield pytest.param(name, label, sizes, id=f"{name}-{label}", marks=pytest.mark.slow)


def _inputs(name: str, label: str, graph) -> list[torch.Tensor]:
    """Fresh inputs: weights scaled by 1/sqrt(fan-in) so every result is O(1); attention
    inputs scaled by 0.3 to keep exp tame."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{name}/{label}".encode()))
    tensors = []
    for i, t in enumerate(graph.input_types):
        x = torch.randn(t.dims, generator=gen, dtype=torch.float32)
        if name in ATTENTION:
            x = x * 0.3
        elif i > 0:
            x = x / t.dims[-2] ** 0.5
        tensors.append(x)
    return tensors


def _close(actual, expected):
    scale = max(1.0, float(expected.abs().max()))
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5 * scale)


def test_every_workload_has_a_torch_program():
    assert set(WORKLOADS) == set(TORCH_PROGRAMS)


@pytest.mark.parametrize("name, label, sizes", list(_cases()))
def test_workload_matches_torch(name, label, sizes):
    work = WORKLOADS[name]
    naive = work.naive(sizes, F32)
    optimized = work.optimized(sizes, F32)
    assert optimized.input_types == naive.input_types
    assert [t.dims for t in optimized.output_types] == [t.dims for t in naive.output_types]

    inputs = _inputs(name, label, naive)
    expected = TORCH_PROGRAMS[name](*inputs)
    assert expected.abs().max() > 1e-3  # the inputs exercise the computation

    (got_optimized,) = optimized(inputs=inputs)
    (got_naive,) = naive(inputs=inputs)
    assert got_optimized.dtype == torch.float32
    assert tuple(got_optimized.shape) == tuple(expected.shape)
    _close(got_optimized, expected)
    _close(got_naive, expected)


@pytest.mark.parametrize("name, label, sizes", list(_cases()))
def test_workload_builds_in_float16_and_bfloat16(name, label, sizes):
    """The default (half precision) graphs pass the builder's checks at every size too."""
    work = WORKLOADS[name]
    for dtype in (mugraph.float16, mugraph.bfloat16):
        naive, optimized = work.naive(sizes, dtype), work.optimized(sizes, dtype)
        assert optimized.input_types == naive.input_types
        assert all(t.dtype is dtype for t in optimized.output_types)


def test_optimized_is_a_single_custom_kernel_where_promised():
    """The fused workloads are one custom kernel; the split ones two."""
    kernels = {
        name: sum(op.kind is mugraph.OpKind.CUSTOMIZED for op in w.optimized(w.small).ops)
        for name, w in WORKLOADS.items()
    }
    assert kernels == {
        "rmsnorm_linear": 1,
        "gated_mlp": 1,
        "lora": 1,
        "adapter_mlp": 2,
        "attention_flashdecoding": 2,
        "attention_flash": 1,
        "attention_mirage_gqa": 2,
    }


def test_workload_sizes_are_checked_by_name():
    """A sizes dict without the workload's names, or with a size that is not a positive int,
    is refused naming them (a KeyError or a shape error deep in the builder before)."""
    import pickle

    work = WORKLOADS["gated_mlp"]
    with pytest.raises(mugraph.ShapeError, match=r"gated_mlp.optimized: sizes lack 'm'"):
        work.optimized({"bogus": 1})
    with pytest.raises(mugraph.ShapeError, match=r"gated_mlp.naive: .*got \{'m': 0\}"):
        work.naive({**work.suite, "m": 0})
    naive_sizes = {k: work.suite[k] for k in ("m", "k", "n")}  # a naive program needs no tiles
    assert work.naive(naive_sizes).structural_hash() == work.naive(work.suite).structural_hash()
    with pytest.raises(mugraph.ShapeError, match="sizes must be a dict"):
        work.optimized([8, 4096])
    again = pickle.loads(pickle.dumps(work))  # the checked builders still pickle
    assert again.naive(work.small).structural_hash() == work.naive(work.small).structural_hash()
