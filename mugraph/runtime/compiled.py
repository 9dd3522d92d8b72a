"""Compiled μGraphs: generated Triton kernels and PyTorch operators, called on tensors.

``compile_graph(graph)`` generates one Triton kernel per graph-defined kernel operator (see
:mod:`mugraph.codegen.triton_gen`) and binds every pre-defined operator to PyTorch
(:mod:`mugraph.codegen.torch_ops`). The resulting :class:`CompiledProgram` checks its inputs,
allocates intermediate tensors once per device and reuses them, launches the kernels in graph
order and returns fresh output tensors. It runs on CUDA tensors and, with
``TRITON_INTERPRET=1`` set before kernels are loaded, on CPU tensors.

Programs are cached in-process by the graph's structural hash and the options.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mugraph.codegen.loader import interpreter_active, load_kernel
from mugraph.codegen.torch_ops import run_torch_op
from mugraph.codegen.triton_gen import CodegenOptions, KernelSource, generate_kernel
from mugraph.errors import GraphInputError, UnsupportedError
from mugraph.ir.graph import BlockGraph, Op
from mugraph.ir.ops import OpKind
from mugraph.ir.tensor import TensorType
from mugraph.runtime.call import check_inputs

_INT32_SPAN = 2**31 - 1


@dataclass(frozen=True)
class LaunchConfig:
    """How a kernel is launched: Triton's ``num_warps`` and ``num_stages``."""

    num_warps: int = 4
    num_stages: int = 2


