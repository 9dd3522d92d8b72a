"""Pictures of μGraphs: a self-contained SVG (and an HTML page around it), no graphviz needed.

The kernel graph is drawn top to bottom in topological levels. Each graph-defined kernel
(``customized``) is a framed box whose title bar gives its grid, block and for-loop range, with
its block graph laid out inside it; the kernel's inputs enter through ports on the box's top
edge and its outputs leave through ports on the bottom edge. The label on each port's edge
gives the input's ``imap`` and ``forloop_dim`` (or the output's ``omap`` and ``forloop_dim`` and
the device tensor it writes). Every operator box names the operator and its output tensor's
shape.

The layout is a small layered (Sugiyama-style) layout: longest-path levels, dummy points on
edges that span levels, barycentric ordering to reduce crossings, and x positions found by
isotonic regression towards the neighbours' positions, so boxes of one level never overlap.
Text widths are estimated from a monospace font. :func:`layout` returns the boxes and edges
with absolute coordinates (the tests check them); :func:`to_svg` and :func:`to_html` draw them.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

from mugraph.ir.builder import expect_kernel_graph
from mugraph.ir.graph import BlockGraph, Op
from mugraph.ir.ops import AccumKind, Group, OpKind
from mugraph.ir.tensor import TensorType

FONT_FAMILY = "DejaVu Sans Mono, Menlo, Consolas, 'Liberation Mono', monospace"
CHAR_WIDTH = 0.62  # advance of one monospace character, in ems (slightly generous)
MAX_LINE = 44  # longer lines are wrapped

# (font size, line height) per text style
TEXT_STYLES = {
    "name": (13, 17),
    "type": (12, 16),
    "note": (12, 15),
    "title": (14, 18),
    "subtitle": (12, 16),
    "caption": (15, 20),
}
PAD_X, PAD_Y = 9, 6  # inside an operator box
KERNEL_PAD = 18  # between a kernel box's frame and its block graph
KERNEL_GAPS = (44, 46)  # horizontal and vertical gaps of the kernel-level layout
BLOCK_GAPS = (26, 30)  # ... and of a block graph inside a kernel box
DUMMY_WIDTH = 6
MARGIN = 20

_AXES = "xyz"
_SKIP_ATTRS = {"graph", "index", "dtensor", "program", "imap", "omap", "forloop_dim"}


# ---- the result of a layout ---------------------------------------------------------------------


@dataclass
class TextLine:
    """One line of text inside a box, in a named style (see ``TEXT_STYLES``)."""

    text: str
    style: str = "name"


@dataclass
class Box:
    """A rectangle of the picture in absolute coordinates (x, y: top-left corner).

    ``kind`` is one of: input, output, op, accum, block_input, block_output, annotation,
    kernel (a custom kernel's frame) and title (its title bar). ``parent`` is the id of the
    kernel box a block-level box lies in (None at the kernel level).
    """

    id: str
    kind: str
    x: float
    y: float
    w: float
    h: float
    lines: list[TextLine] = field(default_factory=list)
    parent: str | None = None

    @property
    def right(self) -> float:
        return self.x + self.w

    @property
    def bottom(self) -> float:
        return self.y + self.h

    def overlaps(self, other: Box) -> bool:
        """Whether the two rectangles share interior area."""
        return (
            self.x < other.right and other.x < self.right
            and self.y < other.bottom and other.y < self.bottom
        )

    def contains(self, other: Box) -> bool:
        return (
            self.x <= other.x and other.right <= self.right
            and self.y <= other.y and other.bottom <= self.bottom
        )


@dataclass
class Edge:
    """A polyline; segments between points at different x are drawn as smooth curves."""

    points: list[tuple[float, float]]
    kind: str = "kernel"  # kernel | block | lead (a port's line inside a kernel box)
    arrow: bool = True


@dataclass
class Layout:
    """Everything :func:`to_svg` draws."""

    width: float
    height: float
    boxes: list[Box]
    edges: list[Edge]
    ports: list[tuple[float, float]] = field(default_factory=list)
    caption: str = ""

    def box(self, box_id: str) -> Box:
        for b in self.boxes:
            if b.id == box_id:
                return b
        raise KeyError(box_id)


# ---- text ---------------------------------------------------------------------------------------


def text_width(text: str, style: str = "name") -> float:
    """Estimated width of ``text`` in pixels (monospace font)."""
    return len(text) * TEXT_STYLES[style][0] * CHAR_WIDTH


def _wrap(text: str, limit: int = MAX_LINE) -> list[str]:
    """Split a long line at spaces or commas so that no piece is longer than ``limit``."""
    pieces: list[str] = []
    while len(text) > limit:
        cut = max(text.rfind(" ", 3, limit), text.rfind(",", 3, limit) + 1)
        if cut <= 3:  # nothing to break at (past a continuation's indent): cut the word
            cut = limit
        pieces.append(text[:cut].rstrip())
        text = "  " + text[cut:].lstrip()
    pieces.append(text)
    return pieces


def _lines(*items: tuple[str, str]) -> list[TextLine]:
    out = []
    for text, style in items:
        out += [TextLine(piece, style) for piece in _wrap(text)]
    return out


def _box_size(lines: list[TextLine]) -> tuple[float, float]:
    width = max(text_width(line.text, line.style) for line in lines)
    height = sum(TEXT_STYLES[line.style][1] for line in lines)
    return width + 2 * PAD_X, height + 2 * PAD_Y


def map_text(grid_map: tuple[int, ...]) -> str:
    """An imap / omap as ``{x:0, y:-, z:-}`` (``-``: replicated / not mapped)."""
    parts = [f"{a}:{'-' if d < 0 else d}" for a, d in zip(_AXES, grid_map, strict=False)]
    return "{" + ", ".join(parts) + "}"


def _attr_text(name: str, value: Any) -> str:
    if isinstance(value, AccumKind):
        return f"{name}={value.value}"
    if isinstance(value, TensorType):
        return ""
    return f"{name}={value}"


def op_title(op: Op, name: str) -> str:
    """``b6 matmul`` / ``%2 rms_norm normalized_shape=(256,)``: name, kind, attributes."""
    attrs = [_attr_text(k, v) for k, v in op.attrs if k not in _SKIP_ATTRS]
    text = " ".join([name, op.kind.value, *[a for a in attrs if a]])
    if op.kind is OpKind.THREAD_GRAPH:
        from mugraph.ir.thread import render_program

        text += " {" + render_program(op.attr("program"), len(op.inputs)) + "}"
    return text


def _dims3(dims) -> str:
    return "(" + ", ".join(str(d) for d in dims) + ")"


# ---- a layered layout -------------------------------------------------------------------------


@dataclass
class _Node:
    key: str
    w: float
    h: float
    rank: int
    dummy: bool = False
    x: float = 0.0  # centre
    y: float = 0.0  # top


@dataclass
class _Link:
    src: str
    dst: str
    src_dx: float = 0.0  # where on the source's bottom edge, from its centre
    dst_dx: float = 0.0  # where on the target's top edge, from its centre
    chain: list[str] = field(default_factory=list)


class LayeredLayout:
    """Places boxes in rows by rank (top to bottom) and routes links between them.

    Every link must go from a lower rank to a higher one. Rows are top-aligned; a link
    leaves its source at the bottom edge, runs vertically through rows it crosses (at a dummy
    point of its own), and enters its target at the top edge.
    """

    def __init__(self, hgap: float, vgap: float, fixed_rows: frozenset[int] = frozenset()) -> None:
        self.hgap, self.vgap = hgap, vgap
        self.fixed_rows = fixed_rows  # rows kept in the order their nodes were added
        self.nodes: dict[str, _Node] = {}
        self.links: list[_Link] = []
        self.rows: list[list[str]] = []
        self.tops: list[float] = []
        self.heights: list[float] = []
        self.width = self.height = 0.0

    def add_node(self, key: str, w: float, h: float, rank: int) -> None:
        self.nodes[key] = _Node(key, w, h, rank)

    def add_link(self, src: str, dst: str, src_dx: float = 0.0, dst_dx: float = 0.0) -> _Link:
        if self.nodes[dst].rank <= self.nodes[src].rank:
            raise ValueError(f"link {src} -> {dst} does not go down the ranks")
        link = _Link(src, dst, src_dx, dst_dx)
        self.links.append(link)
        return link

    # the steps
    def solve(self) -> None:
        self._make_rows()
        self._order()
        self._place_x()
        self._place_y()

    def _make_rows(self) -> None:
        count = 1 + max((n.rank for n in self.nodes.values()), default=0)
        self.rows = [[] for _ in range(count)]
        for node in self.nodes.values():
            self.rows[node.rank].append(node.key)
        for i, link in enumerate(self.links):
            chain = [link.src]
            for rank in range(self.nodes[link.src].rank + 1, self.nodes[link.dst].rank):
                key = f"~{i}.{rank}"
                self.nodes[key] = _Node(key, DUMMY_WIDTH, 0.0, rank, dummy=True)
                self.rows[rank].append(key)
                chain.append(key)
            link.chain = chain + [link.dst]
        self._segments()

    def _segments(self) -> None:
        """Links cut into pieces between adjacent rows: (upper, lower, upper_dx, lower_dx)."""
        self.down: dict[str, list[tuple[str, float, float]]] = {k: [] for k in self.nodes}
        self.up: dict[str, list[tuple[str, float, float]]] = {k: [] for k in self.nodes}
        for link in self.links:
            last = len(link.chain) - 2
            for j, (a, b) in enumerate(zip(link.chain, link.chain[1:], strict=False)):
                a_dx = link.src_dx if j == 0 else 0.0
                b_dx = link.dst_dx if j == last else 0.0
                self.down[a].append((b, a_dx, b_dx))
                self.up[b].append((a, b_dx, a_dx))

    # ordering within rows: barycentres, keeping the order with the fewest crossings
    def _order(self) -> None:
        best = [list(r) for r in self.rows]
        best_crossings = self._crossings()
        for _ in range(6):
            for r in range(1, len(self.rows)):
                self._sort_row(r, self.up)
            for r in range(len(self.rows) - 2, -1, -1):
                self._sort_row(r, self.down)
            crossings = self._crossings()
            if crossings < best_crossings:
                best, best_crossings = [list(r) for r in self.rows], crossings
        self.rows = best
        self._transpose()

    def _position(self, key: str, dx: float) -> float:
        """Where a port lies in its row, in units of places (its box's index, +- under 1/2)."""
        return self._index[key] + self._frac(key, dx)

    def _sort_row(self, r: int, neighbours: dict) -> None:
        if r in self.fixed_rows or r - len(self.rows) in self.fixed_rows:
            return
        self._index = {k: i for row in self.rows for i, k in enumerate(row)}
        keys = []
        for i, key in enumerate(self.rows[r]):
            near = neighbours[key]
            if near:
                bary = sum(self._position(k, dx) for k, _, dx in near) / len(near)
            else:
                bary = float(i)
            keys.append((bary, i, key))
        self.rows[r] = [key for _, _, key in sorted(keys)]

    def _crossings(self) -> float:
        self._index = {k: i for row in self.rows for i, k in enumerate(row)}
        return sum(self._pair_crossings(r) for r in range(len(self.rows) - 1))

    def _pair_crossings(self, r: int) -> float:
        """Crossings of the link pieces between row ``r`` and row ``r + 1``; two pieces that
        cross only because of the ports of a box they share count a quarter (they cross at
        that box, where it is easy to follow)."""
        if r < 0 or r + 1 >= len(self.rows):
            return 0.0
        pieces = [
            (a, b, self._position(a, a_dx), self._position(b, b_dx))
            for a in self.rows[r] for b, a_dx, b_dx in self.down[a]
        ]
        total = 0.0
        for i, (a1, b1, x1, y1) in enumerate(pieces):
            for a2, b2, x2, y2 in pieces[i + 1:]:
                if (x1 - x2) * (y1 - y2) < 0:
                    total += 0.25 if a1 == a2 or b1 == b2 else 1.0
        return total

    def _transpose(self) -> None:
        """Swap neighbours in a row while that removes crossings (after the sweeps)."""
        self._index = {k: i for row in self.rows for i, k in enumerate(row)}
        for _ in range(4):
            improved = False
            for r, row in enumerate(self.rows):
                if r in self.fixed_rows or r - len(self.rows) in self.fixed_rows:
                    continue
                for i in range(len(row) - 1):
                    before = self._pair_crossings(r - 1) + self._pair_crossings(r)
                    self._swap(row, i)
                    after = self._pair_crossings(r - 1) + self._pair_crossings(r)
                    if after < before:
                        improved = True
                    else:
                        self._swap(row, i)
            if not improved:
                return

    def _swap(self, row: list[str], i: int) -> None:
        row[i], row[i + 1] = row[i + 1], row[i]
        self._index[row[i]], self._index[row[i + 1]] = i, i + 1

    def _frac(self, key: str, dx: float) -> float:
        """A port's offset from its box's centre as a fraction of the box's width."""
        node = self.nodes[key]
        return max(-0.45, min(0.45, dx / node.w)) if node.w else 0.0

    # x positions: each row at once, as close to its neighbours as the order allows
    def _gap(self, a: str, b: str) -> float:
        both_dummy = self.nodes[a].dummy and self.nodes[b].dummy
        one_dummy = self.nodes[a].dummy or self.nodes[b].dummy
        return self.hgap / 3 if both_dummy else self.hgap / 2 if one_dummy else self.hgap

    def _offsets(self, row: list[str]) -> list[float]:
        offsets = [0.0]
        for a, b in zip(row, row[1:], strict=False):
            step = self.nodes[a].w / 2 + self._gap(a, b) + self.nodes[b].w / 2
            offsets.append(offsets[-1] + step)
        return offsets

    def _place_row(self, row: list[str], desired: list[float], weights: list[float]) -> None:
        offsets = self._offsets(row)
        fitted = isotonic([d - o for d, o in zip(desired, offsets, strict=True)], weights)
        for key, z, o in zip(row, fitted, offsets, strict=True):
            self.nodes[key].x = z + o

    def _desired(self, key: str, sides: list[dict]) -> tuple[float, float]:
        """Where the neighbours on ``sides`` pull ``key`` (and how hard)."""
        pulls = [
            self.nodes[other].x + other_dx - own_dx
            for side in sides for other, own_dx, other_dx in self._near(side, key)
        ]
        if not pulls:
            return self.nodes[key].x, 0.01
        weight = 4.0 if self.nodes[key].dummy else 1.0
        return sum(pulls) / len(pulls), weight * len(pulls)

    @staticmethod
    def _near(side: dict, key: str) -> list[tuple[str, float, float]]:
        """``key``'s neighbours on one side as (neighbour, own port dx, neighbour port dx)."""
        return side[key]

    def _sweep(self, rows: range, sides: list[dict]) -> None:
        for r in rows:
            row = self.rows[r]
            pulls = [self._desired(key, sides) for key in row]
            self._place_row(row, [p[0] for p in pulls], [p[1] for p in pulls])

    def _place_x(self) -> None:
        for row in self.rows:
            for key, offset in zip(row, self._offsets(row), strict=True):
                self.nodes[key].x = offset
        top_down = range(1, len(self.rows))
        bottom_up = range(len(self.rows) - 2, -1, -1)
        for _ in range(10):
            self._sweep(top_down, [self.up])
            self._sweep(bottom_up, [self.down])
        for _ in range(3):
            self._sweep(range(len(self.rows)), [self.up, self.down])
        left = min(n.x - n.w / 2 for n in self.nodes.values())
        for node in self.nodes.values():
            node.x -= left
        self.width = max(n.x + n.w / 2 for n in self.nodes.values())

    def _place_y(self) -> None:
        top = 0.0
        for row in self.rows:
            height = max(self.nodes[k].h for k in row)
            self.tops.append(top)
            self.heights.append(height)
            for key in row:
                self.nodes[key].y = top
            top += height + self.vgap
        self.height = top - self.vgap

    # routes
    def route(self, link: _Link) -> list[tuple[float, float]]:
        """The points of ``link``: down the source's row, through dummies, into the target."""
        src, dst = self.nodes[link.src], self.nodes[link.dst]
        x = src.x + link.src_dx
        points = [(x, src.y + src.h)]
        band_bottom = self.tops[src.rank] + self.heights[src.rank]
        if band_bottom > src.y + src.h:
            points.append((x, band_bottom))
        for key in link.chain[1:-1]:
            node = self.nodes[key]
            points.append((node.x, self.tops[node.rank]))
            points.append((node.x, self.tops[node.rank] + self.heights[node.rank]))
        points.append((dst.x + link.dst_dx, dst.y))
        return points


def isotonic(values: list[float], weights: list[float]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in weighted least squares (PAVA)."""
    blocks: list[list[float]] = []  # [weighted sum, weight, count]
    for v, w in zip(values, weights, strict=True):
        blocks.append([v * w, w, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, wt, n = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += wt
            blocks[-1][2] += n
    out: list[float] = []
    for s, wt, n in blocks:
        out += [s / wt] * int(n)
    return out


def _spread(index: int, count: int, width: float) -> float:
    """Where input ``index`` of ``count`` enters a box of ``width`` (from its centre)."""
    if count <= 1:
        return 0.0
    step = min(18.0, (width - 2 * PAD_X) / (count - 1))
    return (index - (count - 1) / 2) * step


# ---- block graphs ---------------------------------------------------------------------------


@dataclass
class _Piece:
    """A laid-out sub-picture in its own coordinates (origin at its top-left)."""

    width: float
    height: float
    boxes: list[Box]
    edges: list[Edge]
    in_ports: list[float] = field(default_factory=list)  # x of each kernel input's port
    out_ports: list[float] = field(default_factory=list)  # x of each kernel output's port
    in_tops: list[float] = field(default_factory=list)  # y where each input's lead line ends
    out_bottoms: list[float] = field(default_factory=list)  # y where each output's begins


def _block_op_kind(op: Op) -> str:
    if op.kind is OpKind.BLOCK_INPUT:
        return "block_input"
    if op.kind is OpKind.BLOCK_OUTPUT:
        return "block_output"
    if op.kind in Group.ACCUMULATOR:
        return "accum"
    return "op"


def _block_op_lines(block: BlockGraph, i: int, op: Op, out_index: int) -> list[TextLine]:
    if op.kind is OpKind.BLOCK_INPUT:
        return _lines((f"b{i} input[{op.attr('index')}]", "name"), (str(op.outputs[0]), "type"))
    if op.kind is OpKind.BLOCK_OUTPUT:
        return _lines((f"output[{out_index}]", "name"))
    return _lines((op_title(op, f"b{i}"), "name"), (str(op.outputs[0]), "type"))


def _block_ranks(block: BlockGraph) -> list[int]:
    """Row of each block operator: input iterators in row 1 (row 0: their port labels),
    operators below their inputs, every output saver in the last operator row."""
    ranks: list[int] = []
    for op in block.ops:
        if op.kind is OpKind.BLOCK_INPUT:
            ranks.append(1)
        else:
            ranks.append(1 + max((ranks[r.op] for r in op.inputs), default=1))
    last = max([r for r, op in zip(ranks, block.ops, strict=True)
                if op.kind is not OpKind.BLOCK_OUTPUT] + [1]) + 1
    return [last if op.kind is OpKind.BLOCK_OUTPUT else r
            for r, op in zip(ranks, block.ops, strict=True)]


def layout_block_graph(block: BlockGraph, kernel: str, out_names: list[str]) -> _Piece:
    """Lay out one block graph; ``kernel`` prefixes the box ids, ``out_names`` are the
    device tensors its outputs write (``%3``, ``%3.1``)."""
    # output savers and their labels stay in output order (-2, -1: the last two rows), so
    # that the kernel's output ports are in order
    engine = LayeredLayout(*BLOCK_GAPS, fixed_rows=frozenset({-2, -1}))
    ranks = _block_ranks(block)
    lines: dict[str, tuple[str, list[TextLine]]] = {}
    outputs = 0
    out_keys: list[tuple[str, Op]] = []
    for i, op in enumerate(block.ops):
        key = f"{kernel}/b{i}"
        lines[key] = (_block_op_kind(op), _block_op_lines(block, i, op, outputs))
        engine.add_node(key, *_box_size(lines[key][1]), ranks[i])
        if op.kind is OpKind.BLOCK_INPUT:
            port = f"{kernel}/in{op.attr('index')}"
            text = _lines((f"imap {map_text(op.attr('imap'))}", "note"),
                          (f"forloop_dim {op.attr('forloop_dim')}", "note"))
            lines[port] = ("annotation", text)
            engine.add_node(port, *_box_size(text), 0)
            engine.add_link(port, key)
        if op.kind is OpKind.BLOCK_OUTPUT:
            out_keys.append((key, op))
            outputs += 1
    for k, (key, op) in enumerate(out_keys):
        port = f"{kernel}/out{k}"
        tensor = block.ops[op.inputs[0].op]
        dims = customized_dims(block, op, tensor.outputs[op.inputs[0].index])
        text = _lines((f"omap {map_text(op.attr('omap'))}", "note"),
                      (f"forloop_dim {op.attr('forloop_dim')}", "note"),
                      (f"→ {out_names[k]} {dims}", "note"))
        lines[port] = ("annotation", text)
        engine.add_node(port, *_box_size(text), ranks[-1] + 1)
        engine.add_link(key, port)
    links = _block_links(engine, block, kernel)
    engine.solve()
    return _block_piece(engine, lines, links, kernel, len(block.input_ops), len(out_keys))


def customized_dims(block: BlockGraph, out_op: Op, tile: TensorType) -> str:
    """The device tensor an output saver writes, as text: ``[4, 96] float16``."""
    from mugraph.ir import maps

    dims = maps.output_dims(
        "new_output", tile.dims, block.grid_dim, out_op.attr("omap"),
        block.forloop_range, out_op.attr("forloop_dim"),
    )
    return str(TensorType(tuple(dims), tile.dtype))


def _block_links(engine: LayeredLayout, block: BlockGraph, kernel: str) -> list[_Link]:
    links = []
    for i, op in enumerate(block.ops):
        dst = f"{kernel}/b{i}"
        width = engine.nodes[dst].w
        for j, ref in enumerate(op.inputs):
            dx = _spread(j, len(op.inputs), width)
            links.append(engine.add_link(f"{kernel}/b{ref.op}", dst, 0.0, dx))
    return links


def _block_piece(engine: LayeredLayout, lines: dict, links: list[_Link], kernel: str,
                 n_in: int, n_out: int) -> _Piece:
    boxes = []
    for key, (kind, text) in lines.items():
        node = engine.nodes[key]
        boxes.append(Box(key, kind, node.x - node.w / 2, node.y, node.w, node.h, text, kernel))
    edges = [Edge(engine.route(link), "block") for link in engine.links]
    ins = [engine.nodes[f"{kernel}/in{j}"] for j in range(n_in)]
    outs = [engine.nodes[f"{kernel}/out{k}"] for k in range(n_out)]
    return _Piece(
        engine.width, engine.height, boxes, edges,
        in_ports=[n.x for n in ins], out_ports=[n.x for n in outs],
        in_tops=[n.y for n in ins], out_bottoms=[n.y + n.h for n in outs],
    )


# ---- kernel graphs ----------------------------------------------------------------------------


@dataclass
class _KernelBox:
    """A custom kernel's frame: title lines, size and its block graph's picture."""

    key: str
    title: list[TextLine]
    title_h: float
    inner: _Piece
    inner_dx: float
    w: float
    h: float

    def in_dx(self, j: int) -> float:
        return self.inner_dx + self.inner.in_ports[j] - self.w / 2

    def out_dx(self, k: int) -> float:
        return self.inner_dx + self.inner.out_ports[k] - self.w / 2


def _kernel_box(graph, i: int, op: Op) -> _KernelBox:
    block: BlockGraph = op.attr("graph")
    key = f"%{i}"
    names = [f"%{i}" + (f".{k}" if k else "") for k in range(len(op.outputs))]
    inner = layout_block_graph(block, key, names)
    title = _lines(
        (f"%{i} customized kernel", "title"),
        (f"grid {_dims3(block.grid_dim)}  forloop_range {block.forloop_range}", "subtitle"),
        (f"block {_dims3(block.block_dim)}", "subtitle"),
    )
    title_w, title_h = _box_size(title)
    w = max(inner.width + 2 * KERNEL_PAD, title_w)
    h = title_h + inner.height + 2 * KERNEL_PAD
    return _KernelBox(key, title, title_h, inner, (w - inner.width) / 2, w, h)


def _kernel_ranks(graph) -> list[int]:
    """Row of each kernel operator: one below its lowest input; a graph input sits just
    above its first consumer (a weight used late is drawn beside the operator using it)."""
    ranks: list[int] = []
    for op in graph.ops:
        ranks.append(1 + max((ranks[r.op] for r in op.inputs), default=-1))
    consumers: dict[int, list[int]] = {}
    for i, op in enumerate(graph.ops):
        for ref in op.inputs:
            consumers.setdefault(ref.op, []).append(ranks[i])
    for ref in graph.outputs:
        consumers.setdefault(ref.op, []).append(ranks[ref.op] + 1)
    for i, op in enumerate(graph.ops):
        if op.kind is OpKind.INPUT and consumers.get(i):
            ranks[i] = min(consumers[i]) - 1
    return ranks


def _kernel_lines(i: int, op: Op) -> tuple[str, list[TextLine]]:
    if op.kind is OpKind.INPUT:
        return "input", _lines((f"%{i} input[{op.attr('index')}]", "name"),
                               (str(op.outputs[0]), "type"))
    types = [(str(t), "type") for t in op.outputs]
    return "op", _lines((op_title(op, f"%{i}"), "name"), *types)


def layout(graph) -> Layout:
    """Lay out a kernel graph with its block graphs inside their kernels' boxes."""
    expect_kernel_graph(graph, "visualize")
    engine = LayeredLayout(*KERNEL_GAPS)
    ranks = _kernel_ranks(graph)
    kernels: dict[str, _KernelBox] = {}
    plain: dict[str, tuple[str, list[TextLine]]] = {}
    for i, op in enumerate(graph.ops):
        key = f"%{i}"
        if op.kind is OpKind.CUSTOMIZED:
            kernels[key] = _kernel_box(graph, i, op)
            engine.add_node(key, kernels[key].w, kernels[key].h, ranks[i])
        else:
            plain[key] = _kernel_lines(i, op)
            engine.add_node(key, *_box_size(plain[key][1]), ranks[i])
    for i, op in enumerate(graph.ops):
        for j, ref in enumerate(op.inputs):
            _kernel_link(engine, kernels, f"%{ref.op}", ref.index, f"%{i}", j, len(op.inputs))
    for k, ref in enumerate(graph.outputs):
        key = f"out{k}"
        plain[key] = ("output", _lines((f"output {k}", "name")))
        engine.add_node(key, *_box_size(plain[key][1]), ranks[ref.op] + 1)
        _kernel_link(engine, kernels, f"%{ref.op}", ref.index, key, 0, 1)
    engine.solve()
    return _assemble(graph, engine, kernels, plain)


def _kernel_link(engine, kernels, src: str, out_index: int, dst: str, j: int, count: int):
    src_dx = kernels[src].out_dx(out_index) if src in kernels else 0.0
    if dst in kernels:
        dst_dx = kernels[dst].in_dx(j)
    else:
        dst_dx = _spread(j, count, engine.nodes[dst].w)
    engine.add_link(src, dst, src_dx, dst_dx)


def _assemble(graph, engine: LayeredLayout, kernels: dict, plain: dict) -> Layout:
    """Absolute coordinates: kernel-level boxes, kernel frames, and block graphs inside."""
    top = MARGIN + TEXT_STYLES["caption"][1] + 12
    dx, dy = MARGIN, top
    boxes: list[Box] = []
    edges = [Edge(_shift(engine.route(link), dx, dy), "kernel") for link in engine.links]
    ports: list[tuple[float, float]] = []
    for key, (kind, text) in plain.items():
        node = engine.nodes[key]
        boxes.append(Box(key, kind, node.x - node.w / 2 + dx, node.y + dy, node.w, node.h, text))
    for key, kb in kernels.items():
        node = engine.nodes[key]
        x0, y0 = node.x - node.w / 2 + dx, node.y + dy
        boxes.append(Box(key, "kernel", x0, y0, kb.w, kb.h))
        boxes.append(Box(f"{key}/title", "title", x0, y0, kb.w, kb.title_h, kb.title, key))
        ix, iy = x0 + kb.inner_dx, y0 + kb.title_h + KERNEL_PAD
        for b in kb.inner.boxes:
            boxes.append(Box(b.id, b.kind, b.x + ix, b.y + iy, b.w, b.h, b.lines, key))
        edges += [Edge(_shift(e.points, ix, iy), e.kind) for e in kb.inner.edges]
        edges += _lead_lines(kb, x0, y0, ix, iy, ports)
    width = max([engine.width + 2 * MARGIN, _caption_width(graph) + 2 * MARGIN])
    return Layout(width, engine.height + dy + MARGIN, boxes, edges, ports, caption(graph))


def _lead_lines(kb: _KernelBox, x0, y0, ix, iy, ports: list) -> list[Edge]:
    """A kernel's ports: lines from the title bar to the input labels, and from the output
    labels to the frame's bottom edge."""
    lines = []
    for x, y in zip(kb.inner.in_ports, kb.inner.in_tops, strict=True):
        start = (x + ix, y0 + kb.title_h)
        lines.append(Edge([start, (x + ix, y + iy)], "lead", arrow=False))
        ports.append(start)
    for x, y in zip(kb.inner.out_ports, kb.inner.out_bottoms, strict=True):
        end = (x + ix, y0 + kb.h)
        lines.append(Edge([(x + ix, y + iy), end], "lead", arrow=False))
        ports.append(end)
    return lines


def _shift(points, dx: float, dy: float) -> list[tuple[float, float]]:
    return [(x + dx, y + dy) for x, y in points]


def caption(graph) -> str:
    """One line about the graph: inputs, outputs, custom kernels, operators."""
    kernels = sum(1 for op in graph.ops if op.kind is OpKind.CUSTOMIZED)
    others = sum(1 for op in graph.ops if op.kind not in (OpKind.INPUT, OpKind.CUSTOMIZED))
    ins, outs = len(graph.input_ops), len(graph.outputs)
    return (
        f"μGraph: {ins} input{'s' * (ins != 1)}, {outs} output{'s' * (outs != 1)}, "
        f"{kernels} custom kernel{'s' * (kernels != 1)}, "
        f"{others} pre-defined operator{'s' * (others != 1)}"
    )


def _caption_width(graph) -> float:
    return text_width(caption(graph), "caption")


# ---- drawing --------------------------------------------------------------------------------

_CSS = """
.edge-kernel { stroke: #37474f; stroke-width: 1.6; fill: none; }
.edge-block { stroke: #5c6bc0; stroke-width: 1.3; fill: none; }
.edge-lead { stroke: #5c6bc0; stroke-width: 1.3; fill: none; stroke-dasharray: 4 3; }
.box-input { fill: #e8f5e9; stroke: #2e7d32; }
.box-output { fill: #fff3e0; stroke: #ef6c00; }
.box-op { fill: #e3f2fd; stroke: #1565c0; }
.box-accum { fill: #f3e5f5; stroke: #7b1fa2; }
.box-block_input { fill: #e8f5e9; stroke: #2e7d32; }
.box-block_output { fill: #fff3e0; stroke: #ef6c00; }
.box-annotation { fill: #fffde7; stroke: #c9b458; stroke-dasharray: 3 2; }
.box-kernel { fill: #f7f9fc; stroke: #263238; stroke-width: 1.8; }
.box-title { fill: #263238; stroke: #263238; }
.port { fill: #263238; }
text { font-family: %FONT%; fill: #1a1a1a; }
.t-name { font-size: 13px; font-weight: bold; }
.t-type { font-size: 12px; fill: #37474f; }
.t-note { font-size: 12px; fill: #5d4037; }
.t-title { font-size: 14px; font-weight: bold; fill: #ffffff; }
.t-subtitle { font-size: 12px; fill: #e0e0e0; }
.t-caption { font-size: 15px; font-weight: bold; }
"""


def _fmt(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".")


def _path(points: list[tuple[float, float]]) -> str:
    """Vertical runs as lines, runs between rows as smooth S-curves."""
    parts = [f"M{_fmt(points[0][0])},{_fmt(points[0][1])}"]
    for (x1, y1), (x2, y2) in zip(points, points[1:], strict=False):
        if abs(x1 - x2) < 0.5:
            parts.append(f"L{_fmt(x2)},{_fmt(y2)}")
        else:
            mid = (y1 + y2) / 2
            parts.append(f"C{_fmt(x1)},{_fmt(mid)} {_fmt(x2)},{_fmt(mid)} {_fmt(x2)},{_fmt(y2)}")
    return "".join(parts)


def _svg_box(box: Box) -> list[str]:
    radius = 0 if box.kind in ("kernel", "title", "annotation") else 5
    out = [
        f'<rect class="box-{box.kind}" x="{_fmt(box.x)}" y="{_fmt(box.y)}" '
        f'width="{_fmt(box.w)}" height="{_fmt(box.h)}" rx="{radius}"/>'
    ]
    y = box.y + PAD_Y
    centred = box.kind not in ("title",)
    for line in box.lines:
        size, height = TEXT_STYLES[line.style]
        y += height
        baseline = y - (height - size) / 2 - 2
        if centred:
            anchor, x = "middle", box.x + box.w / 2
        else:
            anchor, x = "start", box.x + PAD_X
        out.append(
            f'<text class="t-{line.style}" x="{_fmt(x)}" y="{_fmt(baseline)}" '
            f'text-anchor="{anchor}" xml:space="preserve">{html.escape(line.text)}</text>'
        )
    return out


def _draw(lay: Layout) -> str:
    w, h = _fmt(lay.width), _fmt(lay.height)
    css = _CSS.replace("%FONT%", FONT_FAMILY)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        f'viewBox="0 0 {w} {h}">',
        f"<style>{css}</style>",
        "<defs>",
        '<marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'fill="#37474f"/></marker>',
        "</defs>",
        f'<rect x="0" y="0" width="{w}" height="{h}" fill="#ffffff"/>',
        f'<text class="t-caption" x="{MARGIN}" y="{MARGIN + 15}">{html.escape(lay.caption)}</text>',
    ]
    for box in lay.boxes:
        if box.kind == "kernel":
            out += _svg_box(box)
    for edge in lay.edges:
        marker = ' marker-end="url(#arrow)"' if edge.arrow else ""
        out.append(f'<path class="edge-{edge.kind}" d="{_path(edge.points)}"{marker}/>')
    for box in lay.boxes:
        if box.kind != "kernel":
            out += _svg_box(box)
    for x, y in lay.ports:
        out.append(f'<circle class="port" cx="{_fmt(x)}" cy="{_fmt(y)}" r="3"/>')
    out.append("</svg>")
    return "\n".join(out)


def to_svg(graph) -> str:
    """A self-contained SVG picture of a μGraph (kernel graph with nested block graphs)."""
    return _draw(layout(graph))


def to_html(graph, title: str = "μGraph", notes: list[str] | None = None) -> str:
    """An HTML page (no external assets) with the SVG picture and the text rendering."""
    notes_html = "".join(f"<p>{html.escape(n)}</p>" for n in notes or [])
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>
body {{ font-family: {FONT_FAMILY}; margin: 24px; color: #1a1a1a; background: #fafafa; }}
h1 {{ font-size: 20px; }} h2 {{ font-size: 16px; margin-top: 28px; }}
.figure {{ overflow-x: auto; background: #ffffff; border: 1px solid #ddd; padding: 8px; }}
pre {{ background: #ffffff; border: 1px solid #ddd; padding: 12px; overflow-x: auto;
       font-size: 13px; line-height: 1.35; }}
p {{ font-size: 13px; }}
</style>
</head>
<body>
<h1>{html.escape(title)}</h1>
{notes_html}
<div class="figure">
{to_svg(graph)}
</div>
<h2>Text rendering</h2>
<pre>{html.escape(str(graph))}</pre>
</body>
</html>
"""
