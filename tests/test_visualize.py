"""Pictures of μGraphs: well-formed SVG, complete labels, nesting and no overlapping boxes."""

from __future__ import annotations

import itertools
import re
import xml.etree.ElementTree as ET

import pytest

import mugraph
from mugraph import visualize
from mugraph.ir.ops import OpKind
from mugraph.library import WORKLOADS
from mugraph.search.fusion import construct_thread_graphs

SVG = "{http://www.w3.org/2000/svg}"


def _workload(name: str, optimized: bool = True):
    w = WORKLOADS[name]
    return (w.optimized if optimized else w.naive)(w.small)


def _big_block(graph, x, w1, w3):
    """A custom kernel with 13 block operators and two outputs."""
    tb = mugraph.new_threadblock_graph((8, 1, 1), (128, 1, 1), 4)
    tx = tb.new_input(x, (-1, -1, -1), forloop_dim=1)
    t1 = tb.new_input(w1, (1, -1, -1), forloop_dim=0)
    t3 = tb.new_input(w3, (1, -1, -1), forloop_dim=0)
    a1 = tb.forloop_accum(tb.matmul(tx, t1))
    a3 = tb.forloop_accum(tb.matmul(tx, t3))
    r = tb.forloop_accum(tx, "rms")
    d1, d3 = tb.div(a1, r), tb.div(a3, r)
    gated = tb.mul(tb.silu(d1), d3)
    tb.new_output(tb.relu(tb.add(gated, d1)), (1, -1, -1))
    tb.new_output(tb.mul_scalar(d3, 0.5), (1, -1, -1))
    return graph.customized([x, w1, w3], tb)


def big_graph():
    """15 kernel operators (two custom kernels of 15 block operators each), 3 outputs."""
    g = mugraph.new_kernel_graph()
    x = g.new_input((8, 256))
    w1, w3 = g.new_input((256, 128)), g.new_input((256, 128))
    w4, w5, b = g.new_input((128, 64)), g.new_input((128, 64)), g.new_input((8, 64))
    o1, o2 = _big_block(g, x, w1, w3)
    p = g.matmul(o1, w4)
    r = g.mul(g.add(p, g.matmul(o2, w5)), b)
    t = g.exp(r)
    v = g.div(t, g.reduction(t, 1))
    z = g.clamp(g.sub(g.sqrt(g.square(v)), b), -1.0, 1.0)
    o3, o4 = _big_block(g, x, w1, w3)
    g.mark_output(z)
    g.mark_output(g.add(o3, o4))
    g.mark_output(g.gelu(p))
    return g


GRAPHS = {
    "gqa_fig4c": lambda: _workload("attention_mirage_gqa"),
    "rmsnorm_linear": lambda: _workload("rmsnorm_linear"),
    "flashdecoding": lambda: _workload("attention_flashdecoding"),
    "lora": lambda: _workload("lora"),
    "adapter_mlp": lambda: _workload("adapter_mlp"),
    "attention_naive": lambda: _workload("attention_mirage_gqa", optimized=False),
    "big": big_graph,
    "big_thread_graphs": lambda: construct_thread_graphs(big_graph()),
}


@pytest.fixture(params=sorted(GRAPHS), scope="module")
def case(request):
    graph = GRAPHS[request.param]()
    return graph, visualize.layout(graph), visualize.to_svg(graph)


def _texts(svg: str) -> list[str]:
    root = ET.fromstring(svg)
    return [el.text or "" for el in root.iter(f"{SVG}text")]


def _all_text(svg: str) -> str:
    return "\n".join(_texts(svg))


def _block_ops(graph):
    for i, op in enumerate(graph.ops):
        if op.kind is OpKind.CUSTOMIZED:
            yield i, op.attr("graph")


# ---- well-formed and complete ------------------------------------------------------------------


def test_svg_is_well_formed_xml(case):
    _, _, svg = case
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    assert float(root.get("width")) > 0 and float(root.get("height")) > 0
    assert "href" not in svg  # self-contained: no external references


