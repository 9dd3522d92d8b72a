"""Operator calls flattened into their kernel launches: the steady state of the
``mugraph::partition`` and ``mugraph::partitions`` calls in a compiled model.

A partition call goes through Python layers for each partition it runs: the weights prepared
in a memo, views of raw inputs, the shape guard, the compiled program's plan lookup, the
fills of its launch arguments, the outputs' views. Given inputs of the same shapes, strides
and dtypes, all of that computes the same launches every call but for the pointers (on the
H100 machine, running the recorded launches instead saved 1.6-2.7 ms of host time per step of
a 16-layer decode, ``benchmarks/RESULTS.md``).

:class:`FlatCall` is one call recorded at the level of kernel launches (the compiled
programs log their fast plans' launches, :func:`mugraph.runtime.compiled.recording_program_calls`):
each pointer a kernel reads or writes is traced to where it comes from — an input of the
operator plus a fixed offset, one of the call's fresh output buffers, or a tensor that
outlives calls (a weight the memo prepared, a partition's constant, a program's own buffers:
its pointer is kept). A later call whose inputs match the recording (shapes, strides, dtypes,
device, alignment to 16 bytes, inputs sharing memory as they did) allocates the fresh buffers,
fills in the pointers and launches; nothing else runs in Python.

What would make a recorded call wrong is guarded, and then the call takes the full path and
is recorded again: a weight the memo prepares from changed in place (its version counter), or
the memo prepared anything since (its epoch: a kept pointer may be stale). A call that cannot
be flattened — a member on PyTorch, a program off its fast plan, a kernel reading a tensor
made during the call, an output that is not a fresh buffer — keeps the full path; after
``RECORD_TRIES`` such calls the site stops trying (``note`` says why).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mugraph.integration.torch_ops import memo_epoch, tensor_version
from mugraph.runtime.compiled import _current_stream, allocate_fresh, recording_program_calls

RECORD_TRIES = 4  # calls that fail to flatten before a call site stops trying
ALIGNMENT = 16  # bytes: Triton specializes a pointer argument on being a multiple of this

# Off: every call takes the full path (``benchmarks/bench_models.py`` times both ways).
enabled = True


class NotFlat(Exception):
    """This call cannot be replayed as its launches (the message says why)."""


@dataclass
class FlatCall:
    """One recorded operator call (see the module docstring). ``launches``: (launcher, the
    arguments as recorded, fills), a fill being (argument position, 0: operator input / 1:
    fresh buffer, its index, byte offset); ``outputs``: (fresh buffer, None or the output's
    (shape, strides, storage offset) as a view of it)."""

    device: torch.device
    signature: list[tuple]  # per input: (shape, strides, dtype)
    residues: tuple[int, ...]  # per input: data_ptr % ALIGNMENT
    versions: tuple[tuple[int, int], ...]  # (input, version) of inputs weights come from
    ties: tuple[tuple[int, int, int], ...]  # (i, j, byte distance) of inputs sharing memory
    epoch: int
    fresh_specs: list[tuple]  # (shape, strides, dtype)
    launches: list[tuple]
    outputs: list[tuple[int, tuple | None]]
    keep: list[torch.Tensor] = field(default_factory=list)  # tensors whose pointers are kept

    def pointers(self, inputs: Sequence[Any]) -> list[int] | None:
        """The inputs' pointers when ``inputs`` may take the recorded launches (see the module
        docstring), else None."""
        if len(inputs) != len(self.signature) or memo_epoch() != self.epoch:
            return None
        pointers = []
        for x, (shape, strides, dtype), residue in zip(inputs, self.signature, self.residues,
                                                      strict=False):
            if not isinstance(x, torch.Tensor) or x.dtype is not dtype or x.shape != shape:
                return None
            pointer = x.data_ptr()
            if pointer % ALIGNMENT != residue or x.stride() != strides:
                return None
            pointers.append(pointer)
        if inputs[0].device != self.device:
            return None
        for i, version in self.versions:
            if tensor_version(inputs[i]) != version:
                return None
        for i, j, delta in self.ties:
            if pointers[j] - pointers[i] != delta:
                return None
        return pointers

    def matches(self, inputs: Sequence[Any]) -> bool:
        return self.pointers(inputs) is not None

    def run(self, inputs: Sequence[Any]) -> list[torch.Tensor] | None:
        """The recorded launches on ``inputs`` and the outputs; None (nothing launched) when
        the inputs do not match the recording."""
        pointers = self.pointers(inputs)
        return None if pointers is None else self._launch(pointers)

    def _launch(self, pointers: list[int]) -> list[torch.Tensor]:
        fresh = allocate_fresh(self.fresh_specs, self.device)
        sources = (pointers, [t.data_ptr() for t in fresh])
        stream = _current_stream(self.device.index or 0) if self.device.type == "cuda" else 0
        for launch, args, fills in self.launches:
            if fills:
                args = list(args)
                for position, source, index, offset in fills:
                    args[position] = sources[source][index] + offset
            launch(stream, args)
        return [fresh[k] if view is None else fresh[k].as_strided(*view)
                for k, view in self.outputs]


def flatten(log: list, inputs: Sequence[Any], outputs: Sequence[Any], programs: int,
            stable: Callable[[int], bool], weight_inputs: Sequence[int]) -> FlatCall:
    """The :class:`FlatCall` of a call that took ``inputs``, returned ``outputs`` and logged
    ``log`` (:func:`~mugraph.runtime.compiled.recording_program_calls`) while running
    ``programs`` compiled programs. ``stable(storage address)``: whether a tensor there
    outlives calls with the same contents; ``weight_inputs``: the inputs weights are prepared
    from (their versions are guarded). Raises :class:`NotFlat`."""
    if not inputs or not all(isinstance(x, torch.Tensor) for x in inputs):
        raise NotFlat("an input is not a tensor")
    if len(log) != programs or any(entry[0] != "plan" for entry in log):
        paths = [entry[0] for entry in log]
        raise NotFlat(f"{programs} programs to run, the call ran {paths} (a program off its "
                      "fast plan, or a partition on PyTorch)")
    fresh: list[torch.Tensor] = []
    specs: list[tuple] = []
    launches: list[tuple] = []
    tracer = _Tracer(inputs, fresh, stable)
    for _, plan, plan_fresh, plan_inputs in log:
        if not plan.open:
            raise NotFlat("a fast plan holds its inputs' pointers")
        first = len(fresh)
        fresh.extend(plan_fresh)
        specs.extend(plan.fresh_specs)
        for launch, args, fills, direct in plan.launches:
            if not direct:
                raise NotFlat("a kernel launches through Triton's JIT")
            args = list(args)
            ours = []
            for position, kind, k in fills:
                t = plan_fresh[k] if kind == 0 else plan_inputs[k]
                if kind == 0:
                    ours.append((position, 1, first + k, 0))
                    continue
                source = tracer.trace(t)
                if source is None:
                    args[position] = t.data_ptr()
                else:
                    ours.append((position, *source))
            launches.append((launch, tuple(args), tuple(ours)))
    return FlatCall(
        device=inputs[0].device,
        signature=[(x.shape, tuple(x.stride()), x.dtype) for x in inputs],
        residues=tuple(x.data_ptr() % ALIGNMENT for x in inputs),
        versions=tuple((i, tensor_version(inputs[i])) for i in weight_inputs),
        ties=tracer.ties(),
        epoch=memo_epoch(),
        fresh_specs=specs,
        launches=launches,
        outputs=[_output_view(k, t, fresh) for k, t in enumerate(outputs)],
        keep=tracer.kept,
    )


def recorded(call: Callable[[], Any], inputs: Sequence[Any], programs: int,
             stable: Callable[[int], bool], weight_inputs: Sequence[int]
             ) -> tuple[Any, FlatCall | NotFlat]:
    """``call()``'s outputs, and its :class:`FlatCall` (see :func:`flatten`) or the
    :class:`NotFlat` saying why there is none."""
    with recording_program_calls() as log:
        outputs = call()
    try:
        return outputs, flatten(log, inputs, outputs, programs, stable, weight_inputs)
    except NotFlat as why:
        return outputs, why


class _Tracer:
    """Where a tensor a kernel reads comes from: (0, operator input, byte offset), (1, fresh
    buffer, byte offset), or None (a stable tensor: its pointer is kept, and so is it)."""

    def __init__(self, inputs: Sequence[torch.Tensor], fresh: list[torch.Tensor],
                 stable: Callable[[int], bool]) -> None:
        self.inputs = inputs
        self.fresh = fresh
        self.stable = stable
        self.kept: list[torch.Tensor] = []
        self.by_storage: dict[int, list[int]] = {}
        for i, x in enumerate(inputs):
            self.by_storage.setdefault(x.untyped_storage().data_ptr(), []).append(i)

    def trace(self, t: torch.Tensor) -> tuple[int, int, int] | None:
        storage = t.untyped_storage().data_ptr()
        for k, f in enumerate(self.fresh):
            if f.untyped_storage().data_ptr() == storage:
                return 1, k, t.data_ptr() - f.data_ptr()
        owners = self.by_storage.get(storage)
        if owners:
            i = owners[0]
            return 0, i, t.data_ptr() - self.inputs[i].data_ptr()
        if self.stable(storage):
            self.kept.append(t)
            return None
        raise NotFlat(f"a kernel reads a tensor {tuple(t.shape)} {t.dtype} made during the "
                      "call (not an input, a fresh output or a kept weight)")

    def ties(self) -> tuple[tuple[int, int, int], ...]:
        """Inputs sharing memory: the first of each group and every other, with the distance
        between their pointers (a later call must keep it, since launches read one through
        the other's pointer)."""
        out = []
        for owners in self.by_storage.values():
            first = owners[0]
            out.extend((first, j, self.inputs[j].data_ptr() - self.inputs[first].data_ptr())
                       for j in owners[1:])
        return tuple(out)


def _output_view(k: int, t: Any, fresh: list[torch.Tensor]) -> tuple[int, tuple | None]:
    """Output ``k`` as (fresh buffer, None when it is that buffer, else its view arguments)."""
    if not isinstance(t, torch.Tensor):
        raise NotFlat(f"output {k} is not a tensor")
    storage = t.untyped_storage().data_ptr()
    for j, f in enumerate(fresh):
        if f.untyped_storage().data_ptr() != storage:
            continue
        if t.shape == f.shape and t.stride() == f.stride() and t.data_ptr() == f.data_ptr():
            return j, None
        return j, (tuple(t.shape), tuple(t.stride()), t.storage_offset())
    raise NotFlat(f"output {k} is not a kernel's fresh buffer (a copy made in the call)")


class CallSite:
    """One operator call site (a partition or a chain of them): its recorded call, and how
    its calls went."""

    def __init__(self, name: str, programs: int, stable: Callable[[int], bool],
                 weight_inputs: Sequence[int] | None) -> None:
        self.name = name
        self.programs = programs
        self.stable = stable
        self.weight_inputs = weight_inputs  # None: weights prepared from members' outputs
        self.flat: FlatCall | None = None
        self.failures = 0
        self.fast = 0
        self.full = 0
        self.note = "not recorded yet"

    def call(self, inputs: list, full: Callable[[list], list], ready: Callable[[], bool]
             ) -> list:
        """The call: the recorded launches when they apply, else ``full(inputs)`` (recorded
        when ``ready()`` says every member runs its compiled program)."""
        flat = self.flat
        if flat is not None and enabled and not _autograd(inputs):
            outputs = flat.run(inputs)
            if outputs is not None:
                self.fast += 1
                return outputs
            self.flat = None
            self.note = "inputs or weights changed: recording again"
        self.full += 1
        if (not enabled or self.failures >= RECORD_TRIES or self.weight_inputs is None
                or not inputs or not isinstance(inputs[0], torch.Tensor)
                or inputs[0].device.type != "cuda" or not ready() or _autograd(inputs)):
            return full(inputs)
        outputs, flat = recorded(lambda: full(inputs), inputs, self.programs, self.stable,
                                 self.weight_inputs)
        if isinstance(flat, NotFlat):
            self.failures += 1
            self.note = f"not flattened: {flat}"
        else:
            self.flat = flat
            self.note = (f"flattened: {len(self.flat.launches)} launches, "
                         f"{len(self.flat.fresh_specs)} fresh buffers")
        return outputs


def _autograd(inputs: Sequence[Any]) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in inputs)
