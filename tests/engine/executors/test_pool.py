"""executor=auto over the machine's cores (`PoolExecutor`): how many processes it takes, the
sequential executor's results bit for bit, and a stopped, killed or locked run as in one process.

The test session sets OMP_NUM_THREADS=1 (conftest), so `auto` stays in one process elsewhere;
these tests ask for the processes (`executor.workers=2`) or clear it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fedexp.core.types import ConfigError
from fedexp.engine.executors import select
from fedexp.engine.executors.pool import PoolExecutor
from fedexp.run import Experiment
from fedexp.runtime import threads
from fedexp.runtime.checkpoint import CHECKPOINT_FILE
from saved_runs import same, saved_models

SHORT = ("rounds=2", "eval_every=1", "checkpoint_every=0")
POOL = ("executor.workers=2",)


@pytest.fixture
def cores(monkeypatch):
    """`cores(n)`: the machine as `executor=auto` sees it, n cores and no OMP_NUM_THREADS."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("RANK", raising=False)

    def set_cores(n: int) -> None:
        monkeypatch.setattr(threads, "available_cores", lambda: n)

    return set_cores


def test_auto_takes_min_of_cores_and_cohort_processes(cores, monkeypatch):
    cores(16)
    assert select.cpu_workers("auto", "cpu", "auto", 10)[0] == 10
    assert select.cpu_workers("auto", "cpu", "auto", 40) == (
        16,
        "16 cores available, 40 clients a round",
    )
    assert select.cpu_workers("auto", "cpu", 4, 40)[0] == 4  # threads=4: 16 // 4 processes
    assert select.cpu_workers("auto", "cpu", "auto", 1)[0] == 1  # a cohort of one
    assert select.cpu_workers(3, "cpu", "auto", 40)[0] == 3
    assert select.cpu_workers(3, "cpu", "auto", 2)[0] == 2
    assert select.cpu_workers("auto", "cuda", "auto", 40) == (1, "training on CUDA")
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # a parallel sweep's share of the cores
    assert select.cpu_workers("auto", "cpu", "auto", 40) == (
        4,
        "4 cores OMP_NUM_THREADS, 40 clients a round",
    )
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # a sweep that fills the cores: one process
    assert select.cpu_workers("auto", "cpu", "auto", 40)[0] == 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    cores(1)
    assert select.cpu_workers("auto", "cpu", "auto", 40)[0] == 1
    monkeypatch.setenv("RANK", "0")
    cores(16)
    assert select.cpu_workers("auto", "cpu", "auto", 40) == (1, "a torchrun rank")
    for bad in (0, -1, "two", True, 1.5):
        with pytest.raises(ConfigError, match="^executor.workers: must be auto or an integer"):
            select.cpu_workers(bad, "cpu", "auto", 40)


@pytest.mark.experiment
def test_auto_on_two_cores_runs_two_processes_with_one_thread_each(compose_cfg, cores, tmp_path):
    cores(2)
    exp = Experiment(compose_cfg(*SHORT), tmp_path / "run")
    assert isinstance(exp.executor.inner, PoolExecutor) and exp.executor.workers == 2
    assert exp.threads == 1
    cores(1)
    one = Experiment(compose_cfg(*SHORT), tmp_path / "one")
    assert one.executor.workers == 1 and not isinstance(one.executor.inner, PoolExecutor)


@pytest.mark.experiment
def test_a_run_whose_processes_fill_the_cores_draws_the_partition_plot_after_its_rounds(
    compose_cfg, lifecycle, cores, monkeypatch, tmp_path
):
    from fedexp.run import lifecycle as run_lifecycle

    real, asked = run_lifecycle.start_partition_stats, []

    def start(data, run_dir, title, background):
        asked.append(background)
        return real(data, run_dir, title, background)

    monkeypatch.setattr(run_lifecycle, "start_partition_stats", start)
    for n in (2, 3):  # the pool of two on two cores: none spare; on three: one
        cores(n)
        run_dir = tmp_path / f"cores{n}"
        summary = lifecycle.run(compose_cfg(*SHORT, "clients_per_round=2"), run_dir)
        assert summary["metrics"]["runtime/processes"] == 2
        assert (run_dir / "partition_labels.png").read_bytes()[:4] == b"\x89PNG"
    assert asked == ["end", True]


