"""Shape-class representatives: the small program a class search runs on."""

from __future__ import annotations

import torch
import torch.nn as nn

import mugraph as mi
import mugraph.integration as mgi
from mugraph.cache import config_hash
from mugraph.integration import dynamo
from mugraph.search import shape_class as sc
from mugraph.search.config import SearchConfig
from mugraph.search.driver import superoptimize

# A Llama-3.2-1B prefill's attention as the torch.compile capture hands it over (32 heads,
# K/V already expanded to them, a 0/1 causal mask), at 128 tokens instead of 512.
EXPANDED_HEADS_ATTENTION = """mugraph 1
%0 = input() [index=0] -> float16[32,1,128,64]/[8192,8192,64,1]
%1 = input() [index=1] -> float16[32,1,64,128]/[8192,64,1,64]
%2 = matmul(%0, %1) -> float16[32,1,128,128]/[16384,16384,128,1]
%3 = input() [index=2] -> float16[1,1,128,128]/[16384,16384,128,1]
%4 = exp(%2) -> float16[32,1,128,128]/[16384,16384,128,1]
%5 = mul(%4, %3) -> float16[32,1,128,128]/[16384,16384,128,1]
%6 = reduction(%5) [dim=3] -> float16[32,1,128,1]/[128,128,1,1]
%7 = div(%5, %6) -> float16[32,1,128,128]/[16384,16384,128,1]
%8 = input() [index=3] -> float16[32,1,128,64]/[8192,8192,64,1]
%9 = matmul(%7, %8) -> float16[32,1,128,64]/[8192,8192,64,1]
outputs %9
"""


def test_many_heads_stay_small_in_the_representative_and_the_class_search_finds_it():
    """Heads are a batch dim of both products: 32 of them become 2 (not 64, which left the
    one-block search no tiling that fits shared memory: 0 states on the 1B model)."""
    program = mi.from_text(EXPANDED_HEADS_ATTENTION)
    cls = sc.classify(program)
    assert cls is not None and cls.name == "attention"
    small = sc.representative(program)
    assert [t.dims for t in small.input_types] == [
        (2, 1, 64, 64), (2, 1, 64, 64), (1, 1, 64, 64), (2, 1, 64, 64)]
    result = superoptimize(small, time_limit=120, workers=1, **sc.class_overrides(cls, small))
    assert result.candidates, result.summary()



class ResidualProjection(nn.Module):
    """x + h W^T: a projection with a residual (the linear_epilogue class)."""

    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        self.proj = nn.Linear(k, n, bias=False)

    def forward(self, h, x):
        return x + self.proj(h)


def _compiled_projection(k: int, n: int, rows: int, cache_dir) -> mgi.PartitionReport:
    """Compile a ResidualProjection, check it against eager, return its one partition."""
    torch._dynamo.reset()
    mgi.clear_reports()
    model = ResidualProjection(k, n).eval()
    h, x = torch.randn(1, rows, k), torch.randn(1, rows, n)
    compiled = torch.compile(model, backend="mugraph", dynamic=False,
                             options={"time_limit": 60, "cache_dir": str(cache_dir)})
    with torch.no_grad():
        torch.testing.assert_close(compiled(h, x), model(h, x), rtol=1e-4, atol=1e-4)
    (part,) = [p for r in mgi.reports() for p in r.partitions]
    return part


def test_a_long_reduction_gets_a_looped_kernel_when_the_representative_has_none(tmp_path):
    """A Llama-1B MLP down projection with its residual (K = 8192): the class search on the
    representative (K = 64) prefers one block holding the whole reduction, which no tiling of
    the real sizes fits in shared memory; the backend searches again with a for-loop
    required and tiles that (before: "none of 0 tilings fits", PyTorch ran it)."""
    part = _compiled_projection(8192, 256, 1, tmp_path)
    assert part.shape_class == "linear_epilogue" and part.runs_on == "mugraph", part.line()
    assert part.tiling["loop"] is not None and not part.detail
    # the new field keys only when set: the key of a default config is the one it had before
    assert config_hash(SearchConfig()) == "f91ab7d83c351fa2115ba8f869de2c81"
    assert config_hash(SearchConfig(loop_required=True)) != config_hash(SearchConfig())


