"""Running a partition: the chosen μGraph on mugraph, or the original fx nodes on PyTorch.

A :class:`MugraphPartition` stands in the rewritten fx graph for the nodes it replaces. It
receives their outside inputs and returns their outside outputs (a tuple). It runs

* on CUDA tensors: the μGraph compiled by :func:`mugraph.compile`;
* on CPU tensors: the μGraph's reference semantics (``graph(inputs=...)``);
* the original PyTorch nodes (``fallback``) when mugraph is not to be used for it, when
  autograd needs the result, or — with a warning, once — when running the μGraph fails,
  including when its inputs do not have the shapes it was built for (the shape guard: a
  kernel is never run on another shape; the backend specializes per input signature, so
  this only fires if something calls a partition outside its specialization).
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any

import torch
from torch.fx import Graph, GraphModule

from mugraph.errors import MugraphError, ShapeError
from mugraph.integration.capture import CapturedProgram, ExternalInput, apply_adapters
from mugraph.integration.flat_calls import CallSite
from mugraph.integration.torch_ops import concat, fold_weights, memo_holds


def fallback_module(captured: CapturedProgram) -> GraphModule:
    """The partition's original fx nodes as a module: raw inputs in, outputs (a tuple) out."""
    graph = Graph()
    env = {}
    for i, node in enumerate(captured.raw_inputs):
        env[node] = graph.placeholder(f"in{i}_{node.name}")
    for node in captured.nodes:
        env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(tuple(env[n] for n in captured.outputs))
    return GraphModule(torch.nn.Module(), graph)


def _on_cuda(values: tuple) -> bool:
    return any(isinstance(v, torch.Tensor) and v.device.type == "cuda" for v in values)


def cuda_milliseconds(fn, warmup: int = 2, reps: int = 15) -> float:
    """Median milliseconds of ``fn()`` on the current CUDA stream."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def cuda_mean_milliseconds(fn, warmup: int = 3, reps: int = 20) -> float:
    """Mean milliseconds of ``reps`` back-to-back calls of ``fn()`` on the current CUDA
    stream (after ``warmup`` calls): one pair of events around them all."""
    for _ in range(warmup):
        fn()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


class NumericMismatch(MugraphError):
    """A partition's μGraph computed other values than its PyTorch nodes on real inputs."""


def _needs_autograd(values: tuple) -> bool:
    if not torch.is_grad_enabled():
        return False
    return any(isinstance(v, torch.Tensor) and v.requires_grad for v in values)


