"""Host cost of a mugraph program's launches inside an Inductor graph, on a GPU (a probe).

    python benchmarks/probe_inductor_launch.py [--chain 16] [--n 2000]

A compiled μGraph (the library's rmsnorm_linear at a decode size) is called ``--chain`` times
in a row (each call's output feeds the next one's normalised input) in four ways, and the
wall time per call is printed (microseconds, back to back, the GPU synchronised only around
the ``--n`` repetitions):

- ``program``: the compiled program called from Python (its fast plan);
- ``library op``: through an operator defined on a ``torch.library.Library`` whose Python body
  calls the program, as ``mugraph::partition`` does, inside a graph compiled by Inductor;
- ``triton_op``: through an operator made with ``torch.library.triton_op`` whose body launches
  the program's kernels with ``wrap_triton``, inside a graph compiled by Inductor (which then
  launches the kernels from its own wrapper code: no Python body at run time);
- ``inductor``: the same computation written in PyTorch, compiled by Inductor.

On the H100 machine (2026-11-26, ``benchmarks/RESULTS.md``; the probe then warmed up with
three calls, now with one) the ``triton_op`` replay cost 37.7 us a call against 14.0 for the
program and 20.0 for the library operator: Inductor's launcher for a user-defined kernel is
not cheaper than mugraph's fast plan, so the recording and replay below stay in this probe.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.probe_partition_calls import per_call_us  # noqa: E402
from mugraph.ir.ops import Group, OpKind  # noqa: E402

# ---- a compiled program as a triton_op: its recorded launches, replayed with wrap_triton ----

_NAMES = itertools.count()


class NotReplayable(Exception):
    """The program's launches cannot be replayed by a ``triton_op`` (see the module)."""


class LaunchMismatch(Exception):
    """An operator made by :func:`program_op` was called on inputs unlike its examples."""


@dataclass(frozen=True)
class TensorArg:
    """A kernel argument that is a view of input ``source`` (``kind`` "input") or of buffer
    ``source`` the body allocates (``kind`` "buffer")."""

    kind: str
    source: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class Buffer:
    """A buffer the body allocates: ``numel`` elements of ``dtype`` (zeroed when ``zero``)."""

    numel: int
    dtype: torch.dtype
    zero: bool


@dataclass(frozen=True)
class Launch:
    """One kernel launch: the Triton kernel, its grid, launch settings and arguments."""

    kernel: Any
    grid: tuple[int, int, int]
    num_warps: int
    num_stages: int
    args: tuple  # TensorArg or a plain value


@dataclass(frozen=True)
class RecordedLaunches:
    """What one call of a program does, as views of its inputs and of fresh buffers."""

    inputs: tuple[tuple[tuple[int, ...], tuple[int, ...], torch.dtype], ...]
    buffers: tuple[Buffer, ...]
    launches: tuple[Launch, ...]
    outputs: tuple[TensorArg, ...]


def replayable(program) -> str | None:
    """Why ``program`` cannot be replayed (None: it can)."""
    for op in program.graph.ops:
        if op.kind is not OpKind.INPUT and op.kind is not OpKind.CUSTOMIZED and (
            op.kind not in Group.VIEW
        ):
            return f"it runs a PyTorch operator ({op.kind.name.lower()})"
    if any(program._aliased):
        return "an output is one of its inputs"
    return None


def record_launches(program, inputs: list[torch.Tensor]) -> RecordedLaunches:
    """Run ``program`` once on ``inputs`` and record its launches (see the module)."""
    from mugraph.runtime.compiled import ChainedStep

    why = replayable(program)
    if why is not None:
        raise NotReplayable(f"the program's launches cannot be replayed: {why}")
    trace: list = []
    values = program.run_values(list(inputs), _trace=trace)
    storages: dict[int, tuple[str, int]] = {}
    for k, x in enumerate(inputs):
        storages.setdefault(x.untyped_storage().data_ptr(), ("input", k))
    buffers: list[Buffer] = []
    syncs = {id(entry[3]) for entry in trace if isinstance(entry[0], ChainedStep)}

    def tensor_arg(t: torch.Tensor) -> TensorArg:
        base = t.untyped_storage().data_ptr()
        if base not in storages:
            storages[base] = ("buffer", len(buffers))
            numel = t.untyped_storage().nbytes() // t.element_size()
            buffers.append(Buffer(numel, t.dtype, id(t) in syncs))
        kind, source = storages[base]
        return TensorArg(kind, source, tuple(t.shape), tuple(t.stride()), t.storage_offset())

    launches = []
    for step, ins, outs, scratch, sides, _ in trace:
        args, index64 = step.arguments(ins, outs, scratch, sides)
        config = step.launch_config
        launches.append(Launch(
            step.kernel(index64), tuple(step.grid), config.num_warps, config.num_stages,
            tuple(tensor_arg(a) if isinstance(a, torch.Tensor) else a for a in args)))
    outputs = []
    for ref in program._outputs:
        outputs.append(tensor_arg(values[ref.op][ref.index]))
    spec = tuple((tuple(x.shape), tuple(x.stride()), x.dtype) for x in inputs)
    return RecordedLaunches(spec, tuple(buffers), tuple(launches), tuple(outputs))


def _view(arg: TensorArg, inputs: list[torch.Tensor], buffers: list[torch.Tensor]):
    base = inputs[arg.source] if arg.kind == "input" else buffers[arg.source]
    if arg.kind == "input" and (base.shape, base.stride(), base.storage_offset()) == (
        arg.shape, arg.strides, arg.offset
    ):
        return base
    return base.as_strided(arg.shape, arg.strides, arg.offset)


