"""The ``torch.compile`` backend: ``torch.compile(model, backend="mugraph", options={...})``.

Dynamo hands the backend an fx GraphModule and example inputs (``options`` arrive as the
keyword argument ``options``). For each concrete input signature the backend

1. copies the graph, inlines known leaf modules, rewrites ``x * sigmoid(x)`` to ``silu``,
   propagates shapes on fake tensors and canonicalizes model idioms (RMSNorm, norm weights
   folded into projections, stacked Q/K/V: :mod:`mugraph.integration.canonicalize`);
2. partitions it around matmul and attention anchors (:mod:`mugraph.integration.partition`);
3. for each partition of a known shape class (:mod:`mugraph.search.shape_class`), takes the
   search of its small representative from the result cache (:mod:`mugraph.cache`) or runs
   it under the class preset, tiles the answer for the real sizes and verifies that tiling
   (on a GPU, the cheapest few that verify are timed and the fastest is kept); other
   partitions are looked up / superoptimized as they are;
4. replaces each partition by a :class:`~mugraph.integration.runtime.MugraphPartition` module;
   with ``rest="inductor"`` on a GPU, each is first timed against its PyTorch nodes (op by op
   and compiled by Inductor alone, once per function and layout), the ones PyTorch wins stay
   as fx nodes, and the others become ``torch.ops.mugraph.partition`` calls in the graph
   Inductor compiles.

What was timed on the GPU (tilings, launch settings, answers, mugraph against PyTorch) and the
capture checks that passed are kept with the result cache (:class:`mugraph.cache.MeasurementCache`):
a later process reuses them, re-verifying each stored tiling and checking its kernel against
the reference semantics before it runs.

Shapes are static per specialization: a graph Dynamo compiled with dynamic shapes is
specialized again for every new concrete signature (and hits the cache for programs seen
before). Nothing makes the model fail: a graph or a node mugraph cannot handle runs on PyTorch.

Options (all optional; an unknown one, or a value the backend cannot use, is refused with a
:class:`BackendOptionError` naming it before anything is compiled):

``time_limit``          search budget per partition, seconds (default 30; 0: no search)
``search``              SearchConfig overrides, and ``"preset"`` (a dict)
``cache``               use the result cache (default True)
``cache_dir``           where (default: ``mugraph.cache.default_cache_dir()``)
``max_partition_ops``   most mugraph operators in one partition (default 8)
``max_partition_inputs`` most kernel-graph inputs of one partition (default 4)
``elementwise``         what runs elementwise operators no anchor takes: ``"pytorch"``
                        (default) or ``"mugraph"`` (captured greedily)
``shape_classes``       search partitions of known shape classes on a small representative
                        and tile the answer (default True)
``rest``                what runs the rest of the graph: ``"eager"`` (default: the fx graph,
                        op by op) or ``"inductor"`` (Inductor compiles it, the partitions
                        being opaque ``torch.ops.mugraph.partition`` calls)
``run_unimproved``      run a partition on mugraph even when the search found nothing
                        better than the captured program (default False: PyTorch runs it)
``check_capture``       check each captured program against its PyTorch nodes on random
                        float64 inputs before using it (default True)
``workers``             search worker processes (default 1)
``verbose``             print the report of each compiled graph
"""

from __future__ import annotations

import itertools
import math
import operator
import os
import re
import time
import warnings
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from torch.fx import Graph, GraphModule, Node

from mugraph.errors import MissingDependencyError, MugraphError, UnsupportedError
from mugraph.integration import passes
from mugraph.integration.canonicalize import canonicalize, unfold_norm_weights
from mugraph.integration.capture import (
    CapturedProgram,
    ExternalInput,
    apply_adapters,
    meta_value,
)
from mugraph.integration.check import check_capture
from mugraph.integration.lowering import op_name, target_name
from mugraph.integration.partition import DEFAULT_MAX_INPUTS, DEFAULT_MAX_OPS, partition_graph
from mugraph.integration.report import Fallback, GraphReport, PartitionReport, record
from mugraph.integration.runtime import MugraphPartition, fallback_module
from mugraph.integration.torch_ops import WEIGHT_PREPARATION, fold_weights_op
from mugraph.search.config import FLAG, POSITIVE_INT, is_number

BACKEND_NAME = "mugraph"
_GRAPH_IDS = itertools.count()


