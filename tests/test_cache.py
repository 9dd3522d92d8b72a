"""The persistent result cache: keys, atomic entries, and never trusting what is on disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

import mugraph
from mugraph import cache as cache_mod
from mugraph.cache import ResultCache, default_cache_dir, make_key
from mugraph.library import WORKLOADS
from mugraph.search.config import SearchConfig
from mugraph.search.generator import Stats

SIZES = WORKLOADS["rmsnorm_linear"].small


def naive(dtype=mugraph.float16, sizes=SIZES):
    return WORKLOADS["rmsnorm_linear"].naive(sizes, dtype)


def fused(dtype=mugraph.float16, sizes=SIZES):
    return WORKLOADS["rmsnorm_linear"].optimized(sizes, dtype)


def fake_result(config: SearchConfig, timed_out=False, interrupted=False):
    """A stand-in SearchResult with the fields the cache summarises."""
    stats = Stats(states=123, block_graphs=7, candidates=2)
    return SimpleNamespace(
        stats=stats, candidates=[object()], elapsed=1.5, units_done=3, units_total=4,
        timed_out=timed_out, interrupted=interrupted, config=config,
    )


@pytest.fixture
def cache(tmp_path):
    return ResultCache(tmp_path / "results")


def store(cache, program=None, best=None, config=None, **result):
    program = program or naive()
    config = config or SearchConfig(time_limit=5.0)
    path = cache.put(program, config, best, fake_result(config, **result), arch="cpu")
    return program, config, path


def test_default_dir_honours_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("MUGRAPH_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert default_cache_dir() == tmp_path / "elsewhere"
    assert ResultCache().path == tmp_path / "elsewhere"
    monkeypatch.delenv("MUGRAPH_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "mugraph" / "results"


def test_round_trip_of_an_improved_graph_is_reverified(cache):
    program, config, path = store(cache, best=fused())
    assert path.exists() and path.parent == cache.path
    got = cache.get(program, config, arch="cpu")
    assert got is not None and got is not program
    assert got == fused()
    assert got.verification.passed  # checked again on the way in
    assert got.cache_entry["improved"] is True
    assert got.cache_entry["search"]["states"] == 123
    entry = json.loads(path.read_text())
    assert entry["key"]["program"] == program.structural_hash()
    assert entry["key"]["version"] == mugraph.__version__
    assert entry["key"]["arch"] == "cpu"
    assert set(entry) >= {"best", "verification", "search", "created", "checksum"}


def test_an_unimproved_entry_gives_back_the_program(cache):
    program, config, _ = store(cache, best=None)
    assert cache.get(program, config, arch="cpu") is program
    store(cache, program=program, best=program)
    assert cache.get(program, config, arch="cpu") is program


def test_a_miss_is_none(cache):
    assert cache.get(naive(), SearchConfig(), arch="cpu") is None


@pytest.mark.parametrize(
    "change",
    ["dtype", "shape", "arch", "version", "config"],
)
def test_key_changes_miss(cache, monkeypatch, change):
    program, config, _ = store(cache, best=fused())
    arch = "cpu"
    if change == "dtype":
        program = naive(mugraph.float32)
    elif change == "shape":
        program = naive(sizes={**SIZES, "m": 8})
    elif change == "arch":
        arch = "sm_90"
    elif change == "version":
        monkeypatch.setattr(mugraph, "__version__", "999.0")
    elif change == "config":
        config = SearchConfig(time_limit=5.0, max_block_ops=3)
    assert cache.get(program, config, arch=arch) is None


def test_budget_and_workers_are_not_in_the_key(cache):
    program, config, _ = store(cache, best=fused())
    other = SearchConfig(time_limit=60.0, workers=8)
    assert make_key(program, other, "cpu") == make_key(program, config, "cpu")
    assert cache.get(program, other, arch="cpu") is not None  # a complete search: any budget


def test_a_search_cut_short_is_not_reused_for_a_larger_budget(cache):
    program, config, _ = store(cache, best=None, timed_out=True)
    assert cache.get(program, SearchConfig(time_limit=5.0), arch="cpu") is program
    assert cache.get(program, SearchConfig(time_limit=2.0), arch="cpu") is program
    assert cache.get(program, SearchConfig(time_limit=30.0), arch="cpu") is None


def test_an_interrupted_search_is_not_stored(cache):
    _, _, path = store(cache, best=fused(), interrupted=True)
    assert path is None and cache.entries() == []


def test_a_corrupted_entry_is_ignored_with_a_warning(cache):
    program, config, path = store(cache, best=fused())
    entry = json.loads(path.read_text())
    entry["search"]["states"] += 1  # valid JSON, wrong checksum
    path.write_text(json.dumps(entry))
    with pytest.warns(UserWarning, match="checksum"):
        assert cache.get(program, config, arch="cpu") is None


def test_a_truncated_entry_is_ignored_with_a_warning(cache):
    program, config, path = store(cache, best=fused())
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    with pytest.warns(UserWarning, match="truncated"):
        assert cache.get(program, config, arch="cpu") is None


def test_a_stale_entry_is_ignored_with_a_warning(cache):
    program, config, path = store(cache, best=fused())
    entry = json.loads(path.read_text())
    entry["key"]["version"] = "0.0.1"  # written by another version, under this key's name
    entry["checksum"] = cache_mod._checksum(entry)
    path.write_text(json.dumps(entry))
    with pytest.warns(UserWarning, match="stale"):
        assert cache.get(program, config, arch="cpu") is None


def test_a_wrong_graph_on_disk_fails_reverification(cache):
    program, config, path = store(cache, best=fused())
    wrong = mugraph.new_kernel_graph()  # same interface, another function
    x = wrong.new_input((SIZES["m"], SIZES["k"]), dtype=mugraph.float16)
    w = wrong.new_input((SIZES["k"], SIZES["n"]), dtype=mugraph.float16)
    wrong.mark_output(wrong.matmul(x, w))
    entry = json.loads(path.read_text())
    entry["best"] = wrong.to_json()
    entry["checksum"] = cache_mod._checksum(entry)
    path.write_text(json.dumps(entry))
    with pytest.warns(UserWarning, match="re-verification"):
        assert cache.get(program, config, arch="cpu") is None


def test_writes_are_atomic_and_listed(cache):
    store(cache, best=fused())
    store(cache, program=naive(mugraph.float32), best=None)
    names = sorted(p.name for p in cache.path.iterdir())
    assert len(names) == 2 and all(n.endswith(".json") and not n.startswith(".") for n in names)
    entries = cache.entries()
    assert len(entries) == 2
    for e in entries:
        assert {"key", "path", "size", "created", "program"} <= set(e)
        assert e["valid"] and e["size"] > 0 and Path(e["path"]).exists()
    assert {e["program"] for e in entries} == {
        naive().structural_hash(), naive(mugraph.float32).structural_hash()
    }
    assert cache.clear() == 2
    assert cache.entries() == [] and list(cache.path.iterdir()) == []


def test_a_broken_file_is_listed_as_invalid(cache):
    store(cache, best=fused())
    (cache.path / "garbage.json").write_text("{not json")
    listed = {e["key"]: e for e in cache.entries()}
    assert listed["garbage"]["valid"] is False
    assert sum(e["valid"] for e in listed.values()) == 1


def test_a_second_process_hits_the_cache_quickly(cache):
    program, config, _ = store(cache, best=fused())
    script = textwrap.dedent(
        f"""
        import time
        from mugraph.cache import ResultCache
        from mugraph.library import WORKLOADS
        from mugraph.search.config import SearchConfig
        import mugraph
        program = WORKLOADS["rmsnorm_linear"].naive({SIZES!r}, mugraph.float16)
        started = time.perf_counter()
        got = ResultCache({str(cache.path)!r}).get(program, SearchConfig(time_limit=5.0),
                                                   arch="cpu")
        print(got is not None and got is not program, time.perf_counter() - started)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(mugraph.__file__).parents[1])}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=120, check=True).stdout.split()
    assert out[0] == "True"
    assert float(out[1]) < 1.0
