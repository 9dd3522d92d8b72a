"""The lowered IR (mugraph.codegen.lowered) and ``mugraph show --lowered``: a golden text for the
Fig 4c GQA μGraph; every block's tile layout against the tiles the reference semantics cut
(brute force over every block, iteration and element); specs placed as block_phases says;
register and shared-memory footprints; clear errors for block graphs it cannot lower.

Regenerate the golden text after an intended change with
``MUGRAPH_UPDATE_GOLDEN=1 python -m pytest tests/test_lowered.py`` (and read the diff)."""

from __future__ import annotations

import itertools
import math
import os
import re
from pathlib import Path

import numpy as np
import pytest
from known_graphs import library_graphs, searched_graphs  # tests/known_graphs.py

from mugraph import cli
from mugraph.codegen.lowered import (
    LoweredKernel,
    LoweringError,
    Memory,
    SpecKind,
    lower_block,
    lower_graph,
)
from mugraph.codegen.lowered_text import kernel_text, lowered_text
from mugraph.dtypes import DType
from mugraph.errors import UnsupportedError
from mugraph.ir.builder import new_kernel_graph, new_threadblock_graph
from mugraph.ir.graph import BlockGraph, Op
from mugraph.ir.layout import Layout
from mugraph.ir.ops import OpKind
from mugraph.ir.phase import Phase, block_phases
from mugraph.ir.tensor import TensorRef, TensorType
from mugraph.ir.tiling import tile_division
from mugraph.library import WORKLOADS
from mugraph.runtime.compiled import SHARED_MEMORY_BUDGET, default_launch, loop_tile_bytes
from mugraph.semantics.partition import assemble_output, split_input

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden"
GQA_TEXT = GOLDEN / "gqa_fig4c_small.mgt"
GQA_LOWERED = GOLDEN / "gqa_fig4c_small.lowered.txt"
UPDATE = os.environ.get("MUGRAPH_UPDATE_GOLDEN") == "1"


def custom_kernels(graph):
    """(customized op, its lowered kernel) of every custom kernel of ``graph``."""
    ops = [op for op in graph.ops if op.kind is OpKind.CUSTOMIZED]
    return list(zip(ops, lower_graph(graph), strict=True))


def strided_graph():
    """Column-major tensors, every grid axis mapped (z, y, x to dims 0, 1, 2), an output
    concatenating the iterations' tiles along its forloop_dim."""
    g = new_kernel_graph()
    x = g.new_input((4, 6, 16), strides=(1, 4, 24))
    tb = new_threadblock_graph((2, 3, 2), (64, 1, 1), 2)
    tx = tb.new_input(x, (2, 1, 0), forloop_dim=2)
    tb.new_output(tb.exp(tx), (2, 1, 0), forloop_dim=2)
    (out,) = g.customized([x], tb)
    g.mark_output(out, strides=(1, 4, 24))
    return g


LIBRARY = dict(library_graphs())
TILED = {name: graph for name, graph in LIBRARY.items() if custom_kernels(graph)}
TILED["strided_grid_xyz"] = strided_graph()


# ---- the golden text ----------------------------------------------------------------------------


def test_show_lowered_prints_the_golden_text_of_the_fig4c_gqa_graph(capsys):
    assert cli.main(["show", str(GQA_TEXT), "--lowered"]) == cli.EXIT_OK
    printed = capsys.readouterr().out
    if UPDATE:
        GQA_LOWERED.write_text(printed, encoding="utf-8")
    assert printed == GQA_LOWERED.read_text(encoding="utf-8")


def test_show_lowered_reads_json_too_and_says_when_there_is_no_custom_kernel(tmp_path, capsys):
    workload = WORKLOADS["attention_mirage_gqa"]
    path = tmp_path / "graph.json"
    path.write_text(workload.optimized(workload.small).to_json())
    assert cli.main(["show", str(path), "--lowered"]) == cli.EXIT_OK
    assert capsys.readouterr().out == GQA_LOWERED.read_text(encoding="utf-8")
    path.write_text(workload.naive(workload.small).to_json())
    assert cli.main(["show", str(path), "--lowered"]) == cli.EXIT_OK
    assert "no custom kernels" in capsys.readouterr().out


def test_show_lowered_refuses_a_task_graph(capsys, monkeypatch):
    monkeypatch.setattr(cli, "_is_task_graph", lambda path: True)
    code = cli.main(["show", str(GQA_TEXT), "--lowered"])
    assert code == cli.EXIT_ERROR
    assert "--lowered: " in capsys.readouterr().err