# ---- options ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class BackendOptions:
    """The ``options`` of ``torch.compile(..., backend="mugraph")`` (see the module docstring)."""

    time_limit: float = 30.0
    search: dict = field(default_factory=dict)
    cache: bool = True
    cache_dir: str | None = None
    max_partition_ops: int = DEFAULT_MAX_OPS
    max_partition_inputs: int = DEFAULT_MAX_INPUTS
    elementwise: str = "pytorch"
    shape_classes: bool = True
    rest: str = "eager"
    run_unimproved: bool = False
    check_capture: bool = True
    workers: int = 1
    verbose: bool = False

    def __post_init__(self) -> None:
        _check_options(self)

    @classmethod
    def parse(cls, options: dict | None) -> BackendOptions:
        if options is not None and not isinstance(options, dict):
            raise BackendOptionError(
                f"mugraph backend: options must be a dict, got {type(options).__name__}")
        options = dict(options or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise BackendOptionError(
                f"mugraph backend: unknown option(s) {unknown}; known: {sorted(known)}"
            )
        search = options.get("search")
        if search is not None and not isinstance(search, dict):
            raise BackendOptionError(
                f"mugraph backend: option 'search' must be a dict of search options, got "
                f"{search!r}")
        search = dict(search or {})
        _check_search_dict(search)
        options["search"] = search
        return cls(**options)


class BackendOptionError(MugraphError, ValueError):
    """An option of the torch.compile backend that is unknown or has a value it cannot use
    (names the option and the value)."""


def _one_of(*choices: str) -> tuple:
    return (lambda v: v in choices, " or ".join(repr(c) for c in choices))


# every field of BackendOptions but the search dict (parse checks that), as (test, what the
# error says it must be), in SearchConfig's form (mugraph.search.config)
_OPTION_RULES = {
    "time_limit": (lambda v: is_number(v) and math.isfinite(v) and v >= 0,
                   "a number of seconds >= 0 (0: no search)"),
    "cache": FLAG,
    "cache_dir": (lambda v: v is None or isinstance(v, str | os.PathLike), "None or a folder path"),
    "max_partition_ops": POSITIVE_INT,
    "max_partition_inputs": POSITIVE_INT,
    "elementwise": _one_of("pytorch", "mugraph"),
    "shape_classes": FLAG,
    "rest": _one_of("eager", "inductor"),
    "run_unimproved": FLAG,
    "check_capture": FLAG,
    "workers": POSITIVE_INT,
    "verbose": FLAG,
}


def _check_options(options: BackendOptions) -> None:
    for name, (valid, wanted) in _OPTION_RULES.items():
        if not valid(value := getattr(options, name)):
            raise BackendOptionError(
                f"mugraph backend: option {name!r} must be {wanted}, got {value!r}")
    path = None if options.cache_dir is None else Path(options.cache_dir).expanduser()
    if path is not None and path.exists() and not path.is_dir():
        raise BackendOptionError(f"mugraph backend: option 'cache_dir' must be a folder (this "
                                 f"path is a file), got {options.cache_dir!r}")


def _check_search_dict(search: dict) -> None:
    """The ``search`` dict: known SearchConfig fields (and ``preset``), each value one the
    search can use (the checks superoptimize makes)."""
    from mugraph.search.config import SearchConfig
    from mugraph.search.driver import SearchOptionError, _check_search_options
    from mugraph.search.space import PRESETS

    allowed = {f.name for f in fields(SearchConfig)} | {"preset"}
    unknown = sorted(set(search) - allowed)
    if unknown:
        raise BackendOptionError(f"mugraph backend: unknown search option(s) {unknown}")
    preset = search.get("preset")
    if preset is not None and preset not in PRESETS:
        raise BackendOptionError(
            f"mugraph backend: search preset {preset!r} is unknown; use one of {sorted(PRESETS)}")
    try:
        _check_search_options(search.get("time_limit"), search.get("workers"),
                              search.get("target_cost"))
        SearchConfig().with_overrides(**{k: v for k, v in search.items() if k != "preset"})
    except (SearchOptionError, UnsupportedError, TypeError, ValueError) as error:
        raise BackendOptionError(f"mugraph backend: option 'search': {error}") from None


# ---- the backend -----------------------------------------------------------------------------


def mugraph_backend(gm: GraphModule, example_inputs: list, **kwargs: Any):
    """The Dynamo backend: returns a callable running ``gm`` with mugraph partitions."""
    options = BackendOptions.parse(kwargs.get("options"))
    compiled = MugraphCompiledGraph(gm, options)
    if all(_is_concrete(x) for x in example_inputs):
        compiled.static = True
        compiled.specialize(list(example_inputs))
    return compiled


def optimize_fx(gm: GraphModule, example_inputs, **options: Any) -> MugraphCompiledGraph:
    """``gm`` (e.g. from ``torch.fx.symbolic_trace``) with mugraph partitions.

    Specialized for ``example_inputs`` now, and again for every new input signature (no
    Dynamo guards here: each call's signature is checked).
    """
    compiled = MugraphCompiledGraph(gm, BackendOptions.parse(options))
    compiled.specialize(list(example_inputs))
    return compiled


def _is_concrete(value: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool | FakeTensor):
        return False
    if isinstance(value, torch.Tensor):
        return all(isinstance(s, int) for s in value.shape)
    return True


def _signature(args: list | tuple) -> tuple:
    sig = []
    for a in args:
        if isinstance(a, torch.Tensor):
            sig.append((tuple(a.shape), tuple(a.stride()), a.dtype, a.device))
        else:
            sig.append(a)
    return tuple(sig)


def _describe_signature(args: list | tuple) -> str:
    parts = []
    for a in args:
        if isinstance(a, torch.Tensor):
            parts.append(f"{str(a.dtype).removeprefix('torch.')}{list(a.shape)}")
        else:
            parts.append(repr(a))
    text = ", ".join(parts)
    return text if len(text) < 160 else text[:157] + "..."


class MugraphCompiledGraph:
    """``gm`` specialized per concrete input signature (once, when Dynamo's shapes are static)."""

    def __init__(self, gm: GraphModule, options: BackendOptions) -> None:
        self.gm = gm
        self.options = options
        self.static = False
        self.specialized: dict[tuple, GraphModule] = {}
        self._only: GraphModule | None = None

    def __call__(self, *args: Any) -> Any:
        if self.static and self._only is not None:
            return self._only(*args)
        key = _signature(args)
        module = self.specialized.get(key)
        if module is None:
            module = self.specialize(list(args))
        return module(*args)

    def specialize(self, args: list) -> GraphModule:
        """Partition, search and rewrite ``gm`` for the concrete inputs ``args``."""
        started = time.perf_counter()
        module, report = specialize(self.gm, args, self.options)
        report.seconds = time.perf_counter() - started
        record(report)
        if self.options.verbose:
            print(report.format())
        self.specialized[_signature(args)] = module
        if self.static:
            self._only = module
        return module


# ---- specialization ----------------------------------------------------------------------------


def specialize(
    gm: GraphModule, args: list, options: BackendOptions
) -> tuple[GraphModule, GraphReport]:
    """``gm`` with mugraph partitions for inputs like ``args``, and the report of what it did."""
    report = GraphReport(next(_GRAPH_IDS), _describe_signature(args))
    try:
        return _specialize(gm, args, options, report), report
    except Exception as error:  # noqa: BLE001 - any failure: the graph runs as it is
        first = str(error).splitlines()[0] if str(error) else ""
        report.error = f"{type(error).__name__}: {first}"
        report.partitions = []
        return gm, report


def _specialize(gm: GraphModule, args: list, options: BackendOptions,
                report: GraphReport) -> GraphModule:
    work = _prepare(gm, args)
    if isinstance(work, str):
        report.error = work
        return gm
    parts = partition_graph(work.graph, options.max_partition_ops, options.max_partition_inputs,
                            options.elementwise)
    report.fallbacks = [
        Fallback(n.name, target_name(n), why) for n, why in parts.fallbacks.items()
    ]
    modules = {}
    for i, captured in enumerate(parts.partitions):
        name = f"mugraph_partition_{i}"
        modules[name] = _partition_module(name, captured, options, report)
    if options.rest == "inductor" and _inductor_ready(parts.partitions, args):
        return _with_inductor(work, parts.partitions, modules, args, report,
                              _measurements(options))
    return rewrite(work, list(zip(parts.partitions, modules, strict=True)), modules)


def _inductor_ready(partitions: list[CapturedProgram], args: list) -> bool:
    """Inductor can take the graph: no autograd, and every partition input is a tensor."""
    if torch.is_grad_enabled() and any(
        isinstance(a, torch.Tensor) and a.requires_grad for a in args
    ):
        return False
    return all(isinstance(meta_value(n), torch.Tensor) for c in partitions for n in c.raw_inputs)


def _with_inductor(work: GraphModule, partitions: list[CapturedProgram], modules: dict,
                   args: list, report: GraphReport, measured=None):
    """The rewritten graph, partitions as opaque operators, compiled by Inductor.
    ``measured``: the :class:`~mugraph.cache.MeasurementCache` of choices timed before."""
    from torch._inductor.compile_fx import compile_fx

    from mugraph.integration.runtime import register_partition

    _choose_on_the_gpu(work, partitions, modules, args, measured)
    # what PyTorch runs stays in the graph, for Inductor to compile (and fuse with the rest)
    parts = [(captured, name) for captured, name in zip(partitions, modules, strict=True)
             if modules[name].use_mugraph]  # fmt: skip
    unfold_norm_weights(work, {n for captured, _ in parts for n in captured.nodes})
    keys = {}
    for captured, name in parts:
        keys[name] = register_partition(modules[name], [meta_value(n) for n in captured.outputs])
    prepared = _preparations(parts)
    for captured, name in parts:
        inside = prepared[name]
        modules[name].prepare_inside([
            (inside[n][0], inside[n][1], len(inside[n][2])) if n in inside else None
            for n in captured.raw_inputs])
        modules[name].adapt_outside([i for i, _, _ in modules[name].copies_outside()])
    module = rewrite(work, parts, modules, keys, prepared)
    report.rest = "inductor"
    return compile_fx(module, list(args))


def _preparations(parts: list[tuple[CapturedProgram, str]]) -> dict[str, dict]:
    """Per partition mugraph runs: its raw inputs that are prepared weights
    (``mugraph::fold_weights`` / ``mugraph::concat`` of parameters) used by nothing but such
    partitions, as {node: (kind, site, tensor nodes)}. Those are prepared inside the partition
    call (the same memo) from the tensors, one operator call less per step."""
    owned = {n for captured, _ in parts for n in captured.nodes}
    out: dict[str, dict] = {}
    for captured, name in parts:
        found = {}
        for n in captured.raw_inputs:
            if n.op != "call_function" or n.target not in WEIGHT_PREPARATION:
                continue
            if not all(u in owned for u in n.users):
                continue
            if n.target is fold_weights_op:
                kind, tensors, site = "fold", [n.args[0], *n.args[1]], n.args[2]
            else:
                kind, tensors, site = "concat", list(n.args[0]), n.args[1]
            if all(isinstance(t, Node) for t in tensors):
                found[n] = (kind, site, tensors)
        out[name] = found
    return out


def _choose_on_the_gpu(work: GraphModule, partitions: list[CapturedProgram], modules: dict,
                       args: list, measured=None) -> None:
    """On CUDA inputs, time each partition mugraph would run against its PyTorch nodes —
    run op by op and compiled by Inductor alone — now, on the values the graph computes from
    ``args`` (one eager run), instead of at its first call: a partition PyTorch wins is then
    left to Inductor rather than run inside an opaque operator. Partitions computing the same
    function on the same input layouts (a model's layers) are timed once, on the first; with
    ``measured`` (a :class:`~mugraph.cache.MeasurementCache`), times taken by an earlier
    process on this GPU are reused and new ones stored. Whichever way the choice is made, a
    partition mugraph runs is first compared with its PyTorch nodes on its own inputs."""
    timed = [(captured, modules[name]) for captured, name in zip(partitions, modules, strict=True)
             if modules[name].use_mugraph and modules[name].measure]  # fmt: skip
    if not timed or not _on_the_gpu(args):
        return
    needed = {n for captured, _ in timed for n in captured.raw_inputs}
    try:
        values = _node_values(work, args, needed)
    except Exception:  # noqa: BLE001 - then each partition is timed at its first call
        return
    decided: dict[tuple, dict] = {}
    from_disk: set[tuple] = set()
    for captured, module in timed:
        raw = tuple(values[n] for n in captured.raw_inputs)
        key = _timing_key(module, raw)
        what = _partition_what(module, key) if measured is not None and key is not None else None
        if what is not None and key not in decided:
            stored = measured.get("partition", what)
            if stored is not None and _well_formed_times(stored):
                decided[key] = stored
                from_disk.add(key)
        try:
            if key in decided:
                if key in from_disk:
                    module.report.stored.append("partition")
                module.adopt(decided[key])
                if module.use_mugraph:  # compiled now, and checked on its own inputs
                    module.check_against_pytorch(raw, None)
                continue
            times = module.choose_by_measurement(
                raw, rival=lambda m=module, r=raw: _inductor_rival(m.fallback, r),
                copies_outside=True)
            if key is not None:
                decided[key] = times
            if what is not None:
                measured.put("partition", what, times)
        except Exception as error:  # noqa: BLE001 - PyTorch runs the partition
            module.give_up(error)


def _timing_key(module: MugraphPartition, raw: tuple) -> tuple | None:
    """What a partition's times depend on: its μGraph, its inputs' adaptations and the
    shapes, strides and dtypes of its raw inputs (None: never shared)."""
    from mugraph.ir.hashing import kernel_graph_hash

    if module.report is None:
        return None
    layouts = tuple((tuple(v.shape), v.stride(), v.dtype) if isinstance(v, torch.Tensor)
                    else repr(v) for v in raw)  # fmt: skip
    return kernel_graph_hash(module.best), tuple(module.specs), layouts


def _partition_what(module: MugraphPartition, key: tuple) -> dict:
    """What a partition's stored times are keyed by: its timing key (μGraph, adaptations,
    layouts), the μGraph's launch settings and the PyTorch code it is timed against."""
    from mugraph.cache import text_digest

    return {"timing": repr(key), "launch": _launch_of(module.best),
            "pytorch": text_digest(module.fallback.code), "method": PARTITION_TIMING}


def _well_formed_times(times: dict) -> bool:
    """Stored partition times: mugraph's and at least one rival's, positive numbers."""
    return ("mugraph_ms" in times and len(times) > 1
            and all(isinstance(v, int | float) and v > 0 for v in times.values()))


def _launch_of(graph) -> list:
    """A graph's recorded launch settings as data: [[kernel position, setting], ...]."""
    settings = getattr(graph, "launch_settings", None) or {}
    return sorted([int(i), c.to_list()] for i, c in settings.items())


def _measurements(options: BackendOptions):
    """The measured choices kept with the result cache (None when the cache is off)."""
    from mugraph.cache import ResultCache

    return ResultCache(options.cache_dir).measurements if options.cache else None


def _inductor_rival(fallback: GraphModule, raw: tuple):
    """The partition's PyTorch nodes compiled by Inductor alone (None if it cannot)."""
    from torch._inductor.compile_fx import compile_fx

    try:
        with torch._guards.tracing(None):
            return compile_fx(passes.copy_graph_module(fallback), list(raw))
    except Exception:  # noqa: BLE001 - timed against the eager nodes only
        return None


def _on_the_gpu(args: list) -> bool:
    return any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)