def final_state(cfg, run_dir: Path):
    exp = Experiment(cfg, run_dir)
    orch = exp.orchestrator()
    try:
        metrics = orch.run()
    finally:
        close = getattr(exp.executor, "close", None)
        if close is not None:
            close()
    store = exp.store.state_dict()
    return orch.state, {k: v for k, v in metrics.items() if not k.startswith("time/")}, store


# every kind of client half: a global model, client state in the store (SCAFFOLD's control
# variates, FedRep's heads, Ditto's personal models), FedHeNN's representations, WAFFLe's
# Concrete samples, FRL's rankings, q-FFL's starting loss, FedProto's prototypes
SLOW = {"ditto", "qffl", "fedproto"}  # the slow tier's (`pytest -m slow`)
ALGORITHMS = [
    pytest.param(a, marks=pytest.mark.slow) if a in SLOW else a
    for a in (
        "fedavg",
        "scaffold",
        "fedrep",
        "ditto",
        "fedhenn",
        "waffle",
        "frl",
        "qffl",
        "fedproto",
    )
]


@pytest.mark.experiment
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_the_pool_trains_as_the_sequential_executor_bit_for_bit(compose_cfg, tmp_path, algorithm):
    base = (*SHORT, f"algorithm={algorithm}", "clients_per_round=4")
    seq_state, seq_metrics, seq_store = final_state(
        compose_cfg(*base, "executor=sequential"), tmp_path / "seq"
    )
    pool_state, pool_metrics, pool_store = final_state(compose_cfg(*base, *POOL), tmp_path / "pool")
    assert pool_metrics == seq_metrics
    assert same(pool_state.params, seq_state.params)
    assert same(pool_store, seq_store)  # the clients' state came back from the worker


@pytest.mark.experiment
def test_the_workers_start_before_the_first_round_is_timed(compose_cfg, tmp_path):
    exp = Experiment(compose_cfg("rounds=1", "checkpoint_every=0", *POOL), tmp_path / "run")
    orch, pool = exp.orchestrator(), exp.executor.inner
    alive = []

    def run_round(state, t):  # what the round finds when its time starts
        alive.append([proc.is_alive() for proc in pool._procs])
        return timed_round(state, t)

    timed_round, orch.run_round = orch.run_round, run_round
    try:
        orch.run()
    finally:
        exp.executor.close()
    assert alive == [[True]]  # forked by the run's start-up: the fork is not round 1's time


@pytest.mark.experiment
def test_messages_larger_than_the_pipe_go_both_ways_without_a_deadlock(compose_cfg, tmp_path):
    # an MLP of 600 x 600 on digits: 0.4 M parameters, a 1.6 MB payload to each client and an
    # upload as large back, both while the other side may be sending (a socket pipe holds
    # some 200 kB); SCAFFOLD sends its control variates both ways too
    base = (*SHORT, "algorithm=scaffold", "clients_per_round=6", "model.hidden=[600,600]")
    seq_state, seq_metrics, _ = final_state(
        compose_cfg(*base, "executor=sequential"), tmp_path / "s"
    )
    with deadline(120):  # a deadlock fails the test instead of hanging the suite
        pool_state, pool_metrics, _ = final_state(compose_cfg(*base, *POOL), tmp_path / "pool")
    assert pool_metrics == seq_metrics
    assert same(pool_state.params, seq_state.params)


@pytest.mark.experiment
def test_a_round_is_one_message_to_each_worker_with_a_shared_payload_pickled_once(
    compose_cfg, tmp_path, monkeypatch
):
    from fedexp.engine.executors import pool

    frames = []

    def recording(conn, pieces):  # the run's process's round messages
        frames.append(sum(p.nbytes for p in pieces))
        pool_write(conn, pieces)

    pool_write = pool.write_frame
    monkeypatch.setattr(pool, "write_frame", recording)
    # FedAvg sends the cohort one Weights: an MLP of 64-200-200-10, 0.2 MB
    cfg = compose_cfg(*SHORT, "num_clients=12", "clients_per_round=12", *POOL)
    exp = Experiment(cfg, tmp_path / "pool")
    orch = exp.orchestrator()
    try:
        orch.run()
        assert exp.executor.inner.last_round_shared is True
    finally:
        exp.executor.close()
    leaves = torch.utils._pytree.tree_leaves(orch.state.params)
    model_bytes = sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))
    assert len(frames) == 2  # one message a round to the one worker, nothing else
    assert all(model_bytes < size < 1.2 * model_bytes for size in frames)  # 12 clients, 1 model


