"""The persistent result cache: keys, atomic entries, and never trusting what is on disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
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


def test_a_shorter_search_cut_short_does_not_replace_a_better_entry(cache):
    """The same subprogram searched again with a smaller share of a budget (the attention
    part of a larger program, say) keeps the longer or complete search's answer."""
    program, _, first = store(cache, best=fused(), config=SearchConfig(time_limit=12.0),
                              timed_out=True)
    _, _, again = store(cache, program, best=None, config=SearchConfig(time_limit=5.0),
                        timed_out=True)
    assert again is None
    assert cache.get(program, SearchConfig(time_limit=12.0), arch="cpu") is not program
    _, _, longer = store(cache, program, best=None, config=SearchConfig(time_limit=30.0),
                         timed_out=True)
    assert longer == first  # a longer search replaces it
    assert cache.get(program, SearchConfig(time_limit=30.0), arch="cpu") is program
    _, _, complete = store(cache, program, best=fused(), config=SearchConfig(time_limit=1.0))
    assert complete == first  # a complete search replaces anything
    _, _, cut = store(cache, program, best=None, config=SearchConfig(time_limit=60.0),
                      timed_out=True)
    assert cut is None  # nothing cut short replaces a complete search


def test_an_entry_ranked_with_older_kernels_is_replaced_by_any_search(cache, monkeypatch):
    """Its measured ranking timed kernels the code generator no longer emits."""
    import mugraph.cache as cache_module

    program, _, first = store(cache, best=fused(), config=SearchConfig(time_limit=1.0))
    monkeypatch.setattr(cache_module, "CODEGEN_REVISION", cache_module.CODEGEN_REVISION + 1)
    _, _, cut = store(cache, program, best=None, config=SearchConfig(time_limit=5.0),
                      timed_out=True)
    assert cut == first
    assert json.loads(first.read_text())["codegen"] == cache_module.CODEGEN_REVISION
    _, _, again = store(cache, program, best=None, config=SearchConfig(time_limit=2.0),
                        timed_out=True)
    assert again is None  # the new entry is of this revision: the usual rule again


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
    with pytest.warns(UserWarning, match="stale or foreign entry"):
        assert cache.get(program, config, arch="cpu") is None


def rewrite(path, change):
    """Change an entry's fields with ``change(entry)`` and give it a matching checksum: an
    entry that is intact but wrong in what it says."""
    entry = json.loads(path.read_text())
    change(entry)
    entry["checksum"] = cache_mod._checksum(entry)
    path.write_text(json.dumps(entry))


def expect_ignored(cache, program, config, path, problem):
    """``get`` treats the entry as a miss, with one warning naming the file and the problem."""
    with pytest.warns(UserWarning) as caught:
        assert cache.get(program, config, arch="cpu") is None
    (warning,) = [w for w in caught if "mugraph cache" in str(w.message)]
    text = str(warning.message)
    assert f"ignoring the entry {path}: " in text and problem in text, text
    return text


def test_a_foreign_file_under_an_entry_name_is_ignored(cache):
    program, config, path = store(cache, best=fused())
    path.write_text(json.dumps({"format": 1, "hello": "world"}))
    expect_ignored(cache, program, config, path, "checksum mismatch")
    path.write_text(json.dumps(["a", "list"]))
    expect_ignored(cache, program, config, path, "foreign file: not a mugraph cache entry")
    path.write_bytes(b"\xff\xfe\x00garbage")
    expect_ignored(cache, program, config, path, "unreadable or truncated")


def test_the_entry_of_another_program_is_ignored(cache):
    other = naive(mugraph.float32)
    _, _, other_path = store(cache, program=other, best=None)
    program, config, path = store(cache, best=fused())
    path.write_bytes(other_path.read_bytes())  # intact, but another key's entry
    expect_ignored(cache, program, config, path, "stale or foreign entry")
    assert {e["valid"] for e in cache.entries()} == {True, False}