class _Recorder(torch.fx.Interpreter):
    """Runs a graph and keeps the values of some of its nodes."""

    def __init__(self, module: GraphModule, keep: set[Node]) -> None:
        super().__init__(module)
        self.keep = keep
        self.kept: dict[Node, Any] = {}

    def run_node(self, n: Node) -> Any:
        value = super().run_node(n)
        if n in self.keep:
            self.kept[n] = value
        return value


def _node_values(work: GraphModule, args: list, nodes: set[Node]) -> dict[Node, Any]:
    recorder = _Recorder(work, nodes)
    with torch.no_grad():
        recorder.run(*args)
    return recorder.kept


def _prepare(gm: GraphModule, args: list) -> GraphModule | str:
    """A copy of ``gm`` ready to partition, or the reason the whole graph stays as it is."""
    work = passes.copy_graph_module(gm)
    passes.inline_known_modules(work)
    passes.fuse_silu(work)
    mutation = passes.mutating_node(work.graph)
    if mutation is not None:
        return f"it writes tensors in place ({mutation.name}: {target_name(mutation)})"
    passes.propagate_shapes(work, args)
    canonicalize(work, lambda: passes.propagate_shapes(work, args))
    return work


def _partition_module(name: str, captured: CapturedProgram, options: BackendOptions,
                      report: GraphReport) -> MugraphPartition:
    program = captured.graph
    part = PartitionReport(
        name, [n.name for n in captured.nodes], [target_name(n) for n in captured.nodes],
        captured.kinds, program.structural_hash(),
    )
    report.partitions.append(part)
    fallback = fallback_module(captured)
    problem = _check(captured, fallback, _measurements(options)) if options.check_capture else None
    if problem is not None:
        part.status, part.detail = "capture mismatch", problem
        return MugraphPartition(captured, program, False, part, fallback)
    try:
        best = _optimize(program, options, _arch(captured), part)
    except Exception as error:  # noqa: BLE001 - a failed search: PyTorch runs the partition
        part.status, part.detail = "error", f"search failed: {type(error).__name__}: {error}"
        best = program
        if isinstance(error, MissingDependencyError):  # every partition would say so: say it
            warnings.warn(f"mugraph: no partition can be optimized: {error}", stacklevel=2)
    improved = best is not program and part.status != "error"
    use = improved or (options.run_unimproved and part.status != "error")
    part.runs_on = "mugraph" if use else "pytorch"
    return MugraphPartition(captured, best, use, part, fallback)


# Capture checks of this process, by program and the fx operators it came from: the layers
# of a model lower the same operators to the same program, and are checked once.
_CHECKED: dict[tuple, str | None] = {}


