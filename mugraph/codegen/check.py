"""The second correctness check: a compiled program against the reference semantics.

The program runs on fresh random floats; every operator's outputs are compared with the
reference evaluation of that operator on the program's own inputs to it (so a mismatch names
the operator that produced it, without earlier rounding blamed on it), then the graph's
outputs with :func:`mugraph.semantics.reference.evaluate` of the whole graph.

Tolerances depend on the dtype: an element passes when
``|out - ref| <= atol * rms(ref) + rtol * |ref|``; non-finite values must agree exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mugraph.dtypes import DType
from mugraph.errors import MugraphError
from mugraph.ir.ops import OpKind
from mugraph.ir.tensor import TensorRef

# (rtol, atol relative to the reference's RMS) per dtype
TOLERANCES: dict[DType, tuple[float, float]] = {
    DType.float16: (2e-2, 2e-2),
    DType.bfloat16: (6e-2, 6e-2),
    DType.float32: (1e-4, 1e-4),
}


# the largest finite value of each dtype
DTYPE_MAX: dict[DType, float] = {
    DType.float16: 65504.0,
    DType.bfloat16: 3.3895313892515355e38,
    DType.float32: float(np.finfo(np.float32).max),
}


class CodegenMismatchError(MugraphError):
    """A compiled kernel (or PyTorch operator) disagrees with the reference semantics."""


@dataclass(frozen=True)
class Comparison:
    """How one tensor compares with its reference."""

    max_abs_error: float
    max_rel_error: float  # max |out - ref| / (atol·rms(ref) + rtol·|ref|): <= 1 passes
    worst_index: tuple[int, ...]
    nonfinite_mismatch: int
    beyond: int = 0  # elements whose error is beyond the tolerance
    count: int = 0  # elements compared

    @property
    def ok(self) -> bool:
        return self.nonfinite_mismatch == 0 and self.max_rel_error <= 1.0


def compare(out: np.ndarray, ref: np.ndarray, rtol: float, atol: float) -> Comparison:
    """Compare ``out`` with ``ref`` (float64 arrays of one shape)."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    finite = np.isfinite(ref)
    same_nonfinite = (np.isnan(ref) & np.isnan(out)) | (~np.isnan(ref) & (out == ref))
    bad_nonfinite = int(np.count_nonzero(~finite & ~same_nonfinite))
    bad_nonfinite += int(np.count_nonzero(finite & ~np.isfinite(out)))
    safe = np.where(finite & np.isfinite(out), 1.0, 0.0)
    ref_f = np.where(finite, ref, 0.0)
    out_f = np.where(np.isfinite(out), out, 0.0)
    rms = float(np.sqrt(np.mean(ref_f**2))) if ref_f.size else 0.0
    err = np.abs(out_f - ref_f) * safe
    bound = atol * max(rms, 1e-30) + rtol * np.abs(ref_f)
    ratio = err / bound
    worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape) if ratio.size else ()
    return Comparison(
        max_abs_error=float(err.max()) if err.size else 0.0,
        max_rel_error=float(ratio.max()) if ratio.size else 0.0,
        worst_index=tuple(int(i) for i in worst),
        nonfinite_mismatch=bad_nonfinite,
        beyond=int(np.count_nonzero(ratio > 1.0)),
        count=int(ratio.size),
    )


def random_inputs(graph, device, seed: int = 0, scale: float = 1.0) -> list:
    """Uniform(-scale, scale) inputs with the graph's declared dtypes and strides (drawn on
    the device: in float32 on a GPU, where a language model's weights are drawn in
    milliseconds instead of seconds; in float64 on the CPU)."""
    import torch

    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    draw = torch.float32 if device.type == "cuda" else torch.float64
    inputs = []
    for t in graph.input_types:
        values = torch.rand(t.dims, generator=gen, dtype=draw, device=device) * 2 - 1
        values = values * scale
        dtype = getattr(torch, t.dtype.torch_name)
        strides = t.strides or None
        buf = torch.empty_strided(t.dims, strides, dtype=dtype, device=device) if strides else None
        if buf is None:
            buf = torch.empty(t.dims, dtype=dtype, device=device)
        buf.copy_(values.to(dtype))
        inputs.append(buf)
    return inputs


def _numpy(t) -> np.ndarray:
    return t.detach().to("cpu").double().numpy()


def default_device():
    """CUDA when present, else the CPU (which needs TRITON_INTERPRET=1 to run kernels)."""
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _op_reference(op, args: list[np.ndarray]) -> list[np.ndarray]:
    from mugraph.semantics.interpret import KERNEL_CONTEXT, run_block_graph
    from mugraph.semantics.reference import REFERENCE

    with np.errstate(all="ignore"):
        if op.kind is OpKind.CUSTOMIZED:
            return run_block_graph(REFERENCE, op.attr("graph"), args)
        return REFERENCE.apply(op, args, KERNEL_CONTEXT)


