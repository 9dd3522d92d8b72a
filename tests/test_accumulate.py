"""Accumulating block outputs (``new_output(..., accumulate=True)``): the blocks along the grid
axes an omap leaves out add their tiles into one part of the output.

Reference and finite-field semantics against NumPy and against the plain program, the value
that is the same in every block (summed as many times as there are blocks), round trips
through JSON and text, and where such outputs are refused (the abstract semantics of the
search, a standalone kernel). Malformed maps are in the must-reject corpus
(``tests/corpus``, ``output_accumulate_*``)."""

from __future__ import annotations

import numpy as np
import pytest

import mugraph
from mugraph.errors import UnsupportedError
from mugraph.ir.builder import KernelGraph, new_threadblock_graph
from mugraph.ir.graph import accumulates
from mugraph.ir.ops import OpKind
from mugraph.semantics.abstract import ABSTRACT_SEMANTICS, AbstractSemanticsError, var
from mugraph.semantics.reference import evaluate

F32 = mugraph.float32


def split_k(scale: float = 1.0, k: int = 64, parts: int = 4) -> KernelGraph:
    """``x @ w`` with the reduction split over grid x (summed) and w's columns over grid y."""
    g = KernelGraph()
    x = g.new_input((4, k), dtype=F32)
    w = g.new_input((k, 16), dtype=F32)
    tb = new_threadblock_graph((parts, 2, 1), (128, 1, 1))
    tx = tb.new_input(x, (1, -1, -1), -1)
    tw = tb.new_input(w, (0, 1, -1), -1)
    tb.new_output(tb.mul_scalar(tb.matmul(tx, tw), scale), (-1, 1, -1), accumulate=True)
    (out,) = g.customized([x, w], tb)
    g.mark_output(out)
    return g


def plain_matmul(k: int = 64) -> KernelGraph:
    g = KernelGraph()
    x = g.new_input((4, k), dtype=F32)
    w = g.new_input((k, 16), dtype=F32)
    g.mark_output(g.matmul(x, w))
    return g


def test_split_k_sums_the_partial_products():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((4, 64)), rng.standard_normal((64, 16))
    (got,) = evaluate(split_k(), [a, b])
    assert got.shape == (4, 16)
    np.testing.assert_allclose(got, a @ b, rtol=1e-12, atol=1e-12)


def test_a_value_the_same_in_every_block_is_added_once_per_block():
    g = KernelGraph()
    x = g.new_input((2, 8), dtype=F32)
    tb = new_threadblock_graph((3, 1, 1), (128, 1, 1))
    tb.new_output(tb.new_input(x, (-1, -1, -1), -1), (-1, -1, -1), accumulate=True)
    (out,) = g.customized([x], tb)
    g.mark_output(out)
    a = np.random.default_rng(1).standard_normal((2, 8))
    (got,) = evaluate(g, [a])
    np.testing.assert_allclose(got, 3 * a)


def test_the_finite_field_verifier_proves_and_refutes_split_k():
    assert mugraph.verify(split_k(), plain_matmul()).passed
    assert mugraph.verify(split_k(parts=2), plain_matmul()).passed
    assert not mugraph.verify(split_k(scale=2.0), plain_matmul()).passed


def test_accumulate_survives_json_and_text():
    g = split_k()
    for back in (mugraph.from_json(g.to_json()), mugraph.from_text(mugraph.to_text(g))):
        (saver,) = back.ops[2].attr("graph").output_ops
        assert accumulates(saver)
        assert mugraph.verify(back, plain_matmul()).passed
    # an output that does not accumulate keeps the attributes it always had
    plain = new_threadblock_graph((1, 1, 1), (128, 1, 1))
    x = KernelGraph().new_input((4, 8), dtype=F32)
    plain.new_output(plain.new_input(x, (-1, -1, -1), -1), (-1, -1, -1))
    assert "accumulate" not in plain.ops[-1].attr_dict


def test_the_search_has_no_abstract_expression_for_it():
    (saver,) = split_k().ops[2].attr("graph").output_ops
    rule = ABSTRACT_SEMANTICS[OpKind.BLOCK_OUTPUT]
    with pytest.raises(AbstractSemanticsError, match="accumulating output"):
        rule([var("t")], [(4, 16)], saver.attr_dict)
    assert rule([var("t")], [(4, 16)], {"omap": (0, -1, -1), "forloop_dim": -1}) == var("t")


def test_a_standalone_kernel_refuses_it():
    with pytest.raises(UnsupportedError, match="only inside a persistent kernel"):
        mugraph.compile(split_k())
