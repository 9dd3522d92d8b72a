"""The code generator emits its Triton source from the lowered IR (mugraph.codegen.lowered):
the source of every known graph, under every codegen variant the tests and the runtime use,
is byte-for-byte what the stored snapshot says (hashes: tests/golden/codegen_sources.json,
rewritten by ``python tests/codegen_snapshot.py --write`` when a change is meant), and the
emitter follows the lowered IR's decisions rather than deriving its own."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from codegen_snapshot import (  # noqa: E402
    BASE,
    SNAPSHOT,
    all_sources,
    workaround_graphs,
)
from known_graphs import library_graphs, one_kernel  # noqa: E402

from mugraph.codegen import triton_gen  # noqa: E402
from mugraph.codegen.lowered import (  # noqa: E402
    AccumForm,
    ProductForm,
    SpecKind,
    TransposeForm,
    lower_block,
    lower_graph,
)
from mugraph.ir.ops import OpKind  # noqa: E402

LIBRARY = dict(library_graphs())
WORKAROUND = dict(workaround_graphs())


def only_kernel(graph):
    (block,) = [op.attr("graph") for op in graph.ops if op.kind is OpKind.CUSTOMIZED]
    return block


def test_generated_sources_match_the_snapshot():
    stored = json.loads(SNAPSHOT.read_text())
    now = all_sources()
    changed = sorted(k for k in stored.keys() | now.keys() if stored.get(k) != now.get(k))
    assert not changed, f"{len(changed)} of {len(now)} sources changed: {changed[:20]}"


def test_the_emitter_follows_the_lowered_product_form(monkeypatch):
    """A product the lowering calls a broadcast is emitted as one, though M, K, N exceed 1:
    the emitter reads the form, it does not derive it."""
    block = only_kernel(WORKAROUND["workaround/two_dots"])
    assert "tl.dot" in triton_gen.generate_kernel(block, "k", options=BASE).source

    def broadcast_only(*args, **kwargs):
        kernel = lower_block(*args, **kwargs)
        specs = tuple(replace(s, products=tuple(replace(p, form=ProductForm.BROADCAST)
                                                for p in s.products))
                      for s in kernel.specs)
        return replace(kernel, specs=specs)

    monkeypatch.setattr(triton_gen, "lower_block", broadcast_only)
    source = triton_gen.generate_kernel(block, "k", options=BASE).source
    assert "tl.dot" not in source and "tl.sum(" in source


@pytest.mark.parametrize("name,forms,transposes", [
    ("workaround/chained", [ProductForm.DOT, ProductForm.TRANSPOSED], {TransposeForm.PRODUCT}),
    ("workaround/sum", [ProductForm.DOT, ProductForm.TRANSPOSED],
     {TransposeForm.ELEMENTWISE, TransposeForm.TRANS, TransposeForm.PRODUCT}),
    ("workaround/dot3", [ProductForm.DOT, ProductForm.TRANSPOSED, ProductForm.DOT_FLOAT32],
     {TransposeForm.PRODUCT}),
    ("workaround/two_dots", [ProductForm.DOT, ProductForm.DOT, ProductForm.DOT_FLOAT32], set()),
])
def test_the_triton_36_workaround_is_in_the_lowered_ir(name, forms, transposes):
    (kernel,) = lower_graph(WORKAROUND[name])
    found = [p.form for s in kernel.specs for p in s.products]
    assert sorted(found, key=lambda f: f.name) == sorted(forms, key=lambda f: f.name)
    specs = [s for s in kernel.specs if s.kind is SpecKind.TRANSPOSE]
    assert {s.transpose for s in specs} == transposes
    names = {t.tensor.name for t in kernel.registers}
    assert all(s.outputs[0] in names for s in specs)  # each transpose is a register tile


def test_an_abandoned_transpose_leaves_no_dead_statement():
    """X @ (W + P @ (A @ B)): the sum cannot be transposed (P @ (A @ B) has a dot operand),
    so its product takes float32 operands and nothing is transposed (the emitter before the
    lowered IR emitted ``b1T = tl.trans(b1)`` from the abandoned attempt, never used)."""
    ins = [((16, 64), (-1, -1, -1), -1), ((64, 64), (1, -1, -1), -1),
           ((64, 64), (-1, -1, -1), -1), ((64, 16), (-1, -1, -1), -1),
           ((16, 64), (1, -1, -1), -1)]
    graph = one_kernel(ins, lambda tb, t: [(tb.matmul(t[0], tb.add(
        t[1], tb.matmul(t[2], tb.matmul(t[3], t[4])))), (1, -1, -1), -1)])
    (kernel,) = lower_graph(graph)
    outer = max((s for s in kernel.specs if s.products), key=lambda s: s.op)
    assert outer.products[0].form is ProductForm.DOT_FLOAT32
    assert not [s for s in kernel.specs if s.kind is SpecKind.TRANSPOSE and s.op == 1]
    source = triton_gen.generate_kernel(only_kernel(graph), "k", options=BASE).source
    assert "b1T" not in source


def accumulations(graph, **options) -> list[AccumForm]:
    return [s.accumulation for k in lower_graph(graph, replace(BASE, **options))
            for s in k.specs if s.kind is SpecKind.ACCUMULATE]


def test_accumulation_forms_follow_the_options():
    rms = LIBRARY["rmsnorm_linear/optimized"]
    assert AccumForm.DEFERRED in accumulations(rms)
    assert AccumForm.DEFERRED not in accumulations(rms, defer_reductions=False)
    attention = LIBRARY["attention_flash/optimized"]
    assert AccumForm.RESCALED in accumulations(attention)
    assert AccumForm.RESCALED not in accumulations(attention, stable_exp=False)
    decoding = LIBRARY["attention_flashdecoding/optimized"]
    assert AccumForm.MERGED in accumulations(decoding)  # the softmax carry's consumer


def test_lowered_footprints_follow_the_options():
    """The lowering pads with the options' dot_min_dim and unrolls as they say."""
    block = only_kernel(WORKAROUND["workaround/chained"])
    default, wide = lower_block(block), lower_block(block, options=replace(BASE, dot_min_dim=32))
    assert max(t.padded_elements for t in wide.registers) > max(
        t.padded_elements for t in default.registers)
    assert not default.unrolled and lower_block(block, options=replace(BASE, unroll=True)).unrolled