def _fake_gpu(monkeypatch, time_of) -> list:
    """A GPU architecture pretended and tilings timed by ``time_of(n)`` for the n-th graph
    timed (fresh tiling and answer records); returns the graphs timed, in order."""
    timed: list = []

    def fake_timer(program):
        def timer(graph):
            timed.append(graph)
            return time_of(len(timed))
        return timer

    monkeypatch.setattr(dynamo, "_arch", lambda captured: "sm_90")
    monkeypatch.setattr(dynamo, "_tiling_timer", fake_timer)
    monkeypatch.setattr(dynamo, "_FASTER", {})
    monkeypatch.setattr(dynamo, "_TILED", {})
    return timed


def test_on_a_gpu_the_verified_tilings_are_timed_and_the_fastest_kept(monkeypatch, tmp_path):
    """With a GPU, the cheapest tilings that verify are all timed there and the fastest one
    runs (the cost model only orders them). A fake GPU architecture and timer stand in: the
    timer calls each later tiling faster, so the last one timed must be chosen."""
    timed = _fake_gpu(monkeypatch, lambda count: 10.0 - count)
    part = _compiled_projection(512, 256, 16, tmp_path)
    times = part.tiling["timed_ms"]
    assert part.runs_on == "mugraph" and len(times) > 1, part.line()
    assert times == sorted(times, reverse=True)  # the last timed is the fastest: chosen
    # the representative's answer reduces in one block: on a GPU the looped answer is tiled
    # too, and the two answers' choices are timed against each other (the looped one, timed
    # last, is faster here)
    block, looped = part.tiling["answers_ms"]
    assert looped < block and part.tiling["loop"] is not None
    chosen = [entry[0] for key, entry in dynamo._TILED.items() if key[-1]]
    assert len(chosen) == 2 and chosen[1] is timed[-1] and chosen[0] is timed[-2]


def test_on_a_gpu_the_faster_of_the_two_answers_is_kept(monkeypatch, tmp_path):
    """When the one-block answer times faster than the looped one, it stays (with its
    tiling record), and the looped answer's tiling record does not leak into the report."""
    _fake_gpu(monkeypatch, float)  # each later graph slower
    part = _compiled_projection(512, 256, 16, tmp_path)
    block, looped = part.tiling["answers_ms"]
    assert block < looped and part.tiling["loop"] is None, part.line()


# A decode step's attention as the capture hands it over: 2 KV groups of 4 query heads, one
# query token, 256 keys (K transposed in the KV cache's memory).
DECODE_ATTENTION = """mugraph 1
%0 = input() [index=0] -> float16[2,4,1,64]/[256,64,64,1]
%1 = input() [index=1] -> float16[2,1,64,256]/[16384,64,1,64]
%2 = matmul(%0, %1) -> float16[2,4,1,256]/[1024,256,256,1]
%3 = exp(%2) -> float16[2,4,1,256]/[1024,256,256,1]
%4 = reduction(%3) [dim=3] -> float16[2,4,1,1]/[4,1,1,1]
%5 = div(%3, %4) -> float16[2,4,1,256]/[1024,256,256,1]
%6 = input() [index=2] -> float16[2,1,256,64]/[16384,16384,64,1]
%7 = matmul(%5, %6) -> float16[2,4,1,64]/[256,64,64,1]
outputs %7
"""


