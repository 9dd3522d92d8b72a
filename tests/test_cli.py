"""The ``mugraph`` command line: each subcommand's output, files and exit codes."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import mugraph
from mugraph import cli
from mugraph.library import WORKLOADS

ROOT = Path(__file__).resolve().parents[1]

TINY_PROGRAM = """
import mugraph

def program():
    g = mugraph.new_kernel_graph()
    x = g.new_input((4, 32), dtype=mugraph.float16)
    w = g.new_input((32, 16), dtype=mugraph.float16)
    g.mark_output(g.matmul(g.rms_norm(x, 32), w))
    return g
"""


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str | None] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m mugraph.cli ARGS`` in a fresh process."""
    environ = dict(os.environ)
    environ["PYTHONPATH"] = str(ROOT) + os.pathsep + environ.get("PYTHONPATH", "")
    for name, value in (env or {}).items():  # None: unset
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    return subprocess.run(
        [sys.executable, "-m", "mugraph.cli", *args], cwd=cwd or ROOT, env=environ,
        capture_output=True, text=True, timeout=timeout,
    )


def call(capsys, *args: str) -> tuple[int, str, str]:
    """``cli.main(ARGS)`` in this process: (exit code, stdout, stderr)."""
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_error_line(err: str, *fragments: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("mugraph: error: ")
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0]


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def graphs(tmp_path):
    """JSON files: the Fig 4c GQA μGraph and its program, RMSNorm+Linear fused and naive,
    and a graph of the same interface that computes something else."""
    gqa = WORKLOADS["attention_mirage_gqa"]
    rms = WORKLOADS["rmsnorm_linear"]
    s = rms.small
    other = mugraph.new_kernel_graph()
    x = other.new_input((s["m"], s["k"]))
    w = other.new_input((s["k"], s["n"]))
    other.mark_output(other.matmul(x, w))  # no normalisation
    files = {
        "gqa": gqa.optimized(gqa.small),
        "gqa_naive": gqa.naive(gqa.small),
        "rms": rms.optimized(s),
        "rms_naive": rms.naive(s),
        "other": other,
    }
    paths = {}
    for name, graph in files.items():
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(graph.to_json())
    return paths


# ---- help -------------------------------------------------------------------------------------


def test_console_help_in_a_fresh_process():
    done = run_cli("--help")
    assert done.returncode == 0
    for command in ("optimize", "show", "verify", "cache"):
        assert command in done.stdout


@pytest.mark.parametrize("command, expected", [
    ("optimize", ["PROGRAM.py", "--time-limit", "--workers", "--max-block-ops",
                  "--max-custom-kernels", "--config", "--out", "--no-progress", "--debug"]),
    ("show", ["GRAPH.json", "--svg", "--html"]),
    ("verify", ["A.json", "B.json", "--delta", "--max-rounds", "--seed"]),
    ("cache", ["ls", "clear"]),
])
def test_subcommand_help(capsys, command, expected):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for word in expected:
        assert word in out


