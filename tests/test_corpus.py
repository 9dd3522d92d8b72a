"""The must-reject corpus (tests/corpus/): malformed programs, maps, JSON documents, texts of
μGraphs and command lines, each with the mugraph error it must raise and fragments of its
message.

Every program entry is also run through ``mugraph optimize`` and every JSON or text entry
through ``mugraph show``, in this process: the command line must fail with one error line
naming the same error, before any search.
"""

from __future__ import annotations

import importlib.util
import json
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import mugraph
from mugraph import cli

CORPUS = Path(__file__).parent / "corpus"
MANIFEST = tomllib.loads((CORPUS / "corpus.toml").read_text(encoding="utf-8"))
PROGRAMS = MANIFEST["program"]
DOCUMENTS = MANIFEST["json"]
COMMANDS = MANIFEST["cli"]
TEXTS = MANIFEST["text"]


def load_module(path: Path) -> ModuleType:
    """A corpus program file as a fresh module."""
    spec = importlib.util.spec_from_file_location(f"mugraph_corpus_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _verify(module: ModuleType, options: dict) -> Any:
    other = getattr(module, "other", module.program)
    return mugraph.verify(module.program(), other(), **options)


# stage -> what is done with the entry's module (the step that must raise)
STAGES: dict[str, Callable[[ModuleType, dict], Any]] = {
    "build": lambda module, options: module.program(),
    "call": lambda module, options: module.program()(inputs=module.inputs()),
    "verify": _verify,
    "compile": lambda module, options: mugraph.compile(module.program(), check=False,
                                                       **options),
}


def error_class(name: str) -> type:
    cls = getattr(mugraph, name)
    assert issubclass(cls, mugraph.MugraphError), name
    return cls


def assert_fragments(text: str, fragments: list[str]) -> None:
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in:\n{text}"


# ---- the corpus as a whole -------------------------------------------------------------------


def test_the_corpus_is_large_and_every_entry_has_its_file():
    assert len(PROGRAMS) + len(DOCUMENTS) + len(TEXTS) + len(COMMANDS) >= 60
    assert {p.stem for p in (CORPUS / "programs").glob("*.py")} == set(PROGRAMS)
    assert {p.stem for p in (CORPUS / "json").glob("*.json")} == set(DOCUMENTS)
    assert {p.stem for p in (CORPUS / "text").glob("*.mgt")} == set(TEXTS)
    for section in (PROGRAMS, DOCUMENTS, TEXTS):
        for name, entry in section.items():
            error_class(entry["error"])
            assert entry["message"] and all(entry["message"]), name
            assert entry.get("stage", "build") in STAGES, name
            assert entry.get("context") in (None, "kernel", "block"), name
    for name, entry in COMMANDS.items():
        assert entry["stderr"] and entry["exit"] != 0, name


# ---- programs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_program_is_rejected(name):
    entry = PROGRAMS[name]
    module = load_module(CORPUS / "programs" / f"{name}.py")
    step = STAGES[entry.get("stage", "build")]
    with pytest.raises(error_class(entry["error"])) as caught:
        step(module, entry.get("options", {}))
    text = str(caught.value)
    assert_fragments(text, entry["message"])
    level = entry.get("context")
    if level is not None:  # the surrounding graph, the rejected operator marked
        assert f"in {level} graph:" in text and "<- rejected" in text, text
        assert re.search(r">>> \S", text), text


BUILT_PROGRAMS = sorted(n for n, e in PROGRAMS.items() if e.get("stage", "build") == "build")


@pytest.mark.parametrize("name", BUILT_PROGRAMS)
def test_program_is_rejected_by_the_command_line(name, capsys, tmp_path):
    entry = PROGRAMS[name]
    path = CORPUS / "programs" / f"{name}.py"
    code = cli.main(["optimize", str(path), "--no-progress", "--out", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert code == cli.EXIT_ERROR
    (line,) = err.strip().splitlines()
    assert line.startswith(f"mugraph: error: {entry['error']}: "), line
    assert entry["message"][0] in line, line
    assert "search:" not in out and not (tmp_path / "out").exists()


# ---- JSON documents ----------------------------------------------------------------------------


def assert_load_rejects(load: Callable[[str], Any], path: Path, entry: dict):
    """``load`` of the file's text raises the entry's error; returns (text, the error)."""
    text = path.read_text(encoding="utf-8")
    with pytest.raises(error_class(entry["error"])) as caught:
        load(text)
    assert_fragments(str(caught.value), entry["message"])
    return text, caught


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_document_is_rejected(name):
    entry = DOCUMENTS[name]
    text, caught = assert_load_rejects(mugraph.from_json, CORPUS / "json" / f"{name}.json", entry)
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        return
    if isinstance(parsed, dict):  # the same document, parsed already: the same answer
        with pytest.raises(error_class(entry["error"])) as again:
            mugraph.from_json(parsed)
        assert str(again.value) == str(caught.value)


def assert_show_rejects(path: Path, entry: dict, capsys) -> None:
    """``mugraph show PATH`` fails with one error line naming the entry's error and file."""
    assert cli.main(["show", str(path)]) == cli.EXIT_ERROR
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"mugraph: error: {entry['error']}: {path}: "), line
    assert entry["message"][0] in line, line


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_document_is_rejected_by_the_command_line(name, capsys):
    assert_show_rejects(CORPUS / "json" / f"{name}.json", DOCUMENTS[name], capsys)


# ---- texts of μGraphs --------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_text_is_rejected(name):
    assert_load_rejects(mugraph.from_text, CORPUS / "text" / f"{name}.mgt", TEXTS[name])


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_text_is_rejected_by_the_command_line(name, capsys):
    assert_show_rejects(CORPUS / "text" / f"{name}.mgt", TEXTS[name], capsys)


# ---- command lines -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_command_line_is_rejected(name, capsys, tmp_path):
    entry = COMMANDS[name]
    args = [a.format(corpus=CORPUS, tmp=tmp_path) for a in entry["args"]]
    try:
        code = cli.main(args)
    except SystemExit as stop:  # argparse's own errors
        code = stop.code
    out, err = capsys.readouterr()
    assert code == entry["exit"], (out, err)
    assert_fragments(err, entry["stderr"])
    assert "Traceback" not in err and "internal error" not in err
    assert not re.search(r"invalid _?\w+ value", err), err  # a parser function's own name
