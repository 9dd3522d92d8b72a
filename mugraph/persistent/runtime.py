"""Running a persistent kernel: buffers, descriptors, launches, decode steps.

:class:`PersistentProgram` builds the task graph, generates and loads the Triton module
(:mod:`mugraph.persistent.codegen`), allocates the intermediates and the small device arrays
the kernel walks (task descriptors, queues, event counters, the meta buffer) and launches it:

- **persistent mode** (CUDA): ``programs_per_sm`` programs per SM (``num_programs`` in all),
  each running its queue; before the first launch the compiled kernel's registers and shared
  memory are checked so that every program is resident at once (otherwise a wait could block a
  program whose producer never gets an SM: a deadlock). When the count was not given and that
  many do not fit, the task graph is rebuilt for as many as fit. ``max_registers`` caps the
  registers per thread (Triton's ``maxnreg``) so that more programs fit, spilling what does
  not. Steps can be replayed from a CUDA graph: the kernel advances the position itself.
  With ``claim_blocks=True`` the tasks of a kernel that wait for one event and trigger the
  same events (:func:`claim_groups`: the projections, gate/up and down of a decoder) take
  their blocks one at a time from a counter of the step instead of each running a fixed
  range, so that no level waits for its slowest program's share. (Off by default: on the
  H100 it made both decoders' steps slower, twenty-third session.)
  ``program_sets=2`` gives the levels of the step to two sets of programs in turn
  (``build_task_graph``'s ``program_sets``; ``program_set_layout`` says which programs form a
  set), so that a program loads its next task's tiles a whole level before its wait.
  ``pipeline_depth`` and ``pipeline_bytes`` set how many of a task's blocks load before its
  wait (``pipeline_depth=2, pipeline_bytes=65536`` holds two 32 KB blocks), and
  ``program_set_spread=N`` runs a level of more than N blocks per program of a set (the LM
  head) on every program (``build_task_graph``'s ``spread_blocks``). Off by default: slower
  on the H100 in every form measured (Qwen3-0.6B, thirty-eighth session: 872-1219 µs a step
  against 711; a set's programs stream a level's weights no faster than all of them do).
- **topological mode** (CPU under ``TRITON_INTERPRET=1``, or on request): one program runs every
  task in the global topological order; each wait only checks that its event has fired.

In both modes, with ``continuations=True``, a continuation (a small task that is its event's
only consumer) is in no queue: the task whose trigger completes its event runs it.

A step decodes one token: the embedding of the current token (the meta buffer's TOKEN, set by
``step(token)`` or left by the previous step's argmax), every layer, the logits, the argmax. The
KV caches stay on the device; ``generate`` runs greedy decoding without synchronising (with
``eos_token_id``, once a step, to stop after it).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable, Sequence
from dataclasses import replace
from numbers import Integral
from typing import Any

from mugraph.codegen.loader import interpreter_active, load_kernel
from mugraph.errors import GraphInputError, MugraphError, UnsupportedError
from mugraph.ir.graph import accumulates
from mugraph.ir.ops import OpKind
from mugraph.ir.tensor import TensorRef
from mugraph.persistent.codegen import (
    DESC_HEADER,
    FIELD_COUNT,
    FIELD_FIRST,
    PIPELINE_BYTES,
    PREFETCH_PRIORITIES,
    QUEUE_KIND_BITS,
    STREAM_SLOTS,
    TRACE_STAMPS,
    TRIGGER_FIELDS,
    VECTOR_BYTES,
    ArgSpec,
    BodySource,
    KernelSpec,
    PersistentOptions,
    generate_body,
    generate_program,
    scratch_per_program,
)
from mugraph.persistent.kernel import PersistentKernel
from mugraph.persistent.parallel import Peer
from mugraph.persistent.stream import MAX_BYTES, MIN_BYTES, stream_plan, stream_regions
from mugraph.persistent.taskgraph import TaskGraph
from mugraph.persistent.tensors import META_SIZE, Attached, MetaSlot, Row, Scratch

KERNEL_NAME = "mg_persistent"
REGISTERS_PER_SM = 65536
THREADS_PER_SM = 2048
# Two programs of 4 warps per SM: while one waits for an event or reduces a tile, the other's
# loads are in flight. On the H100 (2026-11-27, seventeenth session, call 3 of
# benchmarks/RESULTS.md) they decoded a step in 1135 / 1501 µs (Qwen3-0.6B / Llama-3.2-1B
# shapes) against 1279 / 1569 µs for one program of 8 warps per SM.
PROGRAMS_PER_SM = 2
NUM_WARPS = 4
MAX_PIPELINE_DEPTH = 8  # blocks of static tiles a task may hold in registers ahead
# With continuations=True (off by default: slower on the H100, see PersistentOptions), tasks
# moving at most this many bytes that are their event's only consumer run as continuations of
# the event's last producer (see mugraph.persistent.taskgraph): the attention combines (about
# 9 KB in both model shapes), the KV-cache appends (10-36 KB) and the argmax stages;
# projections move far more and keep their queues.
CONTINUATION_BYTES = 64 * 1024


class PersistentRuntimeError(MugraphError):
    """A persistent launch reported a failure (a wait that gave up), or cannot be made safe."""


def kernel_specs(kernel: PersistentKernel) -> list[KernelSpec]:
    """The generator's view of every custom kernel of the step, in graph order."""
    from mugraph.codegen.triton_gen import TL_DTYPE

    graph = kernel.graph
    specs = []
    for k, op in enumerate(graph.ops):
        if op.kind is not OpKind.CUSTOMIZED:
            continue
        role = kernel.roles.get(k)
        block = op.attr("graph")
        args: list[ArgSpec] = []
        static = set()
        for i, ref in enumerate(op.inputs):
            t = graph.tensor_type(ref)
            if graph.ops[ref.op].kind is OpKind.INPUT:
                static.add(i)
            arg = _arg("in", i, t, kernel.binding(ref), TL_DTYPE)
            args.append(_summed_arg(arg, t) if summed_output(graph, ref) else arg)
        for j, t in enumerate(op.outputs):
            arg = _arg("out", j, t, kernel.binding(TensorRef(k, j)), TL_DTYPE)
            args.append(_summed_arg(arg, t) if summed_output(graph, TensorRef(k, j)) else arg)
        argmax = role.argmax if role else None
        companions = 0 if argmax is None else (1 if argmax == "partial" else 2)
        for c in range(companions):
            args.append(ArgSpec("cmp", c, "tl.int32", (1,)))
        label = f"%{k} {role.label}" if role else f"%{k}"
        specs.append(KernelSpec(k, label, block, tuple(args), frozenset(static), argmax))
    return specs