def default_launch(block: BlockGraph) -> LaunchConfig:
    """The block graph's own thread count (block_dim) as warps, two pipeline stages."""
    warps = max(1, math.prod(block.block_dim) // 32)
    warps = 1 << (warps.bit_length() - 1)  # a power of two
    return LaunchConfig(num_warps=min(warps, 16), num_stages=2)


def kernel_name(op_index: int) -> str:
    return f"mg_k{op_index}"


def kernel_label(op_index: int) -> str:
    return f"customized kernel %{op_index} ({kernel_name(op_index)})"


def op_label(graph, op_index: int) -> str:
    op = graph.ops[op_index]
    if op.kind is OpKind.CUSTOMIZED:
        return kernel_label(op_index)
    return f"PyTorch operator %{op_index} ({op.kind.value})"


def _span(t) -> int:
    """Elements between a tensor's first and last address, plus one."""
    return 1 + sum((d - 1) * abs(s) for d, s in zip(t.shape, t.stride(), strict=True) if d > 0)


def _is_out_of_resources(error: Exception) -> bool:
    return type(error).__name__ in ("OutOfResources", "OutOfResourcesError")


class KernelStep:
    """One graph-defined operator: its generated kernel(s) and launch configuration."""

    def __init__(self, graph, op_index: int, options: CodegenOptions, launch: LaunchConfig) -> None:
        self.op_index = op_index
        self.op: Op = graph.ops[op_index]
        self.block: BlockGraph = self.op.attr("graph")
        self.options = options
        self.launch_config = launch
        self.label = kernel_label(op_index)
        self._sources: dict[bool, KernelSource] = {}
        self._kernels: dict[bool, Any] = {}
        self.kernel_source(False)  # generate now: unsupported graphs fail at compile time

    def kernel_source(self, index64: bool) -> KernelSource:
        if index64 not in self._sources:
            options = replace(self.options, index64=index64)
            self._sources[index64] = generate_kernel(
                self.block, kernel_name(self.op_index), self.label, options
            )
        return self._sources[index64]

    @property
    def source(self) -> KernelSource:
        return self.kernel_source(False)

    def kernel(self, index64: bool) -> Any:
        if index64 not in self._kernels:
            src = self.kernel_source(index64)
            self._kernels[index64] = load_kernel(src.name, src.source)
        return self._kernels[index64]

    def launch(self, inputs: list[Any], outputs: list[Any], scratch: Any) -> None:
        tensors = [*inputs, *outputs] + ([scratch] if scratch is not None else [])
        index64 = any(_span(t) > _INT32_SPAN for t in tensors)
        args: list[Any] = []
        for t in [*inputs, *outputs]:
            args.append(t)
            args.extend(int(s) for s in t.stride())
        if scratch is not None:
            args.append(scratch)
        kernel = self.kernel(index64)
        config = self.launch_config
        try:
            grid = self.block.grid_dim
            kernel[grid](*args, num_warps=config.num_warps, num_stages=config.num_stages)
        except Exception as error:  # noqa: BLE001 - retried with a smaller pipeline
            if not _is_out_of_resources(error) or config.num_stages <= 1:
                raise
            self.launch_config = LaunchConfig(config.num_warps, 1)
            kernel[self.block.grid_dim](*args, num_warps=config.num_warps, num_stages=1)


@dataclass
class _DeviceState:
    device: Any
    buffers: dict[tuple[int, int], Any] = field(default_factory=dict)
    scratch: dict[int, Any] = field(default_factory=dict)


class CompiledProgram:
    """A kernel graph bound to generated kernels; call it as ``program(inputs=[...])``."""

    def __init__(
        self,
        graph,
        options: CodegenOptions | None = None,
        launch: dict[int, LaunchConfig] | None = None,
        kernel_options: dict[int, CodegenOptions] | None = None,
    ) -> None:
        graph.check()
        self.graph = graph
        self.options = options or CodegenOptions(interpret=interpreter_active())
        self.kernel_options = dict(kernel_options or {})
        launch = dict(launch or {})
        self.steps: dict[int, KernelStep] = {}
        for i, op in enumerate(graph.ops):
            if op.kind is OpKind.CUSTOMIZED:
                config = launch.get(i) or default_launch(op.attr("graph"))
                opts = self.kernel_options.get(i, self.options)
                self.steps[i] = KernelStep(graph, i, opts, config)
        self._devices: dict[str, _DeviceState] = {}
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
        """All generated Triton source, one kernel after the other."""
        parts = [f"# ---- {k.label} ----\n{k.source}" for k in self.kernels]
        return "\n\n".join(parts)

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
        return CompiledProgram(self.graph, self.options, configs, kernel_options)

    # ---- running -------------------------------------------------------------------------

    def __call__(self, inputs: Sequence[Any] | None = None, **kwargs: Any) -> list[Any]:
        if kwargs:
            raise UnsupportedError(f"compiled program: unknown options {sorted(kwargs)}")
        values = self.run_values(inputs)
        return [self._finish_output(values, k, ref) for k, ref in enumerate(self._outputs)]

    def run_values(self, inputs: Sequence[Any] | None) -> list[list[Any]]:
        """Every operator's outputs (one list per operator of the kernel graph)."""
        self._check_inputs(inputs)
        state = self._device_state(inputs[0].device)
        values: list[list[Any]] = []
        for kind, op, refs, payload in self._plan:
            if kind is OpKind.INPUT:
                values.append([inputs[payload]])
                continue
            args = [values[r.op][r.index] for r in refs]
            if kind is OpKind.CUSTOMIZED:
                values.append(self._run_kernel(payload, args, state))
            else:
                values.append([run_torch_op(op, args)])
        return values

    def _build_plan(self) -> None:
        """What each call needs, computed once: the op list, expected inputs, buffers."""
        graph = self.graph
        self._outputs = tuple(graph.outputs)
        self._plan = []
        for i, op in enumerate(graph.ops):
            payload = op.attr("index") if op.kind is OpKind.INPUT else self.steps.get(i)
            self._plan.append((op.kind, op, op.inputs, payload))
        self._expected = [(t.dims, t.dtype.torch_name) for t in graph.input_types]
        self._fresh = {(r.op, r.index) for r in self._outputs}
        self._out_specs = [graph.tensor_type(r) for r in self._outputs]
        self._aliased = [graph.ops[r.op].kind is OpKind.INPUT for r in self._outputs]

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
        if device.type == "cpu" and interpreter_active():
            return
        raise GraphInputError(
            f"compiled programs run on CUDA tensors (or on CPU tensors with TRITON_INTERPRET=1 "
            f"set before compiling); got tensors on {device}"
        )

    def _run_kernel(self, step: KernelStep, args: list[Any], state: _DeviceState) -> list[Any]:
        i = step.op_index
        outs = [self._output_buffer(i, j, t, state) for j, t in enumerate(step.op.outputs)]
        step.launch(args, outs, self._scratch(step, state))
        return outs

    def _output_buffer(self, i: int, j: int, t: TensorType, state: _DeviceState) -> Any:
        key = (i, j)
        if key in self._fresh:
            return _empty(t, state.device)  # graph outputs are fresh every call
        buf = state.buffers.get(key)
        if buf is None:
            buf = state.buffers[key] = _empty(t, state.device)
        return buf

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


def _empty(t: TensorType, device) -> Any:
    import torch

    dtype = getattr(torch, t.dtype.torch_name)
    return torch.empty_strided(t.dims, t.strides, dtype=dtype, device=device)


# ---- compile_graph and its cache ---------------------------------------------------------

_PROGRAMS: dict[tuple, CompiledProgram] = {}
_CHECKED: set[tuple] = set()


def _freeze(mapping: dict | None) -> tuple:
    return tuple(sorted((mapping or {}).items()))


def compile_graph(
    graph,
    *,
    check: bool = False,
    num_warps: int | None = None,
    num_stages: int | None = None,
    launch: dict[int, LaunchConfig] | None = None,
    kernel_options: dict[int, CodegenOptions] | None = None,
    cache: bool = True,
    seed: int = 0,
    **codegen: Any,
) -> CompiledProgram:
    """Compile a kernel graph into a :class:`CompiledProgram`.

    num_warps / num_stages: one launch configuration for every kernel (``launch`` sets them
    per kernel, keyed by the customized operator's position in ``graph.ops``).
    codegen: fields of :class:`~mugraph.codegen.triton_gen.CodegenOptions`
    (max_tile_elements, dot_min_dim, hoist_invariants).
    check: run :func:`mugraph.codegen.check.check_against_reference` before returning.
    """
    graph.check()
    unknown = set(codegen) - {"max_tile_elements", "dot_min_dim", "hoist_invariants"}
    if unknown:
        raise UnsupportedError(f"compile_graph: unknown options {sorted(unknown)}")
    options = CodegenOptions(interpret=interpreter_active(), **codegen)
    configs = dict(launch or {})
    if num_warps is not None or num_stages is not None:
        for i, op in enumerate(graph.ops):
            if op.kind is OpKind.CUSTOMIZED and i not in configs:
                base = default_launch(op.attr("graph"))
                configs[i] = LaunchConfig(
                    num_warps or base.num_warps, num_stages or base.num_stages
                )
    key = (graph.structural_hash(), options, _freeze(configs), _freeze(kernel_options))
    program = _PROGRAMS.get(key) if cache else None
    if program is None:
        program = CompiledProgram(graph, options, configs, kernel_options)
        if cache:
            _PROGRAMS[key] = program
    if check and (key, seed) not in _CHECKED:
        from mugraph.codegen.check import check_against_reference

        check_against_reference(graph, program, seed=seed)
        _CHECKED.add((key, seed))
    return program


def clear_cache() -> None:
    """Forget every compiled program of this process."""
    _PROGRAMS.clear()
    _CHECKED.clear()
