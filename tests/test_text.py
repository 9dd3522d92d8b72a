"""The text form of μGraphs (mugraph.ir.text): every graph mugraph builds or searched reads
back equal (same structural hash, same JSON), a golden text for the Fig 4c GQA μGraph, values
of every kind, and the command line reading and printing it. Malformed texts are in the
must-reject corpus (tests/corpus/text/)."""

from __future__ import annotations

from pathlib import Path

import pytest
from known_graphs import library_graphs, searched_graphs  # tests/known_graphs.py

import mugraph
from mugraph import cli
from mugraph.dtypes import DType
from mugraph.ir.ops import AccumKind, OpKind
from mugraph.ir.serialize import to_json
from mugraph.ir.tensor import TensorType
from mugraph.ir.text import _Cursor, _value, value_text
from mugraph.library import WORKLOADS

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden" / "gqa_fig4c_small.mgt"


def assert_round_trip(graph) -> None:
    again = mugraph.from_text(mugraph.to_text(graph))
    assert again.structural_hash() == graph.structural_hash()
    assert to_json(again) == to_json(graph)
    assert mugraph.to_text(again) == mugraph.to_text(graph)


@pytest.mark.parametrize("name", [n for n, _ in library_graphs()])
def test_every_library_graph_reads_back_equal(name):
    assert_round_trip(dict(library_graphs())[name])


def test_every_searched_suite_graph_reads_back_equal():
    graphs = dict(searched_graphs())
    assert len(graphs) >= 20
    for graph in graphs.values():
        assert_round_trip(graph)


def test_the_fig4c_gqa_graph_is_written_as_the_golden_text():
    workload = WORKLOADS["attention_mirage_gqa"]
    graph = workload.optimized(workload.small)
    golden = GOLDEN.read_text(encoding="utf-8")
    assert "\n".join(line for line in golden.splitlines() if not line.startswith("#")) + "\n" == (
        graph.to_text()
    )
    assert mugraph.from_text(golden).structural_hash() == graph.structural_hash()


VALUES = [
    0, -1, 7, 1.5, 1e-06, float("inf"), -float("inf"), "a \"quoted\" name", None, True, False,
    (), (3,), (0, -1, (2, 3)), AccumKind.RMS, OpKind.EXP,
    TensorType((4, 8), DType.bfloat16, (8, 1)), TensorType((2, 3), DType.float32),
    TensorType((), DType.float16),
]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_every_kind_of_attribute_value_reads_back(value):
    text = value_text(value)
    cursor = _Cursor(text, "test")
    again = _value(cursor)
    assert cursor.done(), text
    assert again == value and type(again) is type(value), text


def test_nan_reads_back_as_nan():
    again = _value(_Cursor(value_text(float("nan")), "test"))
    assert again != again


def test_comments_and_blank_lines_are_ignored():
    workload = WORKLOADS["attention_mirage_gqa"]
    graph = workload.optimized(workload.small)
    commented = graph.to_text().replace("\n%4", "\n\n  # the combining kernel\n%4")
    text = "# a bug report\n\n" + commented
    assert mugraph.from_text(text).structural_hash() == graph.structural_hash()


def test_show_prints_the_text_form_and_reads_it_back(tmp_path, capsys):
    workload = WORKLOADS["attention_mirage_gqa"]
    graph = workload.optimized(workload.small)
    path = tmp_path / "graph.json"
    path.write_text(graph.to_json())
    assert cli.main(["show", str(path), "--text"]) == cli.EXIT_OK
    printed = capsys.readouterr().out
    assert printed == graph.to_text()
    text_file = tmp_path / "graph.txt"  # recognised by its header line, whatever the suffix
    text_file.write_text(printed)
    assert cli.main(["show", str(text_file)]) == cli.EXIT_OK
    assert "customized" in capsys.readouterr().out


def test_from_text_refuses_what_is_not_a_str():
    with pytest.raises(mugraph.SerializationError, match="from_text: expected a str, got dict"):
        mugraph.from_text({"format": "mugraph"})
