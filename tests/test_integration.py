"""PyTorch integration: FX capture, partitioning, and the torch.compile backend (on the CPU).

Most tests compile with ``time_limit=0`` (no search) and ``run_unimproved=True``: every
captured partition then runs on mugraph's reference semantics, so the outputs check the
capture itself against eager PyTorch. The search and the cache are tested with a spy on the
search entry point.
"""

from __future__ import annotations

import importlib
import math
import operator
import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mugraph
import mugraph.integration as mgi
from mugraph.cache import ResultCache
from mugraph.integration import dynamo as backend
from mugraph.integration.runtime import MugraphPartition
from mugraph.library import WORKLOADS
from mugraph.search import api

CAPTURE_ONLY = {"time_limit": 0, "run_unimproved": True, "cache": False, "elementwise": "mugraph"}


@pytest.fixture(autouse=True)
def fresh(tmp_path, monkeypatch):
    """A fresh cache directory, fresh Dynamo caches and an empty report list per test."""
    monkeypatch.setenv("MUGRAPH_CACHE_DIR", str(tmp_path / "cache"))
    torch._dynamo.reset()
    mgi.clear_reports()
    torch.manual_seed(0)
    yield
    torch._dynamo.reset()


@pytest.fixture
def search_calls(monkeypatch):
    """Count calls of the search (the driver's entry point as the API calls it)."""
    calls = []
    real = api.superoptimize

    def spy(program, **kwargs):
        calls.append(program.structural_hash())
        return real(program, **kwargs)

    monkeypatch.setattr(api, "superoptimize", spy)
    return calls


def run_compiled(module: nn.Module, *inputs, **options):
    compiled = torch.compile(module, backend="mugraph", options=options or CAPTURE_ONLY)
    with torch.no_grad():
        return compiled(*inputs), module(*inputs)


def spy_on_inductor(monkeypatch, timer=lambda f: (f(), 1.0)[1]) -> list:
    """Inductor replaced by a spy (it keeps every module it is handed and runs it as it is),
    a GPU pretended, and partitions timed by ``timer``; returns the modules handed."""
    import torch._inductor.compile_fx as inductor

    from mugraph.integration import runtime

    handed: list = []

    def spy(module, args):
        handed.append(module)
        return module.forward

    monkeypatch.setattr(inductor, "compile_fx", spy)
    monkeypatch.setattr(backend, "_on_the_gpu", lambda args: True)
    monkeypatch.setattr(runtime, "cuda_milliseconds", timer)
    return handed


def with_inductor(model: nn.Module):
    """``model`` compiled by the backend with ``rest="inductor"`` (capture only)."""
    return torch.compile(model, backend="mugraph", options={**CAPTURE_ONLY, "rest": "inductor"})


def partitions_called(module) -> list[int]:
    """The registered partitions a rewritten graph calls, in order: one per
    ``mugraph::partition`` call, each member of a ``mugraph::partitions`` chain."""
    from mugraph.integration import runtime

    keys = []
    for node in module.graph.nodes:
        if node.target is torch.ops.mugraph.partition.default:
            keys.append(node.args[0])
        elif node.target is torch.ops.mugraph.partitions.default:
            keys.extend(runtime.chain_members(node.args[0]))
    return keys


def assert_close(got, want, tol=1e-5):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def partitions():
    return [p for r in mgi.reports() for p in r.partitions]


def fallbacks():
    return {f.node: f.reason for r in mgi.reports() for f in r.fallbacks}


# ---- small modules ----------------------------------------------------------------------------


class GatedMLP(nn.Module):
    def __init__(self, dim=16, hidden=32):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class NormLinear(nn.Module):
    def __init__(self, dim=16, out=24, eps=1e-6):
        super().__init__()
        self.norm = nn.RMSNorm(dim, eps=eps)
        self.proj = nn.Linear(dim, out, bias=True)

    def forward(self, x):
        return self.proj(self.norm(x))


