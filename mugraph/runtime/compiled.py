"""Compiled μGraphs: generated Triton kernels and PyTorch operators, called on tensors.

``compile_graph(graph)`` generates one Triton kernel per graph-defined kernel operator (see
:mod:`mugraph.codegen.triton_gen`) and binds every pre-defined operator to PyTorch
(:mod:`mugraph.codegen.torch_ops`). The resulting :class:`CompiledProgram` checks its inputs,
allocates intermediate tensors once per device and reuses them, launches the kernels in graph
order and returns fresh output tensors. It runs on CUDA tensors and, with
``TRITON_INTERPRET=1`` set before kernels are loaded, on CPU tensors.

Calls on CUDA take a fast path once a set of inputs has been seen (a :class:`_Plan`, keyed by
the inputs' data pointers and checked against their shapes, strides and dtypes): the launch
arguments of every kernel are precomputed, and kernels are launched through the compiled
kernel's launcher rather than Triton's JIT dispatch. With ``cuda_graph`` on (the default on
CUDA) a plan also captures the whole program in a CUDA graph, keyed by the pointers of the
fresh outputs it is given, the second time it sees them, and replays it afterwards: one launch
per call. Programs with PyTorch operators, or outputs that alias inputs, run the general path
(each operator dispatched from Python) and, with ``cuda_graph`` on, capture that path in a CUDA
graph the same way (a :class:`_CapturedPlan`).

Programs are cached in-process by the graph's structural hash and the options.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from functools import cache
from pathlib import Path
from typing import Any

from mugraph.codegen.chained import SYNC_SLOTS, generate_chained
from mugraph.codegen.launch import (  # noqa: F401 - re-exported: the runtime's launch API
    LARGE_TILE,
    SHARED_MEMORY_BUDGET,
    LaunchConfig,
    default_launch,
    loop_tile_bytes,
    max_warps,
)
from mugraph.codegen.loader import interpreter_active, load_kernel
from mugraph.codegen.stable_exp import NO_CARRY, KernelCarry, softmax_carry_plan
from mugraph.codegen.torch_ops import run_torch_op
from mugraph.codegen.triton_gen import CodegenOptions, KernelSource, generate_kernel
from mugraph.dtypes import DType
from mugraph.errors import GraphInputError, UnsupportedError
from mugraph.ir.builder import expect_kernel_graph
from mugraph.ir.graph import BlockGraph, Op
from mugraph.ir.ops import Group, OpKind
from mugraph.ir.tensor import TensorType, contiguous_strides
from mugraph.runtime.call import check_inputs

_INT32_SPAN = 2**31 - 1
CPU_HOW_TO = (
    "To run the kernels on CPU tensors, use Triton's interpreter: set TRITON_INTERPRET=1 in "
    "the environment before Python imports triton (e.g. TRITON_INTERPRET=1 python script.py), "
    "then compile"
)
MAX_GRAPHS_PER_PLAN = 4  # CUDA graphs kept per input set (one per set of output pointers)
MAX_PLANS = 8  # input sets with a fast path, per program

# While a caller records how a call ran (:func:`recording_program_calls`): a list each
# program call appends to — ("plan", plan, fresh outputs, inputs) for a fast plan's direct
# launches, ("other",) for any other path (the checked path, a CUDA graph, PyTorch operators).
_CALL_LOG: list | None = None


@contextmanager
def recording_program_calls():
    """Within this block, compiled programs' calls are logged to the list it yields (see
    ``_CALL_LOG``): what :mod:`mugraph.integration.flat_calls` flattens into launches."""
    global _CALL_LOG
    saved, log = _CALL_LOG, []
    _CALL_LOG = log
    try:
        yield log
    finally:
        _CALL_LOG = saved


def kernel_name(op_index: int) -> str:
    return f"mg_k{op_index}"


def kernel_label(op_index: int) -> str:
    return f"customized kernel %{op_index} ({kernel_name(op_index)})"


def op_label(graph, op_index: int) -> str:
    op = graph.ops[op_index]
    if op.kind is OpKind.CUSTOMIZED:
        return kernel_label(op_index)
    return f"PyTorch operator %{op_index} ({op.kind.value})"


def _span_of(shape, strides) -> int:
    return 1 + sum((d - 1) * abs(s) for d, s in zip(shape, strides, strict=True) if d > 0)


def _span(t) -> int:
    """Elements between a tensor's first and last address, plus one."""
    return _span_of(t.shape, t.stride())


def _is_out_of_resources(error: Exception) -> bool:
    return type(error).__name__ in ("OutOfResources", "OutOfResourcesError")


def _hook_active(hook: Any) -> bool:
    """Whether a Triton launch hook does anything (None, or an empty HookChain, does not)."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return calls is None or bool(calls)


def _direct_launcher(compiled: Any, grid: tuple[int, int, int]):
    """A function ``(stream, args)`` that launches ``compiled`` (a Triton CompiledKernel)
    through its launcher, as Triton's JIT does once it has found the kernel; raises
    :class:`_NoPlan` (with the reason) when that is not possible: the interpreter, launch
    hooks set (a profiler), or a Triton without these entry points."""
    if compiled is None:
        raise _NoPlan("no compiled kernel (interpreter?)")
    try:
        from triton import knobs

        hooks = knobs.runtime
        if _hook_active(hooks.launch_enter_hook) or _hook_active(hooks.launch_exit_hook):
            raise _NoPlan("Triton launch hooks are set")
    except ImportError:
        pass
    try:
        run = compiled.run  # loads the module (and checks its resources) on first access
        function = compiled.function
        packed = compiled.packed_metadata
    except Exception as error:  # noqa: BLE001 - no direct launch: the JIT path stays
        raise _NoPlan(f"compiled kernel without launcher entry points: {error}") from None
    g0, g1, g2 = grid

    def launch(stream: int, args) -> None:
        run(g0, g1, g2, stream, function, packed, None, None, None, *args)

    return launch


def _jit_launcher(step: KernelStep, index64: bool):
    """A function ``(stream, args)`` launching through Triton's JIT (tensor arguments; the
    stream is PyTorch's current one, as always with the JIT)."""
    kernel = step.kernel(index64)
    grid = step.grid

    def launch(stream: int, args) -> None:
        config = step.launch_config
        kernel[grid](*args, num_warps=config.num_warps, num_stages=config.num_stages)

    return launch


