"""Inputs that are layouts, end to end: a transposed weight and folded GQA heads with a
transposed key cache go through the search, the verifier and the generated kernels, and the
kernels read the caller's views where they lie — no copy is made (issue 17).

The kernels run on the CPU under the Triton interpreter (set before Triton is imported), or
on the GPU where there is one.
"""

from __future__ import annotations

import os
import warnings

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton is imported

import pytest  # noqa: E402

import mugraph as mi  # noqa: E402
from mugraph.codegen.loader import interpreter_active  # noqa: E402
from mugraph.runtime.compiled import compile_graph  # noqa: E402
from mugraph.search.driver import superoptimize  # noqa: E402

DEVICE = torch.device("cpu" if interpreter_active() else "cuda")
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


class NoCopies:
    """Fails the test if any of ``tensors`` is copied (``contiguous`` / ``clone`` / ``to``)."""

    def __init__(self, monkeypatch, *tensors: torch.Tensor) -> None:
        watched = {t.data_ptr() for t in tensors}
        for name in ("contiguous", "clone", "to"):
            original = getattr(torch.Tensor, name)

            def guarded(self, *args, _original=original, _name=name, **kwargs):
                if self.data_ptr() in watched and not self.is_contiguous():
                    raise AssertionError(f"a strided input was copied ({_name})")
                return _original(self, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, guarded)


def searched_and_compiled(program):
    result = superoptimize(program, time_limit=120, workers=1, max_custom_kernels=1)
    assert result.candidates, "the search found no verified μGraph"
    best = result.candidates[0].graph
    assert mi.verify(best, program, max_rounds=4).passed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return best, compile_graph(best, cache=False)


def test_a_transposed_weight_is_read_in_place(monkeypatch):
    """y = x @ W.T with W an nn.Linear weight (32 x 64, row-major): the program's input is
    W.T as a layout (strides (1, 64)), and every stage keeps it."""
    g = mi.new_kernel_graph()
    x = g.new_input((8, 64), dtype=mi.float16)
    w_t = g.new_input((64, 32), strides=(1, 64), dtype=mi.float16)
    g.mark_output(g.matmul(g.rms_norm(x, 64), w_t))
    best, program = searched_and_compiled(g)
    assert best.input_ops[1].outputs[0].strides == (1, 64)
    xs = torch.randn(8, 64, device=DEVICE).half()
    weight = torch.randn(32, 64, device=DEVICE).half()
    NoCopies(monkeypatch, weight)
    got = program(inputs=[xs, weight.t()])[0]
    monkeypatch.undo()
    x32 = xs.float()
    want = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True))) @ weight.float().t()
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=5e-2)


def test_folded_gqa_heads_over_a_transposed_key_cache(monkeypatch):
    """Scores of 2 KV heads x 4 query heads: Q (8 heads, 1 token, 16) folded to (2, 4, 16)
    — a view — against the key cache K (2, 32, 16) read as K^T (2, 16, 32), strides
    (512, 1, 16): both are the caller's memory."""
    g = mi.new_kernel_graph()
    q = g.new_input((2, 4, 16), dtype=mi.float16)
    k_t = g.new_input((2, 16, 32), strides=(512, 1, 16), dtype=mi.float16)
    g.mark_output(g.exp(g.matmul(q, k_t)))
    best, program = searched_and_compiled(g)
    assert best.input_ops[1].outputs[0].strides == (512, 1, 16)
    queries = (torch.randn(8, 1, 16, device=DEVICE) / 4).half()
    keys = (torch.randn(2, 32, 16, device=DEVICE) / 4).half()
    folded = queries.view(2, 4, 16)
    assert folded.data_ptr() == queries.data_ptr()
    NoCopies(monkeypatch, keys)
    got = program(inputs=[folded, keys.transpose(1, 2)])[0]
    monkeypatch.undo()
    want = torch.exp(folded.float() @ keys.float().transpose(1, 2))
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=5e-2)


# ---- transposes of computed values: kernel-level views ------------------------------------------


