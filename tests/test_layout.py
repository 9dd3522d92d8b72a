"""The layout algebra's laws, each checked against brute-force index enumeration on random
layouts (mugraph/ir/layout.py)."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mugraph.ir.layout import (
    Layout,
    LayoutError,
    coalesce,
    column_major,
    complement,
    composition,
    logical_divide,
    logical_product,
    make_layout,
    row_major,
)

SIZES = st.sampled_from([1, 2, 3, 4, 8])


@st.composite
def compact_layouts(draw, max_modes: int = 4):
    """A compact layout (a permutation of a column-major one): modes of sizes 1-8 in some
    order of strides, so that tilings divide."""
    sizes = draw(st.lists(SIZES, min_size=1, max_size=max_modes))
    order = draw(st.permutations(range(len(sizes))))
    strides = [0] * len(sizes)
    current = 1
    for i in order:
        strides[i] = current
        current *= sizes[i]
    return Layout(tuple(sizes), tuple(strides))


@st.composite
def strided_layouts(draw, max_modes: int = 3):
    """Any layout with positive strides (possibly overlapping or with holes)."""
    sizes = draw(st.lists(SIZES, min_size=1, max_size=max_modes))
    strides = draw(st.lists(st.integers(0, 40), min_size=len(sizes), max_size=len(sizes)))
    return Layout(tuple(sizes), tuple(strides))


def test_index_order_is_colexicographic_and_coordinates_agree():
    a = Layout((4, 8), (8, 1))  # a row-major 4x8 matrix
    assert a(0) == 0 and a(1) == 8 and a(4) == 1 and a.size == 32 and a.cosize == 32
    assert a((2, 3)) == 2 * 8 + 3
    assert row_major((4, 8)) == a
    assert column_major((4, 8)).offsets() == list(range(32))
    nested = Layout(((2, 2), 8), ((1, 16), 2))
    assert nested.size == 32 and nested(((1, 1), 3)) == 1 + 16 + 6


def test_bad_layouts_are_named():
    with pytest.raises(LayoutError, match="nesting"):
        Layout((2, 3), 1)
    with pytest.raises(LayoutError, match="size below 1"):
        Layout((2, 0), (1, 2))
    with pytest.raises(LayoutError, match="outside"):
        Layout(4, 1)(4)


@given(strided_layouts())
def test_coalesce_keeps_the_function_with_fewer_modes(a):
    c = coalesce(a)
    assert c.size == a.size and c.offsets() == a.offsets()
    assert c.rank <= a.rank


@settings(max_examples=300)
@given(compact_layouts(), st.data())
def test_composition_is_function_composition(a, data):
    """Whenever the composition is computed it is a ∘ b, in b's shape (where a's modes do
    not divide b's strides and sizes it is refused with a LayoutError instead)."""
    b = data.draw(compact_layouts(max_modes=3))
    assume(b.cosize <= a.size)
    try:
        c = composition(a, b)
    except LayoutError as error:
        assert "does not divide" in str(error)
        return
    assert c.size == b.size and c.offsets() == [a(b(i)) for i in range(b.size)]


@pytest.mark.parametrize("a, b", [
    (row_major((8, 16)), Layout((4, 2), (1, 4))),
    (Layout((4, 3), (3, 1)), Layout((2, 6), (1, 2))),
    (Layout((2, 8), (16, 1)), Layout(4, 4)),
    (column_major((4, 4, 4)), Layout((2, 8), (2, 8))),
])
def test_compositions_that_tile_evenly(a, b):
    c = composition(a, b)
    assert c.offsets() == [a(b(i)) for i in range(b.size)]


@given(compact_layouts(), st.sampled_from([1, 2, 4]))
def test_composition_with_a_strided_mode(a, stride):
    size = a.size // stride
    assume(a.size % stride == 0 and size >= 1)
    try:
        c = composition(a, Layout(size, stride))
    except LayoutError:
        return  # the stride does not divide a's modes: reported, not computed wrongly
    assert c.offsets() == [a(i * stride) for i in range(size)]


@given(compact_layouts(max_modes=3), st.sampled_from([1, 2, 4]))
def test_complement_fills_the_holes(a, extra):
    bound = a.cosize * extra
    c = complement(a, bound)
    both = make_layout(a, c)
    image = both.offsets()
    assert len(set(image)) == len(image)  # injective
    assert set(image) == set(range(bound))  # covers [0, bound)


def test_complement_of_a_strided_layout():
    a = Layout(4, 2)  # even offsets 0..6
    c = complement(a, 16)
    assert sorted(make_layout(a, c).offsets()) == list(range(16))


@given(compact_layouts(), st.data())
def test_logical_divide_splits_into_tiles(a, data):
    first = coalesce(a).flat()[0][0]  # a tile inside the first mode always divides
    tile = data.draw(st.sampled_from([t for t in (1, 2, 3, 4, 8) if first % t == 0]))
    tiler = Layout(tile, 1)
    d = logical_divide(a, tiler)
    assert d.mode(0).size == tile and d.size == a.size
    # index (i in tile, j-th tile) is a's index j * tile + i
    for j in range(a.size // tile):
        for i in range(tile):
            assert d((i, j)) == a(j * tile + i)


def test_logical_divide_of_a_matrix_by_a_strided_tiler():
    # rows of a row-major 8x16 matrix, every other row: the tile is rows 0,2,4,6
    a = row_major((8, 16))
    rows = composition(a, Layout(8, 1))  # the row index: offsets 0, 16, ...
    d = logical_divide(rows, Layout(4, 2))
    assert [d((i, 0)) for i in range(4)] == [0, 32, 64, 96]
    assert [d((0, j)) for j in range(2)] == [0, 16]


@given(compact_layouts(max_modes=2), compact_layouts(max_modes=2))
def test_logical_product_repeats_the_layout(a, b):
    p = logical_product(a, b)
    assert p.size == a.size * b.size
    first = [p((i, 0)) for i in range(a.size)]
    assert first == a.offsets()
    image = p.offsets()
    assert len(set(image)) == len(image)  # copies do not overlap


def test_composition_that_does_not_divide_is_an_error():
    with pytest.raises(LayoutError, match="does not divide"):
        composition(Layout((3, 4), (4, 1)), Layout(2, 2))