class HandRMSNorm(nn.Module):
    def __init__(self, dim=16, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def forward(self, q, k, v):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        return torch.softmax(scores, dim=-1) @ v


class Elementwise(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x):
        y = F.relu(x) * 2.0 - x.mean(-1, keepdim=True) + F.gelu(x, approximate="tanh") / 3
        z = (1.0 - y) / (x.exp() + self.bias)  # rank-1 bias broadcast against rank 3
        return z.sum(-1), -x + 0.5


class SiluPattern(nn.Module):
    def forward(self, x, y):
        return torch.bmm(x * torch.sigmoid(x), y)


class SigmoidGate(nn.Module):
    def forward(self, x, y):
        return torch.sigmoid(x) * y + x


class DefaultEpsNorm(nn.Module):
    def forward(self, x):
        return F.rms_norm(x, (8,))  # eps=None: finfo(float32).eps, not 0


class SDPA(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


CASES = {
    "gated_mlp": (GatedMLP, lambda: (torch.randn(2, 4, 16),)),
    "rmsnorm_linear": (NormLinear, lambda: (torch.randn(2, 4, 16),)),
    "hand_rmsnorm": (HandRMSNorm, lambda: (torch.randn(3, 16),)),
    "attention": (Attention, lambda: tuple(torch.randn(2, 3, 8, 4) for _ in range(3))),
    "elementwise": (Elementwise, lambda: (torch.randn(2, 3, 8),)),
    "silu_bmm": (SiluPattern, lambda: (torch.randn(2, 4, 8), torch.randn(2, 8, 4))),
    "sdpa": (SDPA, lambda: tuple(torch.randn(1, 2, 8, 4) for _ in range(3))),
    "sigmoid_gate": (SigmoidGate, lambda: (torch.randn(3, 8), torch.randn(3, 8))),
    "rms_norm_default_eps": (DefaultEpsNorm, lambda: (torch.randn(3, 8) * 1e-4,)),
}


# ---- the backend ------------------------------------------------------------------------------


def test_the_backend_name_and_the_entry_point_resolve():
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("mugraph") is backend.mugraph_backend
    module, name = "mugraph.integration.dynamo:mugraph_backend".split(":")
    assert getattr(importlib.import_module(module), name) is backend.mugraph_backend
    assert backend.register_backend()  # idempotent


@pytest.mark.parametrize("case", sorted(CASES))
def test_captured_modules_match_eager(case):
    make, inputs = CASES[case]
    got, want = run_compiled(make().eval(), *inputs())
    assert_close(got, want)
    parts = partitions()
    assert parts and all(p.runs_on == "mugraph" for p in parts)
    compute = {n: why for n, why in fallbacks().items()
               if "data movement" not in why and "weight preparation" not in why}
    assert not compute, f"unexpected fallbacks: {compute}"


def test_rms_norm_with_eps_is_captured_exactly(monkeypatch):
    captured = []
    real = backend._partition_module
    monkeypatch.setattr(backend, "_partition_module",
                        lambda name, cap, *a: captured.append(cap) or real(name, cap, *a))
    got, want = run_compiled(NormLinear(eps=1e-2).eval(), torch.randn(2, 4, 16) * 0.05)
    assert_close(got, want)  # small inputs: the epsilon matters
    (part,) = partitions()
    assert part.ops == ["rms_norm", "matmul", "add"]  # the weight folded into the projection
    (norm,) = [op for op in captured[0].graph.ops if op.kind.value == "rms_norm"]
    assert norm.attr("eps") == 1e-2


def test_rms_norm_without_eps_is_the_mugraph_operator():
    class Norm(nn.Module):
        def forward(self, x):
            return F.rms_norm(x, (16,), eps=0.0)

    got, want = run_compiled(Norm(), torch.randn(4, 16))
    assert_close(got, want)
    assert partitions()[0].ops == ["rms_norm"]


def test_silu_pattern_and_strided_weight():
    captured = []
    real = backend._partition_module

    def keep(name, cap, options, report):
        captured.append(cap)
        return real(name, cap, options, report)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(backend, "_partition_module", keep)
        run_compiled(SiluPattern(), torch.randn(2, 4, 8), torch.randn(2, 8, 4))
        run_compiled(NormLinear(), torch.randn(2, 4, 16))
    kinds = [op.kind.value for op in captured[0].graph.ops]
    assert "silu" in kinds  # x * sigmoid(x) became one silu
    weights = [t for c in captured for t in c.graph.input_types if t.dims[-2:] == (16, 24)]
    assert weights and weights[0].strides[-2:] == (1, 16)  # W.T as a strided view, no copy


class ProjectTransposeGate(nn.Module):
    """A projection transposed (heads first, as attention wants it), then an epilogue."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 24, bias=False)

    def forward(self, x, y):
        return F.silu(self.proj(x).transpose(0, 1)) * y


@pytest.mark.parametrize("elementwise", ["pytorch", "mugraph"])
def test_a_transpose_of_a_computed_value_stays_in_the_partition(elementwise):
    options = {**CAPTURE_ONLY, "elementwise": elementwise}
    got, want = run_compiled(ProjectTransposeGate(), torch.randn(8, 16), torch.randn(24, 8),
                             **options)
    assert_close(got, want)
    (part,) = partitions()
    assert part.ops == ["matmul", "permute", "silu", "mul"] and part.runs_on == "mugraph"
    assert not fallbacks()


def test_a_partition_with_a_transpose_is_optimized_around_it():
    """Searched: the projection and the epilogue are optimized apart (each its shape class),
    the transpose between them a view the epilogue's kernel reads in place."""
    got, want = run_compiled(ProjectTransposeGate(), torch.randn(8, 16), torch.randn(24, 8),
                             time_limit=10, cache=False)
    assert_close(got, want)
    (part,) = partitions()
    assert (part.status, part.runs_on) == ("optimized", "mugraph"), part.line()
    assert part.shape_class == "linear_epilogue"  # the projection; the epilogue has no class


def test_a_weights_view_is_made_once_and_follows_a_new_weight():
    """W.T of a linear's weight (here the weight with the norm's folded in) is a view made on
    the first call and reused; an in-place update or new memory for the weight is followed."""
    model = NormLinear().eval()
    x = torch.randn(2, 4, 16)
    fn = mgi.optimize_fx(torch.fx.symbolic_trace(model), [x], **CAPTURE_ONLY)
    (module,) = fn.specialized.values()
    (part,) = [m for m in module.modules() if isinstance(m, MugraphPartition)]
    with torch.no_grad():
        for _ in range(2):
            assert_close(fn(x), model(x))
        kept = {i: v[2] for i, v in part._views.items()}
        assert kept and all(v.dim() == 3 for v in kept.values())  # W.T and the bias, rank 3
        fn(x)
        assert all(part._views[i][2] is v for i, v in kept.items())  # the same view objects
        model.proj.weight.mul_(2.0)
        assert_close(fn(x), model(x))
        model.proj.weight.data = torch.randn(24, 16)
        model.proj.bias.data = torch.randn(24)
        assert_close(fn(x), model(x))
        model.norm.weight.data = torch.rand(16) + 0.5  # folded into W: folded again
        assert_close(fn(x), model(x))
        assert all(part._views[i][2] is not v for i, v in kept.items())


def test_slices_of_outside_tensors_reach_mugraph_as_views():
    """x[..., :32], x[..., 32:] and narrow: the partition reads the caller's memory through
    the slices' offsets and strides (no copy); a slice of a value mugraph computes ends the
    partition with that reason."""

    class SplitGate(nn.Module):
        def forward(self, x, y):
            return F.silu(x[..., :32]) * x[..., 32:] + y.narrow(0, 1, 4)

    got, want = run_compiled(SplitGate(), torch.randn(4, 64), torch.randn(6, 32))
    assert_close(got, want)
    (part,) = partitions()
    assert part.ops == ["silu", "mul", "add"] and part.runs_on == "mugraph"

    class SliceOfComputed(nn.Module):
        def forward(self, x, y):
            return F.silu(x * 2.0)[..., :32] * y

    mgi.clear_reports()
    got, want = run_compiled(SliceOfComputed(), torch.randn(4, 64), torch.randn(4, 32))
    assert_close(got, want)
    assert any("a slice of a value computed by mugraph" in why for why in fallbacks().values())


@pytest.mark.parametrize(
    "fn, reason",
    [
        (lambda x: torch.sort(x, -1).values * 2.0, "no mugraph equivalent"),
        (lambda x: F.gelu(x) * 2.0, "erf"),
        (lambda x: F.layer_norm(x, (8,)) + 1.0, "no mugraph equivalent"),
        (lambda x: torch.tanh(x).exp() * x.exp(), "no mugraph equivalent"),
    ],
    ids=["sort", "erf_gelu", "layer_norm", "tanh"],
)
def test_unsupported_ops_fall_back(fn, reason):
    class M(nn.Module):
        def forward(self, x):
            return fn(x) + x.relu()

    got, want = run_compiled(M(), torch.randn(3, 8))
    assert_close(got, want)
    assert any(reason in why for why in fallbacks().values()), fallbacks()


def test_an_inexact_lowering_is_caught_by_the_capture_check(monkeypatch):
    from mugraph.integration import lowering

    def approximate(cx, node, args, kwargs):  # erf gelu as tanh gelu: NOT the same function
        return cx.graph.gelu(cx.tensor(args[0]))

    monkeypatch.setitem(lowering.RULES, "gelu", approximate)

    class M(nn.Module):
        def forward(self, x):
            return F.gelu(x * 3.0) * 2.0

    got, want = run_compiled(M(), torch.randn(4, 8))
    assert_close(got, want)
    (part,) = partitions()
    assert part.status == "capture mismatch" and part.runs_on == "pytorch"


def test_exp_of_exp_is_split_for_the_verifier():
    class M(nn.Module):
        def forward(self, x):
            return torch.softmax(F.silu(x), dim=-1) * 3.0

    got, want = run_compiled(M(), torch.randn(3, 8))
    assert_close(got, want)
    assert len(partitions()) == 2  # silu | softmax: one exponential per path each


def test_in_place_ops_leave_the_graph_to_pytorch():
    class M(nn.Module):
        def forward(self, x):
            y = x * 2.0
            y.add_(1.0)
            return y.exp()

    got, want = run_compiled(M(), torch.randn(3, 8))
    assert_close(got, want)
    assert "in place" in mgi.last_report().error


def test_partition_size_limit_splits():
    options = {**CAPTURE_ONLY, "max_partition_ops": 2}
    got, want = run_compiled(Elementwise(), torch.randn(2, 3, 8), **options)
    assert_close(got, want)
    assert len(partitions()) >= 4 and all(len(p.ops) <= 2 for p in partitions())


def test_new_shapes_specialize_again():
    compiled = torch.compile(GatedMLP(), backend="mugraph", options=CAPTURE_ONLY)
    with torch.no_grad():
        for batch in (2, 3, 5, 3):
            x = torch.randn(batch, 4, 16)
            assert_close(compiled(x), compiled._orig_mod(x))
    signatures = {r.signature for r in mgi.reports()}
    assert len(signatures) == 3  # 2, 3 and 5; the second 3 reuses its specialization


def test_autograd_runs_on_pytorch():
    model = GatedMLP()
    compiled = torch.compile(model, backend="mugraph", options=CAPTURE_ONLY)
    x = torch.randn(2, 4, 16)
    out = compiled(x)
    assert out.requires_grad
    out.sum().backward()
    assert model.w1.weight.grad is not None


def test_a_runtime_failure_falls_back_with_a_warning(monkeypatch):
    def broken(self, raw):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr(MugraphPartition, "_run", broken)
    with pytest.warns(UserWarning, match="kernel exploded"):
        got, want = run_compiled(GatedMLP(), torch.randn(2, 4, 16))
    assert_close(got, want)
    assert all(p.runs_on == "pytorch" for p in partitions())


def test_unknown_options_are_refused():
    with pytest.raises(ValueError, match="bogus"):
        backend.BackendOptions.parse({"bogus": 1})
    with pytest.raises(ValueError, match="max_blocks_typo"):
        backend.BackendOptions.parse({"search": {"max_blocks_typo": 3}})
    with pytest.raises(mugraph.MugraphError, match="options must be a dict"):
        backend.BackendOptions.parse([("time_limit", 1)])


BAD_BACKEND_OPTIONS = [
    ({"time_limit": -1}, "option 'time_limit' must be a number of seconds >= 0"),
    ({"time_limit": "30"}, "option 'time_limit' must be a number of seconds >= 0"),
    ({"time_limit": float("inf")}, "option 'time_limit' must be a number of seconds >= 0"),
    ({"workers": 0}, "option 'workers' must be a positive integer, got 0"),
    ({"elementwise": "triton"}, "option 'elementwise' must be 'pytorch' or 'mugraph'"),
    ({"rest": "jit"}, "option 'rest' must be 'eager' or 'inductor', got 'jit'"),
    ({"max_partition_ops": 0}, "option 'max_partition_ops' must be a positive integer"),
    ({"max_partition_inputs": 2.5}, "option 'max_partition_inputs' must be a positive integer"),
    ({"verbose": "yes"}, "option 'verbose' must be True or False, got 'yes'"),
    ({"cache": 1}, "option 'cache' must be True or False, got 1"),
    ({"cache_dir": 7}, "option 'cache_dir' must be None or a folder path, got 7"),
    ({"search": [1]}, "option 'search' must be a dict of search options"),
    ({"search": {"preset": "fast"}}, "search preset 'fast' is unknown"),
    ({"search": {"time_limit": -3}}, "time_limit must be a positive number of seconds, got -3"),
    ({"search": {"max_blocks": "x"}}, "search option 'max_blocks' must be a positive integer"),
    ({"search": {"delta": 2}}, "search option 'delta' must be a probability between 0 and 1"),
]


@pytest.mark.parametrize(("options", "message"), BAD_BACKEND_OPTIONS,
                         ids=[repr(o) for o, _ in BAD_BACKEND_OPTIONS])
def test_backend_options_the_backend_cannot_use_are_refused(options, message):
    """Each refused by a mugraph error naming the option and the value (once accepted
    silently, or a crash later), before anything is compiled."""
    with pytest.raises(backend.BackendOptionError, match=re.escape(message)):
        backend.BackendOptions.parse(options)
    assert issubclass(backend.BackendOptionError, mugraph.MugraphError)
    assert issubclass(backend.BackendOptionError, ValueError)


def test_a_backend_cache_dir_that_is_a_file_is_refused(tmp_path):
    file = tmp_path / "not_a_folder"
    file.write_text("x")
    with pytest.raises(backend.BackendOptionError, match="must be a folder.*not_a_folder"):
        backend.BackendOptions.parse({"cache_dir": str(file)})
    backend.BackendOptions.parse({"cache_dir": str(tmp_path), "time_limit": 0})  # a folder: fine


def test_optimize_fx_on_a_symbolic_trace():
    model = NormLinear().eval()
    gm = torch.fx.symbolic_trace(model)
    x = torch.randn(2, 4, 16)
    fn = mgi.optimize_fx(gm, [x], **CAPTURE_ONLY)
    with torch.no_grad():
        assert_close(fn(x), model(x))
        assert mgi.last_report().taken
        y = torch.randn(3, 2, 16)  # another shape: specialized again, not reused
        assert_close(fn(y), model(y))
    assert len(mgi.reports()) == 2


# ---- search and cache ---------------------------------------------------------------------------


def test_a_cache_hit_skips_the_search(search_calls, tmp_path):
    options = {"time_limit": 1.0, "cache_dir": str(tmp_path / "results"), "elementwise": "mugraph"}
    model = SigmoidGate()  # one small partition: a short search
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, want = run_compiled(model, x, y, **options)
    assert not [w for w in caught if "cache" in str(w.message)]  # a cold cache is no error
    assert_close(got, want)
    searched = len(search_calls)
    assert searched == len(partitions()) >= 1
    assert all(p.cache == "miss" for p in partitions())

    torch._dynamo.reset()
    mgi.clear_reports()
    got, want = run_compiled(model, x, y, **options)
    assert_close(got, want)
    assert len(search_calls) == searched  # nothing searched again
    assert all(p.cache == "hit" for p in partitions())
    assert len(ResultCache(tmp_path / "results").entries()) == searched


def test_a_corrupted_cache_entry_is_reported_and_searched_again(search_calls, tmp_path):
    folder = tmp_path / "results"
    options = {"time_limit": 1.0, "cache_dir": str(folder)}
    model, x, y = SiluPattern(), torch.randn(2, 8, 16), torch.randn(2, 16, 8)
    run_compiled(model, x, y, **options)
    searched = len(search_calls)
    files = sorted(folder.glob("*.json"))
    assert searched >= 1 and len(files) == searched
    for path in files:  # flip one character in the middle of each entry
        text = path.read_text()
        middle = len(text) // 2
        path.write_text(text[:middle] + ("0" if text[middle] != "0" else "1") + text[middle + 1:])

    torch._dynamo.reset()
    mgi.clear_reports()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, want = run_compiled(model, x, y, **options)
    assert_close(got, want)
    reported = [str(w.message) for w in caught if "mugraph cache" in str(w.message)]
    for path in files:
        assert any(f"ignoring the entry {path}: " in m for m in reported), reported
    assert len(search_calls) == 2 * searched  # searched again, not trusted
    assert all(p.cache == "miss" for p in partitions())
    assert [e["valid"] for e in ResultCache(folder).entries()] == [True] * searched


def test_a_cached_mugraph_runs_and_matches_eager(search_calls):
    sizes = WORKLOADS["rmsnorm_linear"].small  # m=4, k=256, n=96
    naive = WORKLOADS["rmsnorm_linear"].naive(sizes, mugraph.float32)
    fused = WORKLOADS["rmsnorm_linear"].optimized(sizes, mugraph.float32)
    ResultCache().put(naive, None, fused, None, arch="cpu")

    class NormMatmul(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(sizes["k"], sizes["n"]) * 0.05)

        def forward(self, x):
            return F.rms_norm(x, (sizes["k"],), eps=0.0) @ self.w

    got, want = run_compiled(NormMatmul(), torch.randn(sizes["m"], sizes["k"]), time_limit=5,
                             shape_classes=False)
    assert_close(got, want, tol=1e-4)
    (part,) = partitions()
    assert part.program_hash == naive.structural_hash()
    assert (part.cache, part.status, part.runs_on) == ("hit", "optimized", "mugraph")
    assert search_calls == []


def test_the_example_block_runs_through_the_backend(monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "examples"))
    example = importlib.import_module("llama_block")
    block, x = example.make_inputs(example.SIZES["cpu"], torch.float32, "cpu")
    compiled = example.compile_block(block, 0, None, run_unimproved=True, cache=False)
    with torch.no_grad():
        assert_close(compiled(x), block(x), tol=1e-4)
    classes = {p.shape_class for p in mgi.last_report().taken}
    assert {name for name, _ in example.THAT_MATTER} <= classes


def test_a_partition_measured_slower_than_pytorch_runs_on_pytorch(monkeypatch):
    from mugraph.integration import runtime

    model = GatedMLP().eval()
    x = torch.randn(2, 4, 16)
    fn = mgi.optimize_fx(torch.fx.symbolic_trace(model), [x], **CAPTURE_ONLY)
    (module,) = fn.specialized.values()
    parts = [m for m in module.modules() if isinstance(m, MugraphPartition)]
    assert parts and all(p.use_mugraph for p in parts)
    # on a GPU both paths are timed on the first call; here a fake timer says PyTorch is faster
    monkeypatch.setattr(runtime, "_on_cuda", lambda raw: True)
    for part in parts:
        times = iter([2.0, 1.0])
        part.timer = lambda f, times=times: (f(), next(times))[1]
    with torch.no_grad():
        assert_close(fn(x), model(x))
    for part in parts:
        assert not part.use_mugraph and part.report.runs_on == "pytorch"
        assert part.report.measured == {"mugraph_ms": 2.0, "pytorch_ms": 1.0}
        assert "measured slower" in part.report.detail


@pytest.mark.parametrize("faster", ["inductor", "eager", "mugraph"])
def test_with_inductor_partitions_are_timed_when_compiled_and_losers_stay_in_the_graph(
        monkeypatch, faster):
    """rest="inductor" on a GPU: every partition is timed against its PyTorch nodes, run op
    by op and — when mugraph beats that — compiled by Inductor alone, while the graph
    compiles (on the values the graph computes), and one PyTorch wins stays as fx nodes for
    Inductor instead of an opaque mugraph.partition call. Here a fake GPU check and timer
    stand in, and a spy stands in for Inductor (the last module it gets is the graph; the
    ones before, partitions' nodes)."""
    # per partition: mugraph, PyTorch op by op, (PyTorch compiled by Inductor)
    times = iter({"inductor": [2.0, 3.0, 1.0], "eager": [2.0, 1.0],
                  "mugraph": [1.0, 2.0, 3.0]}[faster] * 8)
    handed = spy_on_inductor(monkeypatch, lambda f: (f(), next(times))[1])
    model = GatedMLP().eval()
    x = torch.randn(2, 4, 16)
    got, want = run_compiled(model, x, **CAPTURE_ONLY, rest="inductor")
    assert_close(got, want)
    module = handed[-1]
    calls = partitions_called(module)
    parts = partitions()
    timed = {"mugraph_ms", "pytorch_ms"} | ({"inductor_ms"} if faster != "eager" else set())
    assert parts and all(set(p.measured) == timed for p in parts)
    # Inductor compiles a partition's nodes alone only when mugraph beat them op by op
    assert len(handed) == 1 + (len(parts) if faster != "eager" else 0)
    if faster != "mugraph":
        assert calls == [] and all(p.runs_on == "pytorch" for p in parts)
        assert all("measured slower" in p.detail and "1.000 ms" in p.detail for p in parts)
    else:
        assert len(calls) == len(parts) and all(p.runs_on == "mugraph" for p in parts)


def test_with_inductor_a_folded_weight_is_prepared_inside_the_partition_call(monkeypatch):
    """A norm weight folded into the projection after it (mugraph::fold_weights) that only
    mugraph partitions use is prepared inside the partition call (memoized) from the
    parameters: the graph Inductor gets has no fold_weights call left, one operator call less
    per step."""
    from mugraph.integration.torch_ops import fold_weights_op

    handed = spy_on_inductor(monkeypatch)
    model = NormLinear().eval()
    x = torch.randn(2, 4, 16)
    compiled = with_inductor(model)
    with torch.no_grad():
        for _ in range(2):
            assert_close(compiled(x), model(x))
        model.norm.weight.mul_(2.0)  # a changed parameter: prepared again, not stale
        assert_close(compiled(x), model(x))
    module = handed[-1]
    targets = [n.target for n in module.graph.nodes if n.op == "call_function"]
    (call,) = [n for n in module.graph.nodes if n.target is torch.ops.mugraph.partition.default]
    assert fold_weights_op not in targets
    # the activation, the norm weight, the projection's weight and its bias: graph inputs
    assert len(call.args[1]) == 4 and all(n.op == "placeholder" for n in call.args[1])
    assert any(p.runs_on == "mugraph" for p in partitions())


class NormGatedMLP(nn.Module):
    """RMSNorm (its weight) before a gated MLP's gate and up projections, Llama's way."""

    def __init__(self, dim=16, hidden=32):
        super().__init__()
        self.norm = HandRMSNorm(dim)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        h = self.norm(x)
        return F.silu(self.gate(h)) * self.up(h)


@pytest.mark.parametrize("faster", ["eager", "mugraph"])
def test_with_inductor_a_folded_weight_pytorch_runs_is_unfolded(monkeypatch, faster):
    """When PyTorch wins the norm + gated MLP partition, the graph Inductor gets computes
    ``(n * w) @ W.T`` again instead of reading ``mugraph::fold_weights`` (the rule
    ``unfold_norm_weight``): no prepared copy per call, and Inductor can fuse ``n * w`` into
    the norm. When mugraph runs it, the folded weights stay (prepared inside its call)."""
    from mugraph.integration.torch_ops import fold_weights_op

    times = iter({"eager": [2.0, 1.0], "mugraph": [1.0, 2.0, 3.0]}[faster] * 8)
    handed = spy_on_inductor(monkeypatch, lambda f: (f(), next(times))[1])
    model = NormGatedMLP().eval()
    x = torch.randn(2, 4, 16)
    got, want = run_compiled(model, x, **CAPTURE_ONLY, rest="inductor")
    assert_close(got, want)
    graph = handed[-1].graph
    targets = [n.target for n in graph.nodes if n.op == "call_function"]
    assert fold_weights_op not in targets
    linears = [n for n in graph.nodes if n.target is F.linear]
    if faster == "eager":
        assert len(linears) == 2 and partitions_called(handed[-1]) == []
        # both projections read the norm times its weight (a graph input), not a folded copy
        assert all(n.args[1].op == "placeholder" for n in linears)
        assert len({n.args[0] for n in linears}) == 1 and linears[0].args[0].target is operator.mul
    else:
        assert linears == [] and partitions_called(handed[-1])


class NormQKV(nn.Module):
    """RMSNorm (its weight) before three sibling projections: folded and stacked into one."""

    def __init__(self, dim=16):
        super().__init__()
        self.norm = HandRMSNorm(dim)
        self.q, self.k, self.v = (nn.Linear(dim, n, bias=False) for n in (16, 8, 8))

    def forward(self, x):
        h = self.norm(x)
        return self.q(h), self.k(h), self.v(h)


def test_with_inductor_stacked_projections_pytorch_runs_are_unfolded_per_slice(monkeypatch):
    """Q, K and V folded and stacked (one linear over fold_weights(w, [Wq, Wk, Wv]), sliced)
    and left to PyTorch: each slice becomes its own ``linear(n * w, W)`` again."""
    from mugraph.integration.torch_ops import fold_weights_op

    times = iter([2.0, 1.0] * 8)  # per partition: mugraph, PyTorch op by op
    handed = spy_on_inductor(monkeypatch, lambda f: (f(), next(times))[1])
    model = NormQKV().eval()
    x = torch.randn(2, 4, 16)
    got, want = run_compiled(model, x, **CAPTURE_ONLY, rest="inductor")
    for g, w in zip(got, want, strict=True):
        assert_close(g, w)
    graph = handed[-1].graph
    assert fold_weights_op not in [n.target for n in graph.nodes]
    linears = [n for n in graph.nodes if n.target is F.linear]
    assert len(linears) == 3 and all(n.args[1].op == "placeholder" for n in linears)
    assert not any(n.target is operator.getitem for n in graph.nodes)


class _Residual(nn.Module):
    """Two gated MLPs with a residual sum: consecutive mugraph partitions."""

    def __init__(self):
        super().__init__()
        self.a, self.b = GatedMLP(), GatedMLP()

    def forward(self, x):
        h = x + self.a(x)
        return h + self.b(h)


def test_with_inductor_consecutive_partitions_run_in_one_operator_call(monkeypatch):
    """Partitions mugraph runs one right after the other are one mugraph::partitions call
    (the dispatch into Python paid once), running the same partitions in the same order,
    with the same results."""
    handed = spy_on_inductor(monkeypatch)  # equal times: mugraph keeps every partition
    model = _Residual().eval()
    x = torch.randn(2, 4, 16)
    compiled = with_inductor(model)
    with torch.no_grad():
        for _ in range(2):
            assert_close(compiled(x), model(x))
    module = handed[-1]
    parts = [p for p in partitions() if p.runs_on == "mugraph"]
    targets = [n.target for n in module.graph.nodes if n.op == "call_function"]
    assert len(parts) >= 2
    assert torch.ops.mugraph.partition.default not in targets
    assert targets.count(torch.ops.mugraph.partitions.default) == 1
    assert len(partitions_called(module)) == len(parts)
    (call,) = [n for n in module.graph.nodes if n.target is torch.ops.mugraph.partitions.default]
    assert call.users and all(item.users for item in call.users)  # no getitem left unread


def test_a_chained_partition_that_fails_runs_on_pytorch_and_the_chain_goes_on(monkeypatch):
    """A member of a mugraph::partitions chain whose μGraph fails at run time gives up (a
    warning, PyTorch runs it from then on) inside the same call; the other members run, and
    the results are eager's."""
    from mugraph.integration import runtime

    handed = spy_on_inductor(monkeypatch)
    model = _Residual().eval()
    x = torch.randn(2, 4, 16)
    compiled = with_inductor(model)
    with torch.no_grad():
        assert_close(compiled(x), model(x))
        keys = partitions_called(handed[-1])
        failing = runtime._PARTITIONS[keys[-1]]

        def broken(raw):
            raise RuntimeError("a kernel fault")

        monkeypatch.setattr(failing, "_run", broken)
        with pytest.warns(UserWarning, match="a kernel fault"):
            assert_close(compiled(x), model(x))
        assert_close(compiled(x), model(x))
    assert not failing.use_mugraph and failing.report.runs_on == "pytorch"
    assert all(runtime._PARTITIONS[k].use_mugraph for k in keys[:-1])


def test_chained_calls_stop_at_a_pytorch_node_between_them(monkeypatch):
    """Only calls with nothing but their getitems between them are merged: a PyTorch node
    using one call's output before the next call ends the run."""
    from torch.fx import Graph, GraphModule

    from mugraph.integration import runtime

    class AddOne:
        fake_outputs = [((3,), torch.float32)]

        def run_op(self, inputs):
            return [inputs[0] + 1]

    monkeypatch.setattr(runtime, "_PARTITIONS", {0: AddOne(), 1: AddOne(), 2: AddOne()})
    monkeypatch.setattr(runtime, "_CHAINS", {})
    graph = Graph()
    x = graph.placeholder("x")
    first = graph.call_function(torch.ops.mugraph.partition.default, (0, [x]))
    y = graph.call_function(torch.sin, (graph.call_function(operator.getitem, (first, 0)),))
    second = graph.call_function(torch.ops.mugraph.partition.default, (1, [y]))
    z = graph.call_function(operator.getitem, (second, 0))
    third = graph.call_function(torch.ops.mugraph.partition.default, (2, [z, y]))
    graph.output(graph.call_function(operator.getitem, (third, 0)))
    module = GraphModule(torch.nn.Module(), graph)
    value = torch.randn(3)
    want = module(value)
    assert backend.chain_partition_calls(module.graph) == 1
    module.recompile()
    assert_close(module(value), want)
    assert partitions_called(module) == [0, 1, 2]
    targets = [n.target for n in module.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.mugraph.partition.default) == 1
    assert targets.count(torch.ops.mugraph.partitions.default) == 1


class MaskedGroupedAttention(nn.Module):
    """transformers' attention: key/value heads repeated for grouped queries (repeat_kv), a
    boolean mask, head dim 4 (scale 1/2, a power of two)."""

    def forward(self, q, k, v, mask):
        def repeat(x, g=2):
            b, hk, s, d = x.shape
            return x[:, :, None, :, :].expand(b, hk, g, s, d).reshape(b, hk * g, s, d)

        return F.scaled_dot_product_attention(q, repeat(k), repeat(v), attn_mask=mask)


def _grouped_inputs():
    q, k, v = torch.randn(1, 4, 8, 4), torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 4)
    return q, k, v, torch.rand(1, 1, 8, 8) > 0.3