class _Launchable:
    """What a kernel step and a chained launch share: the generated source and loaded kernel
    for 32- and 64-bit indices (made on first use by ``_generate``), and the launch."""

    launch_config: LaunchConfig
    _sources: dict[bool, KernelSource]
    _kernels: dict[bool, Any]

    def _generate(self, index64: bool) -> KernelSource:
        raise NotImplementedError

    @property
    def grid(self) -> tuple[int, int, int]:
        raise NotImplementedError

    def kernel_source(self, index64: bool) -> KernelSource:
        if index64 not in self._sources:
            self._sources[index64] = self._generate(index64)
        return self._sources[index64]

    @property
    def source(self) -> KernelSource:
        return self.kernel_source(False)

    def kernel(self, index64: bool) -> Any:
        if index64 not in self._kernels:
            src = self.kernel_source(index64)
            self._kernels[index64] = load_kernel(src.name, src.source)
        return self._kernels[index64]

    def _launch(self, args: list, index64: bool) -> Any:
        """Launch through Triton's JIT; returns Triton's compiled kernel (None when
        interpreted). A launch out of shared memory is retried with fewer pipeline stages."""
        kernel = self.kernel(index64)
        while True:
            config = self.launch_config
            try:
                return kernel[self.grid](*args, num_warps=config.num_warps,
                                         num_stages=config.num_stages)
            except Exception as error:  # noqa: BLE001 - retried with a smaller pipeline
                if not _is_out_of_resources(error) or config.num_stages <= 1:
                    raise
                self.launch_config = replace(config, num_stages=config.num_stages - 1)


class KernelStep(_Launchable):
    """One graph-defined operator: its generated kernel(s) and launch configuration."""

    def __init__(self, graph, op_index: int, options: CodegenOptions, launch: LaunchConfig,
                 carry: KernelCarry | None = None) -> None:
        self.op_index = op_index
        self.carry = carry or KernelCarry()
        self.op: Op = graph.ops[op_index]
        self.block: BlockGraph = self.op.attr("graph")
        if launch.gemv_form is not None and launch.gemv_form != options.gemv_form:
            options = replace(options, gemv_form=launch.gemv_form)
        self.options = options
        self.launch_config = launch
        self.label = kernel_label(op_index)
        self._sources: dict[bool, KernelSource] = {}
        self._kernels: dict[bool, Any] = {}
        self.kernel_source(False)  # generate now: unsupported graphs fail at compile time

    def _generate(self, index64: bool) -> KernelSource:
        options = replace(self.options, index64=index64)
        return generate_kernel(self.block, kernel_name(self.op_index), self.label, options,
                               self.carry)

    @property
    def grid(self) -> tuple[int, int, int]:
        return self.block.grid_dim

    def arguments(
        self, inputs: list[Any], outputs: list[Any], scratch: Any, sides: Sequence[Any] = ()
    ) -> tuple[list, bool]:
        """The kernel's argument list for these tensors (``sides``: the scale tensors of the
        softmax carry), and whether it needs 64-bit indices."""
        tensors = [*inputs, *outputs, *sides] + ([scratch] if scratch is not None else [])
        index64 = any(_span(t) > _INT32_SPAN for t in tensors)
        args: list[Any] = []
        for t in [*inputs, *outputs, *sides]:
            args.append(t)
            args.extend(int(s) for s in t.stride())
        if scratch is not None:
            args.append(scratch)
        return args, index64

    def launch(
        self, inputs: list[Any], outputs: list[Any], scratch: Any, sides: Sequence[Any] = ()
    ) -> Any:
        """Launch with these tensors (:meth:`_launch`)."""
        args, index64 = self.arguments(inputs, outputs, scratch, sides)
        return self._launch(args, index64)


class ChainedStep(_Launchable):
    """Two kernel steps in one launch (:mod:`mugraph.codegen.chained`): a kernel whose
    outputs only the next kernel reads, and that kernel. Launched with the first's settings.
    Its arguments come in pairs (the first's, the second's); ``sync`` is its counters."""

    def __init__(self, first: KernelStep, second: KernelStep) -> None:
        self.first, self.second = first, second
        self.op_index = first.op_index
        self.label = f"{first.label} and {second.label}, one launch"
        self.launch_config = replace(first.launch_config, gemv_form=None)
        self._sources: dict[bool, KernelSource] = {}
        self._kernels: dict[bool, Any] = {}
        self.kernel_source(False)

    def _generate(self, index64: bool) -> KernelSource:
        parts = [
            (s.block, kernel_name(s.op_index), s.label, replace(s.options, index64=index64),
             s.carry)
            for s in (self.first, self.second)
        ]
        name = f"mg_c{self.first.op_index}_{self.second.op_index}"
        return generate_chained(parts, name, self.label)

    @property
    def grid(self) -> tuple[int, int, int]:
        return self.source.grid

    def arguments(self, inputs, outputs, sync: Any, sides) -> tuple[list, bool]:
        first, index64_first = self.first.arguments(inputs[0], outputs[0], None, sides[0])
        second, index64_second = self.second.arguments(inputs[1], outputs[1], None, sides[1])
        return [*first, *second, sync], index64_first or index64_second

    def launch(self, inputs, outputs, sync: Any, sides) -> Any:
        args, index64 = self.arguments(inputs, outputs, sync, sides)
        return self._launch(args, index64)


