"""Two dependent kernels in one launch: a kernel of partial results (split-KV attention,
split-K products) and the kernel that combines them.

Launched as two kernels, the second starts only after the first has drained and a second
launch has gone through the GPU's front end — several microseconds on programs that move a few
megabytes. In one launch of ``blocks(first) + blocks(second)`` programs, the first kernel's
blocks run its body and then count themselves done on a counter (a barrier, then a release
atomic); the second kernel's blocks wait until the counter reaches the first kernel's block
count (acquire atomics), run its body, and count themselves on a second counter; the last of
them resets both, so the next launch (or CUDA graph replay) starts from zero.

The wait cannot deadlock as long as blocks are dispatched in the order of their linear number
— every waiting block was dispatched after every block it waits for, which is therefore
resident or done. CUDA does not promise this order, but single-pass algorithms rely on it in
the same way (decoupled look-back scans, stream-K matmuls), and so does mugraph's persistent
kernel. Triton's interpreter runs blocks in that order one at a time, so there the waits find
the count complete.

Measured on the H100 (``python -m benchmarks.probe_codegen_option --option chain_launches``),
it was slower than two launches on most suite rows (the waiting blocks hold SM slots, and the
launch takes the larger kernel's registers and shared memory and the first kernel's warps), so
``CodegenOptions.chain_launches`` is off by default.

Both bodies are mugraph's own emitted kernels (:func:`~mugraph.codegen.triton_gen.emit_kernel`)
as ``@triton.jit`` functions of the linear block number; what they compute is unchanged.
"""

from __future__ import annotations

import math

from mugraph.codegen.stable_exp import KernelCarry
from mugraph.codegen.triton_gen import (
    SOURCE_IMPORTS,
    CodegenOptions,
    KernelSource,
    emit_kernel,
    kernel_function,
    kernel_parameters,
)
from mugraph.ir.graph import BlockGraph

SYNC_SLOTS = 2  # int32 counters: blocks of the first kernel done, blocks of the second done


def generate_chained(
    parts: list[tuple[BlockGraph, str, str, CodegenOptions, KernelCarry]],
    name: str,
    label: str,
) -> KernelSource:
    """One kernel running ``parts`` (two kernels: ``(block, name, label, options, carry)``)
    one after the other in a single launch; its arguments are each part's, in order, then
    the pointer to :data:`SYNC_SLOTS` int32 counters (zero before the first launch)."""
    emitters = [emit_kernel(*part) for part in parts]
    helpers: dict[str, str] = {}
    functions: list[str] = []
    args: list[list[str]] = []
    for k, em in enumerate(emitters):
        helpers.update(em.helpers)
        functions += [*kernel_function(em, f"{em.name}_body", blk="blk"), "", ""]
        args.append([f"p{k}_{a}" for a in kernel_parameters(em)])
    n_first, n_second = (math.prod(em.block.grid_dim) for em in emitters)
    poll = 'tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")'
    wrapper = [
        "@triton.jit",
        f"def {name}({', '.join([*args[0], *args[1], 'sync_ptr'])}):",
        f"    # {label}: {n_first} + {n_second} blocks",
        "    blk = tl.program_id(0)",
        f"    if blk < {n_first}:",
        f"        {emitters[0].name}_body(blk, {', '.join(args[0])})",
        "        tl.debug_barrier()",
        '        tl.atomic_add(sync_ptr, 1, sem="release", scope="gpu")',
        "    else:",
        "        polls = tl.full([], 0, tl.int32)",  # the wait loop needs a statement
        f"        while {poll} < {n_first}:",
        "            polls += 1",
        f"        {emitters[1].name}_body(blk - {n_first}, {', '.join(args[1])})",
        "        tl.debug_barrier()",
        '        done = tl.atomic_add(sync_ptr + 1, 1, sem="acq_rel", scope="gpu")',
        f"        if done == {n_second - 1}:",
        '            tl.atomic_xchg(sync_ptr + 1, 0, sem="relaxed", scope="gpu")',
        '            tl.atomic_xchg(sync_ptr, 0, sem="relaxed", scope="gpu")',
    ]
    helper_lines = [line for h in helpers.values() for line in (*h.splitlines(), "", "")]
    source = "\n".join([*SOURCE_IMPORTS, *helper_lines, *functions, *wrapper]) + "\n"
    return KernelSource(
        name=name,
        source=source,
        grid=(n_first + n_second, 1, 1),
        input_ranks=(),
        output_ranks=(),
        scratch_per_block=0,
        label=label,
    )
