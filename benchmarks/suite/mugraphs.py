"""Which μGraph mugraph runs for a row.

The runner's headline on a GPU is :func:`superoptimized`: what ``superoptimize`` returns for
the row's program, answered by the result cache the suite's search filled
(``benchmarks/searched/cache``, written by ``python -m benchmarks.search_suite`` on the same
GPU, with the GPU ranking's measured pick and launch settings) — the user's own call with
``cache=``; nothing is screened or tuned by the runner. A row the cache has no answer for
has no mugraph figure and says so. The hand-written μGraphs of :mod:`mugraph.library` are a
separate reference column, never the headline. :func:`choose` is the older view used by the
CPU check mode and the bench scripts: the search's file (``benchmarks/searched/<row>.json``),
else the hand-written μGraph.

Hand-written μGraphs are built by the library at the row's sizes and tile choices; where the
row reads an input through strides (K as a transposed view) the graph's inputs are given the
same strides (the generated kernels take strides as arguments). For QK-norm attention the
library has no μGraph of the whole program: the norms run as pre-defined (PyTorch) kernel
operators in front of the library's attention kernels, and the source says so. Attention rows
also screen the library's one-kernel (flash) form; QK-norm rows start with it, because their
logits reach the head dim and the split-KV form's partial sums of exp overflow float16.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from benchmarks.suite.programs import qknorm_terms
from benchmarks.suite.rows import Row
from mugraph.ir.builder import KernelGraph, new_kernel_graph
from mugraph.ir.ops import OpKind
from mugraph.ir.rebuild import rebuild_kernel_graph
from mugraph.ir.serialize import from_json
from mugraph.ir.tensor import TensorRef, TensorType
from mugraph.library import WORKLOADS

SEARCHED_DIR = Path(__file__).resolve().parents[1] / "searched"
CACHE_DIR = SEARCHED_DIR / "cache"


@dataclass
class Choice:
    """The μGraph for a row: ``source`` is "searched", "hand-written" or "none"."""

    source: str
    graph: KernelGraph | None
    note: str = ""
    label: str = ""  # tile sizes (hand-written) or the search file
    candidates: tuple[tuple[str, KernelGraph], ...] = ()  # tiling variants, for the tuner


def searched_path(row: Row, directory: Path | None = None) -> Path:
    return (directory or SEARCHED_DIR) / f"{row.name}.json"


def load_searched(row: Row, program: KernelGraph, directory: Path | None = None):
    """(graph, document) from the row's search file, or (None, reason) when there is none or
    it does not fit the program (a stale file)."""
    path = searched_path(row, directory)
    if not path.exists():
        return None, "no search result"
    try:
        doc = json.loads(path.read_text())
        graph = from_json(json.dumps(doc["graph"]))
    except Exception as error:  # noqa: BLE001 - an unreadable file is reported, not fatal
        return None, f"unreadable {path.name}: {type(error).__name__}: {error}"
    if not doc.get("verified"):
        return None, f"{path.name} is not marked verified"
    if graph.input_types != program.input_types or graph.output_types != program.output_types:
        return None, f"{path.name} does not match the row's program (stale?)"
    return graph, doc


def alternatives(doc: dict, program: KernelGraph) -> list[KernelGraph]:
    """The other verified candidates a search file keeps (those that fit the program)."""
    out = []
    for alt in doc.get("alternatives", []):
        if not alt.get("verified"):
            continue
        try:
            graph = from_json(json.dumps(alt["graph"]))
        except Exception:  # noqa: BLE001, S112 - an unreadable alternative is skipped
            continue
        if graph.input_types == program.input_types:
            out.append(graph)
    return out


# ---- hand-written μGraphs -----------------------------------------------------------------------


def with_input_types(graph: KernelGraph, types) -> KernelGraph:
    """``graph`` rebuilt with its inputs declared as ``types`` (same dims, other strides)."""
    ops = []
    for op in graph.ops:
        if op.kind is OpKind.INPUT:
            want: TensorType = types[op.attr("index")]
            if want.dims != op.outputs[0].dims or want.dtype != op.outputs[0].dtype:
                raise ValueError(f"input {op.attr('index')}: {want} does not fit {op.outputs[0]}")
            op = replace(op, outputs=(want,))
        ops.append(op)
    return rebuild_kernel_graph(ops, list(graph.outputs))


def _library_sizes(row: Row, tiles, small: bool) -> dict:
    s = dict(row.small if small else row.sizes)
    if row.attention:
        s["h_kv"] = s["h"]
    return {**s, **tiles}


def _splice_after_norms(attention: KernelGraph, program: KernelGraph) -> KernelGraph:
    """QK-norm attention: the program's norms as kernel operators, then ``attention``'s
    custom kernels reading the normalized Q and K."""
    g = new_kernel_graph()
    q, k, v = (g.new_input(t.dims, t.strides, t.dtype) for t in program.input_types)
    d = program.input_types[0].dims[-1]
    qn, kn = qknorm_terms(g, q, k, d)
    head = list(g.ops)
    mapping = {0: qn.ref, 1: kn.ref, 2: v.ref}  # attention's input ops -> these tensors
    ops = list(head)
    offset = len(head)
    n_inputs = sum(1 for op in attention.ops if op.kind is OpKind.INPUT)

    def remap(ref: TensorRef) -> TensorRef:
        if ref.op < n_inputs:
            return mapping[ref.op]
        return TensorRef(ref.op - n_inputs + offset, ref.index)

    for op in attention.ops[n_inputs:]:
        ops.append(replace(op, inputs=tuple(remap(r) for r in op.inputs)))
    return rebuild_kernel_graph(ops, [remap(r) for r in attention.outputs])


def hand_written(row: Row, tiles=None, small: bool = False,
                 library: str | None = None) -> KernelGraph:
    """The library's μGraph for the row at its (or its small) sizes (``library``: another
    workload of the library than the row family's); raises when the library cannot build it
    at these sizes (a tile that does not divide, shared memory)."""
    family = row.family
    library = library or family.library
    if library is None:
        raise LookupError(f"mugraph.library has no μGraph for {family.name}")
    workload = WORKLOADS[library]
    tiles = tiles if tiles is not None else (row.small_tiles if small else row.tiles)
    graph = workload.optimized(_library_sizes(row, tiles, small))
    program = row.program(small=small)
    if family.name == "qknorm_attention":
        graph = with_input_types(graph, [TensorType(t.dims, t.dtype, t.strides)
                                         for t in program.input_types])
        return _splice_after_norms(graph, program)
    if graph.input_types != program.input_types:
        graph = with_input_types(graph, program.input_types)
    return graph


def _tile_label(tiles: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in tiles.items() if k not in ("h_tile", "h_tile2"))


def hand_written_choice(row: Row, small: bool = False) -> Choice:
    flash = _flash_candidates(row, small) if row.attention else []
    try:
        graph = hand_written(row, small=small)
    except Exception as error:  # noqa: BLE001 - the row reports why it has no μGraph
        why = (f"library {row.family.library}: "
               f"{type(error).__name__}: {str(error).splitlines()[0][:160]}")
        if not flash:
            return Choice("none", None, why)
        label, graph = flash[0]
        return Choice("hand-written", graph, f"mugraph.library {FLASH_LIBRARY} ({why})", label,
                      tuple(flash))
    note = f"mugraph.library {row.family.library}"
    if row.family.name == "qknorm_attention":
        note += " kernels after the norms as pre-defined (PyTorch) operators"
    tiles = row.small_tiles if small else row.tiles
    candidates = [(_tile_label(tiles), graph)]
    if not small:
        for variant in row.variants:
            try:
                candidates.append((_tile_label(variant), hand_written(row, variant)))
            except Exception:  # noqa: BLE001, S112 - a tiling that does not fit is skipped
                continue
    if flash and row.family.name == "qknorm_attention":
        # logits reach d after the norms: the split-KV form's partial sums of exp overflow
        # float16, the one-kernel form's exp runs with the running row max subtracted
        note += "; one-kernel (flash) form first: split-KV partial sums overflow float16"
        label, graph = flash[0]
        return Choice("hand-written", graph, note, label, tuple(flash + candidates))
    return Choice("hand-written", graph, note, _tile_label(tiles), tuple(candidates + flash))


FLASH_LIBRARY = "attention_flash"


def flash_tilings(sizes: dict, small: bool = False) -> list[dict]:
    """Tilings of the library's one-kernel attention: 32 (or 16, or all) query rows per
    block, V's head dim whole or split in 2 or 4 (more blocks, Q @ K recomputed)."""
    rows, d = sizes["s"], sizes["d"]
    row_tile = next((r for r in (32, 16) if rows % r == 0), rows if rows <= 64 else None)
    if row_tile is None:
        return []
    n_tile = 32 if small else 64
    return [{"n_tile": n_tile, "h_tile": 1, "s_parts": rows // row_tile, "d_parts": p}
            for p in (1, 2, 4) if d % p == 0 and d // p >= 16]


def _flash_candidates(row: Row, small: bool) -> list[tuple[str, KernelGraph]]:
    out = []
    for tiles in flash_tilings(row.small if small else row.sizes, small):
        try:
            graph = hand_written(row, tiles, small, library=FLASH_LIBRARY)
        except Exception:  # noqa: BLE001, S112 - a tiling that does not fit is skipped
            continue
        out.append((f"flash,{_tile_label(tiles)}", graph))
    return out


def choose(row: Row, source: str = "auto", directory: Path | None = None) -> Choice:
    """The row's μGraph at its suite sizes. ``source``: "auto" (searched, else hand-written),
    "searched" or "hand" (only that kind)."""
    program = row.program()
    reason = ""
    if source in ("auto", "searched"):
        graph, doc = load_searched(row, program, directory)
        if graph is not None:
            note = (f"search {doc.get('elapsed_s', '?')} s, {doc.get('states', '?')} states, "
                    f"{doc.get('verification', '')}")
            name = searched_path(row, directory).name
            candidates = [(f"{name}#0", graph)] + [
                (f"{name}#{i}", g) for i, g in enumerate(alternatives(doc, program), start=1)
            ]
            return Choice("searched", graph, note, f"{name}#0", tuple(candidates))
        reason = doc
        if source == "searched":
            return Choice("none", None, reason)
    choice = hand_written_choice(row)
    if reason and choice.source == "none":
        choice.note = f"{reason}; {choice.note}"
    return choice


def search_time_limit(row: Row, directory: Path | None = None) -> float | None:
    """The budget the row was searched with (its search file), so that a lookup asks the
    cache for the same search; None when the row has no search file."""
    path = searched_path(row, directory)
    try:
        return float(json.loads(path.read_text())["time_limit"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def superoptimized(row: Row, cache_dir: Path | None = None, time_limit: float | None = None):
    """(graph, source, note): what ``row.program().superoptimize(cache=..., cache_only=True)``
    returns — the cached search answer with its recorded launch settings — with ``source``
    "searched" (the search's μGraph), "unimproved" (the search found nothing better: the
    program runs as PyTorch operators) or "none" (no answer in the cache: graph None)."""
    import warnings

    from mugraph.cache import ResultCache
    from mugraph.search.api import superoptimize_graph

    program = row.program()
    cache = ResultCache(cache_dir or CACHE_DIR)
    budget = time_limit or search_time_limit(row) or 30.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        best = superoptimize_graph(program, time_limit=budget, cache=cache, cache_only=True)
    result = getattr(best, "search_result", None)
    missing = _cache_misses(result)
    parts = len(result.parts) if result is not None and result.parts else 1
    if best is program:
        if missing:
            return None, "none", f"no search result in {cache.path} (cache_only lookup)"
        return best, "unimproved", "the search found nothing better than the program"
    note = "superoptimize(cache=benchmarks/searched/cache)"
    if parts > 1:
        note += f": {parts} parts stitched"
    if missing:
        note += f"; {missing} of {parts} parts not in the cache (run as PyTorch operators)"
    ranking = getattr(best, "ranking", None) or (getattr(best, "cache_entry", None) or {}).get(
        "ranking")
    if isinstance(ranking, dict) and ranking.get("method"):
        note += f"; ranked by {ranking['method']}"
    return best, "searched", note


def _cache_misses(result) -> int:
    if result is None:
        return 0
    if result.parts:
        return sum(1 for p in result.parts if p.cache == "miss")
    return int(result.cache == "miss")