def chained_pairs(graph, steps: dict[int, KernelStep]) -> dict[int, int]:
    """Kernel ``i`` -> kernel ``j`` run in one launch: ``j`` is the only reader of ``i``'s
    outputs (none a graph output), reads nothing else but program inputs, nothing else runs
    between them, neither needs block scratch, and ``j`` takes ``i``'s warp count."""
    outputs = {(r.op, r.index) for r in graph.outputs}
    readers: dict[int, set[int]] = {}
    for j, op in enumerate(graph.ops):
        for r in op.inputs:
            readers.setdefault(r.op, set()).add(j)
    ops = graph.ops
    pairs: dict[int, int] = {}
    for i, first in steps.items():
        if len(readers.get(i, ())) != 1 or i in pairs.values():
            continue
        (j,) = readers[i]
        second = steps.get(j)
        if second is None or any((i, k) in outputs for k in range(len(ops[i].outputs))):
            continue
        if any(r.op != i and (ops[r.op].kind is not OpKind.INPUT or r.op > i)
               for r in ops[j].inputs):
            continue
        if any(ops[k].kind is not OpKind.INPUT for k in range(i + 1, j)):
            continue
        if first.source.scratch_per_block or second.source.scratch_per_block:
            continue
        if first.launch_config.num_warps > max_warps(second.block):
            continue
        pairs[i] = j
    return pairs


@dataclass
class _DeviceState:
    device: Any
    buffers: dict[tuple[int, int], Any] = field(default_factory=dict)
    scratch: dict[int, Any] = field(default_factory=dict)
    scales: dict[tuple[int, int], Any] = field(default_factory=dict)  # softmax carry
    syncs: dict[int, Any] = field(default_factory=dict)  # counters of chained launches


