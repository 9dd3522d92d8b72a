"""The text form of the lowered IR (:mod:`mugraph.codegen.lowered`), for people and golden tests.

Deterministic: the same kernel always prints the same lines. One kernel reads::

    kernel %4: grid (2,1,1), for-loop of 4 iterations (unrolled), 4 warps, 1 stage
      #blocks:(2,1,1).block
      #threads:(32,4):(1,32).thread
      register tiles leave out 1 leading dim of size 1
      global
        %in0:[2,4,1,64].fp16.GL  (2,4,1,64):(256,64,64,1)
          tile (1,4,1,16):(0,64,0,1)  iteration 4:16  block (2,1,1):(256,0,0)
      ...
      before the loop
        %b2 <- Init()  # fill 0
      in the loop
        %b0 <- Move[GL->RF](%in0)
      ...

Tensors are ``name:[dims].dtype.memory`` (Graphene's notation), layouts ``shape:stride``
(:mod:`mugraph.ir.layout`), specs ``outputs <- Kind(inputs)``, a Move with the memories it
goes through, and a comment saying what the operator does.
"""

from __future__ import annotations

from collections.abc import Iterable

from mugraph.codegen.lowered import (
    DTYPE_NAMES,
    LoweredKernel,
    RegisterTile,
    SharedTile,
    Spec,
    dims_text,
)
from mugraph.ir.phase import Phase

INDENT = "  "
PHASE_TITLES = {
    Phase.INVARIANT: "before the loop",
    Phase.LOOP: "in the loop",
    Phase.POST: "after the loop",
}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _header(k: LoweredKernel) -> str:
    loop = f"for-loop of {_plural(k.forloop_range, 'iteration')}"
    if k.unrolled:
        loop += " (unrolled)"
    grid = ",".join(map(str, k.grid))
    return (f"kernel {k.name}: grid ({grid}), {loop}, {_plural(k.num_warps, 'warp')}, "
            f"{_plural(k.num_stages, 'stage')}")


def _threads(k: LoweredKernel) -> list[str]:
    lines = [f"#blocks:({','.join(map(str, k.grid))}).block",
             f"#threads:{k.threads}.thread  # (lane, warp) -> thread"]
    if k.lead:
        lines.append(f"register tiles leave out {_plural(k.lead, 'leading dim')} of size 1")
    return lines


def _globals(k: LoweredKernel) -> list[str]:
    lines = ["global"]
    for g in k.global_tiles:
        lines.append(f"{INDENT}{g.tensor}  {g.layout}")
        lines.append(f"{INDENT * 2}{g.division}")
    return lines


def _shared_line(t: SharedTile) -> str:
    if t.view_of is not None:
        return f"{INDENT}{t.tensor}  view of {t.view_of}"
    return f"{INDENT}{t.tensor}  padded {dims_text(t.padded)}, {t.bytes_per_stage} bytes per stage"


def _shared(k: LoweredKernel) -> list[str]:
    if not k.shared:
        return ["shared: none"]
    head = (f"shared: {k.shared_bytes_per_stage} bytes per stage x {k.num_stages} = "
            f"{k.shared_bytes} bytes")
    return [head, *(_shared_line(t) for t in k.shared)]


def _register_line(t: RegisterTile) -> str:
    where = f"view of {t.view_of}" if t.view_of is not None else f"padded {dims_text(t.padded)}"
    return (f"{INDENT}{t.tensor}  {where}, {t.elements_per_thread} per thread: "
            f"(thread,value) {t.threads_values}")


def _registers(k: LoweredKernel) -> list[str]:
    largest = k.largest_register_tile
    if largest is None:
        return ["registers: none"]
    head = (f"registers: at most {_plural(largest.elements_per_thread, 'value')} per thread "
            f"({largest.tensor.name}, {largest.bytes_per_thread} bytes of "
            f"{DTYPE_NAMES[largest.tensor.dtype]})")
    return [head, *(_register_line(t) for t in k.registers)]


def spec_text(spec: Spec) -> str:
    """``outputs <- Kind<variant>(inputs)  # detail; flags`` (a Move's variant: its route)."""
    variant = "->".join(m.value for m in spec.route) if spec.route else spec.variant
    kind = spec.kind.value + (f"<{variant}>" if variant else "")
    text = f"{', '.join(spec.outputs)} <- {kind}({', '.join(spec.inputs)})"
    notes = "; ".join([*filter(None, [spec.detail]), *sorted(f.value for f in spec.flags)])
    return text + (f"  # {notes}" if notes else "")


def _specs(k: LoweredKernel) -> list[str]:
    lines = []
    for phase, title in PHASE_TITLES.items():
        specs = k.phase_specs(phase)
        if specs:
            lines.append(title)
            lines += [INDENT + spec_text(s) for s in specs]
    if k.unused:
        lines.append(f"unused (no output needs them): {', '.join(k.unused)}")
    return lines


def kernel_text(k: LoweredKernel) -> str:
    """The text of one lowered kernel (lines end with a newline)."""
    body = [*_threads(k), *_globals(k), *_shared(k), *_registers(k), *_specs(k)]
    return "\n".join([_header(k), *(INDENT + line for line in body)]) + "\n"


def lowered_text(kernels: Iterable[LoweredKernel]) -> str:
    """The text of several lowered kernels, a blank line between two."""
    return "\n".join(kernel_text(k) for k in kernels)


__all__ = ["kernel_text", "lowered_text", "spec_text"]