def test_repeated_key_value_heads_are_read_in_place_with_enable_gqa():
    """Rule grouped_kv_heads: attention on repeat_kv'd keys and values reads the heads
    themselves (enable_gqa=True): no copy g times the cache, the same result."""
    from torch.fx.passes.shape_prop import ShapeProp

    from mugraph.integration import canonicalize as canon

    gm = torch.fx.symbolic_trace(MaskedGroupedAttention())
    inputs = _grouped_inputs()
    ShapeProp(gm).propagate(*inputs)
    for node in gm.graph.nodes:  # the propagated shapes as the canonicalization reads them
        meta = node.meta.get("tensor_meta")
        node.meta["val"] = torch.empty(meta.shape, dtype=meta.dtype) if meta else None
    want = gm(*inputs)
    assert canon.ungroup_kv_heads(gm) == 1
    (sdpa,) = [n for n in gm.graph.nodes if n.target is F.scaled_dot_product_attention]
    assert sdpa.kwargs["enable_gqa"] and [a.name for a in sdpa.args[1:3]] == ["k", "v"]
    assert not [n for n in gm.graph.nodes if n.op == "call_method" and n.target == "expand"]
    assert_close(gm(*inputs), want)
    assert {r.name for r in canon.RULES} >= {"grouped_kv_heads"}