def test_a_round_goes_whole_to_every_worker_unless_that_moves_far_more_than_shards():
    from fedexp.engine.executors.pool import SHARED_LIMIT, broadcast

    mb = 2**20
    asked = []

    def fixed(total):  # what fixed shards would move, noted when asked
        return lambda: asked.append(total) or total

    assert broadcast(1 * mb, 15, fixed(0)) and asked == []  # 15 MB in all: under the limit
    assert broadcast(SHARED_LIMIT // 2, 2, fixed(0)) and asked == []  # the limit itself
    # a 44 MB model the cohort shares (FedAvg, ResNet-18), 15 workers: shards move it 15 times too
    assert broadcast(44 * mb, 15, fixed(15 * 44 * mb)) and asked == [15 * 44 * mb]
    # and 20 clients' own 44 MB entries (Ditto): 924 MB to each of 15 workers (13.9 GB) against
    # the model to each and each entry once (1.5 GB): shards
    assert not broadcast(21 * 44 * mb, 15, fixed((15 + 20) * 44 * mb))
    assert broadcast(4 * mb, 30, fixed(60 * mb))  # 120 MB, twice the shards' 60 MB: still whole
    assert not broadcast(4 * mb, 31, fixed(60 * mb))


def slow_worker(monkeypatch, seconds: float) -> list[int]:
    """Each worker sleeps `seconds` before each client (patched before the fork, so the
    workers inherit it); the returned list gets how many clients each worker's round sent."""
    from fedexp.engine.executors import pool

    parent, counts = os.getpid(), []
    train = pool.SequentialExecutor.run

    def run(self, *args, **kwargs):
        if os.getpid() != parent:
            time.sleep(seconds)
        return train(self, *args, **kwargs)

    def receive(self, w, conn):  # the run's process, a worker's round's results
        results, left = real_receive(self, w, conn)
        counts.append(len(results))
        return results, left

    real_receive = pool.PoolExecutor._receive
    monkeypatch.setattr(pool.SequentialExecutor, "run", run)
    monkeypatch.setattr(pool.PoolExecutor, "_receive", receive)
    return counts


@pytest.mark.experiment
def test_a_slower_worker_claims_fewer_clients_and_the_results_stay_the_same(
    compose_cfg, tmp_path, monkeypatch
):
    base = (*SHORT, "num_clients=12", "clients_per_round=12")
    seq_state, seq_metrics, _ = final_state(
        compose_cfg(*base, "executor=sequential"), tmp_path / "s"
    )
    counts = slow_worker(monkeypatch, 0.5)
    pool_state, pool_metrics, _ = final_state(compose_cfg(*base, *POOL), tmp_path / "pool")
    assert pool_metrics == seq_metrics and same(pool_state.params, seq_state.params)
    assert len(counts) == 2  # a round's results came back once a round
    assert all(1 <= n <= 3 for n in counts)  # of 12: the run's process claimed the rest


@pytest.mark.experiment
def test_above_the_shared_limit_each_process_trains_a_fixed_shard_with_the_same_results(
    compose_cfg, tmp_path, monkeypatch
):
    from fedexp.engine.executors import pool

    base = (*SHORT, "algorithm=scaffold", "num_clients=12", "clients_per_round=12")
    seq_state, seq_metrics, seq_store = final_state(
        compose_cfg(*base, "executor=sequential"), tmp_path / "s"
    )
    monkeypatch.setattr(pool, "SHARED_LIMIT", 0)  # every round over both: fixed shards
    monkeypatch.setattr(pool, "SHARED_OVER_FIXED", 0.0)
    counts = slow_worker(monkeypatch, 0.1)  # a shard is kept however slow its process
    exp = Experiment(compose_cfg(*base, *POOL), tmp_path / "pool")
    orch = exp.orchestrator()
    try:
        metrics = orch.run()
        assert exp.executor.inner.last_round_shared is False
    finally:
        exp.executor.close()
    assert {k: v for k, v in metrics.items() if not k.startswith("time/")} == seq_metrics
    assert same(orch.state.params, seq_state.params)
    assert same(exp.store.state_dict(), seq_store)  # the entries went out and came back
    assert counts == [6, 6]  # near-equal expected steps: half the clients each, both rounds


@pytest.mark.experiment
@pytest.mark.parametrize("space", [64 * 2**20, 1024])
def test_a_workers_results_come_back_through_shared_memory_or_the_pipe_the_same(
    compose_cfg, tmp_path, monkeypatch, space
):
    from fedexp.engine.executors import pool

    base = (*SHORT, "algorithm=scaffold", "num_clients=12", "clients_per_round=12")
    seq_state, seq_metrics, seq_store = final_state(
        compose_cfg(*base, "executor=sequential"), tmp_path / "s"
    )
    ways = []

    def receive(conn):  # the run's process: "in space", or the results themselves
        message = real_receive(conn)
        ways.append(message[0])
        return message

    real_receive = pool.receive
    monkeypatch.setattr(pool, "RESULT_SPACE", space)  # 1 kB: no round's results fit
    monkeypatch.setattr(pool, "receive", receive)
    pool_state, pool_metrics, pool_store = final_state(compose_cfg(*base, *POOL), tmp_path / "p")
    assert pool_metrics == seq_metrics and same(pool_state.params, seq_state.params)
    assert same(pool_store, seq_store)  # the control variates the clients left came back
    assert ways == (["in space"] * 2 if space > 1024 else ["end"] * 2)


def failing_worker(monkeypatch, fail) -> None:
    """Each worker calls `fail()` in place of training its first client (patched before the
    fork, so the workers inherit it); the run's process trains as usual."""
    from fedexp.engine.executors import pool

    parent, train = os.getpid(), pool.SequentialExecutor.run

    def run(self, *args, **kwargs):
        if os.getpid() != parent:
            fail()
        return train(self, *args, **kwargs)

    monkeypatch.setattr(pool.SequentialExecutor, "run", run)


def boom():
    raise RuntimeError("boom")


@pytest.mark.experiment
@pytest.mark.parametrize(
    ("fail", "said"),
    [(boom, "worker process 1 failed: RuntimeError: boom"), (lambda: os._exit(3), "died")],
)
def test_a_worker_that_raises_or_dies_mid_round_stops_the_run_with_one_error(
    compose_cfg, tmp_path, monkeypatch, fail, said
):
    from fedexp.engine.executors.pool import WorkerFailed

    failing_worker(monkeypatch, fail)
    exp = Experiment(compose_cfg(*SHORT, "num_clients=12", "clients_per_round=12", *POOL), tmp_path)
    pool = exp.executor.inner
    with deadline(120), pytest.raises(WorkerFailed, match=said):  # not a hang
        exp.orchestrator().run()
    assert pool._procs == [] and pool._bound is None  # the pool was closed: workers stopped


@contextlib.contextmanager
def deadline(seconds: int):
    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.experiment
def test_a_stopped_pool_run_resumes_as_an_uninterrupted_one(compose_cfg, lifecycle, tmp_path):
    cfg = compose_cfg("rounds=3", "eval_every=1", "checkpoint_every=0", "algorithm=scaffold", *POOL)
    ref = lifecycle.run(cfg, tmp_path / "reference")
    assert ref["metrics"]["runtime/processes"] == 2
    run_dir = tmp_path / "stopped"
    stopped = lifecycle.run(cfg, run_dir, callbacks=[lifecycle.SignalAfter(1)])
    assert stopped["status"] == "interrupted" and stopped["checkpoint_round"] == 1
    resumed = lifecycle.run(cfg, run_dir, resume=True)
    assert resumed["status"] == "completed" and resumed["resumed_from_round"] == 1
    assert lifecycle.final(resumed) == lifecycle.final(ref)
    assert lifecycle.rows(run_dir) == lifecycle.rows(tmp_path / "reference")
    assert same(saved_models(run_dir), saved_models(tmp_path / "reference"))


def children(pid: int) -> set[int]:
    """The run's worker processes: its children forked from it (the same command line)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    found = set()
    for child in path.read_text().split() if path.exists() else ():
        try:
            # its forks are the workers and, at the start, the process drawing the partition
            if cmdline(int(child)) == cmdline(pid) and comm(int(child)) != "partition-plot":
                found.add(int(child))
        except FileNotFoundError:
            continue
    return found


def cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def alive(pid: int) -> bool:
    """Whether any thread of the process still runs: a killed process's leader turns zombie
    while its other threads exit, and its files (the run dir's lock) close with the last."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return False
    for task in tasks:
        try:
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, IndexError):
            continue
        if state not in ("Z", "X"):
            return True
    return False


def start_pool_run(tmp_path, lifecycle, run_dir: str, *overrides: str, **popen):
    """`python -m fedexp` of a pool run whose rounds each sleep 0.4 s, in a process of its own."""
    env = dict(os.environ, WANDB_MODE="offline", FEDEXP_CACHE_DIR=str(tmp_path / "cache"))
    env["FEDEXP_DATA_DIR"] = str(tmp_path / "data")
    env["PYTHONPATH"] = os.pathsep.join([str(lifecycle.repo / "src"), str(lifecycle.tests_dir)])
    slow = ["attack._target_=slow_attack.SleepEachRound", "+attack.seconds=0.4"]
    args = [sys.executable, "-m", "fedexp", *overrides, *slow, f"hydra.run.dir={run_dir}"]
    return subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, **popen)