def _check(captured: CapturedProgram, fallback: GraphModule, measured=None) -> str | None:
    """Why the capture is not trusted (None: it matches PyTorch numerically). With
    ``measured`` (a :class:`~mugraph.cache.MeasurementCache`), a capture an earlier process
    checked with the same PyTorch and mugraph is not checked again (passes only are kept:
    the check is a function of the key, its random inputs being seeded)."""
    from mugraph.cache import text_digest

    key = (
        captured.graph.structural_hash(), tuple(captured.graph.input_types),
        _node_structure(fallback.graph), tuple(repr(s) for s in captured.input_specs),
        tuple(captured.output_index), repr(captured.output_shapes),
    )
    if key not in _CHECKED:
        what = {"capture": text_digest(repr(key))}
        if measured is not None and measured.get("capture", what) == {"passed": True}:
            _CHECKED[key] = None
            return None
        try:
            _CHECKED[key] = check_capture(captured, fallback)
        except Exception as error:  # noqa: BLE001 - what cannot be checked is not trusted
            _CHECKED[key] = f"the capture check failed to run ({type(error).__name__}: {error})"
        if measured is not None and _CHECKED[key] is None:
            measured.put("capture", what, {"passed": True})
    return _CHECKED[key]


def _node_structure(graph: Graph) -> tuple:
    """The nodes' targets and arguments with every node named by its position, so that the
    same computation in another layer of a model (other node names) has the same structure,
    and the shapes and dtypes of the graph's inputs."""
    position = {n: i for i, n in enumerate(graph.nodes)}

    def named(value):
        return torch.fx.node.map_arg(value, lambda n: f"%{position[n]}")

    structure = []
    for n in graph.nodes:
        if n.op == "placeholder":
            value = meta_value(n) if ("val" in n.meta or "example_value" in n.meta) else None
            structure.append(("input", repr(getattr(value, "shape", None)),
                              repr(getattr(value, "dtype", None))))
        elif n.op != "output":
            structure.append((target_name(n), repr(named(n.args)), repr(named(n.kwargs))))
    return tuple(structure)


def _arch(captured: CapturedProgram) -> str:
    from mugraph.cache import current_arch

    for spec in captured.input_specs:
        if isinstance(spec, ExternalInput):
            return current_arch(meta_value(captured.raw_inputs[spec.source]).device)
    return "cpu"


def _search_config(program, options: BackendOptions):
    from mugraph.cache import resolve_config

    overrides = {"time_limit": max(float(options.time_limit), 0.0), "workers": options.workers}
    overrides.update(options.search)
    return resolve_config(program, overrides)


def _optimize(program, options: BackendOptions, arch: str, part: PartitionReport):
    """The best μGraph for ``program``: by its shape class, else from the cache or a search;
    a program with views (``permute``) piece by piece around them."""
    from mugraph.cache import ResultCache
    from mugraph.search.partition import has_views
    from mugraph.search.shape_class import classify

    if has_views(program):
        return _optimize_around_views(program, options, arch, part)
    cache = ResultCache(options.cache_dir) if options.cache else None
    cls = classify(program) if options.shape_classes and not options.search else None
    if cls is not None:
        best = _optimize_by_class(program, cls, options, arch, part, cache)
        if best is not None:
            return best
    return _optimize_as_is(program, options, arch, part, cache)


def _optimize_around_views(program, options: BackendOptions, arch: str, part: PartitionReport):
    """``program`` cut at its views (each view kept, no kernel holds it), every other piece
    optimized as a partition of its own (its shape class, the cache or a search), stitched
    back. Each piece's answer is verified against the piece, so the whole computes the
    program (substitution of equals)."""
    from mugraph.search.partition import moves_only, split_at_views, stitch

    pieces = split_at_views(program)
    chosen, classes = [], []
    for piece in pieces:
        if moves_only(piece.graph):
            chosen.append(piece.graph)
            continue
        part.shape_class = ""
        chosen.append(_optimize(piece.graph, options, arch, part))
        classes.append(part.shape_class)
    part.shape_class = "+".join(c for c in classes if c)
    improved = any(c is not p.graph for c, p in zip(chosen, pieces, strict=True))
    if improved:
        part.status = "optimized"
    return stitch(program, pieces, chosen) if improved else program


def _optimize_by_class(program, cls, options: BackendOptions, arch: str, part: PartitionReport,
                       cache):
    """Search (or take from the cache) the class representative, then tile and verify; None
    when the class path does not apply (the program is then searched as it is)."""
    from mugraph.search import shape_class as sc

    small = sc.representative(program)
    if small is None:
        return None
    part.shape_class = cls.name
    overrides = {"time_limit": max(float(options.time_limit), 0.0), "workers": options.workers,
                 **sc.class_overrides(cls, small)}
    config = _resolve(small, overrides)
    best_small = _cached_search(small, config, cache, part, options)
    if best_small is small and cls.retry_kinds and part.status != "not searched":
        config = _resolve(small, {**overrides, **sc.class_overrides(cls, small, retry=True)})
        best_small = _cached_search(small, config, cache, part, options)
    if best_small is small:
        part.status = "unimproved" if part.status != "not searched" else part.status
        return program

    def tiled(answer, answer_config):
        """The verified tiling of ``answer`` (None: it cannot be tiled) and whether its
        kernel loops."""
        try:
            tiler = sc.Tiler(answer, small, program)
        except sc.NotInstantiable as error:
            part.detail = f"class {cls.name}: {error}"
            return None, False
        return (_first_verified(tiler, program, answer_config, part, arch, cache, answer),
                tiler.looped)

    best, looped = tiled(best_small, config)
    if not looped and part.status != "not searched" and (best is program or arch != "cpu"):
        # the representative's kernel holds a whole reduction in one block, which at the real
        # sizes no tiling may fit in shared memory, or which is slow there (one block per
        # output tile reads the whole reduction): search it again with a for-loop required;
        # on a GPU the faster of the two answers' tilings is kept
        looped_config = _resolve(small, {**overrides, "loop_required": True})
        looped_small = _cached_search(small, looped_config, cache, part, options)
        if looped_small is not small:
            first = (best, dict(part.tiling), part.detail, part.status)
            part.detail = ""
            other, _ = tiled(looped_small, looped_config)
            if best is program:
                best = other
            elif other is not program:
                best = _faster_answer(program, first, other, part, cache=cache)
    if arch != "cpu" and part.status != "not searched" and sc.splits_reduction(cls, program):
        best = _with_real_size_answer(program, best, options, arch, part, cache)
    return best


def _with_real_size_answer(program, best, options: BackendOptions, arch: str,
                           part: PartitionReport, cache):
    """On a GPU, ``program`` (of a class whose tiled answers cannot split its reduction
    over the grid, which its sizes need: decode attention's few query rows against a long
    KV sequence) also searched as it is, at its real sizes (cached; the split-KV form is in
    that search space), and the faster of that answer and the tiled ``best`` kept."""
    first = (best, dict(part.tiling), part.detail, part.status)
    searched = (part.cache, dict(part.search))  # the class search's record
    other = _cached_search(program, _search_config(program, options), cache, part, options,
                           arch)
    if other is program:
        part.tiling, part.detail, part.status = first[1:]
        part.cache, part.search = searched
        return best
    part.tiling, part.detail, part.status = {"real_size": True}, "", "optimized"
    if best is program:
        return other
    chosen = _faster_answer(program, first, other, part, "real_size_ms", cache)
    if chosen is best:
        part.cache, part.search = searched
    return chosen


# The two tiled answers' times (ms) by the pair (None: no GPU): a model's layers decide once.
_FASTER: dict[tuple, list[float] | None] = {}


