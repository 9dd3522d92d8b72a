"""The ``mugraph`` command line: optimize a program, show / verify μGraphs, manage the cache.

    mugraph optimize PROGRAM.py [--time-limit S] [--workers N] [--cluster [ADDRESS]] [--out DIR]
    mugraph show GRAPH.json|GRAPH.mgt [--text | --lowered] [--svg FILE] [--html FILE]
    mugraph verify A.json B.json [--delta D] [--max-rounds N] [--seed S]
    mugraph cache ls | clear

Errors are reported as one line on stderr (``mugraph: error: ...``) with a non-zero exit
code; ``--debug`` re-raises them with the traceback instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

EXIT_OK, EXIT_NOT_EQUIVALENT, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130
# the presets of mugraph.search.space (named here so that --help imports nothing heavy)
PRESET_NAMES = (
    "attention", "gemv", "lora", "mlp", "elementwise", "generic",
    "norm_linear", "gated_mlp", "attention_block", "lora_block", "linear_epilogue",
)
DEFAULT_TIME_LIMIT = 60.0
LOCAL_RAY = "local"  # --cluster without an address: start a local Ray


class CliError(Exception):
    """A problem with what the user asked for (a missing file, a bad program...)."""


# ---- loading programs and graphs ----------------------------------------------------------


def load_program(path: str | os.PathLike):
    """Run a Python file and return the KernelGraph its ``program()`` function builds, and
    the search options it suggests (its optional ``SEARCH_OPTIONS`` dict)."""
    from mugraph.ir.builder import KernelGraph

    file = Path(path)
    if not file.is_file():
        raise CliError(f"no such program file: {file}")
    module = _import_file(file)
    make = getattr(module, "program", None)
    if not callable(make):
        raise CliError(f"{file} defines no program() function returning a KernelGraph")
    try:
        graph = make()
    except Exception as error:
        if _is_mugraph_error(error):
            raise
        raise CliError(f"program() in {file} raised {_describe_error(error)}") from error
    if not isinstance(graph, KernelGraph):
        raise CliError(
            f"program() in {file} returned {type(graph).__name__}, not a mugraph KernelGraph"
        )
    return graph, _suggested_options(module, file)


def _suggested_options(module, file: Path) -> dict[str, Any]:
    """``SEARCH_OPTIONS`` of a program file: SearchConfig fields (and ``preset``), which the
    command line's options override."""
    from mugraph.errors import MugraphError
    from mugraph.search.config import SearchConfig

    options = getattr(module, "SEARCH_OPTIONS", None)
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise CliError(f"SEARCH_OPTIONS in {file} must be a dict, got {type(options).__name__}")
    known = {f.name for f in dataclasses.fields(SearchConfig)} | {"preset"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise CliError(f"SEARCH_OPTIONS in {file} names unknown search options {unknown}")
    try:  # every value one a search can use, refused here before anything runs
        SearchConfig().with_overrides(**{k: v for k, v in options.items() if k != "preset"})
    except MugraphError as error:
        raise CliError(f"SEARCH_OPTIONS in {file}: {error}") from None
    return dict(options)


def _import_file(file: Path):
    """Import ``file`` as a fresh module; its folder is importable while it runs."""
    name = "mugraph_user_program_" + re.sub(r"\W", "_", file.stem)
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise CliError(f"cannot load {file} as a Python module")
    module = importlib.util.module_from_spec(spec)
    folder = str(file.resolve().parent)
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        if _is_mugraph_error(error):
            raise
        raise CliError(f"could not run {file}: {_describe_error(error)}") from error
    finally:
        if folder in sys.path:
            sys.path.remove(folder)
    return module


def load_graph(path: str | os.PathLike):
    """Read a μGraph: a JSON document (``KernelGraph.to_json``) or, for a ``.mgt`` file or
    one that starts with the text form's header, the text form (``KernelGraph.to_text``)."""
    from mugraph.ir.serialize import from_json
    from mugraph.ir.text import HEADER, from_text

    file = Path(path)
    if not file.is_file():
        raise CliError(f"no such graph file: {file}")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise CliError(f"cannot read {file}: {error}") from error
    meaningful = [ln.strip() for ln in text.splitlines() if ln.strip() and ln[:1] != "#"]
    is_text = file.suffix == ".mgt" or meaningful[:1] == [HEADER]
    try:
        return from_text(text) if is_text else from_json(text)
    except Exception as error:
        if _is_mugraph_error(error):
            raise type(error)(f"{file}: {error}") from error
        raise


def _is_mugraph_error(error: BaseException) -> bool:
    from mugraph.errors import MugraphError

    return isinstance(error, MugraphError)


def _describe_error(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


# ---- progress ------------------------------------------------------------------------------

_STAMP = re.compile(r"^\[\s*[\d.]+/[\d.]+ s\]\s*")
_PRUNED = re.compile(r"^(?P<head>.*?)\s+(?P<pruned>pruned: .*?)\s+(?P<tail>verified .*)$")


class ProgressView:
    """Renders the search's progress reports.

    On a terminal, one live line (redrawn in place, with a ticking clock); otherwise a plain
    line at most every ``interval`` seconds. The driver's reports are
    ``"[elapsed/budget s] units ... states ... pruned: ... verified ... best ..."``; the stamp
    is replaced by this view's own clock, everything else is shown as it comes.
    """

    def __init__(self, stream: TextIO, budget: float, live: bool | None = None,
                 interval: float = 5.0) -> None:
        self.stream = stream
        self.budget = budget
        self.live = _is_tty(stream) if live is None else live
        self.interval = interval
        self.started = time.monotonic()
        self.body = "starting..."
        self.last_print = float("-inf")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def __call__(self, line: str) -> None:
        if line.startswith("search "):  # the final summary: the command prints its own
            return
        if not _STAMP.match(line):
            self._emit_plain(line)
            return
        self.body = _reorder(_STAMP.sub("", line))
        if self.live:
            self._start_ticker()  # after the worker pool has forked
            self._redraw()
        elif time.monotonic() - self.last_print >= self.interval:
            self._emit_plain(self.text())

    def text(self) -> str:
        elapsed = time.monotonic() - self.started
        return f"[{elapsed:6.1f}/{self.budget:.0f} s] {self.body}"

    def _redraw(self) -> None:
        width = max(20, shutil.get_terminal_size((100, 20)).columns - 1)
        with self._lock:
            self.stream.write("\r\x1b[K" + self.text()[:width])
            self.stream.flush()

    def _emit_plain(self, text: str) -> None:
        with self._lock:
            if self.live:
                self.stream.write("\r\x1b[K")
            self.stream.write(text + "\n")
            self.stream.flush()
            self.last_print = time.monotonic()

    def _start_ticker(self) -> None:
        if self._ticker is not None:
            return
        self._ticker = threading.Thread(target=self._tick, name="mugraph-progress", daemon=True)
        self._ticker.start()

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            self._redraw()

    def close(self) -> None:
        """Stop the clock; leave the last line on screen."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            with self._lock:
                self.stream.write("\r\x1b[K" + self.text() + "\n")
                self.stream.flush()


def _reorder(body: str) -> str:
    """Put the (long) pruning counts last, so a cut-off live line keeps verified / best."""
    match = _PRUNED.match(body)
    if match is None:
        return body
    return f"{match['head']}  {match['tail']}  {match['pruned']}"


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False


# ---- optimize --------------------------------------------------------------------------------


def cmd_optimize(args: argparse.Namespace) -> int:
    """Search the program's μGraphs and write the best one with pictures and kernels."""
    program, suggested = load_program(args.program)
    name = Path(args.program).stem
    out = Path(args.out) if args.out else Path("mugraph_out") / name
    check_writable_folder(out, "--out" if args.out else "the output folder")
    say = _printer(sys.stdout)
    say(f"mugraph: optimizing {name} ({args.program})")
    say(str(program))
    preset = args.config or suggested.pop("preset", None)
    budget = args.time_limit or suggested.pop("time_limit", None) or DEFAULT_TIME_LIMIT
    overrides = {**suggested, **_search_overrides(args)}
    overrides.pop("time_limit", None)
    say(f"search: {budget:g} s budget, {_workers_text(overrides)}"
        + "".join(f", {k}={v}" for k, v in overrides.items()
                  if k not in ("workers", "engine", "address"))
        + (f", preset {preset}" if preset else "")
        + (f" (SEARCH_OPTIONS of {Path(args.program).name}: "
           f"{', '.join(sorted(suggested))})" if suggested else ""))
    view = None if args.no_progress else ProgressView(sys.stderr, budget)
    try:
        best = _run_search(program, preset, budget, overrides, view)
    finally:
        if view is not None:
            view.close()
    result = best.search_result
    say(result.summary())
    report = _report(program, best, result)
    _print_report(say, report, best)
    files = _write_outputs(out, program, best, result, report, name)
    say(f"wrote {out}/: " + ", ".join(files))
    return EXIT_OK


def check_writable_folder(folder: Path, what: str) -> None:
    """Raise CliError unless ``folder`` can be created (if missing) and written to: tried for
    real with a probe file, before a search whose results would have nowhere to go. Folders
    the probe creates are removed again."""
    if folder.exists() and not folder.is_dir():
        raise CliError(f"{what} {folder} is a file, not a folder; nothing was searched")
    created: list[Path] = []
    missing = folder
    while not missing.exists() and missing.parent != missing:
        created.append(missing)
        missing = missing.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder, prefix=".mugraph-probe-"):
            pass
    except OSError as error:
        reason = error.strerror or str(error)
        raise CliError(f"{what} {folder} is not writable ({reason}); nothing was searched") \
            from None
    finally:
        for path in created:  # deepest first
            try:
                path.rmdir()
            except OSError:
                break


def _printer(stream: TextIO) -> Callable[[str], None]:
    def say(text: str = "") -> None:
        stream.write(text + "\n")
        stream.flush()

    return say


def _workers_text(overrides: dict) -> str:
    workers = overrides.get("workers")
    if overrides.get("engine") == "ray":
        where = overrides.get("address") or "a local Ray"
        return f"{workers or 'all the'} Ray worker{'s' * (workers != 1)} on {where}"
    count = workers or os.cpu_count() or 1
    return f"{count} worker{'s' * (count != 1)}"


def _search_overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    if args.workers is not None:
        overrides["workers"] = args.workers
    if args.max_block_ops is not None:
        overrides["max_block_ops"] = args.max_block_ops
    if args.max_custom_kernels is not None:
        overrides["max_custom_kernels"] = args.max_custom_kernels
    if args.cluster is not None:
        overrides["engine"] = "ray"
        if args.cluster != LOCAL_RAY:
            overrides["address"] = args.cluster
    return overrides


def _run_search(program, preset: str | None, time_limit: float, overrides: dict,
                view: ProgressView | None):
    """``KernelGraph.superoptimize`` with progress; returns the best graph (or the program)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="mugraph: the search found no verified")
        return program.superoptimize(
            preset, time_limit=time_limit, progress=view or False, **overrides
        )


def _report(program, best, result) -> dict[str, Any]:
    """What the search achieved: costs (estimated, measured when a GPU is present)."""
    from mugraph.optimize.cost_model import estimate

    found = best is not program
    program_cost = estimate(program).seconds
    best_cost = estimate(best).seconds if found else None
    improved = found and best_cost < program_cost
    report: dict[str, Any] = {
        "found": found,
        "improved": improved,
        "program_cost_seconds": program_cost,
        "best_cost_seconds": best_cost,
        "verification": str(getattr(best, "verification", "")) if found else None,
    }
    if found:
        report["measured"] = _measure(program, best)
    return report


def _measure(program, best) -> dict[str, Any]:
    """Median times on the GPU of the program and the best μGraph (skipped without CUDA)."""
    if not _nvidia_driver_present():
        return {"skipped": "no CUDA GPU"}  # without importing torch (seconds) to find out
    try:
        import torch
    except ImportError:
        return {"skipped": "PyTorch is not installed"}
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA GPU"}
    import mugraph
    from mugraph.optimize.profile import profile_program

    out: dict[str, Any] = {}
    for key, graph in (("program", program), ("best", best)):
        try:
            measurement = profile_program(mugraph.compile(graph))
        except Exception as error:  # noqa: BLE001 - a failed measurement is reported, not fatal
            out[f"{key}_error"] = _describe_error(error)
            continue
        if measurement.ok:
            out[f"{key}_seconds"] = measurement.seconds
        else:
            out[f"{key}_error"] = measurement.error
    return out


def _nvidia_driver_present() -> bool:
    """A cheap look for an NVIDIA driver (true also when torch is already imported)."""
    if "torch" in sys.modules:
        return True
    return Path("/proc/driver/nvidia/version").exists() or any(Path("/dev").glob("nvidia[0-9]*"))


def _us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:.2f} us"


def _print_report(say, report: dict, best) -> None:
    if not report["found"]:
        say("")
        say("No μGraph better than the program was found: no verified candidate within the "
            "search space and time budget. The program is unchanged (try a larger "
            "--time-limit, --max-block-ops or --max-custom-kernels).")
        return
    say("")
    say("best μGraph:")
    say(str(best))
    say(f"verification: {report['verification']}")
    ranking = getattr(best, "ranking", None)
    if ranking is not None:
        say(ranking.summary())
    program_cost, best_cost = report["program_cost_seconds"], report["best_cost_seconds"]
    speedup = program_cost / best_cost if best_cost else float("inf")
    say(f"estimated time (cost model): program {_us(program_cost)}, best {_us(best_cost)} "
        f"({speedup:.2f}x)")
    measured = report.get("measured", {})
    if "skipped" in measured:
        say(f"measured time: skipped ({measured['skipped']})")
    else:
        slow, fast = measured.get("program_seconds"), measured.get("best_seconds")
        ratio = f" ({slow / fast:.2f}x)" if slow and fast else ""
        say(f"measured time (GPU, median): program {_us(slow)}, best {_us(fast)}{ratio}"
            + "".join(f"; {k}: {v}" for k, v in measured.items() if k.endswith("_error")))
    if not report["improved"]:
        say("The best μGraph found is not faster than the program by the cost model: nothing "
            "better was found; best.json is written for inspection.")


def _write_outputs(out: Path, program, best, result, report: dict, name: str) -> list[str]:
    """program.json and search.json always; best.json, kernels/, best.svg/.html when found."""
    from mugraph import visualize

    out.mkdir(parents=True, exist_ok=True)
    files = ["program.json", "search.json"]
    (out / "program.json").write_text(program.to_json(), encoding="utf-8")
    search = _search_document(program, result, report, name)
    (out / "search.json").write_text(json.dumps(search, indent=1), encoding="utf-8")
    if not report["found"]:
        return files
    (out / "best.json").write_text(best.to_json(), encoding="utf-8")
    files.append("best.json")
    files.append(_write_kernels(out / "kernels", best))
    (out / "best.svg").write_text(visualize.to_svg(best), encoding="utf-8")
    notes = [f"program: {name}", f"verification: {report['verification']}",
             f"estimated time: program {_us(report['program_cost_seconds'])}, "
             f"best {_us(report['best_cost_seconds'])}"]
    html_text = visualize.to_html(best, title=f"best μGraph for {name}", notes=notes)
    (out / "best.html").write_text(html_text, encoding="utf-8")
    return files + ["best.svg", "best.html"]


def _write_kernels(folder: Path, graph) -> str:
    """The generated Triton source of each custom kernel (no GPU needed to generate it)."""
    import mugraph

    if folder.exists():
        for old in folder.glob("*.py"):
            old.unlink()
    try:  # the source only: checking the kernels needs a GPU (or the interpreter) and time
        paths = mugraph.compile(graph, check=False).save_codes(folder)
    except Exception as error:  # noqa: BLE001 - the search result stays useful without them
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "ERROR.txt").write_text(f"code generation failed: {error}\n", encoding="utf-8")
        return "kernels/ (code generation failed: see kernels/ERROR.txt)"
    return f"kernels/ ({len(paths)} file{'s' * (len(paths) != 1)})"


def _search_document(program, result, report: dict, name: str) -> dict[str, Any]:
    stats = result.stats
    return {
        "program": name,
        "program_hash": program.structural_hash(),
        "improved": report["improved"],
        "found": report["found"],
        "report": report,
        "summary": result.summary(),
        "elapsed": result.elapsed,
        "timed_out": result.timed_out,
        "interrupted": result.interrupted,
        "units_done": result.units_done,
        "units_total": result.units_total,
        "stats": {
            "states": stats.states,
            "block_graphs": stats.block_graphs,
            "candidates": stats.candidates,
            "verified": len(result.candidates),
            "pruned": dict(stats.pruned),
        },
        "config": config_document(result.config),
        "candidates": [
            {"hash": c.hash, "cost_seconds": c.cost, "verification": str(c.verification)}
            for c in result.candidates
        ],
    }


def config_document(config) -> dict[str, Any]:
    """A SearchConfig as JSON data (sets sorted, enums by value)."""
    return {f.name: _json_value(getattr(config, f.name)) for f in dataclasses.fields(config)}


def _json_value(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        return sorted(str(_json_value(v)) for v in value)
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


# ---- show -----------------------------------------------------------------------------------


def cmd_show(args: argparse.Namespace) -> int:
    """Print a μGraph (or a persistent kernel's task graph); optionally write it as an SVG
    picture or an HTML page."""
    from mugraph import visualize
    from mugraph.optimize.cost_model import estimate

    if _is_task_graph(args.graph):
        if args.lowered:
            raise CliError(f"--lowered: {args.graph} is a task graph; show the μGraph of its "
                           "layers instead")
        return _show_task_graph(args)
    graph = load_graph(args.graph)
    say = _printer(sys.stdout)
    if args.text:
        say(graph.to_text().rstrip("\n"))
        return EXIT_OK
    if args.lowered:
        say(_lowered_text(graph).rstrip("\n"))
        return EXIT_OK
    say(str(graph))
    say(f"estimated time (cost model): {estimate(graph).summary()}")
    if args.svg:
        _write_text(args.svg, visualize.to_svg(graph))
        say(f"wrote {args.svg}")
    if args.html:
        _write_text(args.html, visualize.to_html(graph, title=Path(args.graph).name))
        say(f"wrote {args.html}")
    return EXIT_OK


def _lowered_text(graph) -> str:
    """The lowered IR of every custom kernel of ``graph`` (mugraph.codegen.lowered)."""
    from mugraph.codegen.lowered import lower_graph
    from mugraph.codegen.lowered_text import lowered_text

    kernels = lower_graph(graph)
    if not kernels:
        return "no custom kernels: every operator of this μGraph runs through PyTorch"
    return lowered_text(kernels)


def _is_task_graph(path: str) -> bool:
    from mugraph.persistent.taskgraph import is_task_graph_document

    file = Path(path)
    if not file.is_file():
        return False
    with open(file, encoding="utf-8", errors="replace") as handle:
        return is_task_graph_document(handle.read(200))


def _show_task_graph(args: argparse.Namespace) -> int:
    """``mugraph show TASKS.json``: a task graph written by ``TaskGraph.to_json``."""
    from mugraph.persistent import render
    from mugraph.persistent.taskgraph import TaskGraph

    tg = TaskGraph.from_json(Path(args.graph).read_text(encoding="utf-8"))
    say = _printer(sys.stdout)
    say(render.render_text(tg))
    picture = render.to_svg(tg) if (args.svg or args.html) else None
    if args.svg:
        _write_text(args.svg, picture)
        say(f"wrote {args.svg}")
    if args.html:
        import html

        page = (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>"
                f"{html.escape(Path(args.graph).name)}</title></head><body>{picture}"
                f"<pre>{html.escape(render.render_text(tg, max_lines=10**6))}</pre></body></html>")
        _write_text(args.html, page)
        say(f"wrote {args.html}")
    return EXIT_OK


def _write_text(path: str, text: str) -> None:
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(text, encoding="utf-8")


# ---- verify ---------------------------------------------------------------------------------


def cmd_verify(args: argparse.Namespace) -> int:
    """Test two μGraphs for equivalence over finite fields; exit 0 if equivalent, else 1."""
    from mugraph.search.verify import verify

    a, b = load_graph(args.a), load_graph(args.b)
    result = verify(a, b, delta=args.delta, max_rounds=args.max_rounds, seed=args.seed)
    say = _printer(sys.stdout)
    say(str(result))
    if not result.passed:
        say("bound: none (a test round found a difference: the graphs are not equivalent)")
    elif result.bound is None:
        say("bound: none (the verifier's conditions for a bound do not hold; see the message)")
    else:
        met = "meets" if result.meets_delta else "does not meet"
        say(f"bound: false-pass probability <= {result.bound:.3g} ({met} delta={result.delta:g})")
    for note in result.notes:
        say(f"note: {note}")
    return EXIT_OK if result.passed else EXIT_NOT_EQUIVALENT


# ---- cache ---------------------------------------------------------------------------------


def _result_cache(path: str | None):
    try:
        from mugraph.cache import ResultCache
    except ImportError:
        raise CliError("the result cache is not available in this version") from None
    return ResultCache(path)


def _field(entry: Any, name: str, default: Any = None) -> Any:
    if isinstance(entry, dict):
        return entry.get(name, default)
    return getattr(entry, name, default)


def cmd_cache(args: argparse.Namespace) -> int:
    """List or clear the on-disk cache of search results."""
    cache = _result_cache(args.dir)
    say = _printer(sys.stdout)
    where = getattr(cache, "path", args.dir)
    if args.action == "clear":
        removed = cache.clear()
        say(f"removed {removed} entr{'y' if removed == 1 else 'ies'} from {where}")
        return EXIT_OK
    entries = list(cache.entries())
    measured = cache.measurements.count() if hasattr(cache, "measurements") else 0
    if measured:
        say(f"{measured} measured choice{'' if measured == 1 else 's'} (tilings, launch "
            f"settings, mugraph or PyTorch) in {cache.measurements.path}")
    if not entries:
        say(f"the result cache at {where} is empty")
        return EXIT_OK
    say(f"{'key':<18} {'size':>9}  {'created':<19}  {'program':<18} status")
    total = 0
    for entry in entries:
        size = int(_field(entry, "size", 0) or 0)
        total += size
        say(_cache_row(entry, size))
    say(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}, {_size(total)} in {where}")
    return EXIT_OK


def _cache_row(entry: Any, size: int) -> str:
    created = _field(entry, "created")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(created)) if created else "?"
    program = str(_field(entry, "program") or _field(entry, "program_hash") or "?")
    valid = _field(entry, "valid", True)
    problem = _field(entry, "problem")
    status = (f"invalid: {problem}" if problem else "invalid") if valid is False else (
        "improved" if _field(entry, "improved") else "unimproved"
        if _field(entry, "improved") is not None else "ok")
    arch = _field(entry, "arch")
    if arch:
        status += f" {arch}"
    return f"{str(_field(entry, 'key', '?'))[:16]:<18} {_size(size):>9}  {when:<19}  " \
           f"{program[:16]:<18} {status}"


def _size(count: int) -> str:
    if count < 1024:
        return f"{count} B"
    if count < 1024**2:
        return f"{count / 1024:.1f} KB"
    return f"{count / 1024**2:.1f} MB"


# ---- the parser --------------------------------------------------------------------------


def _number_type(convert: Callable[[str], Any], what: str, accept: Callable[[Any], bool]):
    """An argparse ``type`` that converts with ``convert`` and says what the option takes
    (``what``) when the text does not convert or the value is not accepted."""

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except (ValueError, OverflowError):
            value = None
        if value is None or not accept(value):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


_positive_int = _number_type(int, "a positive integer", lambda v: v >= 1)
_seconds = _number_type(
    float, "a positive number of seconds (e.g. 60 or 2.5)", lambda v: 0 < v < float("inf")
)
_probability = _number_type(
    float, "a probability between 0 and 1 (exclusive, e.g. 1e-9)", lambda v: 0 < v < 1
)
_seed = _number_type(int, "an integer seed", lambda v: True)


def build_parser() -> argparse.ArgumentParser:
    """The ``mugraph`` argument parser with its four subcommands."""
    from mugraph import __version__

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show full tracebacks instead of one-line errors")
    parser = argparse.ArgumentParser(
        prog="mugraph",
        description="mugraph: a multi-level superoptimizer for GPU tensor programs (μGraphs).",
    )
    parser.add_argument("--version", action="version", version=f"mugraph {__version__}")
    parser.add_argument("--debug", action="store_true", default=False,
                        help="show full tracebacks instead of one-line errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    _add_optimize(sub, common)
    _add_show(sub, common)
    _add_verify(sub, common)
    _add_cache(sub, common)
    return parser


def _add_optimize(sub, common) -> None:
    p = sub.add_parser(
        "optimize", parents=[common], help="search the best μGraph for a program",
        description="Search μGraphs equivalent to the program defined by PROGRAM.py (a "
        "function program() returning a KernelGraph), verify them, and write the best one "
        "(best.json, pictures, generated Triton kernels) with the search statistics.",
    )
    p.add_argument("program", metavar="PROGRAM.py", help="Python file defining program()")
    p.add_argument("--time-limit", type=_seconds, default=None, metavar="SECONDS",
                   help=f"search time budget in seconds (default: {DEFAULT_TIME_LIMIT:g})")
    p.add_argument("--workers", type=_positive_int, default=None, metavar="N",
                   help="worker processes (default: all cores)")
    p.add_argument("--cluster", nargs="?", const=LOCAL_RAY, default=None, metavar="ADDRESS",
                   help="run the search's work units on Ray: on the cluster at ADDRESS "
                   "('auto', 'ray://host:10001', ...), or on a local Ray started for it when "
                   "no ADDRESS is given (pip install 'mugraph[cluster]')")
    p.add_argument("--max-block-ops", type=_positive_int, default=None, metavar="N",
                   help="most operators in one block graph")
    p.add_argument("--max-custom-kernels", type=_positive_int, default=None, metavar="N",
                   help="most graph-defined kernels in one μGraph")
    p.add_argument("--config", choices=PRESET_NAMES, default=None,
                   help="a search-space preset (default: the program's shape class)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="output folder (default: ./mugraph_out/<program name>)")
    p.add_argument("--no-progress", action="store_true", help="do not show search progress")
    p.set_defaults(func=cmd_optimize)


def _add_show(sub, common) -> None:
    p = sub.add_parser(
        "show", parents=[common], help="print a μGraph, draw it as SVG / HTML",
        description="Print the μGraph in GRAPH.json; --svg / --html write a picture of it "
        "(the kernel graph with each custom kernel's block graph drawn inside it). A task "
        "graph of a persistent kernel (TaskGraph.to_json) is shown as tasks and events.",
    )
    p.add_argument("graph", metavar="GRAPH.json", help="a μGraph written by mugraph (JSON, "
                   "or the text form: a .mgt file)")
    form = p.add_mutually_exclusive_group()
    form.add_argument("--text", action="store_true", help="print the μGraph's text form (which "
                      "mugraph.from_text and this command read back), nothing else")
    form.add_argument("--lowered", action="store_true", help="print the lowered IR of every "
                      "custom kernel (tensors with layouts and memories, threads, specs before, "
                      "in and after the for-loop, shared-memory and register footprints), "
                      "nothing else")
    p.add_argument("--svg", metavar="FILE", help="write an SVG picture")
    p.add_argument("--html", metavar="FILE", help="write an HTML page (picture + text)")
    p.set_defaults(func=cmd_show)


def _add_verify(sub, common) -> None:
    p = sub.add_parser(
        "verify", parents=[common], help="test two μGraphs for equivalence",
        description="Random testing over finite fields (Mirage §5). Exit code 0 if the graphs "
        "are equivalent, 1 if they are not, 2 on errors.",
    )
    p.add_argument("a", metavar="A.json")
    p.add_argument("b", metavar="B.json")
    p.add_argument("--delta", type=_probability, default=1e-9,
                   help="target false-pass probability (default: 1e-9)")
    p.add_argument("--max-rounds", type=_positive_int, default=64, metavar="N",
                   help="most test rounds (default: 64)")
    p.add_argument("--seed", type=_seed, default=None, help="random seed (an integer)")
    p.set_defaults(func=cmd_verify)


def _add_cache(sub, common) -> None:
    p = sub.add_parser(
        "cache", parents=[common], help="list or clear the result cache",
        description="The on-disk cache of search results (MUGRAPH_CACHE_DIR overrides its "
        "location).",
    )
    p.add_argument("action", choices=("ls", "clear"), help="ls: list entries; clear: remove all")
    p.add_argument("--dir", default=None, metavar="DIR", help="cache folder (default: the "
                   "user cache folder, or $MUGRAPH_CACHE_DIR)")
    p.set_defaults(func=cmd_cache)


# ---- entry point ------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run the ``mugraph`` command; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("mugraph: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as error:
        if args.debug:
            raise
        print(f"mugraph: error: {_error_line(error)}", file=sys.stderr)
        return EXIT_ERROR


def _error_line(error: Exception) -> str:
    """One line for the user: the message's first line, with a hint when more was cut."""
    from mugraph.errors import MugraphError

    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    first = lines[0] if lines else ""
    if isinstance(error, CliError):
        return first
    if isinstance(error, MugraphError):
        kind = type(error).__name__
        more = " (--debug shows the whole message)" if len(lines) > 1 else ""
        return f"{kind}: {first}{more}"
    if isinstance(error, OSError):
        return f"{error.strerror or first}: {error.filename}" if error.filename else first
    return f"internal error: {_describe_error(error)} (--debug shows the traceback)"


if __name__ == "__main__":
    sys.exit(main())