class CompiledProgram:
    """A kernel graph bound to generated kernels; call it as ``program(inputs=[...])``.

    cuda_graph: capture each input set's launches in a CUDA graph and replay it (None: on for
    CUDA tensors). Replays read the inputs at the addresses they had when captured, so a
    tensor changed in place is seen; outputs are fresh tensors on every call, as without it.
    """

    def __init__(
        self,
        graph,
        options: CodegenOptions | None = None,
        launch: dict[int, LaunchConfig] | None = None,
        kernel_options: dict[int, CodegenOptions] | None = None,
        cuda_graph: bool | None = None,
    ) -> None:
        graph.check()
        self.graph = graph
        self.options = options or CodegenOptions(interpret=interpreter_active())
        self.kernel_options = dict(kernel_options or {})
        self.cuda_graph = cuda_graph
        launch = dict(launch or {})
        stable = self.options.stable_exp and all(o.stable_exp for o in self.kernel_options.values())
        self.carry = softmax_carry_plan(graph) if stable else NO_CARRY
        self.steps: dict[int, KernelStep] = {}
        for i, op in enumerate(graph.ops):
            if op.kind is OpKind.CUSTOMIZED:
                config = launch.get(i) or default_launch(op.attr("graph"))
                opts = self.kernel_options.get(i, self.options)
                self.steps[i] = KernelStep(graph, i, opts, config, self.carry.of(i))
        self.chains: dict[int, ChainedStep] = {}  # first op index -> its chained launch
        if self.options.chain_launches:
            for i, j in chained_pairs(graph, self.steps).items():
                try:
                    self.chains[i] = ChainedStep(self.steps[i], self.steps[j])
                except UnsupportedError:
                    continue  # launched apart
        self._devices: dict[str, _DeviceState] = {}
        # every device's plans: by input pointers where a CUDA graph holds them, else by the
        # inputs' shapes, strides and dtypes (the pointers are read at each call)
        self._plans: dict[tuple, _Plan | _CapturedPlan] = {}
        self._last_open: _Plan | None = None
        self.plan_note = ""  # how the fast path went (or why there is none)
        self._build_plan()

    # ---- introspection -------------------------------------------------------------------

    @property
    def kernels(self) -> list[KernelSource]:
        return [step.source for step in self.steps.values()]

    @property
    def launch_configs(self) -> dict[int, LaunchConfig]:
        return {i: step.launch_config for i, step in self.steps.items()}

    @property
    def source(self) -> str:
        """All generated Triton source, one kernel after the other (a comment saying so when
        the graph has no custom kernel: its operators all run as PyTorch ops)."""
        parts = [f"# ---- {k.label} ----\n{k.source}" for k in self.kernels]
        parts += [f"# ---- launched: {c.label} ----\n{c.source.source}"
                  for c in self.chains.values()]
        if not parts:
            return (f"# no generated kernel: this graph has no custom kernel; its operators "
                    f"({', '.join(self._torch_ops()) or 'none'}) run as PyTorch ops\n")
        return "\n\n".join(parts)

    def _torch_ops(self) -> list[str]:
        """The kinds of the graph's operators that run as PyTorch ops, in order."""
        return [op.kind.value for op in self.graph.ops
                if op.kind not in (OpKind.INPUT, OpKind.CUSTOMIZED)]

    def __repr__(self) -> str:
        names = ", ".join(k.name for k in self.kernels) or "none"
        return (f"CompiledProgram(kernels: {names}; PyTorch ops: "
                f"{', '.join(self._torch_ops()) or 'none'})")

    def save_codes(self, directory) -> list[Path]:
        """Write one ``.py`` file per kernel into ``directory``; return the paths."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for kernel in self.kernels:
            path = out / f"{kernel.name}.py"
            path.write_text(kernel.source)
            paths.append(path)
        return paths

    def with_config(
        self,
        op_index: int,
        launch: LaunchConfig | None = None,
        options: CodegenOptions | None = None,
    ) -> CompiledProgram:
        """A copy of this program with one kernel's launch config or codegen options changed."""
        configs = self.launch_configs
        kernel_options = dict(self.kernel_options)
        if launch is not None:
            configs[op_index] = launch
        if options is not None:
            kernel_options[op_index] = options
        return CompiledProgram(self.graph, self.options, configs, kernel_options, self.cuda_graph)

    def fast_path_stats(self) -> dict[str, int]:
        """How many input sets have a fast path and how many CUDA graphs they hold."""
        plans = list(self._plans.values())
        return {
            "plans": len(plans),
            "graphs": sum(len(p.graphs) for p in plans),
            "graph_replays": sum(p.replays for p in plans),
        }

    def fast_path_note(self) -> str:
        """Why the fast path or the CUDA graphs are off, or which launcher they use."""
        failed = [p.graph_failed for p in self._plans.values() if p.graph_failed]
        return self.plan_note + (f"; CUDA graph capture failed: {failed[0]}" if failed else "")

    # ---- running -------------------------------------------------------------------------

    def __call__(self, inputs: Sequence[Any] | None = None, **kwargs: Any) -> list[Any]:
        if kwargs:
            raise UnsupportedError(f"compiled program: unknown options {sorted(kwargs)}")
        if self._plans:
            plan = self._plan_for(inputs)
            if plan is not None:
                if plan.verified:
                    return plan.call(inputs)
                try:
                    outs = plan.call(inputs)
                except Exception as error:  # noqa: BLE001 - this Triton launches otherwise
                    self._plans.clear()
                    self._last_open = None
                    self._plannable = False
                    self.plan_note = f"fast path off: {type(error).__name__}: {error}"
                else:
                    plan.verified = True
                    return outs
        return self._call_checked(inputs)

    def _plan_for(self, inputs) -> _Plan | _CapturedPlan | None:
        """The plan made for inputs like these (None: the checked path runs)."""
        last = self._last_open
        if last is not None and last.matches(inputs):
            return last
        try:
            plan = self._plans.get(_input_key(inputs))
        except Exception:  # noqa: BLE001 - not tensors: the checked path says what is wrong
            return None
        if plan is not None and not plan.matches(inputs):
            plan = None
        if plan is None:
            plan = next((p for p in self._plans.values() if p.open and p.matches(inputs)), None)
        if plan is None:
            return None
        if plan.open:
            self._last_open = plan
        return plan

    def _call_checked(self, inputs) -> list[Any]:
        if _CALL_LOG is not None:
            _CALL_LOG.append(("other",))
        self._check_inputs(inputs)
        state = self._device_state(inputs[0].device)
        on_gpu = (state.device.type == "cuda" and not interpreter_active()
                  and _current_device() == state.device.index)
        if self._plannable and on_gpu:
            trace: list = []
            values = self.run_values(inputs, _trace=trace)
            outs = [self._finish_output(values, k, ref) for k, ref in enumerate(self._outputs)]
            self._add_plan(inputs, state, values, trace)
            return outs
        outs = self.run_outputs(inputs)
        if on_gpu and self.cuda_graph is not False:
            self._remember(_CapturedPlan(self, inputs, state.device))
        return outs

    def run_outputs(self, inputs) -> list[Any]:
        """The general path: every operator in order, then the outputs as declared."""
        values = self.run_values(inputs)
        return [self._finish_output(values, k, ref) for k, ref in enumerate(self._outputs)]

    def run_values(
        self, inputs: Sequence[Any] | None, _trace: list | None = None
    ) -> list[list[Any]]:
        """Every operator's outputs (one list per operator of the kernel graph)."""
        self._check_inputs(inputs)
        state = self._device_state(inputs[0].device)
        values: list[list[Any]] = []
        launched: dict[int, list[Any]] = {}  # outputs of second kernels of chained launches
        for i, (kind, op, refs, payload) in enumerate(self._plan):
            if kind is OpKind.INPUT:
                values.append([inputs[payload]])
                continue
            if i in launched:
                values.append(launched.pop(i))
                continue
            args = [values[r.op][r.index] for r in refs]
            if i in self.chains:
                first, second = self._run_chain(self.chains[i], args, values, state, _trace)
                values.append(first)
                launched[self.chains[i].second.op_index] = second
            elif kind is OpKind.CUSTOMIZED:
                values.append(self._run_kernel(payload, args, state, _trace))
            else:
                values.append([run_torch_op(op, args)])
        return values

    def true_value(self, values: list[list[Any]], ref) -> Any:
        """Kernel-level tensor ``ref`` of :meth:`run_values` as the μGraph defines it: the
        partials of the softmax carry are stored rescaled (float32, with a scale tensor) and
        are multiplied back here, in float64."""
        t = values[ref.op][ref.index]
        key = (ref.op, ref.index)
        if key not in self.carry.partials:
            return t
        import torch

        scale = self._devices[str(t.device)].scales[key].double()
        width = self.carry.widths[key]  # element [..., i] has scale [..., i // width]
        return t.double() * torch.exp(scale.repeat_interleave(width, dim=-1))

    def _build_plan(self) -> None:
        """What each call needs, computed once: the op list, expected inputs, buffers."""
        graph = self.graph
        self._outputs = tuple(graph.outputs)
        self._plan = []
        for i, op in enumerate(graph.ops):
            payload = op.attr("index") if op.kind is OpKind.INPUT else self.steps.get(i)
            self._plan.append((op.kind, op, op.inputs, payload))
        self._expected = [(t.dims, t.dtype.torch_name) for t in graph.input_types]
        # an output that is a view (permute) is a view of a fresh tensor of its base
        self._bases = [view_base(graph, r) for r in self._outputs]
        self._fresh = {(b.op, b.index) for b, _ in self._bases}
        self._out_specs = [graph.tensor_type(r) for r in self._outputs]
        self._aliased = [graph.ops[b.op].kind is OpKind.INPUT for b, _ in self._bases]
        # the fast path covers programs of generated kernels (and views), whose outputs they
        # write
        self._plannable = all(
            op.kind in (OpKind.INPUT, OpKind.CUSTOMIZED) or op.kind in Group.VIEW
            for op in graph.ops
        ) and not any(self._aliased)

    def _check_inputs(self, inputs) -> None:
        """A quick check of the inputs; on any doubt the full check, which raises."""
        ok = inputs is not None and len(inputs) == len(self._expected)
        if ok:
            device = None
            for x, (dims, dtype) in zip(inputs, self._expected, strict=True):
                if tuple(getattr(x, "shape", ())) != dims or str(getattr(x, "dtype", "")) != (
                    "torch." + dtype
                ):
                    ok = False
                    break
                if device is None:
                    device = x.device
                elif x.device != device:
                    ok = False
                    break
        if not ok:
            check_inputs(self.graph, inputs)

    def _device_state(self, device) -> _DeviceState:
        key = str(device)
        state = self._devices.get(key)
        if state is None:
            self._check_device(device)
            state = self._devices[key] = _DeviceState(device)
        return state

    def _check_device(self, device) -> None:
        if device.type == "cuda":
            return
        if device.type == "cpu" and interpreter_active() and self.options.interpret:
            return
        if device.type == "cpu" and interpreter_active():
            raise GraphInputError(
                "this compiled program was made without Triton's interpreter, so it cannot run "
                "on CPU tensors: compile it again now that TRITON_INTERPRET=1 is set (set it "
                "before Python imports triton, e.g. TRITON_INTERPRET=1 python script.py)"
            )
        raise GraphInputError(
            f"compiled programs run on CUDA tensors; got tensors on {device}. {CPU_HOW_TO} "
            "(the source and save_codes() need neither; graph(inputs=...) on CPU tensors "
            "runs the reference semantics)"
        )

    def _run_kernel(
        self, step: KernelStep, args: list[Any], state: _DeviceState, trace: list | None = None
    ) -> list[Any]:
        i = step.op_index
        outs = [self._output_buffer(i, j, t, state) for j, t in enumerate(step.op.outputs)]
        scratch = self._scratch(step, state)
        sides = self._scale_buffers(step, state)
        compiled = step.launch(args, outs, scratch, sides)
        if trace is not None:
            trace.append((step, list(args), outs, scratch, sides, compiled))
        return outs

    def _run_chain(self, chain: ChainedStep, args: list[Any], values, state: _DeviceState,
                   trace: list | None = None) -> tuple[list[Any], list[Any]]:
        first, second = chain.first, chain.second
        i, j = first.op_index, second.op_index
        outs_first = [self._output_buffer(i, k, t, state) for k, t in enumerate(first.op.outputs)]
        args_second = [outs_first[r.index] if r.op == i else values[r.op][r.index]
                       for r in second.op.inputs]
        outs_second = [self._output_buffer(j, k, t, state)
                       for k, t in enumerate(second.op.outputs)]
        sync = state.syncs.get(i)
        if sync is None:
            import torch

            sync = state.syncs[i] = torch.zeros(SYNC_SLOTS, dtype=torch.int32,
                                                device=state.device)
        ins, outs = (args, args_second), (outs_first, outs_second)
        sides = (self._scale_buffers(first, state), self._scale_buffers(second, state))
        compiled = chain.launch(ins, outs, sync, sides)
        if trace is not None:
            trace.append((chain, ins, outs, sync, sides, compiled))
        return outs_first, outs_second

    def _output_buffer(self, i: int, j: int, t: TensorType, state: _DeviceState) -> Any:
        key = (i, j)
        if key in self._fresh:
            return _empty(t, state.device)  # graph outputs are fresh every call
        buf = state.buffers.get(key)
        if buf is None:
            # partials of the softmax carry are stored in float32 (float16 could overflow)
            want = replace(t, dtype=DType.float32) if key in self.carry.partials else t
            buf = state.buffers[key] = _empty(want, state.device)
        return buf

    def _scale_buffers(self, step: KernelStep, state: _DeviceState) -> list[Any]:
        """The scale tensors of the softmax carry the kernel reads (its rescaled inputs') and
        writes (its rescaled outputs'), in argument order (float32, contiguous)."""
        widths = step.carry.input_widths
        keys = [(r.op, r.index) for k, r in enumerate(step.op.inputs) if k in widths]
        keys += [(step.op_index, j) for j in sorted(step.carry.carried_outputs)]
        sides = []
        for key in keys:
            buf = state.scales.get(key)
            if buf is None:
                dims = self.carry.scale_dims(self.graph, key)
                t = TensorType(dims, DType.float32, contiguous_strides(dims))
                buf = state.scales[key] = _empty(t, state.device)
            sides.append(buf)
        return sides

    def _scratch(self, step: KernelStep, state: _DeviceState) -> Any:
        per_block = step.source.scratch_per_block
        if not per_block:
            return None
        if step.op_index not in state.scratch:
            import torch

            n = per_block * step.source.num_blocks
            state.scratch[step.op_index] = torch.empty(n, dtype=torch.float32, device=state.device)
        return state.scratch[step.op_index]

    def _finish_output(self, values: list[list[Any]], k: int, ref) -> Any:
        """The output as the graph declares it (strides of mark_output), never an input alias."""
        t = values[ref.op][ref.index]
        want = self._out_specs[k]
        if self._aliased[k] or (want.strides is not None and tuple(t.stride()) != want.strides):
            out = _empty(want, t.device)
            out.copy_(t)
            return out
        return t

    # ---- the fast path ---------------------------------------------------------------------

    def _add_plan(self, inputs, state: _DeviceState, values, trace) -> None:
        try:
            plan = _Plan.build(self, inputs, state, values, trace)
        except _NoPlan as why:
            self.plan_note = f"no fast path: {why}"
            return
        self._remember(plan)

    def _remember(self, plan: _Plan | _CapturedPlan) -> None:
        if len(self._plans) >= MAX_PLANS:
            self._plans.pop(next(iter(self._plans)))
            self._last_open = None
        self._plans[plan.key] = plan
        self.plan_note = plan.note