def _faster_answer(program, first: tuple, other, part: PartitionReport,
                   label: str = "answers_ms", cache=None):
    """Of the tiled answer ``first`` (graph, and its tiling, detail and status as recorded)
    and ``other`` (whose record ``part`` holds), the one faster on the GPU; ``first`` without
    a GPU. Both times go to ``part.tiling[label]``; with ``cache`` (a result cache), times an
    earlier process measured on this GPU are reused, and new ones stored."""
    from mugraph.cache import input_signature

    key = (first[0].structural_hash(), other.structural_hash(), tuple(program.input_types))
    if key not in _FASTER:
        timer = _tiling_timer(program)
        measured = _measured_with(cache, timer)
        what = {"graphs": [[g.structural_hash(), _launch_of(g)] for g in (first[0], other)],
                "inputs": input_signature(program)}
        stored = measured.get("answers", what) if measured is not None else None
        if stored is not None and _two_times(stored.get("ms")):
            _FASTER[key] = stored["ms"]
            part.stored.append(label)
        else:
            _FASTER[key] = (None if timer is None
                            else [round(timer(g), 4) for g in (first[0], other)])
            if measured is not None:
                measured.put("answers", what, {"ms": _FASTER[key]})
    times = _FASTER[key]
    chosen = other
    if times is None or times[1] >= times[0]:
        chosen, part.tiling, part.detail, part.status = first
    if times is not None:
        part.tiling = {**part.tiling, label: times}
    return chosen


# Tiled answers of this process, by program and class search: identical layers of a model
# (and later specializations of the same shapes) are tiled and verified once.
_TILED: dict[tuple, tuple[Any, dict, str]] = {}


def _measured_with(cache, timer):
    """The measured choices of result cache ``cache`` when there is a GPU to time on."""
    return cache.measurements if cache is not None and timer is not None else None


def _two_times(value) -> bool:
    return (isinstance(value, list) and len(value) == 2
            and all(isinstance(v, int | float) and v > 0 for v in value))


def _first_verified(tiler, program, config, part: PartitionReport, arch: str = "cpu",
                    cache=None, answer=None):
    """The cheapest tiling that verifies (at reduced extents); the program when none does.
    On a GPU (``arch`` not "cpu"), the cheapest few by the cost model that verify are timed
    there and the fastest is taken; with ``cache`` (a result cache), the tiling of
    ``answer`` an earlier process chose on this GPU is taken instead when it still verifies
    and runs right, and a new choice is stored."""
    from mugraph.cache import config_hash, input_signature

    timer = _tiling_timer(program) if arch != "cpu" else None
    key = (program.structural_hash(), tuple(program.input_types), config_hash(config),
           timer is not None)
    if key not in _TILED:
        measured = _measured_with(cache, timer)
        what = {"program": key[0], "inputs": input_signature(program), "config": key[2],
                "answer": answer.structural_hash() if answer is not None else None,
                "policy": TIMING_POLICY}
        best = None
        if measured is not None:
            best = _stored_tiling(tiler, config, part, timer, measured.get("tiling", what))
        if best is None:
            best = _verified_tiling(tiler, program, config, part, timer)
            if measured is not None and best is not program:
                measured.put("tiling", what, {"tiling": dict(part.tiling),
                                              "launch": _launch_of(best)})
        _TILED[key] = (None if best is program else best, dict(part.tiling), part.detail)
    best, part.tiling, part.detail = _TILED[key]
    part.status = "optimized" if best is not program else "unimproved"
    return best if best is not None else program


TILINGS_TRIED = 3  # without a GPU: the cheapest tilings (by the cost model) verified, the
# first kept. On a GPU the tilings are timed there first: the CHEAPEST_TIMED cheapest by the
# cost model and one per further grid (the cheapest of each), TILINGS_TIMED grids at most,
# then every for-loop range of the GRIDS_REFINED fastest grids; the fastest tiling that
# verifies is kept. (The cost model's
# order among tilings of one program is a poor guide at prefill sizes: for a Llama-1B down
# projection of 512 rows the fastest tiling, 0.034 ms, tied 21st-24th cheapest, and the six
# cheapest ran in 0.048-0.070 ms; benchmarks/RESULTS.md, fourteenth session.)
CHEAPEST_TIMED = 6  # (what the backend timed before: the search keeps finding these)
TILINGS_TIMED = 12
GRIDS_REFINED = 2
# Also timed: the BIG_TILE_GRIDS grids of the largest tiles (the fewest blocks) that still give
# MIN_GRID_BLOCKS blocks, wherever the cost model ranks them. The cost model ranks them last at
# prefill sizes: for a Llama-1B gated MLP of 512 rows, tiles of 128 x 128 were the 24th grid of
# 25, 64 x 128 the 23rd, and the tiling kept had tiles of 32 x 64 (0.168 ms; fifteenth session).
BIG_TILE_GRIDS = 3
MIN_GRID_BLOCKS = 64
# The launch settings of the LAUNCH_TUNED fastest tilings and of the big-tile grids' are timed
# (``tune.launch_grid``) before one is kept: the default launch gives a kernel with a matmul 4
# warps, too few for the largest tiles. A big-tile grid is timed and tuned with the for-loop
# step nearest PREFERRED_LOOP_TILE, not its cheapest by the cost model. (Sixteenth session, a
# Llama-1B gated MLP of 512 rows: tiles of 128 x 128 with a step of 64 took 0.2655 ms with
# the default launch, 0.0790 ms with 8 warps and 3 stages; the backend had timed and tuned
# that grid with a step of 32 and kept 64 x 128 tiles at 0.0946 ms.)
LAUNCH_TUNED = 3
PREFERRED_LOOP_TILE = 64
# The rule choosing what is timed: stored choices made under another rule are made again.
TIMING_POLICY = 3
LAUNCH_GAIN = 0.95  # a launch setting replaces the default when at least 5% faster
# How a partition's mugraph side is timed against PyTorch: 2, on its recorded launches
# (``MugraphPartition._as_in_the_model``); stored times of another method are measured again.
PARTITION_TIMING = 2


def _verified_tiling(tiler, program, config, part: PartitionReport, timer=None):
    tilings = tiler.tilings()
    tuned: dict[int, tuple] = {}
    if timer is None:
        candidates, times = tilings[:TILINGS_TRIED], []
    else:
        candidates, times = _timed_tilings(tilings, timer)
        tuned = _tuned_launches(candidates, times, timer)
        ranked = [tuned[id(t)][2] if id(t) in tuned else ms
                  for t, ms in zip(candidates, times, strict=True)]
        order = sorted(range(len(candidates)), key=lambda i: ranked[i])
        candidates = [candidates[i] for i in order if ranked[i] != float("inf")]
    chosen, wrong = None, 0
    for tiling in candidates:
        check = _verify_tiling(tiler, tiling, config, part)
        if check is not None and timer is not None and hasattr(timer, "runs_right"):
            problem = timer.runs_right(tiling.graph)
            if problem is not None:  # the kernel, not the μGraph, is wrong: the next one
                part.detail = f"tiling {list(tiling.axes)} / {tiling.loop}: {problem}"
                check, wrong = None, wrong + 1
        if check is not None:
            tiling.graph.verification = check
            chosen = tiling
            break
    if chosen is None:
        part.status = "unimproved"
        part.detail = part.detail or f"none of {len(tilings)} tilings fits and verifies"
        return program
    part.status = "optimized"
    part.detail = ""
    part.tiling = {"grid": [list(a) for a in chosen.axes],
                   "loop": list(chosen.loop) if chosen.loop else None}
    if len(times) > 1:
        part.tiling["timed_ms"] = [round(t, 4) for t in times]
    if wrong:
        part.tiling["wrong_kernels"] = wrong
    if id(chosen) in tuned:
        launch = tuned[id(chosen)]
    elif timer is not None and hasattr(timer, "launch_settings"):
        launch = timer.launch_settings(chosen.graph)
    else:
        launch = None
    if launch is not None:
        chosen.graph.launch_settings = {launch[0]: launch[1]}
        part.tiling["launch"] = [launch[1].num_warps, launch[1].num_stages, launch[2]]
    return chosen.graph