@pytest.mark.parametrize("change, problem", [
    (lambda e: e.update(search=[1, 2]), "the field 'search' must be an object"),
    (lambda e: e["search"].update(timed_out="no"), "the field 'search.timed_out' must be true"),
    (lambda e: e.update(improved="yes"), "the field 'improved' must be true or false"),
    (lambda e: e.update(best=5), "the field 'best' must be a μGraph document"),
    (lambda e: e.pop("created"), "the field 'created' is missing"),
    (lambda e: e.update(best=None), "'improved' and 'best' disagree"),
    (lambda e: e.update(program_hash="0" * 32), "'program_hash' is not the key's program hash"),
    (lambda e: e.update(best="{not a graph"), "the stored μGraph does not load or verify"),
])
def test_an_intact_entry_of_the_wrong_shape_is_ignored(cache, change, problem):
    program, config, path = store(cache, best=fused())
    rewrite(path, change)
    expect_ignored(cache, program, config, path, problem)
    (listed,) = cache.entries()  # ls reads what an entry says, it does not load its μGraph
    assert listed["valid"] is ("μGraph does not load" in problem)
    assert listed["valid"] or problem in listed["problem"]


def test_an_ignored_entry_is_replaced_by_the_next_result(cache):
    program, config, path = store(cache, best=fused())
    text = path.read_text()
    path.write_text(text[: len(text) // 3])
    expect_ignored(cache, program, config, path, "truncated")
    store(cache, program=program, best=fused())  # what a caller does after the miss
    assert cache.get(program, config, arch="cpu") == fused()
    assert [e["valid"] for e in cache.entries()] == [True]


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


# ---- concurrent processes on one cache ------------------------------------------------------

WORKER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import mugraph
    from mugraph.cache import ResultCache
    from mugraph.library import WORKLOADS
    from mugraph.search.config import SearchConfig

    folder, role, rounds, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    w = WORKLOADS["rmsnorm_linear"]
    program = w.naive(w.small, mugraph.float16)
    best = w.optimized(w.small, mugraph.float16)
    cache = ResultCache(folder)
    config = SearchConfig(time_limit=5.0)
    while not go.exists():  # start together
        time.sleep(0.005)
    for i in range(rounds):
        if role == "write":
            cache.put(program, config, best if i % 2 else None, None, arch="cpu")
        elif role == "clear":
            cache.clear()
        else:
            cache.entries()
    print("done", role)
    """
)


def start_workers(folder: Path, roles: list[str], rounds: int, go: Path) -> list:
    env = {**os.environ, "PYTHONPATH": str(Path(mugraph.__file__).parents[1])}
    return [
        subprocess.Popen([sys.executable, "-c", WORKER, str(folder), role, str(rounds), str(go)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for role in roles
    ]


def finish(workers) -> None:
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0 and out.startswith("done"), err


def test_concurrent_writers_of_one_key_leave_one_valid_entry(cache, tmp_path):
    """Three processes write the same key over and over while this one reads it: every read
    is a whole entry (or a miss before the first write), never a warning; one entry is left."""
    go = tmp_path / "go"
    workers = start_workers(cache.path, ["write"] * 3, 60, go)
    program, config = naive(), SearchConfig(time_limit=5.0)
    go.touch()
    reads = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning here is a half-written entry seen
        while any(w.poll() is None for w in workers):
            got = cache.get(program, config, arch="cpu")
            assert got is None or got is program or got == fused()
            reads += 1
    finish(workers)
    assert reads > 0
    names = sorted(p.name for p in cache.path.iterdir())
    assert len(names) == 1 and names[0].endswith(".json"), names  # no temporary files left
    (entry,) = cache.entries()
    assert entry["valid"] and cache.get(program, config, arch="cpu") is not None


def test_writers_listers_and_clear_in_parallel_processes(cache, tmp_path):
    """clear() and ls while others write: no process fails (clear leaves a write in progress
    alone), and the cache is whole afterwards."""
    go = tmp_path / "go"
    workers = start_workers(cache.path, ["write", "write", "clear", "list"], 150, go)
    go.touch()
    finish(workers)
    store(cache, best=fused())
    assert [e["valid"] for e in cache.entries()] == [True]