class MugraphPartition(torch.nn.Module):
    """One partition of an fx graph, run by mugraph (see the module docstring)."""

    def __init__(self, captured: CapturedProgram, best, use_mugraph: bool, report=None,
                 fallback: GraphModule | None = None) -> None:
        super().__init__()
        self.fallback = fallback if fallback is not None else fallback_module(captured)
        self.program = captured.graph
        self.best = best
        self.specs = list(captured.input_specs)
        self.output_index = list(captured.output_index)
        self.output_shapes = list(captured.output_shapes)
        self.use_mugraph = use_mugraph
        self.report = report
        self._consts: dict[tuple, torch.Tensor] = {}
        # per kernel-graph input: the view made of a raw tensor last time (a weight's W.T):
        # (weak reference to the raw tensor, its address, the view), reused while both hold
        self._views: dict[int, tuple] = {}
        self._compiled = None
        # on a GPU, time the μGraph against the PyTorch nodes on the first call and keep the
        # faster (the search's cost model is an estimate; this is a measurement)
        self.measure = True
        self.timer = cuda_milliseconds
        self._prepared: list | None = None  # see prepare_inside
        self._outside: dict[int, tuple] = {}  # see adapt_outside

    def prepare_inside(self, layout: list) -> None:
        """The operator's inputs from now on: for raw input i, ``layout[i]`` is None (it comes
        as it is) or ``(kind, site, count)``: it is prepared in the call from the next
        ``count`` tensors, as ``mugraph::fold_weights`` (kind "fold") or ``mugraph::concat``
        would (the same memo)."""
        self._prepared = layout if any(entry is not None for entry in layout) else None

    def copies_outside(self) -> list[tuple[int, int, tuple]]:
        """The kernel-graph inputs whose adapters copy (a scale, a cast), as (spec index, raw
        input, the adapters up to the last copy): the graph around the operator can compute
        those (Inductor fuses a scale or a cast into the kernel producing the raw input)."""
        found = []
        for i, spec in enumerate(self.specs):
            if not isinstance(spec, ExternalInput):
                continue
            last = max((k for k, (kind, _) in enumerate(spec.adapters)
                        if kind not in _VIEW_ADAPTERS), default=-1)
            if last >= 0:
                found.append((i, spec.source, spec.adapters[:last + 1]))
        return found

    def adapt_outside(self, specs: list[int]) -> None:
        """The operator's inputs from now on end with, for each kernel-graph input in
        ``specs`` (from :meth:`copies_outside`), its raw input already through its copying
        adapters (see :meth:`outside`); only the views after them are applied here."""
        self._outside = {}
        for j, (i, _, done) in enumerate(c for c in self.copies_outside() if c[0] in specs):
            self._outside[i] = (j, self.specs[i].adapters[len(done):])

    def outside(self) -> list[tuple[int, tuple]]:
        """The copies the graph makes for this partition, in the order they end its
        operator's inputs: (raw input, its copying adapters)."""
        return [(source, done) for i, source, done in self.copies_outside()
                if i in self._outside]

    def weight_positions(self) -> list[int]:
        """The positions among the operator's inputs that weights are prepared from (see
        :meth:`prepare_inside`)."""
        out, j = [], 0
        for entry in self._prepared or ():
            count = 1 if entry is None else entry[2]
            if entry is not None:
                out.extend(range(j, j + count))
            j += count
        return out

    def runs_compiled(self) -> bool:
        """Whether a call runs the compiled μGraph and nothing else (decided, no first-call
        measurement left)."""
        return self._compiled is not None and self.use_mugraph and not self.measure

    def holds(self, storage: int) -> bool:
        """Whether one of this partition's constant inputs lives at ``storage``."""
        return any(t.untyped_storage().data_ptr() == storage for t in self._consts.values())

    def _raw(self, given: list) -> list:
        """The partition's raw inputs from the operator's (see :meth:`prepare_inside`)."""
        raw, j = [], 0
        for entry in self._prepared:
            if entry is None:
                raw.append(given[j])
                j += 1
                continue
            kind, site, count = entry
            tensors = list(given[j:j + count])
            j += count
            raw.append(fold_weights(tensors[0], tensors[1:], site) if kind == "fold"
                       else concat(tensors, site))
        return raw

    def forward(self, *raw: Any) -> tuple:
        if not self.use_mugraph or _needs_autograd(raw):
            return self.fallback(*raw)
        try:
            if self.measure and _on_cuda(raw):
                self.choose_by_measurement(raw)
                if not self.use_mugraph:
                    return self.fallback(*raw)
            outs = self._run(raw)
        except Exception as error:  # noqa: BLE001 - never fail the model: PyTorch takes over
            self.give_up(error)
            return self.fallback(*raw)
        return tuple(self._shaped(outs[i], k) for k, i in enumerate(self.output_index))

    def run_op(self, raw: list) -> list[torch.Tensor]:
        """The body of ``torch.ops.mugraph.partition``: the outputs as fresh contiguous tensors.
        Once the partition runs on mugraph for good, straight to the compiled program (which
        checks its inputs' shapes on every call and never returns an input's memory); else
        through :meth:`forward`, whose PyTorch nodes may return views of the inputs."""
        adapted = None
        if self._outside:
            cut = len(raw) - len(self._outside)
            raw, adapted = raw[:cut], raw[cut:]
        if self._prepared is not None:
            raw = self._raw(raw)
        program = self._compiled
        if program is not None and self.use_mugraph and not self.measure and not (
            _needs_autograd(raw)
        ):
            try:
                outs = program(inputs=self._inputs(raw, adapted))
            except Exception as error:  # noqa: BLE001 - PyTorch takes over, as in forward
                self.give_up(error)
            else:
                return [self._shaped(outs[i], k).contiguous()
                        for k, i in enumerate(self.output_index)]
        outs = []
        for value in self(*raw):
            value = value.contiguous()
            outs.append(value.clone() if _aliases(value, raw) else value)
        return outs

    def choose_by_measurement(self, raw: tuple, rival=None, copies_outside: bool = False
                              ) -> dict:
        """Time both ways of running this partition once; PyTorch keeps it when faster.
        ``rival``: makes the PyTorch nodes compiled (by Inductor; None if it cannot), timed
        too when mugraph beats the nodes run op by op; PyTorch's time is then the better of
        the two. ``copies_outside``: the inputs' copying adapters will be computed by the
        graph (:meth:`adapt_outside`), so mugraph is timed without them. Returns the times
        (milliseconds)."""
        self.measure = False
        adapted = None
        if copies_outside:
            self.adapt_outside([i for i, _, _ in self.copies_outside()])
            adapted = [apply_adapters(raw[source], done) for source, done in self.outside()]
        try:
            self.check_against_pytorch(raw, adapted)
            ours = self.timer(self._as_in_the_model(raw, adapted))
        finally:
            self._outside = {}
        theirs = self.timer(lambda: self.fallback(*raw))
        measured = {"mugraph_ms": ours, "pytorch_ms": theirs}
        compiled = rival() if rival is not None and ours <= theirs else None
        if compiled is not None:
            measured["inductor_ms"] = self.timer(lambda: compiled(*raw))
        self.adopt(measured)
        return measured

    def _as_in_the_model(self, raw: tuple, adapted: list | None):
        """A call of this partition on ``raw`` as a compiled model makes it once recorded: its
        compiled program's launches replayed (:class:`~mugraph.integration.flat_calls.FlatCall`),
        not the Python path of a first call (which took 20-40 us more per call on the H100
        machine, enough to hand a gated MLP whose kernel is faster to PyTorch: sixteenth
        session). The full path when the program's call cannot be flattened."""
        from mugraph.integration.flat_calls import NotFlat, recorded

        program = self._compiled
        full = lambda: self._run(raw, adapted)  # noqa: E731
        if program is None or not self.use_mugraph or not torch.cuda.is_available():
            return full
        inputs = self._inputs(raw, adapted)
        try:
            _, flat = recorded(lambda: program(inputs=inputs), inputs, 1, lambda storage: True,
                               ())
        except Exception:  # noqa: BLE001 - a failed call: the full path is timed
            return full
        if isinstance(flat, NotFlat):
            return full
        return lambda: flat.run(inputs) or full()  # (None: the recording no longer applies)

    def check_against_pytorch(self, raw: tuple, adapted: list | None) -> None:
        """Raises when the μGraph's outputs on these inputs (the first call's) are not the
        PyTorch nodes' within the dtype's tolerance (the code generator's,
        :data:`mugraph.codegen.check.TOLERANCES`): a kernel that verified over finite fields
        yet computes wrongly here (a compiler fault) never runs."""
        from mugraph.codegen.check import TOLERANCES, compare

        ours = self._run(raw, adapted)
        theirs = self.fallback(*raw)
        for k, i in enumerate(self.output_index):
            want = theirs[k]
            rtol_atol = TOLERANCES.get(self.best.output_types[i].dtype)
            if rtol_atol is None or not isinstance(want, torch.Tensor):
                continue
            got = self._shaped(ours[i], k).detach().double().cpu().numpy()
            want = want.detach().double().cpu().numpy()
            check = compare(got, want, *rtol_atol)
            if not check.ok:
                at = check.worst_index
                raise NumericMismatch(
                    f"output {k} differs from PyTorch's on the first call's inputs "
                    f"({check.beyond} of {check.count} elements beyond the tolerance, worst "
                    f"{check.max_rel_error:.3g}x it at {at}: {got[at]:.6g} for "
                    f"{want[at]:.6g}; {check.nonfinite_mismatch} non-finite mismatches)")

    def adopt(self, measured: dict) -> None:
        """Run on mugraph or on PyTorch as ``measured`` (this partition's times, or those of
        one computing the same function on the same shapes) says."""
        self.measure = False
        ours = measured["mugraph_ms"]
        theirs = min(v for k, v in measured.items() if k != "mugraph_ms")
        if self.report is not None:
            self.report.measured = dict(measured)
        if theirs < ours:
            self.use_mugraph = False
            if self.report is not None:
                self.report.runs_on = "pytorch"
                self.report.detail = (f"measured slower than PyTorch ({ours:.3f} ms vs "
                                      f"{theirs:.3f} ms)")

    def _shaped(self, value, k: int):
        shape = self.output_shapes[k] if self.output_shapes else None
        if not isinstance(value, torch.Tensor):
            value = torch.as_tensor(value)
        return value if shape is None or value.shape == shape else value.reshape(shape)

    def give_up(self, error: Exception) -> None:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        warnings.warn(
            f"mugraph: running partition {getattr(self.report, 'name', '?')} failed "
            f"({type(error).__name__}: {first}); it runs on PyTorch from now on",
            stacklevel=3,
        )
        self.use_mugraph = False
        if self.report is not None:
            self.report.runs_on = "pytorch"
            self.report.detail = f"runtime failure: {first}"

    def _inputs(self, raw: tuple, adapted: list | None = None) -> list[torch.Tensor]:
        """The kernel graph's inputs from the raw inputs (and, see :meth:`adapt_outside`, the
        inputs the graph adapted)."""
        inputs = []
        for i, spec in enumerate(self.specs):
            if isinstance(spec, ExternalInput):
                value, adapters = raw[spec.source], spec.adapters
                if adapted is not None and i in self._outside:
                    j, adapters = self._outside[i]
                    value = adapted[j]
                inputs.append(self._view(i, value, adapters) if adapters else value)
            else:
                device = next(v.device for v in raw if isinstance(v, torch.Tensor))
                inputs.append(self._const(spec, device))
        return inputs

    def _view(self, i: int, value: torch.Tensor, adapters: tuple) -> torch.Tensor:
        """``value`` through ``adapters``; a pure view of the same tensor at the same address
        (a model's weights, call after call) is made once and reused. (A copy, such as a
        cast mask, is made on every call: Inductor reuses a buffer, rewritten by its own
        kernels, for other values, so neither the tensor nor its version says its content.)"""
        kept = self._views.get(i)
        if kept is not None and kept[0]() is value and kept[1] == value.data_ptr():
            return kept[2]
        view = apply_adapters(value, adapters)
        if _pure_view(adapters) and _same_memory(view, value):
            self._views[i] = (weakref.ref(value), value.data_ptr(), view)
        return view

    def _const(self, spec, device: torch.device) -> torch.Tensor:
        """A constant input (a scalar, a causal mask), made once per device."""
        key = (spec, str(device))
        if key not in self._consts:
            self._consts[key] = spec.tensor(device)
        return self._consts[key]

    def _check_shapes(self, inputs: list[torch.Tensor]) -> None:
        """The guard: a μGraph runs only on the shapes it was searched and verified for."""
        for i, (t, want) in enumerate(zip(inputs, self.best.input_types, strict=True)):
            if tuple(t.shape) != tuple(want.dims):
                raise ShapeError(
                    f"partition {getattr(self.report, 'name', '?')}: input {i} has shape "
                    f"{list(t.shape)}, the μGraph was built for {list(want.dims)}"
                )

    def _run(self, raw: tuple, adapted: list | None = None) -> list[torch.Tensor]:
        inputs = self._inputs(raw, adapted)
        self._check_shapes(inputs)
        if inputs[0].device.type == "cuda":
            if self._compiled is None:
                from mugraph.runtime.compiled import compile_graph

                self._compiled = compile_graph(self.best, cuda_graph=False)
            return self._compiled(inputs=inputs)
        return self.best(inputs=inputs)


