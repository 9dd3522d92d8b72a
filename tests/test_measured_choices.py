"""Choices measured on a GPU kept on disk (``mugraph.cache.MeasurementCache``): a later
process takes the tiling, the faster answer and the mugraph-or-PyTorch decision an earlier
one timed on the same GPU, without timing again, and still verifies and checks what it runs.
No GPU here: a fake architecture and timers stand in, as in ``test_shape_class``."""

from __future__ import annotations

import json
import os

import pytest
import torch

import mugraph.integration as mgi
from mugraph import cache as cache_module
from mugraph.cache import MeasurementCache, ResultCache
from mugraph.integration import dynamo
from tests.test_integration import GatedMLP, assert_close, run_compiled, spy_on_inductor
from tests.test_shape_class import _compiled_projection, _fake_gpu

WHAT = {"program": "abc", "inputs": [[[4, 4], None, "float16"]]}


@pytest.fixture(autouse=True)
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("MUGRAPH_CACHE_DIR", str(tmp_path / "default-cache"))
    torch._dynamo.reset()
    mgi.clear_reports()
    yield
    torch._dynamo.reset()


# ---- the store --------------------------------------------------------------------------------


def test_a_measured_choice_round_trips_under_its_kind_and_what(tmp_path):
    store = MeasurementCache(tmp_path)
    assert store.get("tiling", WHAT) is None
    store.put("tiling", WHAT, {"tiling": {"grid": [["i", 4]]}})
    assert store.get("tiling", WHAT) == {"tiling": {"grid": [["i", 4]]}}
    assert store.get("partition", WHAT) is None  # another kind
    assert store.get("tiling", {**WHAT, "program": "abd"}) is None  # another program
    assert store.count() == 1


def test_another_gpu_or_version_measures_again(tmp_path, monkeypatch):
    store = MeasurementCache(tmp_path)
    store.put("tiling", WHAT, {"x": 1})
    here = cache_module.measuring_environment()
    for field, other in [("device", "NVIDIA H200"), ("triton", "0.0"), ("codegen", -1)]:
        monkeypatch.setattr(cache_module, "measuring_environment",
                            lambda f=field, o=other: {**here, f: o})
        assert store.get("tiling", WHAT) is None, field


def _entry_file(store: MeasurementCache):
    (path,) = store.path.glob("*.json")
    return path


