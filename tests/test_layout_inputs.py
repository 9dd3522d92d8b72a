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