def test_version_and_missing_command(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert mugraph.__version__ in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        cli.main([])
    assert exit_info.value.code == 2


# ---- optimize ------------------------------------------------------------------------------------


def test_optimize_writes_the_best_graph(tmp_path):
    program = write(tmp_path / "tiny_rms.py", TINY_PROGRAM)
    out = tmp_path / "out"
    # without TRITON_INTERPRET (and here without a GPU): the Triton source is written all the same
    done = run_cli("optimize", str(program), "--time-limit", "20", "--max-custom-kernels", "1",
                   "--workers", "2", "--out", str(out), cwd=tmp_path,
                   env={"TRITON_INTERPRET": None})
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    stdout = done.stdout
    assert "mugraph: optimizing tiny_rms" in stdout
    assert "best μGraph:" in stdout and "customized(%0, %1)" in stdout
    assert "verification: equivalent" in stdout
    assert "estimated time (cost model): program" in stdout
    assert "measured time" in stdout
    assert "[" in done.stderr and "states" in done.stderr  # progress lines (not a TTY)
    for name in ("best.json", "program.json", "search.json", "best.svg", "best.html"):
        assert (out / name).is_file(), name
    best = mugraph.from_json((out / "best.json").read_text())
    program_graph = mugraph.from_json((out / "program.json").read_text())
    assert mugraph.verify(best, program_graph).passed
    search = json.loads((out / "search.json").read_text())
    assert search["improved"] is True and search["candidates"]
    assert search["config"]["max_custom_kernels"] == 1
    assert {"states", "block_graphs", "candidates", "verified", "pruned"} <= set(search["stats"])
    assert all({"hash", "cost_seconds", "verification"} <= set(c) for c in search["candidates"])
    kernels = list((out / "kernels").glob("*.py"))
    assert kernels and "@triton.jit" in kernels[0].read_text()
    assert not (out / "kernels" / "ERROR.txt").exists()
    ET.fromstring((out / "best.svg").read_text())
    assert "<svg" in (out / "best.html").read_text()


def test_optimize_says_when_nothing_better_is_found(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    program = write(tmp_path / "tiny_rms.py", TINY_PROGRAM)
    # two block operators cannot hold rms + matmul + accumulation + division
    code, out, err = call(capsys, "optimize", str(program), "--time-limit", "5",
                          "--max-custom-kernels", "1", "--max-block-ops", "2", "--workers", "1",
                          "--no-progress")
    assert code == 0, err
    assert "No μGraph better than the program was found" in out
    folder = tmp_path / "mugraph_out" / "tiny_rms"  # the default output folder
    assert sorted(p.name for p in folder.iterdir()) == ["program.json", "search.json"]
    assert json.loads((folder / "search.json").read_text())["improved"] is False


def test_search_options_of_the_program_file(capsys, tmp_path, monkeypatch):
    seen = {}

    def fake_search(program, preset, time_limit, overrides, view):
        seen.update(preset=preset, time_limit=time_limit, **overrides)
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_run_search", fake_search)
    program = write(tmp_path / "p.py", TINY_PROGRAM + "\nSEARCH_OPTIONS = "
                    "{'max_custom_kernels': 1, 'max_block_ops': 5, 'preset': 'mlp'}\n")
    code, _, err = call(capsys, "optimize", str(program), "--max-block-ops", "4",
                        "--time-limit", "3", "--no-progress")
    assert code == cli.EXIT_INTERRUPTED and "interrupted" in err
    assert seen == {"preset": "mlp", "time_limit": 3.0, "max_custom_kernels": 1,
                    "max_block_ops": 4}  # the command line wins


def test_kernels_are_written_without_a_gpu_or_the_interpreter(tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    w = WORKLOADS["rmsnorm_linear"]
    note = cli._write_kernels(tmp_path / "kernels", w.optimized(w.small))
    assert note == "kernels/ (1 file)"
    (kernel,) = (tmp_path / "kernels").iterdir()
    assert kernel.suffix == ".py" and "@triton.jit" in kernel.read_text()


@pytest.fixture
def no_search(monkeypatch):
    """The search must not start: it fails the test if it does."""
    def fail(*args, **kwargs):
        raise AssertionError("the search ran")

    monkeypatch.setattr(cli, "_run_search", fail)


@pytest.mark.parametrize("where, fragment", [
    ("a_file", "is a file, not a folder"),
    ("a_file/sub", "is not writable (Not a directory)"),
])
def test_an_unwritable_out_fails_before_the_search(capsys, tmp_path, no_search, where,
                                                  fragment):
    program = write(tmp_path / "p.py", TINY_PROGRAM)
    (tmp_path / "a_file").write_text("not a folder")
    out = tmp_path / where
    code, stdout, err = call(capsys, "optimize", str(program), "--out", str(out),
                             "--no-progress", "--time-limit", "30")
    assert code == 2
    assert_one_error_line(err, f"--out {out} {fragment}", "nothing was searched")
    assert "search:" not in stdout


def test_a_writable_out_is_probed_without_a_trace(tmp_path):
    out = tmp_path / "new" / "deeper"
    cli.check_writable_folder(out, "--out")
    assert list(tmp_path.iterdir()) == []  # the folders the probe made are gone
    out.mkdir(parents=True)
    cli.check_writable_folder(out, "--out")
    assert list(out.iterdir()) == []


def test_debug_reraises(capsys, tmp_path):
    path = write(tmp_path / "prog.py", "x = 1\n")
    with pytest.raises(cli.CliError):
        cli.main(["optimize", str(path), "--debug"])
    with pytest.raises(cli.CliError):
        cli.main(["--debug", "show", str(tmp_path / "missing.json")])


def test_error_line_in_a_fresh_process(tmp_path):
    path = write(tmp_path / "prog.py", "def program():\n    return None\n")
    done = run_cli("optimize", str(path), "--no-progress")
    assert done.returncode == 2
    assert_one_error_line(done.stderr, "returned NoneType")


# ---- progress --------------------------------------------------------------------------------


def _report(elapsed: float, units: int) -> str:
    return (f"[{elapsed:6.1f}/60 s] units {units}/10  states 5  pruned: shape 3  "
            f"verified 0  best -")


def test_progress_lines_without_a_terminal():
    stream = io.StringIO()
    view = cli.ProgressView(stream, budget=60, live=False, interval=3600)
    view(_report(0.1, 1))
    view(_report(0.2, 2))  # within the interval: not printed
    view("search complete: 10/10 units ...")  # the summary is the command's to print
    view.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    assert "units 1/10  states 5  verified 0  best -  pruned: shape 3" in lines[0]
    assert lines[0].startswith("[") and "/60 s]" in lines[0]


def test_progress_live_line():
    stream = io.StringIO()
    view = cli.ProgressView(stream, budget=60, live=True)
    view(_report(0.1, 1))
    view(_report(0.2, 2))
    view.close()
    text = stream.getvalue()
    assert "\r\x1b[K" in text and "units 2/10" in text
    assert text.endswith("\n")


# ---- show ---------------------------------------------------------------------------------------


def test_show_prints_and_draws(capsys, graphs, tmp_path):
    svg, page = tmp_path / "pics" / "gqa.svg", tmp_path / "gqa.html"
    code, out, err = call(capsys, "show", str(graphs["gqa"]), "--svg", str(svg),
                          "--html", str(page))
    assert code == 0, err
    assert "KernelGraph (3 inputs, 1 outputs)" in out
    assert "block graph grid=(2, 4, 1)" in out
    assert "estimated time (cost model)" in out
    assert f"wrote {svg}" in out and f"wrote {page}" in out
    root = ET.fromstring(svg.read_text())
    assert root.tag.endswith("svg")
    assert "imap {x:0, y:3, z:-}" in svg.read_text()
    assert "<svg" in page.read_text() and "block_input(input[0]" in page.read_text()


# ---- verify ------------------------------------------------------------------------------------


def test_verify_equivalent(capsys, graphs):
    code, out, err = call(capsys, "verify", str(graphs["rms"]), str(graphs["rms_naive"]),
                          "--seed", "1")
    assert code == 0, err
    assert out.startswith("equivalent")
    assert "bound: false-pass probability <=" in out


def test_verify_gqa_against_its_program(capsys, graphs):
    code, out, _ = call(capsys, "verify", str(graphs["gqa"]), str(graphs["gqa_naive"]),
                        "--max-rounds", "8", "--delta", "1e-3")
    assert code == 0
    assert "equivalent" in out and "bound:" in out


def test_verify_not_equivalent(capsys, graphs):
    code, out, _ = call(capsys, "verify", str(graphs["rms"]), str(graphs["other"]))
    assert code == 1
    assert "NOT equivalent" in out and "not equivalent)" in out


def test_verify_exit_codes_in_a_fresh_process(graphs):
    assert run_cli("verify", str(graphs["rms"]), str(graphs["rms_naive"])).returncode == 0
    assert run_cli("verify", str(graphs["rms"]), str(graphs["other"])).returncode == 1


# ---- cache -------------------------------------------------------------------------------------


def test_cache_ls_and_clear(capsys, tmp_path, monkeypatch, graphs):
    from mugraph.cache import ResultCache

    folder = tmp_path / "cache"
    monkeypatch.setenv("MUGRAPH_CACHE_DIR", str(folder))
    code, out, _ = call(capsys, "cache", "ls")
    assert code == 0 and "is empty" in out and str(folder) in out
    program = mugraph.from_json(graphs["rms_naive"].read_text())
    best = mugraph.from_json(graphs["rms"].read_text())
    ResultCache().put(program, None, best, None)
    code, out, _ = call(capsys, "cache", "ls")
    assert code == 0
    assert "1 entry" in out and program.structural_hash()[:16] in out and "improved" in out
    ResultCache().measurements.put("tiling", {"program": "p"}, {"tiling": {}})
    code, out, _ = call(capsys, "cache", "ls")
    assert "1 measured choice (" in out and str(folder / "measured") in out
    code, out, _ = call(capsys, "cache", "clear")
    assert code == 0 and "removed 2 entries" in out
    code, out, _ = call(capsys, "cache", "ls", "--dir", str(folder))
    assert "is empty" in out and "measured choice" not in out


def test_cache_ls_says_why_an_entry_is_invalid(capsys, tmp_path):
    (tmp_path / "0123.json").write_text('{"hello": "world"}')
    code, out, _ = call(capsys, "cache", "ls", "--dir", str(tmp_path))
    assert code == 0
    assert "invalid: foreign file: not a mugraph cache entry" in out


def test_cache_entries_as_objects(capsys, monkeypatch):
    class Entry:
        key, size, created, program_hash = "k" * 40, 2048, 0.0, "p" * 32

    class FakeCache:
        path = "/somewhere"

        def __init__(self, path=None):
            pass

        def entries(self):
            return [Entry()]

        def clear(self):
            return 3

    monkeypatch.setattr(cli, "_result_cache", lambda path: FakeCache(path))
    code, out, _ = call(capsys, "cache", "ls")
    assert code == 0 and "k" * 16 in out and "2.0 KB" in out and "p" * 16 in out
    code, out, _ = call(capsys, "cache", "clear")
    assert "removed 3 entries from /somewhere" in out


def test_cache_unavailable(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "mugraph.cache", None)  # the import fails
    code, out, err = call(capsys, "cache", "ls")
    assert code == 2
    assert_one_error_line(err, "the result cache is not available in this version")


# ---- bundled examples --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["rmsnorm_linear", "gated_mlp", "attention"])
def test_bundled_examples_define_programs(name):
    graph, options = cli.load_program(ROOT / "examples" / "programs" / f"{name}.py")
    assert isinstance(graph, mugraph.KernelGraph)
    graph.check()
    assert isinstance(options, dict)


def test_readme_set_up_commands_and_cpu_notes():
    """The README's test command is the one CI runs; it says how to run kernels on the CPU and
    does not promise that a plain pip keeps PyTorch's CPU build."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    blocks = readme.split("```bash\n")[1:3]
    commands = [block.split("\n```")[0].strip() for block in blocks]
    assert commands[1] == ci
    assert commands[0].startswith("pip install torch==2.13.0 && pip install -e . && mugraph "
                                  "optimize examples/programs/rmsnorm_linear.py")
    assert (ROOT / "examples" / "programs" / "rmsnorm_linear.py").is_file()
    assert "keeps PyTorch's CPU build" not in readme
    assert "TRITON_INTERPRET=1 python" in " ".join(readme.split())
    assert "before Python imports triton" in " ".join(readme.split())