def test_with_inductor_inputs_copied_by_their_adapters_are_computed_by_the_graph(monkeypatch):
    """The query scaled by a power of two and the boolean mask cast to 0/1 are computed by
    the graph around the partition (Inductor fuses them into the kernels producing their
    sources), not copied inside every call; the raw inputs still reach the partition for
    its PyTorch fallback. Results are eager's, and so after a give-up."""
    from mugraph.integration import runtime
    from mugraph.integration.capture import apply_adapters

    handed = spy_on_inductor(monkeypatch)
    model = MaskedGroupedAttention().eval()
    inputs = _grouped_inputs()
    compiled = with_inductor(model)
    with torch.no_grad():
        assert_close(compiled(*inputs), model(*inputs))
        module = handed[-1]
        adapted = [n for n in module.graph.nodes if n.target is apply_adapters]
        kinds = sorted(kind for n in adapted for kind, _ in n.args[1] if kind != "reshape")
        assert kinds == ["cast", "scale"], kinds
        (key,) = partitions_called(module)
        part = runtime._PARTITIONS[key]
        assert len(part._outside) == 2
        monkeypatch.setattr(part, "_compiled", None)  # the next call goes through forward
        monkeypatch.setattr(part, "_run", lambda raw: (_ for _ in ()).throw(RuntimeError("x")))
        with pytest.warns(UserWarning, match="runs on PyTorch"):
            assert_close(compiled(*inputs), model(*inputs))