def test_every_operator_is_labelled(case):
    graph, _, svg = case
    text = _all_text(svg)
    for i, op in enumerate(graph.ops):
        if op.kind is OpKind.CUSTOMIZED:
            assert f"%{i} customized kernel" in text
        elif op.kind is OpKind.INPUT:
            assert f"%{i} input[{op.attr('index')}]" in text
        else:
            assert f"%{i} {op.kind.value}" in text
    for _, block in _block_ops(graph):
        outputs = 0
        for j, op in enumerate(block.ops):
            if op.kind is OpKind.BLOCK_INPUT:
                assert f"b{j} input[{op.attr('index')}]" in text
            elif op.kind is OpKind.BLOCK_OUTPUT:
                assert f"output[{outputs}]" in text
                outputs += 1
            else:
                assert f"b{j} {op.kind.value}" in text
    for k in range(len(graph.outputs)):
        assert f"output {k}" in text


def test_every_tensor_shape_is_shown(case):
    graph, _, svg = case
    text = _all_text(svg)
    for op in graph.ops:
        for t in op.outputs:
            assert f"[{', '.join(map(str, t.dims))}] {t.dtype.value}" in text
    for _, block in _block_ops(graph):
        for op in block.ops:
            for t in op.outputs:
                assert str(t) in text


def test_maps_grids_and_forloops_are_annotated(case):
    graph, _, svg = case
    text = _all_text(svg)
    for i, block in _block_ops(graph):
        grid = ", ".join(map(str, block.grid_dim))
        assert f"grid ({grid})  forloop_range {block.forloop_range}" in text
        for op in block.input_ops:
            assert f"imap {visualize.map_text(op.attr('imap'))}" in text
            assert f"forloop_dim {op.attr('forloop_dim')}" in text
        for op in block.output_ops:
            assert f"omap {visualize.map_text(op.attr('omap'))}" in text
        assert f"→ %{i} " in text


def test_fig4c_annotations_are_the_papers():
    svg = visualize.to_svg(_workload("attention_mirage_gqa"))
    text = _all_text(svg)
    for expected in ("imap {x:0, y:3, z:-}", "imap {x:0, y:2, z:-}", "imap {x:0, y:-, z:-}",
                     "omap {x:0, y:3, z:-}", "grid (2, 4, 1)  forloop_range 2",
                     "grid (2, 1, 1)  forloop_range 4", "b1 reshape dims=(1, 4, 16)",
                     "b11 forloop_accum acc=sum", "→ %3.1 [2, 4, 1, 4] float16"):
        assert expected in text


# ---- geometry -----------------------------------------------------------------------------------


def test_block_graphs_are_nested_inside_their_kernel_box(case):
    graph, lay, _ = case
    kernels = {b.id: b for b in lay.boxes if b.kind == "kernel"}
    assert len(kernels) == sum(1 for op in graph.ops if op.kind is OpKind.CUSTOMIZED)
    for box in lay.boxes:
        if box.parent is None:
            continue
        frame = kernels[box.parent]
        assert frame.contains(box), (box, frame)
        if box.kind != "title":
            title = lay.box(f"{box.parent}/title")
            assert box.y >= title.bottom, (box, title)
    for i, block in _block_ops(graph):
        inside = [b for b in lay.boxes if b.parent == f"%{i}" and b.kind != "title"]
        # every block operator, plus one port label per input and per output
        assert len(inside) == len(block.ops) + len(block.input_ops) + len(block.output_ops)


def test_no_two_boxes_overlap(case):
    _, lay, _ = case
    boxes = [b for b in lay.boxes if b.kind != "title"]
    for a, b in itertools.combinations(boxes, 2):
        if a.kind == "kernel" and b.parent == a.id or b.kind == "kernel" and a.parent == b.id:
            continue  # a block-level box inside its own kernel's frame
        assert not a.overlaps(b), (a.id, b.id)
    titles = [b for b in lay.boxes if b.kind == "title"]
    for title, box in itertools.product(titles, boxes):
        if box.id != title.parent:
            assert not title.overlaps(box), (title.id, box.id)