def task_bodies(
    specs: list[KernelSpec], options: PersistentOptions
) -> tuple[dict[int, int], list[BodySource]]:
    """One body per distinct source; kernel op -> kind (its body's position)."""
    placeholder = "mg_body_placeholder"
    kinds: dict[int, int] = {}
    texts: dict[str, int] = {}
    bodies: list[BodySource] = []
    for spec in specs:
        src = generate_body(spec, placeholder, options)
        if src.text not in texts:
            k = len(bodies)
            texts[src.text] = k
            name = f"mg_task{k}"
            pf = src.prefetch_name.replace(placeholder, name) if src.prefetch_name else None
            bodies.append(
                BodySource(name, pf, src.text.replace(placeholder, name), src.scratch,
                           helpers=src.helpers, prefetch_fields=src.prefetch_fields)
            )
        kinds[spec.op] = texts[src.text]
        bodies[kinds[spec.op]].kernels.append(spec.label)
    return kinds, bodies


def program_source(specs: list[KernelSpec], options: PersistentOptions) -> str:
    """The Triton module of a persistent kernel: its bodies and the dispatcher."""
    _, bodies = task_bodies(specs, options)
    width = descriptor_width(specs) + (CLAIM_FIELDS if options.claims else 0)
    width += 2 * STREAM_SLOTS if options.stream_field >= 0 else 0
    return generate_program(bodies, width, KERNEL_NAME, options)


CLAIMING_TASKS = 8  # tasks per block counter (``claim_blocks=True``)
CLAIM_FIELDS = 2  # descriptor fields of claims: the counter, the first block it hands out