def test_decode_attention_on_a_gpu_is_also_searched_at_its_real_sizes(monkeypatch, tmp_path):
    """One query row per head against a long KV sequence: the class answer's tilings split
    only output indices (few blocks, each walking every key), so on a GPU the program is
    also searched as it is, where the split-KV form lives, and the faster answer is kept
    (here the real-size one, timed last and faster). Without a GPU nothing changes."""
    from mugraph.integration.report import PartitionReport
    from mugraph.search.verify import verify

    program = mi.from_text(DECODE_ATTENTION)
    cls = sc.classify(program)
    assert cls.name == "attention" and sc.splits_reduction(cls, program)
    assert not sc.splits_reduction(cls, mi.from_text(EXPANDED_HEADS_ATTENTION))
    options = dynamo.BackendOptions.parse({"time_limit": 60, "cache_dir": str(tmp_path)})

    timed = _fake_gpu(monkeypatch, lambda count: 10.0 - count)
    part = PartitionReport("p", [], [], [], "")
    best = dynamo._optimize(program, options, "sm_90", part)
    tiled, real = part.tiling["real_size_ms"]
    assert real < tiled and part.tiling.get("real_size") and best is timed[-1], part.line()
    assert "searched at the real sizes" in part.line()
    assert verify(best, program).passed

    part = PartitionReport("p", [], [], [], "")
    best = dynamo._optimize(program, options, "cpu", part)
    assert "real_size_ms" not in part.tiling and "real_size" not in part.tiling


# Grids A-D of a cost-ordered tiling list (grids interleaved, as the tiler's order mixes
# them), each with 1-3 for-loop ranges; the graph of a tiling is its name, e.g. "B2".
FAKE_TILINGS = "A1 B1 A2 C1 D1 B2 A3 C2 D2".split()
FIRST_MS = {"A1": 3.0, "B1": 1.0, "C1": float("inf"), "D1": 2.0}  # others: 5 ms


def _fake_tilings() -> list:
    from types import SimpleNamespace

    return [SimpleNamespace(axes=((name[0], 64),), loop=int(name[1]), graph=name)
            for name in FAKE_TILINGS]


def _timed(monkeypatch, timed_grids: int, refined: int, timer=None, cheapest: int = 0,
           big: int = 0, tilings=None) -> tuple[list, list]:
    """(graphs timed, their times) by ``dynamo._timed_tilings`` of the fake tilings."""
    monkeypatch.setattr(dynamo, "CHEAPEST_TIMED", cheapest)
    monkeypatch.setattr(dynamo, "BIG_TILE_GRIDS", big)
    monkeypatch.setattr(dynamo, "TILINGS_TIMED", timed_grids)
    monkeypatch.setattr(dynamo, "GRIDS_REFINED", refined)
    tilings, times = dynamo._timed_tilings(tilings or _fake_tilings(), timer or _fake_timer([]))
    return [t.graph for t in tilings], times


def _fake_timer(log: list):
    def timer(graph):
        log.append(graph)
        return FIRST_MS.get(graph, 5.0)
    return timer


def test_on_a_gpu_one_tiling_per_grid_is_timed_then_the_fastest_grids_refined(monkeypatch):
    """``_timed_tilings`` times the CHEAPEST_TIMED cheapest tilings and the cheapest tiling of
    each grid (in the cost order, at most TILINGS_TIMED grids), then the other for-loop
    ranges of the GRIDS_REFINED fastest grids (fastest first); a grid whose tilings all fail
    (infinity) is never refined. A timer with ``precompile`` gets each batch's graphs before
    they are timed."""
    log: list = []
    graphs, times = _timed(monkeypatch, 12, 2, _fake_timer(log))
    assert graphs == log == ["A1", "B1", "C1", "D1", "B2", "D2"]
    assert times == [3.0, 1.0, float("inf"), 2.0, 5.0, 5.0]
    # every grid refined but C, whose first tiling failed
    assert _timed(monkeypatch, 12, 4)[0] == ["A1", "B1", "C1", "D1", "B2", "D2", "A2", "A3"]
    # two grids timed at most: C and D are not
    assert _timed(monkeypatch, 2, 2)[0] == ["A1", "B1", "B2", "A2", "A3"]
    # the three cheapest timed too (A2 with A1 and B1), in the cost order; refined: B and D
    assert _timed(monkeypatch, 12, 2, cheapest=3)[0] == ["A1", "B1", "A2", "C1", "D1", "B2",
                                                         "D2"]

    class PrecompilingTimer:
        def precompile(self, batch):
            log.append(("precompile", batch))

        __call__ = staticmethod(_fake_timer(log))

    log.clear()
    _timed(monkeypatch, 12, 2, PrecompilingTimer())
    assert log == [("precompile", ["A1", "B1", "C1", "D1"]), "A1", "B1", "C1", "D1",
                   ("precompile", ["B2", "D2"]), "B2", "D2"]