def _exp_kernel(g, x):
    """A custom kernel computing exp(x) of a 2-d tensor, 16 rows per block (``x`` may be a
    view: the kernel reads it through its strides)."""
    tb = mi.new_threadblock_graph((x.dims[0] // 16, 1, 1), (128, 1, 1), 1)
    tile = tb.new_input(x, (0, -1, -1), forloop_dim=-1)
    tb.new_output(tb.exp(tile), (0, -1, -1))
    return g.customized([x], tb)[0]


def test_a_transposed_intermediate_is_a_view_read_in_place():
    """exp(exp(X)^T): the transpose is a kernel-level permute — no kernel and no copy, the
    second kernel reads the first one's output through permuted strides; the view itself is
    an output too, and later calls never write into what an earlier call returned."""
    g = mi.new_kernel_graph()
    x = g.new_input((32, 64), dtype=mi.float32)
    viewed = g.transpose(_exp_kernel(g, x), 0, 1)
    assert viewed.strides == (1, 64)
    g.mark_output(_exp_kernel(g, viewed))
    g.mark_output(viewed)
    assert [op.kind.value for op in g.ops] == ["input", "customized", "permute", "customized"]
    assert g.ops[3].attr("graph").ops[0].attr("dtensor").strides == (1, 64)
    for cuda_graph in (None, False):  # on a GPU: plans with CUDA graphs, and open plans
        program = compile_graph(g, cache=False, cuda_graph=cuda_graph)
        first_in = torch.randn(32, 64, device=DEVICE) / 4
        first = program(inputs=[first_in])
        kept = [t.clone() for t in first]
        for _ in range(4):
            program(inputs=[torch.randn(32, 64, device=DEVICE) / 4])
        for got, want in zip(first, kept, strict=True):
            assert torch.equal(got, want), "a later call wrote into an earlier call's output"
        torch.testing.assert_close(first[1], torch.exp(first_in).t())
        torch.testing.assert_close(first[0], torch.exp(torch.exp(first_in).t()))
        assert first[1].stride() == (1, 64)
        if DEVICE.type == "cuda":
            assert program.fast_path_stats()["plans"] >= 1, program.fast_path_note()
    if DEVICE.type == "cuda":  # one open plan serves inputs at any address
        assert program.fast_path_stats()["plans"] == 1, program.fast_path_note()


def test_the_search_cuts_at_a_transpose_of_a_computed_value():
    """silu(X^T @ W)^T @ V searched: each matmul becomes a kernel, the transposes stay views
    between them (the search never holds one in a kernel), and the result is verified against
    the program and runs."""
    g = mi.new_kernel_graph()
    x = g.new_input((64, 32), dtype=mi.float16)
    w = g.new_input((64, 64), dtype=mi.float16)
    v = g.new_input((32, 64), dtype=mi.float16)
    h = g.silu(g.matmul(g.transpose(x, 0, 1), w))
    g.mark_output(g.matmul(g.transpose(h, 0, 1), v))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        best = g.superoptimize(time_limit=16, workers=1)
    kinds = [op.kind.value for op in best.ops if op.kind.value != "input"]
    assert kinds == ["permute", "customized", "permute", "customized"], kinds
    assert best.verification.passed
    assert mi.verify(best, g, max_rounds=4).passed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = compile_graph(best, cache=False)
    xs = [(torch.randn(*t.dims, device=DEVICE) / 4).half() for t in g.input_types]
    got = program(inputs=xs)[0]
    a, b, c = (t.float() for t in xs)
    want = torch.nn.functional.silu(a.t() @ b).t() @ c
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=5e-2)


def test_a_sliced_input_is_read_where_it_lies(monkeypatch):
    """The right half of a (32, 128) tensor, x[:, 64:]: strides (128, 1) and an offset of 64
    elements; the kernel reads it in place."""
    g = mi.new_kernel_graph()
    half = g.new_input((32, 64), strides=(128, 1), dtype=mi.float32)
    g.mark_output(_exp_kernel(g, half))
    program = compile_graph(g, cache=False)
    whole = torch.randn(32, 128, device=DEVICE) / 4
    NoCopies(monkeypatch, whole[:, 64:])
    got = program(inputs=[whole[:, 64:]])[0]
    monkeypatch.undo()
    torch.testing.assert_close(got, torch.exp(whole[:, 64:]))
