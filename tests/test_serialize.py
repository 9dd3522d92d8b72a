"""JSON round trip, structural hashing, and rejection of corrupted documents."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mugraph
from mugraph import OpKind, SerializationError
from mugraph.library import WORKLOADS

F32 = mugraph.float32
NONE = (-1, -1, -1)


def round_trip(g):
    text = g.to_json()
    loaded = mugraph.from_json(text)
    assert isinstance(loaded, mugraph.KernelGraph)
    assert loaded == g
    assert loaded.structural_hash() == g.structural_hash()
    assert hash(loaded) == hash(g)
    assert str(loaded) == str(g)
    assert loaded.to_json() == text  # stable: a second round trip changes nothing
    assert loaded.input_types == g.input_types
    assert loaded.output_types == g.output_types
    return loaded


def every_kind_graph(scalar=0.1, exponent=1.5, imap_w=(-1, -1, -1), dtype=F32):
    """A kernel graph that uses every operator kind, strided inputs included."""
    g = mugraph.new_kernel_graph()
    x = g.new_input((8, 16), strides=(1, 8), dtype=dtype)  # column-major
    w = g.new_input((16, 32), dtype=dtype)
    w2 = g.new_input((32, 16), strides=(17, 1), dtype=dtype)  # padded rows
    y = g.matmul(x, w)  # [8, 32]
    t = g.pow(g.sqrt(g.square(g.exp(g.mul_scalar(y, 1 / 3)))), 1.0)
    t = g.clamp(g.relu(g.gelu(g.silu(t))), -0.25, 0.75)
    t = g.pow(g.mul_scalar(t, scalar), exponent)
    t = g.div(g.sub(g.add(t, g.reduction(t, 1)), y), g.exp(g.reduction(y, 0)))
    t = g.mul(g.rms_norm(t, 32), g.softmax(y, -1))
    yy = g.transpose(g.permute(y, (1, 0)), 0, 1)  # two views: y again, no copy
    t = g.reshape(g.concat(t, yy, 0), (8, 64))
    h = g.reshape(t, (8, 2, 32))
    h = g.reshape(g.reduction(h, 1), (8, 32))  # [8, 32]

    tb = mugraph.new_threadblock_graph((2, 1, 1), (128, 1, 1), 4, 4)
    th = tb.new_input(h, (0, -1, -1), forloop_dim=1)  # [4, 8]
    tw = tb.new_input(w2, imap_w, forloop_dim=0)  # [8, 16]
    mm = tb.matmul(th, tw)  # [4, 16]
    program = [
        (OpKind.MUL_SCALAR, (0,), (("scalar", 0.3),)),
        (OpKind.EXP, (1,), ()),
        (OpKind.ADD, (2, 0), ()),
    ]
    tg = tb.thread_graph([mm], program)
    rmax = tb.reduction_max(tg, 1)  # [4, 1]
    acc_max = tb.forloop_accum_max(rmax)
    acc_none = tb.forloop_accum(mm)
    acc_sum = tb.forloop_accum(th, "sum")
    acc_mean = tb.forloop_accum(th, "mean")
    acc_rms = tb.forloop_accum(th, "rms")
    acc_dimx = tb.forloop_accum(th, "sum_todimx")  # [4, 4]
    resc = tb.forloop_accum_rescale(tg, tb.exp(tb.mul_scalar(rmax, -0.5)), "sum")
    resc2 = tb.forloop_accum_rescale(mm, rmax)  # [4, 16]
    out1 = tb.div(tb.rms_norm(acc_none), tb.add(acc_max, resc))
    cat = tb.concat(acc_dimx, tb.concat(acc_sum, acc_rms, 1), 1)  # [4, 6]
    out2 = tb.reshape(tb.mul(cat, tb.sub(acc_mean, acc_sum)), (2, 12))
    tb.new_output(out1, (0, -1, -1))
    tb.new_output(out2, (0, -1, -1))
    tb.new_output(tg, (0, -1, -1), forloop_dim=1)
    tb.new_output(resc2, (0, -1, -1))
    o1, o2, o3, o4 = g.customized([h, w2], tb)
    g.mark_output(o1)
    g.mark_output(o2, strides=(1, 4))
    g.mark_output(o3)
    g.mark_output(g.add(o4, o1))
    return g


def _kinds(ops):
    kinds = set()
    for op in ops:
        kinds.add(op.kind)
        if op.kind is OpKind.CUSTOMIZED:
            kinds |= _kinds(op.attr("graph").ops)
        if op.kind is OpKind.THREAD_GRAPH:
            kinds |= {step[0] for step in op.attr("program")}
    return kinds


def test_every_kind_graph_uses_every_kind():
    g = every_kind_graph()
    assert _kinds(g.ops) == set(OpKind)


def test_every_kind_graph_round_trip():
    g = every_kind_graph()
    loaded = round_trip(g)
    gen = torch.Generator().manual_seed(31)
    inputs = [torch.randn(t.dims, generator=gen) for t in g.input_types]
    for a, b in zip(g(inputs=inputs), loaded(inputs=inputs), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("scalar", [0.1, 1 / 3, -2.5e-7, 1e30, 3, 2.0])
def test_float_scalars_survive_exactly(scalar):
    g = every_kind_graph(scalar=scalar, exponent=scalar if scalar > 0 else 1.5)
    loaded = round_trip(g)
    values = [op.attr("scalar") for op in loaded.ops if op.kind is OpKind.MUL_SCALAR]
    assert float(scalar) in values
    assert all(isinstance(v, float) for v in values)


def test_float16_and_bfloat16_round_trip():
    for dtype in (mugraph.float16, mugraph.bfloat16):
        round_trip(every_kind_graph(dtype=dtype))


def _library_cases():
    for name, work in WORKLOADS.items():
        for label, sizes in [("small", work.small), ("suite", work.suite), *work.extra.items()]:
            for form in ("naive", "optimized"):
                yield pytest.param(name, sizes, form, id=f"{name}-{label}-{form}")


@pytest.mark.parametrize("name, sizes, form", list(_library_cases()))
def test_library_round_trip(name, sizes, form):
    work = WORKLOADS[name]
    for dtype in (mugraph.float16, F32):
        g = getattr(work, form)(sizes, dtype)
        round_trip(g)


def test_round_trip_of_a_graph_without_outputs_and_with_dead_ops():
    g = mugraph.new_kernel_graph()
    x = g.new_input((4, 4))
    g.exp(x)
    loaded = mugraph.from_json(g.to_json())
    assert loaded.to_json() == g.to_json() and str(loaded) == str(g)


# ---- structural hash ---------------------------------------------------------------------


def _two_branches(order):
    """exp(x) @ w and sqrt(y) added, plus a block graph; ``order`` decides which independent
    operators are added first."""
    g = mugraph.new_kernel_graph()
    x = g.new_input((8, 16), dtype=F32)
    w = g.new_input((16, 8), dtype=F32)
    y = g.new_input((8, 8), dtype=F32)
    if order == 0:
        a = g.matmul(g.exp(x), w)
        b = g.sqrt(y)
    else:
        b = g.sqrt(y)
        ex = g.exp(x)
        a = g.matmul(ex, w)
    s = g.add(a, b)
    tb = mugraph.new_threadblock_graph((2,), (128, 1, 1), 2)
    if order == 0:
        ts = tb.new_input(s, (0, -1, -1), 1)
        tx = tb.new_input(x, (0, -1, -1), -1)
        total = tb.forloop_accum(ts, "sum")
        big = tb.reduction_max(tx, 1)
    else:
        ts = tb.new_input(s, (0, -1, -1), 1)
        tx = tb.new_input(x, (0, -1, -1), -1)
        big = tb.reduction_max(tx, 1)
        total = tb.forloop_accum(ts, "sum")
    tb.new_output(tb.div(total, big), (0, -1, -1))
    (o,) = g.customized([s, x], tb)
    g.mark_output(o)
    g.mark_output(b)
    return g


def test_hash_ignores_the_order_of_independent_operators():
    g0, g1 = _two_branches(0), _two_branches(1)
    assert g0.to_json() != g1.to_json()  # really built in different orders
    assert g0.structural_hash() == g1.structural_hash()
    assert g0 == g1 and hash(g0) == hash(g1)
    inputs = [torch.randn(t.dims, generator=torch.Generator().manual_seed(5)) + 3
              for t in g0.input_types]
    for a, b in zip(g0(inputs=inputs), g1(inputs=inputs), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_hash_is_a_stable_string():
    """The same in another process (another PYTHONHASHSEED): usable as a cache key."""
    h = _two_branches(0).structural_hash()
    assert isinstance(h, str) and len(h) == 32 and int(h, 16) >= 0
    w = WORKLOADS["attention_mirage_gqa"]
    here = w.optimized(w.small).structural_hash()
    code = (
        "from mugraph.library import WORKLOADS; w = WORKLOADS['attention_mirage_gqa']; "
        "print(w.optimized(w.small).structural_hash())"
    )
    env = {"PYTHONHASHSEED": "123", "PYTHONPATH": str(Path(mugraph.__file__).parent.parent)}
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env=env)
    assert other.stdout.strip() == here


def _variant(
    dims=(8, 16), dtype=F32, strides=None, scalar=0.5, exponent=2.0, clamp=(-1.0, 1.0),
    red_dim=1, imap=(0, -1, -1), fdim=1, omap=(0, -1, -1), out_fdim=-1, grid=(2,), loops=2,
    acc="sum", block=(128, 1, 1), cat_dim=1, out_strides=None, dimx=64,
):
    g = mugraph.new_kernel_graph()
    x = g.new_input(dims, strides=strides, dtype=dtype)
    t = g.clamp(g.pow(g.mul_scalar(x, scalar), exponent), *clamp)
    r = g.reduction(t, red_dim)
    tb = mugraph.new_threadblock_graph(grid, block, loops, dimx)
    tt = tb.new_input(t, imap, fdim)
    acc_t = tb.forloop_accum(tt, acc)
    if out_fdim >= 0:
        tb.new_output(tb.exp(tt), omap, out_fdim)
    else:
        tb.new_output(acc_t, omap, -1)
    (o,) = g.customized([t], tb)
    g.mark_output(g.concat(o, o, cat_dim), strides=out_strides)
    g.mark_output(r)
    return g


VARIANTS = {
    "dims": dict(dims=(8, 32)),
    "dims_rows": dict(dims=(16, 16)),
    "dtype": dict(dtype=mugraph.float16),
    "dtype_bf16": dict(dtype=mugraph.bfloat16),
    "strides": dict(strides=(1, 8)),
    "scalar": dict(scalar=0.5000001),
    "scalar_sign": dict(scalar=-0.5),
    "exponent": dict(exponent=3.0),
    "clamp_lo": dict(clamp=(-2.0, 1.0)),
    "clamp_hi": dict(clamp=(-1.0, 0.5)),
    "reduction_dim": dict(red_dim=0),
    "imap": dict(imap=(1, -1, -1), omap=(1, -1, -1)),
    "imap_only": dict(imap=(1, -1, -1), fdim=-1, loops=1, acc=None),
    "forloop_dim": dict(fdim=0),
    "omap": dict(omap=(1, -1, -1)),
    "output_forloop_dim": dict(out_fdim=1),
    "grid": dict(grid=(4,)),
    "grid_y": dict(grid=(2, 1, 1), block=(64, 2, 1)),
    "forloop_range": dict(loops=4),
    "acc": dict(acc="mean"),
    "acc_rms": dict(acc="rms"),
    "acc_none": dict(acc=None),
    "block_dim": dict(block=(256, 1, 1)),
    "concat_dim": dict(cat_dim=0),
    "output_strides": dict(out_strides=(1, 8)),
    "reduction_dimx": dict(dimx=32),
}


def test_hash_changes_with_every_attribute():
    base = _variant().structural_hash()
    assert _variant().structural_hash() == base  # deterministic
    hashes = {"base": base}
    for name, change in VARIANTS.items():
        g = _variant(**change)
        hashes[name] = g.structural_hash()
        assert hashes[name] != base, name
        assert g != _variant()
        assert mugraph.from_json(g.to_json()).structural_hash() == hashes[name]
    duplicates = {h for h in hashes.values() if list(hashes.values()).count(h) > 1}
    assert not duplicates, {k: v for k, v in hashes.items() if v in duplicates}


def test_hash_of_block_graphs():
    g0, g1 = _variant(), _variant(loops=4)
    (b0,) = [op.attr("graph") for op in g0.ops if op.kind is OpKind.CUSTOMIZED]
    (b1,) = [op.attr("graph") for op in g1.ops if op.kind is OpKind.CUSTOMIZED]
    assert b0.structural_hash() == b0.structural_hash() != b1.structural_hash()


def test_inputs_in_a_different_order_are_a_different_graph():
    def make(swap):
        g = mugraph.new_kernel_graph()
        a, b = g.new_input((4, 4), dtype=F32), g.new_input((4, 4), dtype=F32)
        g.mark_output(g.sub(b, a) if swap else g.sub(a, b))
        return g

    assert make(False) != make(True)


# ---- documents: what from_json takes (malformed documents are in tests/corpus/json) -------


def test_from_json_takes_text_bytes_or_a_parsed_dict():
    g = WORKLOADS["rmsnorm_linear"].optimized(WORKLOADS["rmsnorm_linear"].small)
    text = g.to_json()
    assert mugraph.from_json(json.loads(text)) == g
    assert mugraph.from_json(text.encode()) == g
    for other in (None, 42, [1, 2], g):
        with pytest.raises(SerializationError, match=r"from_json: expected a mugraph JSON "
                           rf"document as str, bytes or a parsed dict, got {type(other).__name__}"):
            mugraph.from_json(other)