def test_with_inductor_a_kernel_computing_other_values_than_pytorch_never_runs(monkeypatch):
    """On the GPU's first call each partition's μGraph is compared with its PyTorch nodes on
    the real inputs: one that verified over finite fields yet computes other floats (a
    compiler fault) runs on PyTorch, saying why, and the model's results are eager's."""
    from mugraph.integration.runtime import MugraphPartition

    spy_on_inductor(monkeypatch)
    right = MugraphPartition._run

    def wrong(self, raw, adapted=None):
        return [out * 1.5 for out in right(self, raw, adapted)]

    monkeypatch.setattr(MugraphPartition, "_run", wrong)
    model = GatedMLP().eval()
    x = torch.randn(2, 4, 16)
    with torch.no_grad(), pytest.warns(UserWarning, match="differs from PyTorch's"):
        assert_close(with_inductor(model)(x), model(x))
    parts = partitions()
    assert parts and all(p.runs_on == "pytorch" for p in parts)
    assert all("differs from PyTorch's" in p.detail for p in parts), [p.detail for p in parts]


class TwoGatedMLPs(nn.Module):
    """Two gated MLPs of one shape (a model's layers: timed once), the second on inputs
    scaled by 1000."""

    def __init__(self):
        super().__init__()
        self.first, self.second = GatedMLP(), GatedMLP()

    def forward(self, x):
        return self.second(self.first(x) * 1000.0)