# ---- partitions as an opaque operator (for Inductor) -------------------------------------------

_PARTITIONS: dict[int, MugraphPartition] = {}


def register_partition(module: MugraphPartition, outputs: list) -> int:
    """Make ``module`` callable as ``torch.ops.mugraph.partition(key, inputs)``; ``outputs``
    are the fake values of its outputs (shapes and dtypes)."""
    key = len(_PARTITIONS)
    module.fake_outputs = [(tuple(v.shape), v.dtype) for v in outputs]
    _PARTITIONS[key] = module
    return key


_VIEW_ADAPTERS = frozenset({"permute", "reshape", "slice"})


def _pure_view(adapters: tuple) -> bool:
    return all(kind in _VIEW_ADAPTERS for kind, _ in adapters)


def _same_memory(view: torch.Tensor, value: torch.Tensor) -> bool:
    """Whether ``view`` reads ``value``'s memory (a reshape that copied does not)."""
    return view.untyped_storage().data_ptr() == value.untyped_storage().data_ptr()


def _aliases(value: torch.Tensor, inputs: list[torch.Tensor]) -> bool:
    ptr = value.untyped_storage().data_ptr()
    return any(t.untyped_storage().data_ptr() == ptr for t in inputs)


def run_partition(key: int, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """``torch.ops.mugraph.partition(key, inputs)``: run registered partition ``key``; fresh
    contiguous outputs (never views of inputs). On CUDA in steady state, its recorded
    launches (:mod:`mugraph.integration.flat_calls`)."""
    module = _PARTITIONS[key]
    if not (inputs and inputs[0].is_cuda):
        return module.run_op(inputs)
    site = _site(("partition", key), module, lambda: _partition_site(key))
    return site.call(inputs, module.run_op, module.runs_compiled)


# operator call sites: ("partition" | "chain", key) -> (what they run, their recorded calls)
_SITES: dict[tuple[str, int], tuple[Any, CallSite]] = {}


def _site(key: tuple[str, int], owner: Any, make) -> CallSite:
    """The call site of ``key`` for ``owner`` (the registered partition or chain; a site made
    for something else registered under the key before is made again)."""
    entry = _SITES.get(key)
    if entry is None or entry[0] is not owner:
        entry = _SITES[key] = (owner, make())
    return entry[1]


def _stable_in(members: list[MugraphPartition]):
    """Whether a storage holds a tensor that outlives calls: a prepared weight or a member's
    constant."""
    return lambda storage: memo_holds(storage) or any(m.holds(storage) for m in members)


def _partition_site(key: int) -> CallSite:
    module = _PARTITIONS[key]
    return CallSite(f"partition {key}", 1, _stable_in([module]), module.weight_positions())


def _chain_site(key: int) -> CallSite:
    members = [_PARTITIONS[member] for member, _ in _CHAINS[key]]
    weights: list[int] | None = []
    for (_, refs), module in zip(_CHAINS[key], members, strict=True):
        for position in module.weight_positions():
            ref = refs[position]
            if ref[0] != 0:  # a weight prepared from another member's output
                weights = None
                break
            weights.append(ref[1])
        if weights is None:
            break
    return CallSite(f"chain {key}", len(members), _stable_in(members), weights)


def call_site_stats() -> list[dict]:
    """Per operator call site: its calls on the recorded launches and on the full path, and
    how its recording went."""
    return [{"site": site.name, "flat_calls": site.fast, "full_calls": site.full,
             "note": site.note} for _, site in _SITES.values()]


def _run_partition_fake(key: int, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    device = inputs[0].device
    return [torch.empty(shape, dtype=dtype, device=device)
            for shape, dtype in _PARTITIONS[key].fake_outputs]


# ---- consecutive partitions as one operator call -------------------------------------------------

# chain key -> its members: (partition key, where each of its inputs comes from: (0, i) the
# chain's input i, (1, j) output j of the members before it, their outputs concatenated,
# (2, j, shape) that output viewed as ``shape``, its elements in the same order)
_CHAINS: dict[int, tuple[tuple[int, tuple[tuple, ...]], ...]] = {}


def register_chain(members: list[tuple[int, list[tuple]]]) -> int:
    """Make registered partitions that run one after the other callable as one
    ``torch.ops.mugraph.partitions(key, inputs)``, which returns every member's outputs, in
    order (see ``_CHAINS``)."""
    key = len(_CHAINS)
    _CHAINS[key] = tuple((member, tuple(refs)) for member, refs in members)
    return key


def output_count(key: int) -> int:
    """How many outputs registered partition ``key`` returns."""
    return len(_PARTITIONS[key].fake_outputs)


def chain_members(key: int) -> list[int]:
    """The partition keys a registered chain runs, in order."""
    return [member for member, _ in _CHAINS[key]]


def run_chain(key: int, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """``torch.ops.mugraph.partitions(key, inputs)``: each member's ``run_op`` in turn (one
    operator call instead of one per partition: the dispatch into Python is paid once); in
    steady state, the recorded launches of all of them."""
    if not (inputs and inputs[0].is_cuda):
        return _run_members(key, inputs)
    site = _site(("chain", key), _CHAINS[key], lambda: _chain_site(key))
    return site.call(inputs, lambda given: _run_members(key, given),
                     lambda: all(_PARTITIONS[m].runs_compiled() for m, _ in _CHAINS[key]))


def _run_members(key: int, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    outs: list[torch.Tensor] = []
    for member, refs in _CHAINS[key]:
        outs.extend(_PARTITIONS[member].run_op([_chain_input(ref, inputs, outs) for ref in refs]))
    return outs


def _chain_input(ref: tuple, inputs: list[torch.Tensor], outs: list[torch.Tensor]):
    """A chain member's input (see ``_CHAINS``); members' outputs are fresh contiguous
    tensors, so an order-keeping view of one is ``.view``."""
    kind = ref[0]
    if kind == 0:
        return inputs[ref[1]]
    if kind == 1:
        return outs[ref[1]]
    return outs[ref[1]].view(ref[2])


def _run_chain_fake(key: int, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    device = inputs[0].device
    return [torch.empty(shape, dtype=dtype, device=device)
            for member, _ in _CHAINS[key] for shape, dtype in _PARTITIONS[member].fake_outputs]


# Defined on a torch.library.Library rather than with torch.library.custom_op: the call is on
# every step of a compiled model, and custom_op's Python wrappers (autograd, aliasing checks)
# cost about 20 us a call more (an empty operator: 26 against 7 us on the 2-core development
# machine); partitions never run under autograd inside Inductor's graphs (the backend gives
# Inductor no graph that needs it).
_LIBRARY = torch.library.Library("mugraph", "FRAGMENT")
_LIBRARY.define("partition(int key, Tensor[] inputs) -> Tensor[]")
_LIBRARY.define("partitions(int key, Tensor[] inputs) -> Tensor[]")
for _dispatch in ("CPU", "CUDA"):
    _LIBRARY.impl("partition", run_partition, _dispatch)
    _LIBRARY.impl("partitions", run_chain, _dispatch)
torch.library.register_fake("mugraph::partition")(_run_partition_fake)
torch.library.register_fake("mugraph::partitions")(_run_chain_fake)