def _fail(label: str, what: str, cmp: Comparison, rtol: float, atol: float) -> CodegenMismatchError:
    return CodegenMismatchError(
        f"{label}: {what} disagrees with the reference semantics: max abs error "
        f"{cmp.max_abs_error:.3g}, {cmp.max_rel_error:.3g}x the tolerance (rtol={rtol}, "
        f"atol={atol}·rms) at index {cmp.worst_index}, {cmp.nonfinite_mismatch} non-finite "
        "mismatches"
    )


AUTO_SCALES = (1.0, 0.25, 1 / 16, 1 / 64)  # input scales tried until nothing overflows


class _ReferenceOverflow(Exception):
    """The program itself overflows an operator's dtype on these inputs."""

    def __init__(self, label: str, dtype: DType) -> None:
        super().__init__(label)
        self.label, self.dtype = label, dtype


def check_against_reference(
    graph,
    program=None,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    seed: int = 0,
    scale: float | None = None,
    device=None,
) -> dict[str, float]:
    """Run ``program`` (compiled from ``graph`` if None) on random inputs; compare with the
    reference. Raises :class:`CodegenMismatchError` naming the first operator that disagrees.
    Returns the worst tolerance ratio seen per operator label (<= 1 everywhere).

    Inputs are Uniform(-scale, scale). When an operator's exact result on them exceeds the
    range of its dtype (exp of a long dot product in float16: the program overflows, whatever
    the kernel), or its arguments are finite and exactly one of its result and the reference
    is not (an intermediate of a customized kernel overflowed), the comparison would say
    nothing about the kernel, so the check starts again on smaller inputs (``AUTO_SCALES``;
    only the given ``scale`` when one is given). On the last scale the first case is an error
    and the second is compared as usual."""
    from mugraph.runtime.compiled import compile_graph

    program = program if program is not None else compile_graph(graph)
    device = device if device is not None else default_device()
    scales = AUTO_SCALES if scale is None else (scale,)
    for s in scales:
        try:
            return _check_at_scale(graph, program, rtol, atol, seed, s, device, s == scales[-1])
        except _ReferenceOverflow as overflow:
            last = overflow
    raise CodegenMismatchError(
        f"{last.label}: its exact result overflows {last.dtype.value} on random inputs of "
        f"every scale tried (down to {scales[-1]:g}), so the compiled program cannot be "
        "compared with the reference semantics"
    )


def _check_at_scale(graph, program, rtol, atol, seed, scale, device, last) -> dict[str, float]:
    from mugraph.runtime.compiled import op_label
    from mugraph.semantics.reference import evaluate

    inputs = random_inputs(graph, device, seed, scale)
    values = program.run_values(inputs)
    report: dict[str, float] = {}
    for i, op in enumerate(graph.ops):
        if op.kind is OpKind.INPUT:
            continue
        args = [_numpy(program.true_value(values, r)) for r in op.inputs]
        expected = _op_reference(op, args)
        label = op_label(graph, i)
        for j, want in enumerate(expected):
            got = program.true_value(values, TensorRef(i, j))
            dtype, got = op.outputs[j].dtype, _numpy(got)
            if all(np.isfinite(a).all() for a in args):
                # an exact result beyond the dtype's range; or finite arguments and a
                # non-finite value on one side only: an intermediate overflowed its float16
                # (the kernel rounds dot operands to the declared dtype, the reference does not)
                one_sided = bool(np.any(np.isfinite(want) != np.isfinite(got)))
                if _overflows(want, dtype) or (one_sided and not last):
                    raise _ReferenceOverflow(label, dtype)
            r, a = _tolerance(dtype, rtol, atol)
            cmp = compare(got, want, r, a)
            report[label] = max(report.get(label, 0.0), cmp.max_rel_error)
            if not cmp.ok:
                raise _fail(label, f"output {j}", cmp, r, a)
    refs = evaluate(graph, [_numpy(x) for x in inputs])
    for k, (ref, want) in enumerate(zip(graph.outputs, refs, strict=True)):
        r, a = _tolerance(graph.tensor_type(ref).dtype, rtol, atol)
        cmp = compare(_numpy(values[ref.op][ref.index]), want, r, a)
        report[f"output {k}"] = cmp.max_rel_error
        if not cmp.ok:
            raise _fail(op_label(graph, ref.op), f"graph output {k} (end to end)", cmp, r, a)
    return report


def _overflows(values: np.ndarray, dtype: DType) -> bool:
    """Whether exact results fall outside the finite range of ``dtype`` (NaN is not overflow:
    sqrt of a negative input is NaN in the kernel too)."""
    with np.errstate(invalid="ignore"):
        return bool(np.any(np.abs(values) > DTYPE_MAX[dtype]))


def _tolerance(dtype: DType, rtol: float | None, atol: float | None) -> tuple[float, float]:
    base_r, base_a = TOLERANCES[dtype]
    return (base_r if rtol is None else rtol, base_a if atol is None else atol)