def view_base(graph, ref) -> tuple[Any, tuple[int, ...] | None]:
    """The tensor ``ref`` is a view of (through permutes), and the one permutation that
    gives ``ref`` from it (None: ``ref`` is no view)."""
    perm = None
    while graph.ops[ref.op].kind in Group.VIEW:
        step = graph.ops[ref.op].attr("perm")
        perm = step if perm is None else tuple(step[p] for p in perm)
        ref = graph.ops[ref.op].inputs[0]
    return ref, perm


def _viewed(fresh: list[Any], outputs: list[tuple[int, tuple[int, ...] | None]]) -> list[Any]:
    """A plan's outputs: fresh buffers, or views of them."""
    return [fresh[k] if perm is None else fresh[k].permute(perm) for k, perm in outputs]


class _NoPlan(Exception):
    """This input set gets no fast path (the general path stays correct)."""


class _Plan:
    """The launches of one program for one layout of its inputs, with arguments precomputed.

    Kernels are launched through their compiled launchers with pointers passed as integers:
    the plan is checked against the inputs' shapes, strides and dtypes, the inputs' and fresh
    outputs' pointers are read at each call, intermediate buffers belong to the program, and
    the fresh outputs of each call are allocated with the strides they were planned with. A
    plan whose launches a CUDA graph replays holds the inputs' pointers too: it is keyed by
    them (``open`` is False). Where Triton offers no such launcher,
    the plan launches through the JIT with tensors (slower, still without the checks).
    """

    def __init__(self) -> None:
        self.key: tuple = ()
        self.signature: list[tuple] = []
        self.device = None
        self.device_index = 0
        self.fresh_specs: list[tuple] = []  # (shape, strides, dtype) of each fresh buffer
        self.outputs: list[tuple] = []  # graph output k -> (fresh buffer, permutation or None)
        self.launches: list[tuple] = []  # (launch, args, fills, direct)
        self.use_graph = False
        self.graphs: OrderedDict = OrderedDict()
        self.seen: dict[tuple, int] = {}
        self.replays = 0
        self.graph_failed = ""
        self.verified = False  # a call went through (until then a failure turns it off)
        self.note = "fast path"
        self.open = True  # valid for any input pointers (no CUDA graph holds them)

    @classmethod
    def build(cls, program: CompiledProgram, inputs, state: _DeviceState, values, trace) -> _Plan:
        import torch

        plan = cls()
        plan.signature = _input_signature(inputs)
        plan.device = state.device
        plan.device_index = state.device.index if state.device.index is not None else 0
        fresh_index: dict[int, int] = {}  # id(tensor) -> fresh buffer index
        for i, j in sorted(program._fresh):
            t = values[i][j]
            fresh_index[id(t)] = len(plan.fresh_specs)
            plan.fresh_specs.append((tuple(t.shape), tuple(t.stride()), t.dtype))
            if t.data_ptr() % 16:
                raise _NoPlan("an output is not 16-byte aligned")
        plan.outputs = [(fresh_index[id(values[b.op][b.index])], perm)
                        for b, perm in program._bases]
        # views (permutes) of fresh buffers and inputs start where their bases start
        fresh_address = {values[i][j].data_ptr(): fresh_index[id(values[i][j])]
                         for i, j in program._fresh}
        input_index = {id(x): k for k, x in enumerate(inputs)}
        input_address = {x.data_ptr(): k for k, x in enumerate(inputs)}
        input_memory = {x.untyped_storage().data_ptr(): k for k, x in enumerate(inputs)}
        held = False  # some launch holds an input's pointer: the plan is keyed by them
        for step, ins, outs, scratch, sides, compiled in trace:
            args, index64 = step.arguments(ins, outs, scratch, sides)
            try:
                launch, direct = _direct_launcher(compiled, step.grid), True
            except _NoPlan as why:
                launch, direct = _jit_launcher(step, index64), False
                plan.note = f"fast path through Triton's JIT ({why})"
            fills = []  # (position, 0: fresh output k / 1: input k)
            flat: list[Any] = []
            for pos, a in enumerate(args):
                if isinstance(a, torch.Tensor):
                    k = fresh_index.get(id(a), fresh_address.get(a.data_ptr()))
                    given = input_index.get(id(a), input_address.get(a.data_ptr()))
                    if k is not None:
                        fills.append((pos, 0, k))
                    elif given is not None:
                        fills.append((pos, 1, given))
                    elif a.untyped_storage().data_ptr() in input_memory:
                        held = True  # a view of an input, passed as it was at planning
                    flat.append(a.data_ptr() if direct else a)
                else:
                    flat.append(a)
            for pos, _, _ in fills:  # never keep the caller's tensors (or pointers) in the plan
                flat[pos] = None
            plan.launches.append((launch, tuple(flat), tuple(fills), direct))
        want = program.cuda_graph
        plan.use_graph = (want is None or bool(want)) and state.device.type == "cuda"
        plan.open = not plan.use_graph and not held
        plan.key = ("any pointers", *plan.signature) if plan.open else _input_key(inputs)
        return plan

    def matches(self, inputs) -> bool:
        return _matches(self.signature, inputs)

    def call(self, inputs) -> list[Any]:
        fresh = self._allocate()
        if self.use_graph and not self.graph_failed:
            import torch

            if _CALL_LOG is not None:
                _CALL_LOG.append(("other",))
            capturing = torch.cuda.is_current_stream_capturing()
            key = tuple([t.data_ptr() for t in fresh])
            graph = self.graphs.get(key)
            if graph is not None and not capturing:
                graph.replay()
                self.replays += 1
                return _viewed(fresh, self.outputs)
            self.launch(fresh, inputs, _current_stream(self.device_index))
            if not capturing and _sightings(self.seen, key) >= 2:
                self._capture(key, fresh, inputs)
            return _viewed(fresh, self.outputs)
        self.launch(fresh, inputs, _current_stream(self.device_index))
        if _CALL_LOG is not None:
            _CALL_LOG.append(("plan", self, fresh, inputs))
        return _viewed(fresh, self.outputs)

    def _allocate(self) -> list[Any]:
        return allocate_fresh(self.fresh_specs, self.device)

    def launch(self, fresh: list[Any], inputs, stream: int) -> None:
        for launch, args, fills, direct in self.launches:
            if fills:
                args = list(args)
                if direct:
                    for pos, kind, k in fills:
                        args[pos] = (fresh[k] if kind == 0 else inputs[k]).data_ptr()
                else:
                    for pos, kind, k in fills:
                        args[pos] = fresh[k] if kind == 0 else inputs[k]
            launch(stream, args)

    def _capture(self, key: tuple, fresh: list[Any], inputs) -> None:
        """Capture this input set's launches with these outputs (replayed by later calls)."""
        _capture_into(self, key, lambda stream: self.launch(fresh, inputs, stream))