def _tuned_launches(candidates: list, times: list[float], timer) -> dict[int, tuple]:
    """id(tiling) -> (kernel position, LaunchConfig, ms) of the timed tilings that a launch
    setting of the timer's ``launch_grid`` made faster: the LAUNCH_TUNED fastest by their
    default launch and, for each of the BIG_TILE_GRIDS grids of the largest tiles (whose
    default launch gives them too few warps), its timed tiling of the for-loop step nearest
    PREFERRED_LOOP_TILE (the fastest of those)."""
    if not hasattr(timer, "launch_grid"):
        return {}
    finite = sorted((i for i, ms in enumerate(times) if ms != float("inf")),
                    key=times.__getitem__)
    picked = finite[:LAUNCH_TUNED]
    for grid in _big_tile_grids({candidates[i].axes for i in finite}):
        preferred = _preferred_step([candidates[i] for i in finite if candidates[i].axes == grid])
        index = next(i for i in finite if candidates[i] is preferred)
        if index not in picked:
            picked.append(index)
    found = timer.launch_grid([candidates[i].graph for i in picked], [times[i] for i in picked])
    return {id(candidates[i]): launch for i, launch in zip(picked, found, strict=True)
            if launch is not None}


def _stored_tiling(tiler, config, part: PartitionReport, timer, stored: dict | None):
    """The tiling an earlier process chose (``stored``: its record and launch setting), when
    it is still among the tilings, verifies, and its compiled kernel (with that launch
    setting) agrees with the reference semantics; else None (it is then timed again)."""
    from mugraph.codegen.launch import LaunchConfig

    if stored is None:
        return None
    try:
        record = dict(stored["tiling"])
        launch = {int(i): LaunchConfig.from_list(c) for i, c in stored.get("launch", [])}
        axes = tuple((str(a), int(g)) for a, g in record.get("grid") or [])
        loop = record.get("loop")
        loop = (str(loop[0]), int(loop[1])) if loop else None
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    match = tiler.tiling(axes, loop)
    if match is None:
        return None
    check = _verify_tiling(tiler, match, config, part)
    if check is None:
        return None
    if launch:
        match.graph.launch_settings = launch
    if hasattr(timer, "runs_right") and timer.runs_right(match.graph) is not None:
        return None
    match.graph.verification = check
    part.status, part.detail, part.tiling = "optimized", "", record
    part.stored.append("tiling")
    return match.graph


def _verify_tiling(tiler, tiling, config, part: PartitionReport):
    """The passed verification of ``tiling`` at reduced extents, or None (the reason goes to
    ``part.detail``)."""
    from mugraph.search.verify import verify

    try:
        small_program, small_graph = tiler.reduced(tiling)
        check = verify(small_graph, small_program, delta=config.delta)
    except Exception as error:  # noqa: BLE001 - an unverifiable tiling is not used
        part.detail = f"tiling not verified: {type(error).__name__}: {error}"
        return None
    return check if check.passed else None


def _timed_tilings(tilings: list, timer) -> tuple[list, list[float]]:
    """(tilings timed, their times in ms), in the order timed: in the cost model's order, the
    CHEAPEST_TIMED cheapest tilings and the cheapest of each other grid (TILINGS_TIMED grids
    at most); then the untimed for-loop ranges of the GRIDS_REFINED grids with the fastest
    tilings. The first batch also holds the cheapest tiling of each of the BIG_TILE_GRIDS
    grids of the largest tiles (see there). Each batch is compiled in parallel first when the
    timer can."""
    by_grid: dict[tuple, list] = {}
    for tiling in tilings:
        by_grid.setdefault(tiling.axes, []).append(tiling)
    big = _big_tile_grids(by_grid)
    firsts = {id(by_grid[g][0]) for g in list(by_grid)[:TILINGS_TIMED]}
    firsts |= {id(_preferred_step(by_grid[g])) for g in big}
    timed = [t for i, t in enumerate(tilings) if i < CHEAPEST_TIMED or id(t) in firsts]
    times = _time_batch(timer, timed)
    best: dict[tuple, float] = {}
    for tiling, ms in zip(timed, times, strict=True):
        best[tiling.axes] = min(ms, best.get(tiling.axes, float("inf")))
    fastest = sorted((g for g in best if best[g] != float("inf")), key=best.get)
    seen = {id(t) for t in timed}
    more = [t for g in fastest[:GRIDS_REFINED] for t in by_grid[g] if id(t) not in seen]
    return timed + more, times + _time_batch(timer, more)


def _preferred_step(tilings: list):
    """Of the tilings of one grid, the one whose for-loop step is nearest PREFERRED_LOOP_TILE
    (the first of those in ``tilings``' order)."""
    def distance(tiling) -> float:
        step = getattr(tiling, "loop_tile", None)
        return abs(math.log2(step / PREFERRED_LOOP_TILE)) if step else 0.0

    return min(tilings, key=distance)


def _big_tile_grids(grids) -> list[tuple]:
    """The BIG_TILE_GRIDS grids of ``grids`` with the fewest blocks, at least MIN_GRID_BLOCKS."""
    return sorted((g for g in grids if _blocks(g) >= MIN_GRID_BLOCKS), key=_blocks)[
        :BIG_TILE_GRIDS]


def _blocks(axes: tuple) -> int:
    """How many blocks a grid of ``axes`` ((index, parts), ...) launches."""
    return math.prod(parts for _, parts in axes)


def _time_batch(timer, tilings: list) -> list[float]:
    graphs = [t.graph for t in tilings]
    if hasattr(timer, "precompile"):
        timer.precompile(graphs)
    return [timer(g) for g in graphs]