@pytest.mark.parametrize("damage", ["truncated", "corrupted", "foreign", "renamed", "no value"])
def test_a_damaged_measured_choice_is_reported_and_ignored(tmp_path, damage):
    store = MeasurementCache(tmp_path)
    store.put("tiling", WHAT, {"x": 1})
    path = _entry_file(store)
    text = path.read_text()
    if damage == "truncated":
        path.write_text(text[: len(text) // 2])
    elif damage == "corrupted":
        path.write_text(text.replace('"x": 1', '"x": 2'))
    elif damage == "foreign":
        path.write_text(json.dumps({"format": 99, "something": "else"}))
    elif damage == "no value":
        entry = json.loads(text)
        entry["value"] = [1]
        entry["checksum"] = cache_module._checksum(entry)
        path.write_text(json.dumps(entry))
    else:  # a whole entry of another key, under this key's name
        store.put("tiling", {**WHAT, "program": "other"}, {"x": 3})
        other = next(p for p in store.path.glob("*.json") if p != path)
        os.replace(other, path)
    with pytest.warns(UserWarning, match="ignoring the measured choice"):
        assert store.get("tiling", WHAT) is None
    store.put("tiling", WHAT, {"x": 4})  # measured again, stored over it
    assert store.get("tiling", WHAT) == {"x": 4}


def test_clearing_the_result_cache_clears_the_measured_choices(tmp_path):
    results = ResultCache(tmp_path)
    results.measurements.put("tiling", WHAT, {"x": 1})
    results.measurements.put("partition", WHAT, {"mugraph_ms": 1.0, "pytorch_ms": 2.0})
    assert results.clear() == 2 and results.measurements.count() == 0


def test_an_unwritable_folder_warns_and_keeps_the_choice_in_the_process(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    store = MeasurementCache(blocker / "measured")
    with pytest.warns(UserWarning, match="could not store a measured choice"):
        assert store.put("tiling", WHAT, {"x": 1}) is None


# ---- the backend's choices --------------------------------------------------------------------


def _new_process(monkeypatch) -> None:
    """What a new process starts without: the in-process records of tilings and answers."""
    monkeypatch.setattr(dynamo, "_FASTER", {})
    monkeypatch.setattr(dynamo, "_TILED", {})
    torch._dynamo.reset()
    mgi.clear_reports()


def test_a_later_process_takes_the_tiling_timed_before_without_timing(monkeypatch, tmp_path):
    """The first compilation times the tilings (and the two answers) on the fake GPU and
    stores its choices; a second, in a fresh process state on the same cache, times nothing,
    runs the same tiling, and says the choices came from an earlier process."""
    timed = _fake_gpu(monkeypatch, lambda count: 1000.0 - count)
    first = _compiled_projection(512, 256, 16, tmp_path)
    assert len(timed) > 2 and not first.stored
    count = len(timed)
    _new_process(monkeypatch)
    again = _compiled_projection(512, 256, 16, tmp_path)
    assert len(timed) == count, "nothing is timed again"
    assert again.runs_on == "mugraph" and again.tiling == first.tiling, again.line()
    assert set(again.stored) == {"tiling", "answers_ms"}
    assert "measured by an earlier process: " in again.line()


def test_a_stored_tiling_that_is_no_longer_among_the_tilings_is_timed_again(
        monkeypatch, tmp_path):
    timed = _fake_gpu(monkeypatch, lambda count: 1000.0 - count)
    first = _compiled_projection(512, 256, 16, tmp_path)
    store = ResultCache(tmp_path).measurements
    for path in store.path.glob("*.json"):
        entry = json.loads(path.read_text())
        if entry["key"]["kind"] == "tiling":  # a grid no tiler makes: the record is off
            entry["value"]["tiling"]["grid"] = [["nowhere", 3]]
            entry["checksum"] = cache_module._checksum(entry)
            path.write_text(json.dumps(entry))
    count = len(timed)
    _new_process(monkeypatch)
    again = _compiled_projection(512, 256, 16, tmp_path)
    assert len(timed) > count and "tiling" not in again.stored
    assert again.tiling["grid"] == first.tiling["grid"]


def test_without_the_cache_nothing_is_stored_or_reused(monkeypatch, tmp_path):
    timed = _fake_gpu(monkeypatch, lambda count: 1000.0 - count)
    model_part = _compiled_projection(512, 256, 16, tmp_path)
    assert model_part.runs_on == "mugraph"
    assert ResultCache(tmp_path).measurements.count() > 0
    # cache off (options.cache False): _measurements gives nothing to store in
    options = dynamo.BackendOptions.parse({"cache": False})
    assert dynamo._measurements(options) is None
    assert timed


@pytest.mark.parametrize("faster", ["mugraph", "eager"])
def test_a_later_process_takes_the_partition_decision_timed_before(
        monkeypatch, tmp_path, faster):
    """rest="inductor" on a (fake) GPU: the first compilation times each partition against
    its PyTorch nodes and stores the times; a later one reuses them (nothing timed), decides
    the same way, and still compares what mugraph runs with PyTorch on its own inputs."""
    calls = []

    def timer(fn):
        fn()
        calls.append(fn)
        return {"mugraph": [1.0, 2.0, 3.0], "eager": [2.0, 1.0]}[faster][(len(calls) - 1) % (
            3 if faster == "mugraph" else 2)]

    spy_on_inductor(monkeypatch, timer)
    options = {"time_limit": 0, "run_unimproved": True, "elementwise": "mugraph",
               "rest": "inductor", "cache_dir": str(tmp_path)}
    model = GatedMLP().eval()
    x = torch.randn(2, 4, 16)
    got, want = run_compiled(model, x, **options)
    assert_close(got, want)
    first = [(p.runs_on, dict(p.measured)) for r in mgi.reports() for p in r.partitions]
    assert first and calls
    count = len(calls)
    checked = []
    real_check = dynamo.MugraphPartition.check_against_pytorch

    def spy_check(self, raw, adapted):
        checked.append(self)
        return real_check(self, raw, adapted)

    monkeypatch.setattr(dynamo.MugraphPartition, "check_against_pytorch", spy_check)
    _new_process(monkeypatch)
    got, want = run_compiled(model, x, **options)
    assert_close(got, want)
    parts = [p for r in mgi.reports() for p in r.partitions]
    assert len(calls) == count, "nothing is timed again"
    assert [(p.runs_on, dict(p.measured)) for p in parts] == first
    assert all("partition" in p.stored for p in parts)
    assert len(checked) == (len(parts) if faster == "mugraph" else 0)


def test_a_capture_checked_by_an_earlier_process_is_not_checked_again(monkeypatch, tmp_path):
    """The numeric check of a capture against its PyTorch nodes (float64, real sizes: seconds
    for a language model's head) is kept when it passes; a later process with the same
    PyTorch and mugraph skips it. A failed check is never kept."""
    checks = []
    real = dynamo.check_capture

    def counting(captured, fallback, seed=0):
        checks.append(captured.graph.structural_hash())
        return real(captured, fallback, seed)

    monkeypatch.setattr(dynamo, "check_capture", counting)
    monkeypatch.setattr(dynamo, "_CHECKED", {})
    options = {"time_limit": 0, "run_unimproved": True, "elementwise": "mugraph",
               "cache_dir": str(tmp_path)}
    model = GatedMLP().eval()
    x = torch.randn(2, 4, 16)
    assert_close(*run_compiled(model, x, **options))
    count = len(checks)
    assert count > 0
    monkeypatch.setattr(dynamo, "_CHECKED", {})
    _new_process(monkeypatch)
    assert_close(*run_compiled(model, x, **options))
    assert len(checks) == count
    # with the cache off, the check runs again
    monkeypatch.setattr(dynamo, "_CHECKED", {})
    _new_process(monkeypatch)
    assert_close(*run_compiled(model, x, **{**options, "cache": False}))
    assert len(checks) == 2 * count


def test_a_stored_tiling_whose_kernel_computes_wrongly_now_is_timed_again(monkeypatch, tmp_path):
    """A stored choice names a tiling, not a kernel: its kernel is checked against the
    reference semantics (``runs_right``) with the stored launch setting before it runs. One
    that now computes wrongly (another Triton, a changed GPU driver) is not used: the
    tilings are timed again and another is kept."""
    from mugraph.codegen.launch import LaunchConfig

    timed: list = []
    rejected: list = []

    class Timer:
        def __init__(self, wrong: set):
            self.wrong = wrong

        def __call__(self, graph):
            timed.append(graph)
            return 1000.0 - len(timed)

        def runs_right(self, graph):
            key = graph.structural_hash()
            if key in self.wrong:
                rejected.append((key, dict(getattr(graph, "launch_settings", {}) or {})))
                return "CodegenMismatchError: output 0 disagrees"
            return None

        def launch_settings(self, graph):
            return (next(i for i, op in enumerate(graph.ops) if op.kind.name == "CUSTOMIZED"),
                    LaunchConfig(8, 3), 0.5)

    wrong: set = set()
    monkeypatch.setattr(dynamo, "_arch", lambda captured: "sm_90")
    monkeypatch.setattr(dynamo, "_tiling_timer", lambda program: Timer(wrong))
    monkeypatch.setattr(dynamo, "_FASTER", {})
    monkeypatch.setattr(dynamo, "_TILED", {})
    first = _compiled_projection(512, 256, 16, tmp_path)
    assert first.runs_on == "mugraph" and first.tiling["launch"] == [8, 3, 0.5]
    kept = [entry[0] for entry in dynamo._TILED.values() if entry[0] is not None]
    wrong.update(g.structural_hash() for g in kept)  # their kernels now compute wrongly
    count = len(timed)
    _new_process(monkeypatch)
    again = _compiled_projection(512, 256, 16, tmp_path)
    assert "tiling" not in again.stored and len(timed) > count
    # the stored tiling was checked with its stored launch setting before it was refused
    assert rejected and rejected[0][1] and rejected[0][0] in wrong
    now = [entry[0] for entry in dynamo._TILED.values() if entry[0] is not None]
    assert again.runs_on == "mugraph" and now
    assert not {g.structural_hash() for g in now} & wrong  # other tilings run now
