"""The search's work units on Ray (issue 16): a local Ray with 2 workers finds what the local
pool finds, and a Ray worker killed mid-search loses no unit. Ray is a real local cluster
here (``pip install mugraph[cluster]``; the dev extras install it, so CI runs these)."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

import mugraph as mi
from mugraph.search.driver import superoptimize

ray = pytest.importorskip("ray")

SMALL = {"max_custom_kernels": 1, "max_block_ops": 5}


def tiny_rmsnorm_linear():
    g = mi.new_kernel_graph()
    x = g.new_input((4, 64), dtype=mi.float32)
    w = g.new_input((64, 32), dtype=mi.float32)
    g.mark_output(g.matmul(g.rms_norm(x, 64), w))
    return g


def hashes(result):
    return [c.hash for c in result.candidates]


@pytest.fixture(scope="module")
def local_ray():
    started = not ray.is_initialized()
    if started:
        root = str(Path(__file__).resolve().parents[1])
        paths = [root, *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(paths)}},
        )
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def pool_result():
    result = superoptimize(tiny_rmsnorm_linear(), time_limit=120, workers=2, **SMALL)
    assert not result.timed_out and result.candidates
    return result


def test_ray_with_two_workers_finds_what_the_local_pool_finds(local_ray, pool_result):
    result = superoptimize(tiny_rmsnorm_linear(), time_limit=120, workers=2, engine="ray", **SMALL)
    assert result.engine == "ray, 2 workers"
    assert not result.timed_out and result.units_done == result.units_total
    assert hashes(result) == hashes(pool_result)
    assert result.stats.states == pool_result.stats.states
    assert "search complete" in result.summary()


def _ray_task_pids() -> list[int]:
    """Ray worker processes running a batch of the search (Ray names an actor's process after
    its class and the method it runs)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if command.startswith(b"ray::SearchWorker.run"):
            pids.append(int(entry.name))
    return pids


def test_a_ray_worker_killed_mid_search_loses_no_unit(local_ray, pool_result):
    killed: list[int] = []

    def kill_one():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not killed:
            pids = _ray_task_pids()
            if pids:
                time.sleep(0.2)  # let it get into its batch
                os.kill(pids[0], signal.SIGKILL)
                killed.append(pids[0])
            time.sleep(0.05)

    thread = threading.Thread(target=kill_one)
    thread.start()
    result = superoptimize(tiny_rmsnorm_linear(), time_limit=120, workers=2, engine="ray", **SMALL)
    thread.join()
    assert killed
    assert result.units_done == result.units_total and not result.failed_items
    assert hashes(result) == hashes(pool_result)


def test_cli_cluster_option_runs_the_search_on_ray(local_ray, tmp_path, capsys):
    from mugraph.cli import main

    program = tmp_path / "tiny.py"
    program.write_text(
        "import mugraph as mi\n\n"
        "def program():\n"
        "    g = mi.new_kernel_graph()\n"
        "    x = g.new_input((4, 64), dtype=mi.float32)\n"
        "    w = g.new_input((64, 32), dtype=mi.float32)\n"
        "    g.mark_output(g.matmul(g.rms_norm(x, 64), w))\n"
        "    return g\n"
    )
    code = main(["optimize", str(program), "--cluster", "--workers", "2", "--time-limit", "60",
                 "--max-block-ops", "4", "--max-custom-kernels", "1", "--no-progress",
                 "--out", str(tmp_path / "out")])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "2 Ray workers on a local Ray" in out and "search complete" in out
    assert (tmp_path / "out" / "best.json").exists()


def test_a_search_stopped_on_ray_resumes_on_the_local_pool(local_ray, pool_result, tmp_path):
    """Checkpoints behave as with the local pool: what Ray finished before the search stopped
    (here: at its target cost) is journalled, and any engine picks the search up from there."""
    checkpoint = tmp_path / "search.ckpt"
    program = tiny_rmsnorm_linear()
    target = pool_result.candidates[0].cost
    first = superoptimize(
        program, time_limit=120, workers=2, engine="ray", checkpoint=checkpoint,
        target_cost=target, **SMALL,
    )  # fmt: skip
    assert first.reached_target and first.units_done < first.units_total
    second = superoptimize(program, time_limit=120, workers=2, checkpoint=checkpoint, **SMALL)
    assert second.resumed_units == first.units_done
    assert second.units_done == second.units_total
    assert hashes(second) == hashes(pool_result)