def wait_for(proc, run_dir: Path, rows: int, checkpoint: bool = False) -> set[int]:
    """Wait until the run has logged `rows` rounds (and written a checkpoint); its workers."""
    workers: set[int] = set()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        workers = children(proc.pid)  # the workers live through the run
        log = run_dir / "metrics.jsonl"
        logged = len(log.read_text().splitlines()) if log.exists() else 0
        if workers and logged >= rows and (run_dir / CHECKPOINT_FILE).exists() >= checkpoint:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be stopped"
    return workers


def gone(workers: set[int]) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(w) for w in workers):
        time.sleep(0.05)
    return not any(alive(w) for w in workers)


def resumed_as_uninterrupted(cfg, lifecycle, run_dir: Path, monkeypatch, capsys) -> dict:
    """`python -m fedexp resume=<run_dir>` (in this process) completes the run, its final
    metrics and every row those of an uninterrupted run of `cfg`; its summary."""
    from conftest import main_in_process

    code, err = main_in_process(monkeypatch, capsys, f"resume={run_dir}")
    assert code == 0, err
    ref = lifecycle.run(cfg, run_dir.parent / "ref")
    got = json.loads((run_dir / "summary.json").read_text())
    assert got["status"] == "completed"
    assert lifecycle.final(got) == lifecycle.final(ref)
    assert lifecycle.rows(run_dir) == lifecycle.rows(run_dir.parent / "ref")
    return got