def replay(recorded: RecordedLaunches, inputs: list[torch.Tensor], launcher) -> list:
    """The program's outputs on ``inputs``: its buffers allocated, its kernels launched with
    ``launcher(kernel)[grid](*args, num_warps=..., num_stages=...)``."""
    _check(recorded, inputs)
    device = inputs[0].device
    buffers = [(torch.zeros if b.zero else torch.empty)(b.numel, dtype=b.dtype, device=device)
               for b in recorded.buffers]
    for launch in recorded.launches:
        args = [_view(a, inputs, buffers) if isinstance(a, TensorArg) else a
                for a in launch.args]
        launcher(launch.kernel)[launch.grid](*args, num_warps=launch.num_warps,
                                             num_stages=launch.num_stages)
    outs = []
    for arg in recorded.outputs:
        out = _view(arg, inputs, buffers)
        outs.append(out if out.is_contiguous() and arg.kind == "buffer" and out.numel() == (
            recorded.buffers[arg.source].numel) else out.contiguous())
    return outs


def _check(recorded: RecordedLaunches, inputs: list[torch.Tensor]) -> None:
    if len(inputs) != len(recorded.inputs):
        raise LaunchMismatch(f"expected {len(recorded.inputs)} inputs, got {len(inputs)}")
    for k, (x, (shape, strides, dtype)) in enumerate(zip(inputs, recorded.inputs, strict=True)):
        if (tuple(x.shape), tuple(x.stride()), x.dtype) != (shape, strides, dtype):
            raise LaunchMismatch(
                f"input {k}: {str(x.dtype).removeprefix('torch.')}{list(x.shape)} with strides "
                f"{list(x.stride())}; the launches were recorded for "
                f"{str(dtype).removeprefix('torch.')}{list(shape)} with strides {list(strides)}")


def program_op(program, inputs: list[torch.Tensor], name: str | None = None):
    """A ``torch.library.triton_op`` (``mugraph::<name>``, called with the program's inputs as
    separate tensors) running ``program`` on inputs shaped like ``inputs``; raises
    :class:`NotReplayable` for programs it cannot replay."""
    from torch.library import triton_op, wrap_triton

    recorded = record_launches(program, list(inputs))
    name = name or f"launches_{next(_NAMES)}"

    @triton_op(f"mugraph::{name}", mutates_args=())
    def run(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return replay(recorded, list(inputs), wrap_triton)

    return run


# ---- the probe -------------------------------------------------------------------------------



def main(argv=None) -> None:
    from mugraph.library import WORKLOADS
    from mugraph.runtime.compiled import compile_graph

    parser = argparse.ArgumentParser()
    parser.add_argument("--chain", type=int, default=16)
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--k", type=int, default=2048)
    args = parser.parse_args(argv)

    work = WORKLOADS["rmsnorm_linear"]
    sizes = dict(m=1, k=args.k, n=args.k, k_tile=256, n_tile=64)
    graph = work.optimized(sizes)
    program = compile_graph(graph, cuda_graph=False)
    dev = torch.device("cuda")
    x = torch.randn(1, args.k, device=dev, dtype=torch.float16)
    ws = [torch.randn(args.k, args.k, device=dev, dtype=torch.float16) / args.k ** 0.5
          for _ in range(args.chain)]
    g = torch.ones(args.k, device=dev, dtype=torch.float16)
    inputs = [x, g, ws[0]] if len(graph.input_types) == 3 else [x, ws[0]]
    print("graph inputs:", [list(t.dims) for t in graph.input_types])
    want = program(inputs=inputs)[0]

    lib = torch.library.Library("mgprobe", "FRAGMENT")
    lib.define("run(Tensor[] inputs) -> Tensor[]")
    lib.impl("run", lambda inputs: program(inputs=list(inputs)), "CUDA")
    torch.library.register_fake("mgprobe::run")(
        lambda inputs: [torch.empty(want.shape, dtype=want.dtype, device=want.device)])
    op = program_op(program, [t for t in inputs], "mgprobe_probe")
    got = op(list(inputs))[0]
    print("triton_op eager max diff:", float((got - want).abs().max()))

    def chained(call):
        def f(x, *ws):
            y = x
            for w in ws:
                y = call([y, g, w] if len(inputs) == 3 else [y, w])
            return y
        return f

    def eager_ref(y, w):
        yf = y.float()
        yn = yf * torch.rsqrt(yf.pow(2).mean(-1, keepdim=True) + 1e-6)
        return (yn.half() * g) @ w

    modes = {
        "program": chained(lambda a: program(inputs=a)[0]),
        "library op": torch.compile(chained(lambda a: torch.ops.mgprobe.run(a)[0])),
        "triton_op": torch.compile(chained(lambda a: op(a)[0])),
        "inductor": torch.compile(chained(lambda a: eager_ref(a[0], a[-1]))),
    }
    rows = []
    for name, fn in modes.items():
        try:
            out = fn(x, *ws)
            torch.cuda.synchronize()
            us = per_call_us(lambda fn=fn: fn(x, *ws), args.n) / args.chain
            rows.append((name, f"{us:.1f}", f"{float(out.float().abs().max()):.3g}"))
        except Exception as error:  # noqa: BLE001 - a probe: report and go on
            rows.append((name, "failed", f"{type(error).__name__}: {str(error)[:200]}"))
    print(f"\n{args.chain} chained calls, k = n = {args.k}, float16; microseconds per call")
    for r in rows:
        print(f"{r[0]:12s} {r[1]:>9s}   {r[2]}")


if __name__ == "__main__":
    main()