def test_with_inductor_every_layer_is_compared_with_pytorch_on_its_own_inputs(monkeypatch):
    """Layers computing the same function on the same layouts share one timing, not the
    first call's float comparison: each is compared on its own inputs, and one whose μGraph
    computes other values there (here: only on large inputs) runs on PyTorch."""
    from mugraph.integration.runtime import MugraphPartition

    spy_on_inductor(monkeypatch)
    right = MugraphPartition._run

    def wrong_on_large_inputs(self, raw, adapted=None):
        outs = right(self, raw, adapted)
        return [out * 1.5 for out in outs] if raw[0].abs().max() > 100 else outs

    monkeypatch.setattr(MugraphPartition, "_run", wrong_on_large_inputs)
    model = TwoGatedMLPs().eval()
    x = torch.randn(2, 4, 16)
    with torch.no_grad(), pytest.warns(UserWarning, match="elements beyond the tolerance"):
        assert_close(with_inductor(model)(x), model(x), tol=1e-4)
    parts = partitions()
    first, second = parts[:len(parts) // 2], parts[len(parts) // 2:]
    assert all(p.runs_on == "mugraph" for p in first), [p.line() for p in first]
    assert all(p.runs_on == "pytorch" and "differs from PyTorch's" in p.detail
               for p in second), [p.line() for p in second]


def test_chained_calls_pass_views_that_keep_the_elements_order(monkeypatch):
    """A decode step's attention output reaches the output projection through reshapes and a
    transpose of a size-1 dim: views that keep the elements' order, so the two calls merge
    (the member reads the output viewed inside the chain). A transpose that reorders the
    elements (a copy by contiguous) ends the run."""
    from torch.fx import Graph, GraphModule

    from mugraph.integration import runtime

    class Scale:
        def __init__(self, shape):
            self.fake_outputs = [(shape, torch.float32)]

        def run_op(self, inputs):
            return [(inputs[0] * 2).contiguous()]

    def build(dims):
        graph = Graph()
        x = graph.placeholder("x")
        first = graph.call_function(torch.ops.mugraph.partition.default, (0, [x]))
        out = graph.call_function(operator.getitem, (first, 0))
        out.meta["val"] = torch.empty(2, 1, 3)
        viewed = graph.call_method("transpose", (out, *dims))
        viewed = graph.call_method("contiguous", (viewed,))
        viewed = graph.call_method("reshape", (viewed, 6))
        second = graph.call_function(torch.ops.mugraph.partition.default, (1, [viewed]))
        graph.output(graph.call_function(operator.getitem, (second, 0)))
        return GraphModule(torch.nn.Module(), graph)

    monkeypatch.setattr(runtime, "_PARTITIONS", {0: Scale((2, 1, 3)), 1: Scale((6,))})
    monkeypatch.setattr(runtime, "_CHAINS", {})
    value = torch.randn(2, 1, 3)
    for dims, merged in (((0, 1), True), ((1, 2), True), ((0, 2), False)):
        module = build(dims)
        want = module(value)
        assert backend.chain_partition_calls(module.graph) == int(merged), dims
        module.graph.eliminate_dead_code()
        module.recompile()
        assert_close(module(value), want)
        methods = [n.target for n in module.graph.nodes if n.op == "call_method"]
        assert methods == ([] if merged else ["transpose", "contiguous", "reshape"])


def test_with_inductor_partitions_of_one_function_and_layout_are_timed_once(monkeypatch):
    """Two layers computing the same function on the same shapes (with their own weights):
    the first is timed and compiled alone by Inductor, the second adopts its times."""
    drawn: list = []
    handed = spy_on_inductor(monkeypatch, lambda f: (f(), drawn.append(1), float(len(drawn)))[2])
    model = nn.Sequential(GatedMLP(), GatedMLP()).eval()
    x = torch.randn(2, 4, 16)
    got, want = run_compiled(model, x, **CAPTURE_ONLY, rest="inductor")
    assert_close(got, want)
    parts = partitions()
    layer = len(parts) // 2  # each layer's partitions, in order
    assert len(parts) == 2 * layer and len(drawn) == 3 * layer and len(handed) == layer + 1
    for first, second in zip(parts[:layer], parts[layer:], strict=True):
        assert first.measured == second.measured and set(first.measured) == {
            "mugraph_ms", "pytorch_ms", "inductor_ms"}
    assert all(p.runs_on == "mugraph" for p in parts)




def test_identical_layers_are_capture_checked_once(monkeypatch):
    """The float64 capture check of a partition is made once per computation: a second
    layer doing the same (other node names, other weights) reuses its verdict."""
    calls: list = []
    check = backend.check_capture

    def counting(captured, fallback, seed=0):
        calls.append(captured.kinds)
        return check(captured, fallback, seed)

    monkeypatch.setattr(backend, "check_capture", counting)
    monkeypatch.setattr(backend, "_CHECKED", {})  # no verdicts of earlier tests
    model = nn.Sequential(GatedMLP(), GatedMLP()).eval()
    x = torch.randn(2, 4, 16)
    assert_close(*run_compiled(model, x))
    parts = partitions()
    assert len(parts) % 2 == 0 and len(calls) == len(parts) // 2 > 0