def test_show_refuses_text_and_lowered_together(capsys):
    with pytest.raises(SystemExit):
        cli.main(["show", str(GQA_TEXT), "--text", "--lowered"])
    assert "not allowed with" in capsys.readouterr().err


def test_the_text_is_deterministic_and_the_ir_hashable():
    graph = LIBRARY["attention_mirage_gqa/optimized"]
    first, again = lower_graph(graph), lower_graph(graph)
    assert first == again and hash(first) == hash(again)
    assert lowered_text(first) == lowered_text(again)
    assert lowered_text(first) == "\n".join(kernel_text(k) for k in first)


# ---- tile layouts against the reference semantics -----------------------------------------------


def offsets_array(t: TensorType) -> np.ndarray:
    """The memory offset of every element of a device tensor."""
    index = np.indices(t.dims, dtype=np.int64)
    return sum(index[d] * s for d, s in enumerate(t.strides)) + np.zeros(t.dims, np.int64)


def lowered_offsets(division, grid, loops: int, tile: tuple[int, ...]) -> np.ndarray:
    """``division``'s offset of every (iteration, block x, y, z, tile element)."""
    found = np.empty((loops, *grid, *tile), np.int64)
    for it, x, y, z in itertools.product(range(loops), *map(range, grid)):
        for coord in np.ndindex(*tile):
            found[(it, x, y, z, *coord)] = division.offset((x, y, z), it, coord)
    return found


def reference_input_offsets(op: Op, block: BlockGraph) -> np.ndarray:
    """Every block's tile of the input, per iteration, as ``split_input`` cuts it."""
    tiles = split_input(offsets_array(op.attr("dtensor")), block.grid_dim, op.attr("imap"),
                        block.forloop_range, op.attr("forloop_dim"))
    return np.broadcast_to(tiles, (block.forloop_range, *block.grid_dim, *op.outputs[0].dims))


def reference_output_offsets(op: Op, block: BlockGraph, out: TensorType) -> np.ndarray:
    """Where ``assemble_output`` puts each element of every block's (iteration's) tile."""
    tile = block.tensor_type(op.inputs[0]).dims
    loops = block.forloop_range if op.attr("forloop_dim") >= 0 else 1
    ids = np.arange(loops * math.prod(block.grid_dim) * math.prod(tile))
    ids = ids.reshape((loops, *block.grid_dim, *tile))
    placed = assemble_output(ids, tile, block.grid_dim, op.attr("omap"), block.forloop_range,
                             op.attr("forloop_dim"))
    where = np.empty(ids.size, np.int64)
    where[placed.ravel()] = offsets_array(out).ravel()
    return np.broadcast_to(where[ids], (block.forloop_range, *block.grid_dim, *tile))


@pytest.mark.parametrize("name", sorted(TILED))
def test_every_tile_layout_is_the_tile_the_reference_semantics_cuts(name):
    for kop, kernel in custom_kernels(TILED[name]):
        block = kop.attr("graph")
        inputs = sorted((op for op in block.ops if op.kind is OpKind.BLOCK_INPUT),
                        key=lambda op: op.attr("index"))
        outputs = [op for op in block.ops if op.kind is OpKind.BLOCK_OUTPUT]
        assert len(kernel.global_tiles) == len(inputs) + len(outputs)
        for op, g in zip(inputs, kernel.global_tiles, strict=False):
            assert g.tensor.name == f"%in{op.attr('index')}"
            expected = reference_input_offsets(op, block)
            found = lowered_offsets(g.division, block.grid_dim, block.forloop_range,
                                    op.outputs[0].dims)
            assert np.array_equal(found, expected), (name, kernel.name, g.tensor.name)
        for j, (op, g) in enumerate(zip(outputs, kernel.global_tiles[len(inputs):], strict=True)):
            assert g.tensor.name == f"%out{j}"
            expected = reference_output_offsets(op, block, kop.outputs[j])
            found = lowered_offsets(g.division, block.grid_dim, block.forloop_range,
                                    block.tensor_type(op.inputs[0]).dims)
            assert np.array_equal(found, expected), (name, kernel.name, g.tensor.name)


def test_a_tile_division_of_a_strided_tensor():
    # a [6, 8] tensor with padded rows (stride 10): dim 1 over 2 blocks, each over 2 iterations
    division = tile_division(Layout((6, 8), (10, 1)), (6, 2), (2, 1, 1), (1, -1, -1), 2, 1)
    assert division.tile == Layout((6, 2), (10, 1))
    assert division.iteration == Layout(2, 2)
    assert division.grid == Layout((2, 1, 1), (4, 0, 0))
    assert division.offset((1, 0, 0), 1, (5, 1)) == 4 + 2 + 51