def test_text_fits_its_box(case):
    _, lay, _ = case
    for box in lay.boxes:
        for line in box.lines:
            assert visualize.text_width(line.text, line.style) <= box.w - 2 * visualize.PAD_X + 1e-6
            assert len(line.text) <= visualize.MAX_LINE + 2


def test_picture_fits_the_canvas(case):
    _, lay, svg = case
    for box in lay.boxes:
        assert 0 <= box.x and box.right <= lay.width
        assert 0 <= box.y and box.bottom <= lay.height
    for edge in lay.edges:
        for x, y in edge.points:
            assert 0 <= x <= lay.width and 0 <= y <= lay.height


def test_svg_rectangles_are_the_layout_boxes(case):
    _, lay, svg = case
    root = ET.fromstring(svg)
    rects = {
        (round(float(r.get("x")), 1), round(float(r.get("y")), 1),
         round(float(r.get("width")), 1), round(float(r.get("height")), 1))
        for r in root.iter(f"{SVG}rect") if r.get("class", "").startswith("box-")
    }
    for box in lay.boxes:
        key = (round(box.x, 1), round(box.y, 1), round(box.w, 1), round(box.h, 1))
        assert key in rects, box.id


def test_kernel_edges_enter_kernels_through_ports(case):
    graph, lay, _ = case
    kernels = [b for b in lay.boxes if b.kind == "kernel"]
    ports = {(round(x, 1), round(y, 1)) for x, y in lay.ports}
    for edge in lay.edges:
        if edge.kind != "kernel":
            continue
        x, y = edge.points[-1]
        for frame in kernels:
            if abs(y - frame.y) < 0.01 and frame.x <= x <= frame.right:
                # the lead line inside starts below the title bar at the same x
                title = lay.box(f"{frame.id}/title")
                assert (round(x, 1), round(title.bottom, 1)) in ports


def test_edges_are_monotone_downwards(case):
    _, lay, _ = case
    for edge in lay.edges:
        ys = [y for _, y in edge.points]
        assert ys == sorted(ys)


# ---- html and helpers ---------------------------------------------------------------------------


def test_html_embeds_svg_and_text_rendering():
    graph = _workload("attention_mirage_gqa")
    page = visualize.to_html(graph, title="Fig 4c", notes=["a note <b>"])
    assert page.startswith("<!DOCTYPE html>")
    assert "<svg" in page and "</svg>" in page
    assert "block_input(input[0], forloop_dim=-1, imap={x:0, y:-, z:-})" in page
    assert "a note &lt;b&gt;" in page
    assert not re.search(r"<(script|link|img)\b", page)
    body = page[page.index("<svg"):page.index("</svg>") + len("</svg>")]
    ET.fromstring(body)


def test_isotonic_regression():
    assert visualize.isotonic([1.0, 3.0, 2.0, 4.0], [1, 1, 1, 1]) == [1.0, 2.5, 2.5, 4.0]
    assert visualize.isotonic([5.0, 1.0], [3, 1]) == [4.0, 4.0]
    assert visualize.isotonic([], []) == []


def test_long_lines_are_wrapped():
    pieces = visualize._wrap("b9 thread_graph {" + "t0=div(in0, in1); " * 6 + "}")
    assert len(pieces) > 1 and all(len(p) <= visualize.MAX_LINE for p in pieces)
    unbroken = visualize._wrap("x" * 100 + " y")
    assert all(len(p) <= visualize.MAX_LINE for p in unbroken)
    assert "".join(p.strip() for p in unbroken) == "x" * 100 + " y"


def test_program_without_custom_kernels():
    g = mugraph.new_kernel_graph()
    x = g.new_input((4, 8))
    g.mark_output(x)  # an input marked as output directly
    g.mark_output(g.relu(x))
    lay = visualize.layout(g)
    assert {b.kind for b in lay.boxes} == {"input", "op", "output"}
    ET.fromstring(visualize.to_svg(g))