def _loaded_workers(setup, prepare: bool = False) -> list[tuple[int, int]]:
    """(pid, rounds held) of each worker of a Ray engine of 2 workers once all have loaded
    ``setup`` (with ``prepare``, its program side first, as ``superoptimize`` sends it while
    it builds the oracle); the engine is closed (its workers stay for the next one)."""
    from mugraph.search.cluster import RayEngine

    engine = RayEngine(workers=2)
    engine.start()
    if prepare:
        engine.prepare(setup.program_side())
    engine.launch(setup)
    try:
        engine.ready()
        deadline = time.monotonic() + 60
        while engine.free() < 2 and time.monotonic() < deadline:
            assert engine.wait(0.5) == []  # answers to the setup: no outcome
        return sorted((slot.pid, slot.rounds) for slot in engine._crew.slots)
    finally:
        engine.close()
        shutil.rmtree(setup.memo_dir, ignore_errors=True)


def test_ray_workers_load_the_setup_with_its_rounds_and_stay_for_the_next_search(local_ray):
    """The worker actors are asked for when the search joins Ray; each draws the program's
    verification rounds when it loads the setup (before it takes work), and the next search of
    this process finds the same worker processes."""
    from mugraph.search.config import default_config
    from mugraph.search.driver import _search_setup, default_cost

    program = tiny_rmsnorm_linear()
    config = default_config(program).with_overrides(workers=2, **SMALL)

    class TwoWorkers:
        slots = 2

        @staticmethod
        def threads():
            return 1

    first = _loaded_workers(_search_setup(program, config, None, TwoWorkers, default_cost))
    assert len({pid for pid, _ in first}) == 2
    assert all(rounds == config.verify_rounds > 0 for _, rounds in first)
    second = _loaded_workers(_search_setup(program, config, None, TwoWorkers, default_cost))
    assert second == first
    # the program side first: the workers hold the rounds it had them draw
    third = _loaded_workers(_search_setup(program, config, None, TwoWorkers, default_cost),
                            prepare=True)  # fmt: skip
    assert third == first
    result = superoptimize(program, time_limit=120, workers=2, engine="ray", **SMALL)
    assert any("2 workers loaded the search" in line for line in result.log)


def test_a_search_that_finds_the_ray_workers_in_use_gets_its_own(local_ray):
    from mugraph.search import cluster

    kept = cluster._Crew.acquire(ray, 1)
    try:
        private = cluster._Crew.acquire(ray, 1)
        assert private is not kept and not private.shared
        private.release()
        assert private.slots == []  # its actors were ended
    finally:
        kept.release()
    assert cluster._Crew.acquire(ray, 1) is kept
    kept.release()


def test_workers_on_the_drivers_machine_read_the_hunger_flag_in_shared_memory(local_ray):
    from mugraph.search.cluster import _HungerFlag

    flag = _HungerFlag(ray)
    try:
        assert flag.actor is None  # one node: no actor to ask
        hungry = flag.link.reader()
        assert hungry() is False
        flag.set(True)
        assert hungry() is True
        flag.set(False)
        assert hungry() is False
    finally:
        flag.close()
    assert not os.path.exists(flag.path)


def test_a_local_ray_is_started_with_mugraph_on_pythonpath_then_it_is_restored(monkeypatch):
    """A local Ray's processes inherit PYTHONPATH from this one while it starts (so Ray can use
    the workers it starts in advance: no job-level runtime_env); the variable is restored."""
    from mugraph.search.cluster import _mugraph_on_path

    root = str(Path(__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    with _mugraph_on_path(True):
        assert os.environ["PYTHONPATH"].split(os.pathsep) == [root, "/elsewhere"]
    assert os.environ["PYTHONPATH"] == "/elsewhere"
    monkeypatch.delenv("PYTHONPATH")
    with _mugraph_on_path(True):
        assert os.environ["PYTHONPATH"] == root
    assert "PYTHONPATH" not in os.environ
    with _mugraph_on_path(False):
        assert "PYTHONPATH" not in os.environ