def test_the_grids_of_the_largest_tiles_are_timed_wherever_the_cost_model_ranks_them(
        monkeypatch):
    """The cost model ranks large tiles last at prefill sizes, where they run fastest: the
    BIG_TILE_GRIDS grids with the fewest blocks (at least MIN_GRID_BLOCKS) are timed too.
    Grids A-E in the cost order launch 512, 256, 128, 64 and 16 blocks: with two grids timed
    by the cost order, the one of the largest tiles that still fills the GPU (D) is added,
    never E (16 blocks)."""
    from types import SimpleNamespace

    blocks = {"A": 512, "B": 256, "C": 128, "D": 64, "E": 16}
    tilings = [SimpleNamespace(axes=(("i", blocks[g]),), loop=1, graph=f"{g}1") for g in blocks]
    monkeypatch.setattr(dynamo, "MIN_GRID_BLOCKS", 64)
    assert _timed(monkeypatch, 2, 0, big=1, tilings=tilings)[0] == ["A1", "B1", "D1"]
    assert _timed(monkeypatch, 2, 0, big=2, tilings=tilings)[0] == ["A1", "B1", "C1", "D1"]
    assert _timed(monkeypatch, 2, 0, big=0, tilings=tilings)[0] == ["A1", "B1"]
    assert dynamo._blocks((("i0.1", 4), ("i1.2", 64))) == 256


def test_launch_settings_are_timed_for_the_fastest_and_the_big_tile_tilings_before_choosing(
        monkeypatch):
    """``_tuned_launches`` asks the timer's ``launch_grid`` for the LAUNCH_TUNED fastest
    tilings (by their default launch) and the fastest timed tiling of each big-tile grid, in
    one batch with their default times, and keeps the settings found faster."""
    from types import SimpleNamespace

    from mugraph.codegen.launch import LaunchConfig

    blocks = {"A": 512, "B": 256, "C": 128, "D": 64}
    tilings = [SimpleNamespace(axes=(("i", blocks[name[0]]),), loop=1, graph=name)
               for name in ["A1", "B1", "C1", "D1", "D2"]]
    times = [1.0, 2.0, float("inf"), 9.0, 8.0]
    asked: list = []

    class Timer:
        def launch_grid(self, graphs, default_ms):
            asked.append((graphs, default_ms))
            return [(0, LaunchConfig(8, 3), 0.5) if g == "D2" else None for g in graphs]

    monkeypatch.setattr(dynamo, "LAUNCH_TUNED", 1)
    monkeypatch.setattr(dynamo, "BIG_TILE_GRIDS", 1)
    monkeypatch.setattr(dynamo, "MIN_GRID_BLOCKS", 64)
    tuned = dynamo._tuned_launches(tilings, times, Timer())
    # the fastest (A1), then D's fastest timed tiling (D2, not D1); C failed: never tuned
    assert asked == [(["A1", "D2"], [1.0, 8.0])]
    assert tuned == {id(tilings[4]): (0, LaunchConfig(8, 3), 0.5)}
    assert dynamo._tuned_launches(tilings, times, lambda graph: 1.0) == {}  # a plain timer