class _CapturedPlan:
    """One input set of a program that runs PyTorch operators (or returns an input): the
    general path, captured in a CUDA graph the second time a set of fresh outputs is seen and
    replayed afterwards — the operators' Python dispatch and the kernels' JIT launches then
    cost one graph launch per call. The capture writes the outputs into the fresh tensors it is
    given (keyed by their pointers, as :class:`_Plan`); PyTorch operators' intermediate tensors
    live in the graph's own memory pool. A program whose capture fails (an operator that
    synchronizes, say) keeps the general path."""

    def __init__(self, program: CompiledProgram, inputs, device) -> None:
        self.program = program
        self.key, self.signature = _input_key(inputs), _input_signature(inputs)
        self.device = device
        self.graphs: OrderedDict = OrderedDict()
        self.seen: dict[tuple, int] = {}
        self.replays = 0
        self.graph_failed = ""
        self.verified = True  # the general path is always right
        self.note = "CUDA graph of the general path (PyTorch operators)"
        self.open = False  # its graphs hold the inputs' pointers

    def matches(self, inputs) -> bool:
        return _matches(self.signature, inputs)

    def call(self, inputs) -> list[Any]:
        import torch

        program = self.program
        if _CALL_LOG is not None:
            _CALL_LOG.append(("other",))
        if self.graph_failed or torch.cuda.is_current_stream_capturing():
            return program.run_outputs(inputs)
        fresh = [_empty(t, self.device) for t in program._out_specs]
        key = tuple([t.data_ptr() for t in fresh])
        graph = self.graphs.get(key)
        if graph is None:
            if _sightings(self.seen, key) < 2:
                return program.run_outputs(inputs)
            graph = self._capture(key, fresh, inputs)
            if graph is None:
                return program.run_outputs(inputs)
        graph.replay()
        self.replays += 1
        return fresh

    def _capture(self, key: tuple, fresh: list[Any], inputs) -> Any:
        program = self.program

        def run(stream: int) -> None:
            values = program.run_values(inputs)
            for k, ref in enumerate(program._outputs):
                fresh[k].copy_(values[ref.op][ref.index])

        return _capture_into(self, key, run)