# ---- phases -------------------------------------------------------------------------------------


def expected_phase(block: BlockGraph, spec, phases: list[Phase]) -> Phase:
    """block_phases' phase of the operator, but: an accumulator is initialised before the loop
    and accumulated in it, and an output with a forloop_dim is stored in every iteration."""
    op = block.ops[spec.op]
    if spec.kind is SpecKind.INIT:
        return Phase.INVARIANT
    if spec.kind is SpecKind.ACCUMULATE:
        return Phase.LOOP
    if op.kind is OpKind.BLOCK_OUTPUT and op.attr("forloop_dim") >= 0:
        return Phase.LOOP
    return phases[spec.op]


def all_kernels():
    for name, graph in [*LIBRARY.items(), *searched_graphs()]:
        for kop, kernel in custom_kernels(graph):
            yield name, kop, kernel


def test_every_spec_is_placed_where_block_phases_says():
    for name, kop, kernel in all_kernels():
        block = kop.attr("graph")
        phases = block_phases(block)
        for spec in kernel.specs:
            assert spec.phase is expected_phase(block, spec, phases), (name, spec)
            if block.ops[spec.op].kind in (OpKind.FORLOOP_ACCUM, OpKind.FORLOOP_ACCUM_MAX,
                                           OpKind.FORLOOP_ACCUM_RESCALE):
                assert phases[spec.op] is Phase.POST  # the value itself is after the loop
        order = [int(s.phase) for s in kernel.specs]
        assert order == sorted(order)
        stored = [s for s in kernel.specs if s.outputs[0].startswith("%out")]
        assert len(stored) == len(block.output_ops)


def test_accumulators_are_initialised_accumulated_and_finished():
    kernel = lower_graph(LIBRARY["rmsnorm_linear/optimized"])[0]
    rms = [s for s in kernel.specs if s.outputs == ("%b4",)]
    assert [(s.kind, s.phase) for s in rms] == [
        (SpecKind.INIT, Phase.INVARIANT), (SpecKind.ACCUMULATE, Phase.LOOP),
        (SpecKind.ELEMENTWISE, Phase.POST)]
    assert rms[1].variant == "rms" and rms[2].detail == "sqrt(acc / 256)"


# ---- footprints ---------------------------------------------------------------------------------