def claim_groups(
    tg: TaskGraph, per_counter: int = CLAIMING_TASKS
) -> list[tuple[int, int, list[int]]]:
    """The tasks that take their blocks from one counter (``claim_blocks``): ``(first block,
    blocks, tasks)`` each, at most ``per_counter`` tasks of one kernel with consecutive
    ranges (one counter for a whole level's 264 programs serializes their atomics: on the
    H100, twenty-third session, the level started 2.6 µs later). A kernel's tasks qualify
    when they cover one range of blocks, all wait for the same event and all trigger the
    same events: then an event they trigger fires only once every one of them has finished,
    that is once the whole range is done, whichever task computed which block."""
    by_kernel: dict[int, list] = {}
    for t in tg.tasks:
        by_kernel.setdefault(t.kernel, []).append(t)
    groups = []
    for tasks in by_kernel.values():
        tasks.sort(key=lambda t: t.first_block)
        first, end = tasks[0].first_block, tasks[0].first_block
        for t in tasks:
            end = end + t.num_blocks if t.first_block == end else -1
        uniform = all(t.wait == tasks[0].wait and sorted(t.triggers) == sorted(tasks[0].triggers)
                      for t in tasks)  # fmt: skip
        if len(tasks) < 2 or end <= first or not uniform:
            continue
        count = -(-len(tasks) // per_counter)  # counters, the tasks spread evenly over them
        for c in range(count):
            part = tasks[len(tasks) * c // count : len(tasks) * (c + 1) // count]
            if len(part) > 1:
                start = part[0].first_block
                groups.append((start, sum(t.num_blocks for t in part), [t.index for t in part]))
    return groups


def descriptor_width(specs: list[KernelSpec]) -> int:
    return DESC_HEADER + max(len(s.args) for s in specs)


def _arg(role: str, index: int, t, binding, tl_dtype) -> ArgSpec:
    if isinstance(binding, Peer):
        raise UnsupportedError(
            f"persistent runtime: tensor {role}{index} is another rank's buffer: multi-GPU "
            "execution is not implemented (the task graph for it is)"
        )
    align = address_alignment(binding, t.dtype.itemsize)
    if isinstance(binding, Row):
        return ArgSpec(
            role, index, tl_dtype[t.dtype], t.strides, binding.slot, binding.row_stride, align
        )
    return ArgSpec(role, index, tl_dtype[t.dtype], t.strides, align=align)


def summed_output(graph, ref: TensorRef) -> bool:
    """Whether ``ref`` is an accumulating output of a custom kernel (its blocks add their
    tiles into it): the runtime keeps it in float32, in two rows, one per step parity."""
    op = graph.ops[ref.op]
    if op.kind is not OpKind.CUSTOMIZED:
        return False
    return accumulates(op.attr("graph").output_ops[ref.index])


def _summed_arg(arg: ArgSpec, t) -> ArgSpec:
    """A summed tensor's argument: float32, with the other step parity's row ``parity``
    elements after this one's (a step adds into one row and zeroes the other for the next).
    Both rows are 16-byte aligned when a row's bytes are a multiple of 16 (the buffer comes
    from PyTorch's allocator), else only 4-byte aligned."""
    row = math.prod(t.dims)
    return replace(arg, dtype="tl.float32", parity=row,
                   align=VECTOR_BYTES if row * 4 % VECTOR_BYTES == 0 else 4)


def queue_entry(task: int, kind: int) -> int:
    """A queue's int32 entry: the task and its body's kind, read by one load."""
    if kind >> QUEUE_KIND_BITS or task >= 1 << (31 - QUEUE_KIND_BITS):
        raise UnsupportedError(
            f"persistent runtime: task {task} of kind {kind} does not fit a queue entry "
            f"({31 - QUEUE_KIND_BITS} bits of task, {QUEUE_KIND_BITS} of kind)"
        )
    return task << QUEUE_KIND_BITS | kind


def address_alignment(binding, itemsize: int) -> int:
    """The largest power of two, at most ``VECTOR_BYTES``, dividing every address a tensor
    bound so takes: an attached view's first element, a run-time row's (base plus a multiple
    of the row's bytes); the runtime's own buffers come from PyTorch's allocators, aligned to
    far more."""
    if isinstance(binding, Attached):
        return _pow2_dividing(binding.tensor.data_ptr() + binding.offset * itemsize)
    if isinstance(binding, Row):
        base = _pow2_dividing(binding.table.data_ptr())
        return min(base, _pow2_dividing(binding.row_stride * itemsize))
    return VECTOR_BYTES


def _pow2_dividing(address: int) -> int:
    return min(VECTOR_BYTES, address & -address) if address else VECTOR_BYTES


def _on_off_options() -> tuple[str, ...]:
    """The options of :class:`PersistentProgram` annotated ``bool`` (on or off, nothing
    else: ``claim_blocks`` and ``prefetch_ahead`` take more and are checked apart)."""
    params = inspect.signature(PersistentProgram.__init__).parameters
    return tuple(name for name, p in params.items() if p.annotation == "bool")


def _prompt_tokens(prompt: Any) -> list[int]:
    """``generate``'s prompt as a list of token ids: a sequence of ints, or an integer tensor
    or array of one row (``(n,)`` or ``(1, n)``, as a tokenizer's ``input_ids``); anything
    else (text, floats, several rows) is refused naming what it got."""
    if hasattr(prompt, "shape") and hasattr(prompt, "tolist"):  # a torch tensor, a NumPy array
        shape = tuple(prompt.shape)
        if len(shape) == 2 and shape[0] == 1:
            prompt = prompt[0]
        elif len(shape) != 1:
            raise GraphInputError(
                f"generate: the prompt must be one row of token ids (batch 1), got shape "
                f"{list(shape)}")
        prompt = prompt.tolist()
    if isinstance(prompt, str | bytes) or not isinstance(prompt, Iterable):
        raise GraphInputError(
            f"generate: the prompt must be a sequence of token ids, got {type(prompt).__name__} "
            f"(tokenize text first)")
    tokens = list(prompt)
    for token in tokens:
        if isinstance(token, bool) or not isinstance(token, Integral):
            raise GraphInputError(f"generate: prompt token {token!r} is not an integer token id")
    return [int(t) for t in tokens]


def _check_int(name: str, value, low: int, high: int | None, meaning: str) -> None:
    """Refuse an option that is not an int (a bool is not) in [low, high] (high None: no
    upper bound), with a message naming the option and what it counts."""
    ok = isinstance(value, int) and not isinstance(value, bool) and low <= value and (
        high is None or value <= high)
    if not ok:
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise UnsupportedError(
            f"persistent runtime: {name} must be an int {bound} ({meaning}), got {value!r}"
        )


class PersistentProgram:
    """A compiled persistent kernel bound to its tensors; see the module docstring."""

    def __init__(
        self,
        kernel: PersistentKernel,
        *,
        mode: str | None = None,
        num_programs: int | None = None,
        programs_per_sm: int = PROGRAMS_PER_SM,
        num_warps: int = NUM_WARPS,
        max_registers: int | None = None,
        prefetch: bool = False,
        prefetch_task: bool = False,
        prefetch_distance: int | None = None,
        pipeline: bool = True,
        pipeline_depth: int = 1,
        pipeline_bytes: int = PIPELINE_BYTES,
        pipeline_dots: bool = False,
        early_static: bool = True,
        loads_first: bool = True,
        first_block_early: bool = False,
        early_triggers: bool = True,
        desc_by_position: bool = True,
        prefetch_ahead: bool | None = None,
        prefetch_priority: str = "evict_normal",
        align_hints: bool = True,
        continuations: bool = False,
        lookahead: bool = False,
        poll_load: bool = False,
        cuda_graph: bool = True,
        hoist: bool = True,
        separate_bodies: bool = True,
        align_reshapes: bool = True,
        trace: bool = False,
        task_allocation: str = "level",
        program_sets: int = 1,
        program_set_layout: str = "halves",
        program_set_spread: int = 0,
        claim_blocks: bool | int = False,
        l2_stream: int = 0,
        l2_stream_after: bool = False,
        l2_stream_names: tuple[str, ...] | None = None,
    ) -> None:
        import torch

        if kernel.world_size > 1:
            raise UnsupportedError(
                "persistent runtime: multi-GPU execution is not implemented (build the task "
                "graph with PersistentKernel.task_graph for each rank)"
            )
        self.kernel = kernel
        self.device = kernel.device
        interpret = interpreter_active()
        on_cuda = self.device is not None and self.device.type == "cuda"
        if not on_cuda and not interpret:
            raise UnsupportedError(
                "persistent runtime: CPU tensors need Triton's interpreter (TRITON_INTERPRET=1)"
            )
        self.mode = mode or ("persistent" if on_cuda and not interpret else "topological")
        if self.mode not in ("persistent", "topological"):
            raise UnsupportedError(f"persistent runtime: unknown mode {self.mode!r}")
        _check_int("programs_per_sm", programs_per_sm, 1, None, "programs per SM")
        _check_int("num_warps", num_warps, 1, 32, "warps per program")
        if num_warps & (num_warps - 1):
            raise UnsupportedError(
                f"persistent runtime: num_warps must be a power of two (Triton's programs run "
                f"1, 2, 4, 8, 16 or 32 warps), got {num_warps}")
        if max_registers is not None:
            _check_int("max_registers", max_registers, 16, 255, "registers per thread")
        if prefetch_distance is not None:
            _check_int("prefetch_distance", prefetch_distance, 1, None, "blocks")
        _check_int("pipeline_depth", pipeline_depth, 1, MAX_PIPELINE_DEPTH, "blocks loaded ahead")
        _check_int("pipeline_bytes", pipeline_bytes, 1, None,
                   "the most bytes of tiles a task body holds ahead")
        given = locals()
        for name in _on_off_options():
            if not isinstance(value := given[name], bool):
                raise UnsupportedError(
                    f"persistent runtime: {name} must be True or False, got {value!r}"
                )
        if claim_blocks and pipeline_depth > 1:
            raise UnsupportedError(
                "persistent runtime: claim_blocks loads one block ahead, not "
                f"{pipeline_depth} (pipeline_depth)"
            )
        if not isinstance(claim_blocks, bool) and (
            not isinstance(claim_blocks, int) or claim_blocks < 2
        ):
            raise UnsupportedError(
                f"persistent runtime: claim_blocks must be a bool or a number of tasks per "
                f"counter (at least 2), got {claim_blocks!r}"
            )
        if claim_blocks and (continuations or lookahead):
            raise UnsupportedError(
                "persistent runtime: claim_blocks does not combine with continuations or "
                "lookahead"
            )
        _check_int("l2_stream", l2_stream, 0, None,
                   "depths ahead that a level's weights are streamed into L2; 0: off")
        if not l2_stream and (l2_stream_after or l2_stream_names is not None):
            raise UnsupportedError(
                "persistent runtime: l2_stream_after and l2_stream_names shape the weights' "
                "streams into L2: they need l2_stream >= 1"
            )
        if l2_stream_names is not None and (
            not isinstance(l2_stream_names, (tuple, list)) or not l2_stream_names
            or not all(isinstance(n, str) and n for n in l2_stream_names)
        ):
            raise UnsupportedError(
                f"persistent runtime: l2_stream_names must be a non-empty tuple of name "
                f"patterns (\"*.down_proj\"), got {l2_stream_names!r}"
            )
        if l2_stream and (continuations or lookahead or prefetch_task or not desc_by_position
                          or prefetch_ahead is False):
            raise UnsupportedError(
                "persistent runtime: l2_stream needs the prefetch_ahead dispatcher: "
                "desc_by_position, and no continuations, lookahead or prefetch_task"
            )
        if prefetch_ahead is not None and not isinstance(prefetch_ahead, bool):
            raise UnsupportedError(
                f"persistent runtime: prefetch_ahead must be None (where it combines with the "
                f"other options), True or False, got {prefetch_ahead!r}"
            )
        # None: the dispatcher reads ahead wherever that combines with the other options
        if prefetch_ahead is True and (continuations or lookahead or prefetch_task
                                       or not desc_by_position):
            raise UnsupportedError(
                "persistent runtime: prefetch_ahead needs desc_by_position and does not combine "
                "with continuations, lookahead or prefetch_task"
            )
        if prefetch_priority not in PREFETCH_PRIORITIES:
            raise UnsupportedError(
                f"persistent runtime: prefetch_priority must be one of "
                f"{sorted(PREFETCH_PRIORITIES)}, got {prefetch_priority!r}"
            )
        self._fit_programs = num_programs is None and on_cuda
        if num_programs is None and on_cuda:
            sms = torch.cuda.get_device_properties(self.device).multi_processor_count
            num_programs = programs_per_sm * sms
        elif num_programs is None:
            num_programs = 4
        self.num_warps = num_warps
        # what every launch of the kernel passes Triton; ``maxnreg`` caps the registers of the
        # whole kernel (its heaviest body sets them otherwise) so that more programs fit per
        # SM, spilling what does not fit (GPU only: the interpreter has no registers)
        self.launch_options: dict[str, int] = {"num_warps": num_warps, "num_stages": 1}
        if max_registers is not None and on_cuda and not interpret:
            self.launch_options["maxnreg"] = max_registers
        _check_int("program_set_spread", program_set_spread, 0, None, "blocks per program")
        # how _rebuild splits the step into tasks (build_task_graph's options)
        self.task_graph_options = {
            "allocation": task_allocation,
            "program_sets": program_sets,
            "set_layout": program_set_layout,
            "spread_blocks": program_set_spread,
        }
        gpu = on_cuda and not interpret
        self.options = PersistentOptions(
            interpret=interpret,
            prefetch=prefetch and gpu,
            prefetch_task=prefetch_task,
            prefetch_distance=prefetch_distance,
            pipeline=pipeline,
            pipeline_depth=pipeline_depth,
            pipeline_bytes=pipeline_bytes,
            pipeline_dots=pipeline_dots,
            early_static=early_static,
            loads_first=loads_first,
            first_block_early=first_block_early,
            early_triggers=early_triggers,
            desc_by_position=desc_by_position,
            prefetch_ahead=prefetch_ahead is not False,
            prefetch_priority=prefetch_priority,
            align_hints=align_hints,
            continuations=continuations,
            lookahead=lookahead,
            poll_load=poll_load,
            cache_hint=gpu,
            hoist=hoist,
            separate_bodies=separate_bodies,
            align_reshapes=align_reshapes,
            trace=trace and gpu,
        )
        self.specs = kernel_specs(kernel)
        self.desc_width = descriptor_width(self.specs)
        # tasks per block counter (claim_blocks: True, or that number)
        self.claiming_tasks = CLAIMING_TASKS if claim_blocks is True else int(claim_blocks)
        if claim_blocks:  # a task's block counter and its pool: descriptor fields
            self.options = replace(self.options, claim_field=self.desc_width)
            self.desc_width += CLAIM_FIELDS
        self.l2_stream = l2_stream
        self.l2_stream_names = None if l2_stream_names is None else tuple(l2_stream_names)
        if l2_stream:  # the ranges a task streams into L2: descriptor fields
            self.options = replace(self.options, stream_field=self.desc_width,
                                   stream_after_body=l2_stream_after)
            self.desc_width += 2 * STREAM_SLOTS
        self.kinds, self.bodies = self._bodies()
        self.source = generate_program(self.bodies, self.desc_width, KERNEL_NAME, self.options)
        self.fn = load_kernel(KERNEL_NAME, self.source)
        self._allocate()
        self._rebuild(num_programs)
        self.cuda_graph = cuda_graph and on_cuda and self.mode == "persistent"
        self._graph = None
        self._checked = False
        self.pos = 0
        self.steps = 0

    # ---- construction ---------------------------------------------------------------------

    def _bodies(self) -> tuple[dict[int, int], list[BodySource]]:
        return task_bodies(self.specs, self.options)

    def _allocate(self) -> None:
        import torch

        dev = self.device
        graph = self.kernel.graph
        self.buffers: dict[tuple[int, int], Any] = {}
        for k, op in enumerate(graph.ops):
            if op.kind is not OpKind.CUSTOMIZED:
                continue
            for j, t in enumerate(op.outputs):
                if not isinstance(self.kernel.binding(TensorRef(k, j)), Scratch):
                    continue
                if summed_output(graph, TensorRef(k, j)):  # two float32 rows (step parity)
                    shape = (2, *t.dims)
                    self.buffers[(k, j)] = torch.zeros(shape, dtype=torch.float32, device=dev)
                    continue
                dtype = getattr(torch, t.dtype.torch_name)
                self.buffers[(k, j)] = torch.zeros(t.dims, dtype=dtype, device=dev)
        self.companions = {
            name: torch.zeros(n, dtype=torch.int32, device=dev)
            for name, n in self.kernel.companions.items()
        }
        self.history = torch.zeros(self.kernel.max_seq_len, dtype=torch.int32, device=dev)
        self.meta = torch.zeros(META_SIZE, dtype=torch.int32, device=dev)

    def _allocate_task_arrays(self) -> None:
        """The arrays whose size follows the task graph: events, scratch per program, trace."""
        import torch

        dev = self.device
        # with claims, two block counters (even and odd steps) per claiming kernel follow the
        # events
        self.claim_groups = (claim_groups(self.tasks, self.claiming_tasks)
                             if self.options.claims else [])  # fmt: skip
        size = len(self.tasks.events) + 2 * len(self.claim_groups)
        self.events = torch.zeros(max(1, size), dtype=torch.int32, device=dev)
        self._claim_slots()
        scratch = scratch_per_program(self.bodies)
        self.scratch = torch.zeros(
            max(1, scratch * self.num_programs), dtype=torch.float32, device=dev
        )
        slots = TRACE_STAMPS * len(self.tasks.tasks) if self.options.trace else 1
        self.trace = torch.zeros(slots, dtype=torch.int64, device=dev)

    def _claim_fields(self, desc) -> None:
        """The descriptors' claim fields: -1 (a range of its own), or for task i of a group
        its block counter, the pool the counter hands out (first + len(tasks) .. first +
        count - 1), and block first + i as its own first block."""
        field = self.options.claim_field
        desc[:, field] = -1
        for g, (first, count, members) in enumerate(self.claim_groups):
            for i, t in enumerate(members):
                desc[t, FIELD_FIRST], desc[t, FIELD_COUNT] = first + i, count - i
                desc[t, field] = len(self.tasks.events) + 2 * g
                desc[t, field + 1] = first + len(members)

    def _stream_fields(self, desc) -> None:
        """The descriptors' stream fields: (address, bytes) of each range a task streams into
        L2 (:func:`~mugraph.persistent.stream.stream_plan`), zero where none."""
        regions = stream_regions(self.kernel, self.specs, self.l2_stream_names)
        if not regions:
            named = f", named like {list(self.l2_stream_names)}" if self.l2_stream_names else ""
            raise UnsupportedError(
                f"persistent runtime: l2_stream: no weight to stream (an attached input that "
                f"no kernel writes, of {MIN_BYTES} to {MAX_BYTES} bytes{named})"
            )
        self.stream = stream_plan(self.tasks.tasks, regions, self.l2_stream)
        field = self.options.stream_field
        for task, ranges in self.stream.items():
            for r, (address, nbytes) in enumerate(ranges):
                desc[task, field + 2 * r], desc[task, field + 2 * r + 1] = address, nbytes

    def _claim_slots(self) -> None:
        """Where the block counters are, for the dispatcher's last program (which zeroes
        the next step's)."""
        self.meta[int(MetaSlot.CLAIM_BASE)] = len(self.tasks.events)
        self.meta[int(MetaSlot.CLAIMS)] = len(self.claim_groups)

    def _address(self, ref: TensorRef) -> int:
        graph = self.kernel.graph
        binding = self.kernel.binding(ref)
        if graph.ops[ref.op].kind is OpKind.CUSTOMIZED and isinstance(binding, Scratch):
            return self.buffers[(ref.op, ref.index)].data_ptr()
        if isinstance(binding, Attached):
            t = binding.tensor
            return t.data_ptr() + binding.offset * t.element_size()
        if isinstance(binding, Row):
            return binding.table.data_ptr()
        raise UnsupportedError(
            f"persistent runtime: no memory for tensor {ref}"
        )  # pragma: no cover

    def _tables(self) -> None:
        """Descriptors, triggers, queues as device arrays."""
        import numpy as np
        import torch

        graph = self.kernel.graph
        tg = self.tasks
        queues = tg.queues if self.mode == "persistent" else [tg.queued_order]
        # descriptors are stored in queue order (the continuations, which no queue holds,
        # after them): the dispatcher finds a queued task's descriptor at its position
        order = [t for q in queues for t in q]
        order += sorted(set(range(len(tg.tasks))) - set(order))
        row_of = {t: i for i, t in enumerate(order)}
        desc = np.zeros((len(tg.tasks), self.desc_width), dtype=np.int64)
        triggers: list[int] = []  # TRIGGER_FIELDS each: event, its continuation or -1, count
        specs = {s.op: s for s in self.specs}
        for t in tg.tasks:
            op = graph.ops[t.kernel]
            row = desc[t.index]
            row[0] = self.kinds[t.kernel]
            row[FIELD_FIRST], row[FIELD_COUNT] = t.first_block, t.num_blocks
            row[3] = t.wait
            row[4] = tg.events[t.wait].count if t.wait >= 0 else 0
            row[5], row[6], row[7] = len(triggers) // TRIGGER_FIELDS, len(t.triggers), t.index
            for e in t.triggers:
                follow = tg.events[e].continuation
                triggers += [e, row_of[follow] if follow >= 0 else -1, tg.events[e].count]
            addresses = [self._address(r) for r in op.inputs]
            addresses += [self._address(TensorRef(t.kernel, j)) for j in range(len(op.outputs))]
            role = self.kernel.roles.get(t.kernel)
            if role and role.argmax:
                addresses.append(self.companions[role.companions[0]].data_ptr())
                if role.argmax == "final":
                    addresses.append(self.history.data_ptr())
            assert len(addresses) == len(specs[t.kernel].args)
            row[DESC_HEADER : DESC_HEADER + len(addresses)] = addresses
        if self.options.claims:
            self._claim_fields(desc)
        if self.l2_stream:
            self._stream_fields(desc)
        flat = [queue_entry(row_of[t], self.kinds[tg.tasks[t].kernel]) for q in queues for t in q]
        starts = np.cumsum([0] + [len(q) for q in queues])
        dev = self.device
        self.desc = torch.as_tensor(desc[order], device=dev)
        self.triggers = torch.as_tensor(
            np.array(triggers or [0, -1, 0], dtype=np.int32), device=dev
        )
        self.queue = torch.as_tensor(np.array(flat, dtype=np.int32), device=dev)
        self.qstart = torch.as_tensor(starts.astype(np.int32), device=dev)
        self.grid = (len(queues),)

    # ---- launching ------------------------------------------------------------------------

    def _args(self) -> tuple:
        return (
            self.desc,
            self.queue,
            self.qstart,
            self.events,
            self.triggers,
            self.meta,
            self.scratch,
            self.trace,
        )

    def _check_residency(self) -> None:
        """All programs must fit on the GPU at once, or a wait may never be satisfied."""
        import torch

        try:
            compiled = self.fn.warmup(
                *self._args(), grid=self.grid, **self.launch_options
            )
            if hasattr(compiled, "_init_handles"):
                compiled._init_handles()
        except (AttributeError, TypeError) as error:  # pragma: no cover - Triton API drift
            self.resources = {"unchecked": f"{type(error).__name__}: {error}"}
            return
        regs = int(getattr(compiled, "n_regs", 0) or 0)
        shared = int(getattr(compiled.metadata, "shared", 0) or 0)
        props = torch.cuda.get_device_properties(self.device)
        threads = 32 * self.num_warps
        smem = int(getattr(props, "shared_memory_per_multiprocessor", 228 * 1024))
        per_sm = min(
            REGISTERS_PER_SM // max(1, regs * threads),
            THREADS_PER_SM // threads,
            smem // max(1, shared) if shared else THREADS_PER_SM,
        )
        self.resources = {
            "registers": regs,
            "shared_bytes": shared,
            "programs_per_sm": per_sm,
            "spills": int(getattr(compiled, "n_spills", 0) or 0),
        }
        if per_sm * props.multi_processor_count < self.grid[0] and self._fit_programs and per_sm:
            self.resources["programs_asked"] = self.grid[0]
            self._rebuild(per_sm * props.multi_processor_count)
        if per_sm * props.multi_processor_count < self.grid[0]:
            raise PersistentRuntimeError(
                f"persistent kernel: {self.grid[0]} programs cannot be resident at once "
                f"({regs} registers x {threads} threads, {shared} bytes of shared memory: "
                f"{per_sm} per SM on {props.multi_processor_count} SMs); use fewer programs "
                "or fewer warps, or cap the registers (max_registers)"
            )

    def _rebuild(self, num_programs: int) -> None:
        """The task graph, its arrays and tables for ``num_programs`` programs (before any
        launch: the kernel's source does not depend on the count)."""
        self.num_programs = num_programs
        self.tasks: TaskGraph = self.kernel.task_graph(
            num_programs,
            **self.task_graph_options,
            continuation_bytes=CONTINUATION_BYTES if self.options.continuations else 0,
        )
        self._allocate_task_arrays()
        self._tables()

    def launch(self) -> None:
        """Run one step (no host synchronisation)."""
        if self.mode == "persistent" and not self._checked:
            self._check_residency()
            self._checked = True
        if self._graph is not None:
            self._graph.replay()
            return
        self.fn[self.grid](*self._args(), **self.launch_options)

    def capture(self) -> None:
        """Record one launch in a CUDA graph; later steps replay it (the kernel advances the
        position itself, so every replay decodes the next token)."""
        import torch

        if not self.cuda_graph or self._graph is not None:
            return
        if not self._checked:
            self._check_residency()  # compiles and loads the kernel outside the capture
            self._checked = True
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.fn[self.grid](*self._args(), **self.launch_options)
        self._graph = graph

    # ---- decoding -------------------------------------------------------------------------

    def reset(self, clear_caches: bool = True) -> None:
        """Back to position 0: counters, history, the sums over blocks (whose rows follow the
        step's parity) and the KV caches."""
        self.meta.zero_()
        self.events.zero_()
        for (k, j), buf in self.buffers.items():
            if summed_output(self.kernel.graph, TensorRef(k, j)):
                buf.zero_()
        self._claim_slots()
        self.history.zero_()
        self.pos = self.steps = 0
        if clear_caches:
            for t in self.kernel.tensors.values():
                if isinstance(t.binding, Row) and t.binding.slot is MetaSlot.POS and t.writer:
                    t.binding.table.zero_()

    def step(self, token: int | None = None) -> None:
        """Decode one token at the current position: ``token`` (default: the last argmax)."""
        if self.pos >= self.kernel.max_seq_len:
            raise GraphInputError(
                f"persistent step: position {self.pos} is past the cache "
                f"({self.kernel.max_seq_len} positions)"
            )
        if token is not None:
            vocab = self._vocab()
            if not isinstance(token, int) or not 0 <= token < vocab:
                raise GraphInputError(f"persistent step: token {token!r} is not in [0, {vocab})")
            self.meta[int(MetaSlot.TOKEN)] = token
        self.launch()
        self.pos += 1
        self.steps += 1

    def _vocab(self) -> int:
        for t in self.kernel.tensors.values():
            if isinstance(t.binding, Row) and t.binding.slot is MetaSlot.TOKEN:
                return int(t.binding.table.shape[0])
        return 2**31 - 1

    def generate(
        self, prompt: list[int], max_new_tokens: int, eos_token_id: int | Sequence[int] = ()
    ) -> list[int]:
        """Greedy decoding: feed ``prompt``, then ``max_new_tokens`` tokens chosen by argmax.

        ``eos_token_id`` (one id or several): stop after the first of them, which is returned
        but not fed back (as transformers' ``generate`` does); the program then stands at the
        position after the last token fed. Each step's token is read back before the next
        launch (one host synchronisation a step); without it the steps run back to back."""
        prompt = _prompt_tokens(prompt)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, Integral):
            raise GraphInputError(
                f"generate: max_new_tokens must be an int, got {max_new_tokens!r}")
        if not prompt or max_new_tokens < 1:
            raise GraphInputError("generate: needs a non-empty prompt and max_new_tokens >= 1")
        if self.pos + len(prompt) + max_new_tokens - 1 > self.kernel.max_seq_len:
            raise GraphInputError(
                f"generate: {len(prompt)} + {max_new_tokens} tokens from position {self.pos} do "
                f"not fit the cache of {self.kernel.max_seq_len}"
            )
        stop = self._stop_tokens(eos_token_id)
        vocab = self._vocab()
        outside = [t for t in prompt if not 0 <= t < vocab]
        if outside:  # before any step: a refused prompt leaves the program where it was
            raise GraphInputError(f"generate: prompt token {outside[0]} is not in [0, {vocab})")
        start = self.steps
        for token in prompt:
            self.step(int(token))
        first = start + len(prompt) - 1
        if stop:
            out = [int(self.history[first])]
            while len(out) < max_new_tokens and out[-1] not in stop:
                self.step()
                out.append(int(self.history[self.steps - 1]))
            self.check_errors()
            return out
        for _ in range(max_new_tokens - 1):
            self.step()
        self.check_errors()
        return [int(x) for x in self.history[first : first + max_new_tokens].tolist()]

    def _stop_tokens(self, eos_token_id: int | Sequence[int]) -> frozenset[int]:
        """The token ids ``generate`` stops after, each checked against the vocabulary."""
        ids = list(eos_token_id) if isinstance(eos_token_id, Iterable) else [eos_token_id]
        vocab = self._vocab()
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, Integral) or not 0 <= t < vocab:
                raise GraphInputError(
                    f"generate: eos_token_id {t!r} is not a token in [0, {vocab})"
                )
        return frozenset(int(t) for t in ids)

    def check_errors(self) -> None:
        """Raise if a wait of the last launches gave up (synchronises)."""
        flag = int(self.meta[int(MetaSlot.ERROR)].item())
        if flag:
            task = flag - 1
            raise PersistentRuntimeError(
                f"persistent kernel: task {task} ({self.tasks.label(task)}) waited for an event "
                "that never fired"
            )

    def buffer(self, tensor) -> Any:
        """The memory of a tensor of the kernel (a PTensor or its name)."""
        name = tensor if isinstance(tensor, str) else tensor.name
        t = self.kernel.tensor(name)
        if t.dtensor is None:
            raise GraphInputError(f"tensor {name!r} is never written")
        ref = t.dtensor.ref
        if summed_output(self.kernel.graph, ref):  # the row the last step added into
            return self.buffers[(ref.op, ref.index)][(self.steps - 1) % 2]
        if (ref.op, ref.index) in self.buffers:
            return self.buffers[(ref.op, ref.index)]
        if isinstance(t.binding, Attached):
            return t.binding.tensor
        raise GraphInputError(
            f"tensor {name!r} has no buffer of its own ({type(t.binding).__name__})"
        )

    def task_count(self) -> int:
        return len(self.tasks.tasks)

    def describe(self) -> str:
        kinds = len(self.bodies)
        return (
            f"{self.tasks.summary()}; {kinds} task bodies; mode {self.mode}, "
            f"{self.grid[0]} programs x {self.num_warps} warps"
        )