def _input_key(inputs) -> tuple:
    return tuple(x.data_ptr() for x in inputs)


def _input_signature(inputs) -> list[tuple]:
    return [(x.shape, tuple(x.stride()), x.dtype) for x in inputs]


def _matches(signature: list[tuple], inputs) -> bool:
    """Whether ``inputs`` have the shapes, strides and dtypes a plan was made for."""
    if len(inputs) != len(signature):
        return False
    for x, (shape, strides, dtype) in zip(inputs, signature, strict=False):
        if x.dtype is not dtype or x.shape != shape or x.stride() != strides:
            return False
    return True


SIGHTINGS_KEPT = 64  # output-pointer sets counted per plan before the counts start over


def _sightings(seen: dict[tuple, int], key: tuple) -> int:
    """How many times a plan has now been called with the fresh outputs ``key`` (a CUDA graph
    is captured at the second)."""
    count = seen.get(key, 0) + 1
    if len(seen) > SIGHTINGS_KEPT:
        seen.clear()
    seen[key] = count
    return count


def _capture_into(plan: _Plan | _CapturedPlan, key: tuple, run) -> Any:
    """Capture ``run(stream)`` on a side stream into a CUDA graph kept in ``plan.graphs`` under
    ``key`` (the oldest evicted beyond MAX_GRAPHS_PER_PLAN); None, with ``plan.graph_failed``
    saying why, when the capture fails (the plan then keeps launching without a graph)."""
    import torch

    graph = torch.cuda.CUDAGraph()
    current = torch.cuda.current_stream(plan.device)
    side = torch.cuda.Stream(plan.device)
    side.wait_stream(current)
    try:
        with torch.cuda.stream(side):
            graph.capture_begin()
            try:
                run(side.cuda_stream)
            finally:
                graph.capture_end()
    except Exception as error:  # noqa: BLE001 - no graph: the plan runs without one
        plan.graph_failed = f"{type(error).__name__}: {error}"
        return None
    finally:
        current.wait_stream(side)
    if len(plan.graphs) >= MAX_GRAPHS_PER_PLAN:
        plan.graphs.popitem(last=False)
    plan.graphs[key] = graph
    return graph


def _current_device() -> int:
    """The current CUDA device's index, without ``torch.cuda``'s Python layers where the
    binding is there."""
    import torch

    getter = getattr(torch._C, "_cuda_getDevice", None)
    return getter() if getter is not None else torch.cuda.current_device()


@cache
def _fast_empty_cuda():
    """PyTorch's C function allocating an uninitialised CUDA tensor on the current device
    (``(size, stride, dtype)``), or None where this PyTorch has none."""
    try:
        import torch

        return getattr(torch._C._dynamo.guards, "_empty_strided_cuda", None)
    except (ImportError, AttributeError):
        return None


def allocate_fresh(specs: list[tuple], device) -> list[Any]:
    """Fresh tensors of ``specs`` ((shape, strides, dtype) each) on ``device``: when it is the
    current CUDA device, through the C function Inductor's generated code allocates with,
    instead of ``torch.empty_strided`` (4.8-5.3 us for a partition's outputs on the H100
    machine, ``benchmarks/probe_partition_calls.py``)."""
    import torch

    fast = _fast_empty_cuda()
    if fast is not None and device.type == "cuda" and _current_device() == (device.index or 0):
        return [fast(shape, strides, dtype) for shape, strides, dtype in specs]
    return [torch.empty_strided(shape, strides, dtype=dtype, device=device)
            for shape, strides, dtype in specs]