class _TilingTimer:
    """Milliseconds per call of a tiled μGraph of ``program`` on the current GPU (inputs drawn
    once; back-to-back calls; infinity when it fails to compile or run). ``precompile``
    compiles a batch's kernels in parallel worker processes first. Timing runs no reference
    check (``runs_right`` does, for the tilings about to be kept). A timer may also be any
    callable of a graph (tests pass plain functions): the other methods are then skipped."""

    def __init__(self, program) -> None:
        self.program = program
        self.inputs: list = []

    def _compiled(self, graph, launch: dict | None = None):
        from mugraph.runtime.compiled import compile_graph

        return compile_graph(graph, cuda_graph=False, check=False, launch=launch)

    def precompile(self, graphs: list) -> None:
        from mugraph.optimize.precompile import precompile

        programs = []
        for graph in graphs:
            try:
                programs.append(self._compiled(graph))
            except Exception:  # noqa: BLE001 - the timer scores it infinity
                continue
        precompile(programs)

    def runs_right(self, graph) -> str | None:
        """Why the compiled ``graph`` (default launch settings) disagrees with the reference
        semantics on random inputs, or None when it agrees: ``compile_graph``'s own check,
        which the runtime's later compilation of the graph then does not repeat."""
        from mugraph.runtime.compiled import compile_graph

        try:
            compile_graph(graph, cuda_graph=False, check=True)
        except Exception as error:  # noqa: BLE001 - any failure disqualifies the tiling
            return f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        return None

    def launch_settings(self, graph) -> tuple | None:
        """(kernel position, LaunchConfig, ms) of the fastest launch setting of ``graph``'s
        one kernel when it beats the default's time by LAUNCH_GAIN, else None. Each setting
        (:func:`~mugraph.optimize.tune.launch_variants`) is timed only after its outputs agree
        with the default setting's (Triton has computed some settings' ``tl.dot`` wrongly)."""
        from mugraph.optimize.tune import launch_variants

        return self._fastest_launches([graph], launch_variants, None)[0]

    def launch_grid(self, graphs: list, default_ms: list[float]) -> list:
        """For each of ``graphs`` (whose default launch took ``default_ms``), what
        ``launch_settings`` returns, over :func:`~mugraph.optimize.tune.launch_grid`'s
        settings (warps and stages together); the settings of all graphs compile in one
        parallel batch."""
        from mugraph.optimize.tune import launch_grid

        return self._fastest_launches(graphs, launch_grid, default_ms)

    def _fastest_launches(self, graphs: list, settings, default_ms: list[float] | None) -> list:
        from mugraph.codegen.launch import default_launch
        from mugraph.ir.ops import OpKind
        from mugraph.optimize.precompile import precompile

        plans = []
        for graph in graphs:
            kernels = [i for i, op in enumerate(graph.ops) if op.kind is OpKind.CUSTOMIZED]
            plan = None
            if len(kernels) == 1:
                block = graph.ops[kernels[0]].attr("graph")
                plan = (kernels[0], self._variants(graph, kernels[0],
                                                   settings(block, default_launch(block))))
            plans.append(plan)
        precompile([compiled for plan in plans if plan for _, compiled in plan[1]])
        base = default_ms or [None] * len(graphs)
        return [None if plan is None else self._fastest(graph, *plan, ms)
                for graph, plan, ms in zip(graphs, plans, base, strict=True)]

    def _variants(self, graph, index: int, configs: list) -> list:
        variants = []
        for config in configs:
            try:
                variants.append((config, self._compiled(graph, {index: config})))
            except Exception:  # noqa: BLE001 - a setting that fails to build is not chosen
                continue
        return variants

    def _fastest(self, graph, index: int, variants: list, base_ms: float | None):
        """(index, config, ms) of the fastest of ``variants`` whose outputs agree with the
        default setting's, when LAUNCH_GAIN faster than the default (``base_ms``, timed
        here when None); else None."""
        from mugraph.optimize.tune import disagreement

        try:
            reference = [o.clone() for o in self._run(self._compiled(graph))]
        except Exception:  # noqa: BLE001 - the default setting stays
            return None
        base_ms = self(graph) if base_ms is None else base_ms
        best = None
        for config, compiled in variants:
            try:
                if disagreement(self._run(compiled), reference) is not None:
                    continue
            except Exception:  # noqa: BLE001 - a setting that fails is not chosen
                continue
            ms = self._time(compiled)
            if ms < base_ms * LAUNCH_GAIN and (best is None or ms < best[2]):
                best = (index, config, round(ms, 4))
        return best

    def _inputs(self) -> list:
        """The program's random CUDA inputs, drawn once."""
        from mugraph.codegen.check import random_inputs

        if not self.inputs:
            self.inputs.extend(random_inputs(self.program, "cuda"))
        return self.inputs

    def _run(self, compiled) -> list:
        outs = compiled(inputs=self._inputs())
        torch.cuda.synchronize()
        return list(outs)

    def __call__(self, graph) -> float:
        try:
            return self._time(self._compiled(graph))
        except Exception:  # noqa: BLE001 - a tiling that does not run is not chosen
            return float("inf")

    def _time(self, compiled) -> float:
        from mugraph.integration.runtime import cuda_mean_milliseconds

        try:
            inputs = self._inputs()
            return cuda_mean_milliseconds(lambda: compiled(inputs=inputs))
        except Exception:  # noqa: BLE001 - a tiling that does not run is not chosen
            return float("inf")


def _tiling_timer(program):
    """A :class:`_TilingTimer` for ``program``, or None without a GPU."""
    return _TilingTimer(program) if torch.cuda.is_available() else None


def _resolve(program, overrides: dict):
    from mugraph.cache import resolve_config

    return resolve_config(program, overrides)


def _cached_search(program, config, cache, part: PartitionReport, options: BackendOptions,
                   arch: str = "any"):
    """The best μGraph of ``program`` under ``config``: from the cache (entries of ``arch``),
    else searched and stored there."""
    from mugraph.cache import search_summary
    from mugraph.search import api

    if cache is not None:
        hit = cache.get(program, config, arch=arch)
        if hit is not None:
            part.cache, part.search = "hit", dict(hit.cache_entry.get("search") or {})
            return hit
        part.cache = "miss"
    if config.time_limit <= 0:
        part.status = "not searched"
        return program
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=re.escape("mugraph: the search found no"))
        best = api.superoptimize_graph(program, config)
    result = getattr(best, "search_result", None)
    part.search = search_summary(result)
    if cache is not None:
        try:
            cache.put(program, config, best, result, arch=arch)
        except OSError as error:
            warnings.warn(f"mugraph: could not store a search result in {cache}: {error}",
                          stacklevel=3)
    return best


def _optimize_as_is(program, options: BackendOptions, arch: str, part: PartitionReport, cache):
    """The best μGraph for ``program``: from the cache, else from a search (then cached)."""
    best = _cached_search(program, _search_config(program, options), cache, part, options, arch)
    if part.status != "not searched":
        part.status = "optimized" if best is not program else "unimproved"
    return best


# ---- rewriting the graph ---------------------------------------------------------------------


def _units(graph: Graph, parts: list[tuple[CapturedProgram, str]]) -> tuple[list, dict]:
    """Schedulable units (a node, or a whole partition) and the unit of every node."""
    unit_of: dict[Node, int] = {}
    units: list = []
    for captured, name in parts:
        for node in captured.nodes:
            unit_of[node] = len(units)
        units.append((captured, name))
    for node in graph.nodes:
        if node not in unit_of and node.op != "output":
            unit_of[node] = len(units)
            units.append(node)
    return units, unit_of


def _schedule(graph: Graph, units: list, unit_of: dict[Node, int]) -> list:
    """The units in a topological order close to the original one (Kahn, by first node)."""
    import heapq

    order = {n: i for i, n in enumerate(graph.nodes)}
    members = [u[0].nodes if isinstance(u, tuple) else [u] for u in units]
    deps = [set() for _ in units]
    users = [set() for _ in units]
    for k, nodes in enumerate(members):
        for node in nodes:
            for a in node.all_input_nodes:
                j = unit_of[a]
                if j != k:
                    deps[k].add(j)
                    users[j].add(k)
    first = [min(order[n] for n in nodes) for nodes in members]
    ready = [(first[k], k) for k in range(len(units)) if not deps[k]]
    heapq.heapify(ready)
    out = []
    while ready:
        _, k = heapq.heappop(ready)
        out.append(units[k])
        for u in users[k]:
            deps[u].discard(k)
            if not deps[u]:
                heapq.heappush(ready, (first[u], u))
    if len(out) != len(units):
        raise RuntimeError("mugraph: the partitions form a cycle (a partitioner bug)")
    return out