def test_register_tiles_are_spread_over_every_thread():
    for name, kop, kernel in all_kernels():
        block = kop.attr("graph")
        assert kernel.num_threads == kernel.num_warps * 32 == default_launch(block).num_warps * 32
        assert kernel.registers, name
        for tile in kernel.registers:
            assert tile.tensor.memory is Memory.REGISTER
            elements, threads = tile.padded_elements, kernel.num_threads
            assert tile.elements_per_thread == max(1, elements // threads)
            tv = tile.threads_values
            assert tv.mode(0).size == threads
            if elements <= 4096:  # every element is held, by as many threads each
                held = np.bincount([tv((t, v)) for t in range(threads)
                                    for v in range(tile.elements_per_thread)])
                assert len(held) == elements and len(set(held)) == 1, (name, tile.tensor)
        largest = kernel.largest_register_tile
        assert kernel.register_elements_per_thread == largest.elements_per_thread >= 1
        assert all(t.elements_per_thread <= largest.elements_per_thread for t in kernel.registers)


def test_shared_memory_holds_the_pipelined_loads_of_dots():
    staged_somewhere = False
    for name, kop, kernel in all_kernels():
        block = kop.attr("graph")
        buffers = [t for t in kernel.shared if t.view_of is None]
        assert kernel.shared_bytes == kernel.num_stages * sum(t.bytes_per_stage for t in buffers)
        assert kernel.shared_bytes_per_stage <= loop_tile_bytes(block)  # the launch's estimate
        assert kernel.shared_bytes <= SHARED_MEMORY_BUDGET
        if block.forloop_range == 1 or kernel.unrolled:
            assert not kernel.shared, name
        for tile in buffers:
            staged_somewhere = True
            assert tile.bytes_per_stage == math.prod(tile.padded) * tile.tensor.dtype.itemsize > 0
            moves = [s for s in kernel.specs if s.outputs == (tile.tensor.name,)]
            assert [(s.kind, s.phase, s.route) for s in moves] == [
                (SpecKind.MOVE, Phase.LOOP, (Memory.GLOBAL, Memory.SHARED))]
        for spec in kernel.specs:  # what reads shared memory is a tl.dot (or a view)
            shared_in = {t.tensor.name for t in kernel.shared} & set(spec.inputs)
            if shared_in:
                assert spec.kind is SpecKind.VIEW or "tl.dot" in spec.variant, (name, spec)
    assert staged_somewhere


def test_the_gqa_kernel_footprints():
    first, second = lower_graph(LIBRARY["attention_mirage_gqa/optimized"])
    assert (first.num_warps, first.num_stages) == (4, 4)
    assert first.shared_bytes_per_stage == 2 * 16 * 16 * 2  # K and V tiles, fp16
    assert first.shared_bytes == 4 * 1024
    assert first.register_elements_per_thread == 16 * 16 // 128
    assert second.shared_bytes == 0 and second.unrolled and second.lead == 1


def test_a_broadcast_matmul_holds_its_product_in_registers():
    sizes = dict(m=1, k=4096, n=14336, n_tile=32, k_tile=128)  # a suite GEMV's tiling
    kernel = lower_graph(WORKLOADS["gated_mlp"].optimized(sizes))[0]
    product = next(t for t in kernel.registers if t.tensor.name == "%b3.product")
    assert product.padded == (1, 128, 32) and product.elements_per_thread == 32


def test_values_no_output_needs_are_not_lowered():
    kernel = lower_graph(LIBRARY["lora/optimized"])[0]
    assert kernel.unused == ("%b5", "%b6")  # the concatenations the split matmul never builds
    names = {s.outputs[0] for s in kernel.specs}
    assert not names & set(kernel.unused)


# ---- errors -------------------------------------------------------------------------------------


def tiny_block(tile_dims=(4, 8), imap=(0, -1, -1)) -> BlockGraph:
    """Built by hand (no builder checks): two blocks, each loading and storing a [4, 8] tile."""
    device = TensorType((8, 8), DType.float16, (8, 1))
    attrs = (("dtensor", device), ("forloop_dim", -1), ("imap", imap), ("index", 0))
    load = Op(OpKind.BLOCK_INPUT, (), attrs, (TensorType(tile_dims, DType.float16),))
    store = Op(OpKind.BLOCK_OUTPUT, (TensorRef(0),), (("forloop_dim", -1), ("omap", imap)), ())
    return BlockGraph((2, 1, 1), (128, 1, 1), 1, 64, (load, store))


def test_a_well_formed_tiny_block_lowers():
    kernel = lower_block(tiny_block(), "tiny", num_warps=1, num_stages=1)
    assert isinstance(kernel, LoweredKernel)
    assert [str(g.tensor) for g in kernel.global_tiles] == ["%in0:[8,8].fp16.GL",
                                                        "%out0:[8,8].fp16.GL"]


@pytest.mark.parametrize("block, launch, message", [
    (tiny_block(tile_dims=(8, 8)), {}, "block_input b0: its tile [8, 8] is not what imap "
     "(0, -1, -1) and forloop_dim -1 make of %in0 [8, 8] ([4, 8])"),
    (tiny_block(imap=(0, 0, -1)), {}, "maps two grid axes"),
    (tiny_block(), {"num_warps": 3}, "num_warps=3 is not a power of two"),
], ids=["tile_disagrees_with_imap", "bad_imap", "bad_warps"])
def test_what_cannot_be_lowered_is_refused_clearly(block, launch, message):
    with pytest.raises(LoweringError, match=re.escape(message)) as caught:
        lower_block(block, "%7", **launch)
    assert isinstance(caught.value, UnsupportedError)
    assert "lowering %7" in str(caught.value)


def test_a_kernel_operator_inside_a_block_graph_is_refused():
    stray = Op(OpKind.INPUT, (), (("index", 1),), (TensorType((4, 8), DType.float16),))
    store = Op(OpKind.BLOCK_OUTPUT, (TensorRef(1),), (("forloop_dim", -1),
                                                     ("omap", (0, -1, -1))), ())
    block = BlockGraph((2, 1, 1), (128, 1, 1), 1, 64, (tiny_block().ops[0], stray, store))
    with pytest.raises(LoweringError, match="lowering %9: input b1: not an operator of a "
                       "block graph"):
        lower_block(block, "%9", num_warps=4, num_stages=1)


def test_kernel_outputs_that_disagree_with_omap_are_refused():
    with pytest.raises(LoweringError, match=r"block_output b1: omap \(0, -1, -1\) and "
                       r"forloop_dim -1 assemble \[8, 8\], but the kernel's output 0 is \[4, 8\]"):
        lower_block(tiny_block(), "%2", outputs=(TensorType((4, 8), DType.float16, (8, 1)),),
                    num_warps=4, num_stages=1)