KILLED = ("debug=smoke", "rounds=12", "eval_every=1", "checkpoint_every=2", *POOL)


@pytest.mark.cli
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")
def test_a_killed_pool_run_takes_its_workers_and_lock_with_it(
    compose_cfg, lifecycle, tmp_path, monkeypatch, capsys
):
    from conftest import main_in_process

    monkeypatch.chdir(tmp_path)
    proc = start_pool_run(tmp_path, lifecycle, "killed", *KILLED)
    run_dir = tmp_path / "killed"
    wait_for(proc, run_dir, rows=1)
    # the run dir is locked while the run goes on
    code, err = main_in_process(monkeypatch, capsys, "debug=smoke", "hydra.run.dir=killed")
    assert code == 2 and "another fedexp process" in err
    workers = wait_for(proc, run_dir, rows=3, checkpoint=True)  # past the round-2 checkpoint
    assert len(workers) == 1 and all(alive(w) for w in workers)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert gone(workers)  # the worker died with the run, and let go of the lock
    got = resumed_as_uninterrupted(compose_cfg(*KILLED), lifecycle, run_dir, monkeypatch, capsys)
    assert got["resumed_from_round"] in (2, 4, 6, 8, 10)


STOPPED = ("debug=smoke", "rounds=4", "eval_every=1", "checkpoint_every=0", *POOL)


@pytest.mark.cli
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")
def test_sigterm_stops_a_pool_run_after_its_round_and_resume_finishes_it(
    compose_cfg, lifecycle, tmp_path, monkeypatch, capsys
):

    monkeypatch.chdir(tmp_path)
    # a process group of its own, signalled as a terminal signals its foreground job: every
    # process of it, the worker too
    proc = start_pool_run(tmp_path, lifecycle, "stopped", *STOPPED, start_new_session=True)
    run_dir = tmp_path / "stopped"
    workers = wait_for(proc, run_dir, rows=1)
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    assert gone(workers)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["stop_signal"] == "SIGTERM"
    assert 1 <= summary["rounds_completed"] < 4
    assert summary["checkpoint_round"] == summary["rounds_completed"]
    resumed_as_uninterrupted(compose_cfg(*STOPPED), lifecycle, run_dir, monkeypatch, capsys)


def test_an_unknown_worker_count_is_one_line(compose_cfg, tmp_path):
    with pytest.raises(ConfigError, match="^executor.workers: must be auto or an integer >= 1"):
        Experiment(compose_cfg("executor.workers=0"), tmp_path)