def rewrite(gm: GraphModule, parts: list[tuple[CapturedProgram, str]],
            modules: dict[str, torch.nn.Module], keys: dict[str, int] | None = None,
            prepared: dict[str, dict] | None = None) -> GraphModule:
    """``gm`` with each partition's nodes replaced by a call of its module (or, with ``keys``,
    of ``torch.ops.mugraph.partition`` on the registered module; with ``prepared``, a raw
    input the partition prepares inside is passed as the tensors it is prepared from)."""
    graph = gm.graph
    units, unit_of = _units(graph, parts)
    new = Graph()
    env: dict[Node, Node] = {}
    for unit in _schedule(graph, units, unit_of):
        if isinstance(unit, Node):
            env[unit] = new.node_copy(unit, lambda n: env[n])
            continue
        captured, name = unit
        inside = (prepared or {}).get(name, {})
        inputs = tuple(env[t] for n in captured.raw_inputs
                       for t in (inside[n][2] if n in inside else [n]))
        if keys is not None:
            inputs += tuple(_copies_outside(new, modules[name], captured, env))
            call = new.call_function(torch.ops.mugraph.partition.default,
                                     (keys[name], list(inputs)))
        else:
            call = new.call_module(name, inputs)
        for j, node in enumerate(captured.outputs):
            env[node] = new.call_function(operator.getitem, (call, j))
            env[node].meta = dict(node.meta)
    output = next(n for n in graph.nodes if n.op == "output")
    new.node_copy(output, lambda n: env[n])
    module = GraphModule(_root(gm, new, modules), new)
    module.graph.eliminate_dead_code()
    if keys is not None and chain_partition_calls(module.graph):
        module.graph.eliminate_dead_code()  # getitems only the chain's own members read
    module.recompile()
    return module


def _copies_outside(graph: Graph, module, captured: CapturedProgram, env: dict) -> list[Node]:
    """Nodes computing the partition's inputs whose adapters copy (a query scaled by a power
    of two, a boolean mask cast to 0/1: :meth:`MugraphPartition.copies_outside`), for the
    partition to read instead of copying on every call; Inductor fuses them into the kernels
    producing their sources."""
    return [graph.call_function(apply_adapters, (env[captured.raw_inputs[source]], done))
            for source, done in module.outside()]


def chain_partition_calls(graph: Graph) -> int:
    """Every run of ``mugraph::partition`` calls with nothing between them but their outputs'
    ``getitem`` nodes and views of those that keep the elements' order (a decode step's
    attention output reshaped for the output projection) becomes one ``mugraph::partitions``
    call: the same partitions run in the same order, and the dispatch into Python is paid
    once per run instead of once per partition (a layer's attention, output projection,
    MLP and the next layer's QKV projection). Returns how many calls were merged away."""
    runs, run = [], []
    views: dict[Node, tuple[Node, tuple[int, ...]]] = {}  # view -> (getitem, its shape)
    for node in graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.mugraph.partition.default:
            run.append(node)
            continue
        if node.op == "call_function" and node.target is operator.getitem and (
            node.args[0] in run
        ):
            continue
        if run and _order_keeping_view(node, run, views):
            continue
        if len(run) > 1:
            runs.append(run)
        run = []
    if len(run) > 1:
        runs.append(run)
    for calls in runs:
        _merge_calls(graph, calls, views)
    return sum(len(calls) - 1 for calls in runs)


# the data movements (lowering's names) a chain may pass through: views of their first
# argument (or, for contiguous, a copy), the other arguments constants
_CHAIN_VIEWS = frozenset({"reshape", "transpose", "permute", "t", "identity"})


def _order_keeping_view(node: Node, run: list[Node], views: dict) -> bool:
    """Whether ``node`` is a view of a ``run`` member's output (or of such a view) whose
    elements, read in order, are that output's in order: then, the outputs being fresh
    contiguous tensors, it is that output ``.view(shape)`` (recorded in ``views``). Checked
    by applying the node to the positions of the output's elements."""
    if node.op not in ("call_method", "call_function") or op_name(node) not in _CHAIN_VIEWS:
        return False
    if not node.args or not isinstance(node.args[0], Node):
        return False
    source = node.args[0]
    if source in views:
        item, shape = views[source]
    elif source.op == "call_function" and source.target is operator.getitem and (
        source.args[0] in run
    ):
        value = source.meta.get("val")
        if not isinstance(value, torch.Tensor):
            return False
        item, shape = source, tuple(value.shape)
    else:
        return False
    if _reads_nodes((node.args[1:], node.kwargs)):
        return False
    positions = torch.arange(math.prod(shape), dtype=torch.int32)
    try:
        before = positions.reshape(shape)
        if node.op == "call_method":
            after = getattr(before, node.target)(*node.args[1:], **node.kwargs)
        else:
            after = node.target(before, *node.args[1:], **node.kwargs)
    except Exception:  # noqa: BLE001 - not a view this check understands
        return False
    if not isinstance(after, torch.Tensor) or not torch.equal(after.reshape(-1), positions):
        return False
    views[node] = (item, tuple(after.shape))
    return True


def _reads_nodes(args: Any) -> bool:
    found = []
    torch.fx.node.map_arg(args, found.append)
    return bool(found)


def _merge_calls(graph: Graph, calls: list[Node], views: dict) -> None:
    """One ``mugraph::partitions`` call in place of consecutive partition ``calls`` (a
    member reading a ``views`` node reads the viewed output, reshaped inside the call)."""
    from mugraph.integration.runtime import output_count, register_chain

    inputs: list[Node] = []
    position: dict[Node, int] = {}
    produced: dict[Node, int] = {}  # a member's getitem -> its index in the chain's outputs
    members = []
    total = 0
    for call in calls:
        key, args = call.args
        refs = []
        for a in args:
            if a in produced:
                refs.append((1, produced[a]))
                continue
            if a in views and views[a][0] in produced:
                item, shape = views[a]
                refs.append((2, produced[item], shape))
                continue
            if a not in position:
                position[a] = len(inputs)
                inputs.append(a)
            refs.append((0, position[a]))
        members.append((key, refs))
        for user in call.users:
            produced[user] = total + user.args[1]
        total += output_count(key)
    with graph.inserting_before(calls[0]):
        merged = graph.call_function(torch.ops.mugraph.partitions.default,
                                     (register_chain(members), inputs))
        for old, index in produced.items():
            item = graph.call_function(operator.getitem, (merged, index))
            item.meta = dict(old.meta)
            old.replace_all_uses_with(item)
    for old in produced:
        graph.erase_node(old)
    for call in reversed(calls):
        graph.erase_node(call)


def _root(gm: GraphModule, graph: Graph, modules: dict[str, torch.nn.Module]) -> dict:
    """Every attribute and submodule ``graph`` refers to, by qualified name."""
    root: dict[str, Any] = {}
    for node in graph.nodes:
        if node.op in ("get_attr", "call_module"):
            target = node.target
            root[target] = modules[target] if target in modules else passes.fetch_attr(gm, target)
    return root


# ---- registration ------------------------------------------------------------------------------


def register_backend() -> bool:
    """Register ``"mugraph"`` with Dynamo (idempotent); False when the name is taken."""
    try:
        from torch._dynamo.backends import registry
    except ImportError:  # pragma: no cover - a torch without Dynamo
        return False
    if registry._COMPILER_FNS.get(BACKEND_NAME) is mugraph_backend:
        return True
    if BACKEND_NAME in registry._COMPILER_FNS:
        return False
    if registry._BACKENDS.get(BACKEND_NAME) is not None:
        return True  # our entry point: Dynamo registers it when the name is looked up
    registry.register_backend(mugraph_backend, name=BACKEND_NAME)
    return True