def test_a_big_tile_grid_is_timed_and_tuned_with_the_preferred_loop_step(monkeypatch):
    """Of a big-tile grid's tilings, the one whose for-loop step is nearest
    PREFERRED_LOOP_TILE is timed first (not the cost model's cheapest of the grid) and its
    launch settings are tuned, even when another step of the grid timed faster."""
    from types import SimpleNamespace

    tilings = [SimpleNamespace(axes=(("i", 512),), loop=1, loop_tile=64, graph="A1"),
               SimpleNamespace(axes=(("i", 64),), loop=1, loop_tile=16, graph="D1"),
               SimpleNamespace(axes=(("i", 64),), loop=2, loop_tile=128, graph="D2"),
               SimpleNamespace(axes=(("i", 64),), loop=3, loop_tile=64, graph="D3")]
    monkeypatch.setattr(dynamo, "MIN_GRID_BLOCKS", 64)
    graphs, _ = _timed(monkeypatch, 1, 0, big=1, tilings=tilings)
    assert graphs == ["A1", "D3"]
    asked: list = []

    class Timer:
        def launch_grid(self, graphs, default_ms):
            asked.extend(graphs)
            return [None] * len(graphs)

    monkeypatch.setattr(dynamo, "LAUNCH_TUNED", 1)
    dynamo._tuned_launches(tilings, [1.0, 2.0, 3.0, 4.0], Timer())
    assert asked == ["A1", "D3"]


def test_a_tiling_a_launch_setting_made_fastest_is_kept_with_that_setting(monkeypatch,
                                                                           tmp_path):
    """The tilings are ranked by their best time, a tuned launch setting's included: the
    tiling slowest by its default launch but fastest with 8 warps is kept, with the setting
    on its graph and in the report, and the default-launch sweep is not run again."""
    from mugraph.codegen.launch import LaunchConfig

    timed: list = []
    swept: list = []

    class Timer:
        def __call__(self, graph):
            timed.append(graph)
            return 1.0 + len(timed)  # each later tiling slower

        def launch_grid(self, graphs, default_ms):
            return [(_one_kernel(g), LaunchConfig(8, 3), 0.25) if g is timed[-1] else None
                    for g in graphs]

        def launch_settings(self, graph):
            swept.append(graph)

    monkeypatch.setattr(dynamo, "_arch", lambda captured: "sm_90")
    monkeypatch.setattr(dynamo, "_tiling_timer", lambda program: Timer())
    monkeypatch.setattr(dynamo, "_FASTER", {})
    monkeypatch.setattr(dynamo, "_TILED", {})
    monkeypatch.setattr(dynamo, "BIG_TILE_GRIDS", 64)  # every grid: the last timed is among them
    monkeypatch.setattr(dynamo, "MIN_GRID_BLOCKS", 1)
    part = _compiled_projection(512, 256, 16, tmp_path)
    assert part.runs_on == "mugraph" and part.tiling["launch"] == [8, 3, 0.25], part.line()
    kept = [entry[0] for key, entry in dynamo._TILED.items() if key[-1] and entry[0]]
    tuned = [g for g in kept if getattr(g, "launch_settings", None)]
    assert tuned and all(g.launch_settings == {_one_kernel(g): LaunchConfig(8, 3)}
                         for g in tuned)
    assert not any(g is s for g in tuned for s in swept)


def _one_kernel(graph) -> int:
    return next(i for i, op in enumerate(graph.ops) if op.kind.name == "CUSTOMIZED")


def test_the_report_names_the_tiling_kept_its_launch_and_the_wrong_kernels_skipped():
    """With tilings timed, the partition's line says which one was kept (grid and loop), the
    launch setting when one was timed faster, and how many faster ones computed wrongly."""
    from mugraph.integration.report import PartitionReport

    part = PartitionReport("p", [], [], [], "")
    part.tiling = {"grid": [["i0.1", 8], ["i1.2", 24]], "loop": ["i0.2", 32],
                   "timed_ms": [0.03, 0.02], "launch": [4, 3, 0.019], "wrong_kernels": 2}
    assert ("tilings timed (ms): 0.0300, 0.0200 (kept: grid i0.1/8 x i1.2/24, loop i0.2/32, "
            "4 warps 3 stages; 2 computed wrongly)") in part.line()
    part.tiling = {"grid": [], "loop": None, "timed_ms": [0.03, 0.02]}
    assert "(kept: grid 1)" in part.line()