def _current_stream(device_index: int) -> int:
    """The raw handle of PyTorch's current stream on the device (what Triton launches on)."""
    import torch

    getter = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if getter is not None:
        return getter(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


def _empty(t: TensorType, device) -> Any:
    import torch

    dtype = getattr(torch, t.dtype.torch_name)
    return torch.empty_strided(t.dims, t.strides, dtype=dtype, device=device)


# ---- compile_graph and its cache ---------------------------------------------------------

_PROGRAMS: dict[tuple, CompiledProgram] = {}
_CHECKED: set[tuple] = set()


def _freeze(mapping: dict | None) -> tuple:
    return tuple(sorted((mapping or {}).items()))


# CodegenOptions a caller may set (interpret and index64 follow from where kernels run)
USER_CODEGEN_OPTIONS = frozenset(
    f.name for f in fields(CodegenOptions) if f.name not in ("interpret", "index64"))


def compile_graph(
    graph,
    *,
    check: bool | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    launch: dict[int, LaunchConfig] | None = None,
    kernel_options: dict[int, CodegenOptions] | None = None,
    cache: bool = True,
    seed: int = 0,
    cuda_graph: bool | None = None,
    **codegen: Any,
) -> CompiledProgram:
    """Compile a kernel graph into a :class:`CompiledProgram`.

    num_warps / num_stages: one launch configuration for every kernel (``launch`` sets them
    per kernel, keyed by the customized operator's position in ``graph.ops``).
    codegen: fields of :class:`~mugraph.codegen.triton_gen.CodegenOptions`
    (:data:`USER_CODEGEN_OPTIONS`: all but interpret and index64).
    cuda_graph: replay each input set's launches as one CUDA graph (None: on for CUDA).
    Without ``launch``, ``num_warps`` and ``num_stages``, kernels launch with the settings
    ``superoptimize`` measured fastest for this graph, if any (:func:`recorded_launch`).
    check: run :func:`mugraph.codegen.check.check_against_reference` before returning
    (None, the default: once per graph in this process — the first program compiled from a
    graph is compared with the reference semantics on random inputs, and a mismatch raises
    CodegenMismatchError naming the kernel; launch variants of it are compared with that
    program by the tuner — when the kernels can run here: without a GPU or Triton's
    interpreter the program is source only, and calling it says what to set). False skips
    the check; True checks every new program (an error where the kernels cannot run).
    """
    expect_kernel_graph(graph, "compile_graph")
    graph.check()
    unknown = set(codegen) - USER_CODEGEN_OPTIONS
    if unknown:
        raise UnsupportedError(f"compile_graph: unknown options {sorted(unknown)}")
    options = CodegenOptions(interpret=interpreter_active(), **codegen)
    if launch is None and num_warps is None and num_stages is None:
        launch = recorded_launch(graph)
    configs = dict(launch or {})
    if num_warps is not None or num_stages is not None:
        for i, op in enumerate(graph.ops):
            if op.kind is OpKind.CUSTOMIZED and i not in configs:
                base = default_launch(op.attr("graph"))
                configs[i] = LaunchConfig(
                    num_warps or base.num_warps, num_stages or base.num_stages
                )
    configs = _within_max_warps(graph, configs)
    key = (
        graph.structural_hash(), options, _freeze(configs), _freeze(kernel_options), cuda_graph
    )
    program = _PROGRAMS.get(key) if cache else None
    if program is None:
        program = CompiledProgram(graph, options, configs, kernel_options, cuda_graph)
        if cache:
            _PROGRAMS[key] = program
    graph_key = ("graph", key[0])
    if check is None:
        # the check runs the kernels: without a device for them (no GPU, no interpreter)
        # the program is only source, and running it says what to set
        check = graph_key not in _CHECKED and kernels_can_run()
    elif check and not kernels_can_run():
        raise UnsupportedError(
            "compile_graph(check=True): the check runs the kernels, which needs a CUDA GPU or "
            f"Triton's interpreter. {CPU_HOW_TO}"
        )
    if check and (key, seed) not in _CHECKED:
        from mugraph.codegen.check import check_against_reference

        check_against_reference(graph, program, seed=seed)
        _CHECKED.add((key, seed))
        _CHECKED.add(graph_key)
    return program


def kernels_can_run() -> bool:
    """Whether generated kernels can run in this process: on a CUDA GPU, or on the CPU under
    Triton's interpreter (``TRITON_INTERPRET=1``)."""
    if interpreter_active():
        return True
    import torch

    return torch.cuda.is_available()


def recorded_launch(graph) -> dict[int, LaunchConfig]:
    """The launch settings the GPU ranking of ``superoptimize`` chose for ``graph``:
    ``graph.launch_settings`` ({op index: LaunchConfig}), else the "launch" of the ranking
    stored with the cache entry the graph was loaded from ({"2": [num_warps, num_stages]},
    with a third element when a GEMV form was chosen); settings that do not name a
    customized operator of the graph are ignored."""
    settings = getattr(graph, "launch_settings", None)
    if settings is None:
        entry = getattr(graph, "cache_entry", None) or {}
        stored = (entry.get("ranking") or {}).get("launch") if isinstance(entry, dict) else None
        settings = {}
        for key, value in (stored or {}).items():
            try:
                settings[int(key)] = LaunchConfig.from_list(value)
            except (TypeError, ValueError):
                return {}
    return {
        i: config for i, config in settings.items()
        if isinstance(i, int) and 0 <= i < len(graph.ops)
        and graph.ops[i].kind is OpKind.CUSTOMIZED and isinstance(config, LaunchConfig)
    }


def _within_max_warps(graph, configs: dict[int, LaunchConfig]) -> dict[int, LaunchConfig]:
    """``configs`` with every requested warp count over :func:`max_warps` lowered to it,
    with a warning naming the kernel."""
    out = {}
    for i, config in configs.items():
        limit = max_warps(graph.ops[i].attr("graph"))
        if config.num_warps > limit:
            warnings.warn(
                f"{kernel_label(i)}: num_warps={config.num_warps} lowered to {limit} "
                "(a chained tl.dot of 64 rows or more with an inner dim of 16; see "
                "mugraph.runtime.compiled.max_warps)",
                stacklevel=3,
            )
            config = replace(config, num_warps=limit)
        out[i] = config
    return out


def clear_cache() -> None:
    """Forget every compiled program of this process."""
    _PROGRAMS.clear()
    _CHECKED.clear()
