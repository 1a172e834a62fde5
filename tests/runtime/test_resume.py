"""Exact resume: a run stopped (SIGTERM, or killed) and resumed ends exactly where an
uninterrupted run with the same seed ends."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from components import wandb_options
from conftest import main_in_process
from fedexp.core.types import ConfigError
from fedexp.loggers.files import CSVLogger
from fedexp.runtime.checkpoint import CHECKPOINT_FILE, save_checkpoint
from fedexp.runtime.run_dir import LOCK_FILE
from saved_runs import same, saved_models

REPO = Path(__file__).resolve().parents[2]
# FedDF distils every round (seconds a round at smoke size): its resume in the slow tier
ALGORITHMS = [
    pytest.param(a, marks=pytest.mark.slow) if a == "feddf" else a
    for a in sorted(p.stem for p in (REPO / "conf" / "algorithm").glob("[!_]*.yaml"))
]
BASE = ("rounds=3", "eval_every=1", "checkpoint_every=0")
# a run stopped after round 1 of 2: its resumed round still trains clients of round 1 (the
# sample of seed 0: clients 0, 1, 2, then 0, 2, 4) from the restored server state and store
SHORT = ("rounds=2", "eval_every=1", "checkpoint_every=0")


def reference(compose_cfg, lifecycle, tmp_path, *overrides, base=SHORT):
    cfg = compose_cfg(*base, *overrides)
    summary = lifecycle.run(cfg, tmp_path / "reference")
    return cfg, summary


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_sigterm_then_resume_matches_an_uninterrupted_run(
    compose_cfg, lifecycle, tmp_path, algorithm
):
    # every algorithm YAML is covered: server state and client store are all a resume restores
    try:
        cfg, ref = reference(compose_cfg, lifecycle, tmp_path, f"algorithm={algorithm}")
    except ConfigError as err:
        pytest.skip(f"{algorithm} needs more than debug=smoke on digits: {err}")
    run_dir = tmp_path / "stopped"
    stopped = lifecycle.run(cfg, run_dir, callbacks=[lifecycle.SignalAfter(1)])
    assert stopped["status"] == "interrupted" and stopped["stop_signal"] == "SIGTERM"
    assert stopped["rounds_completed"] == 1 and stopped["checkpoint_round"] == 1
    resumed = lifecycle.run(cfg, run_dir, resume=True)
    assert resumed["status"] == "completed" and resumed["resumed_from_round"] == 1
    assert lifecycle.final(resumed) == lifecycle.final(ref)
    assert resumed["client_acc"] == ref["client_acc"]
    assert lifecycle.rows(run_dir) == lifecycle.rows(tmp_path / "reference")
    assert same(saved_models(run_dir), saved_models(tmp_path / "reference"))


def test_resume_from_a_periodic_checkpoint_drops_rounds_logged_after_it(
    compose_cfg, lifecycle, tmp_path
):
    # what a kill after round 3 leaves: a checkpoint of round 2, rows 1..3, no summary
    cfg = compose_cfg(*BASE, "checkpoint_every=2")
    run_dir = tmp_path / "reference"
    ref = lifecycle.run(cfg, run_dir, loggers=[CSVLogger(run_dir)])
    payload = torch.load(run_dir / CHECKPOINT_FILE, weights_only=True)
    assert payload["round"] == 2 and ref["checkpoint_round"] == 2
    rows = lifecycle.rows(run_dir)
    (run_dir / "summary.json").unlink()
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write('{"round": 4, "train/lo')  # a line half-written when the process died
    resumed = lifecycle.run(cfg, run_dir, resume=True, loggers=[CSVLogger(run_dir)])
    assert [r["round"] for r in lifecycle.rows(run_dir)] == [1, 2, 3]
    assert lifecycle.rows(run_dir) == rows
    assert lifecycle.final(resumed) == lifecycle.final(ref)
    csv_rounds = [line.split(",")[0] for line in (run_dir / "metrics.csv").read_text().splitlines()]
    assert csv_rounds == ["round", "1", "2", "3"]


def test_a_checkpoint_of_another_config_is_refused(compose_cfg, lifecycle, tmp_path):
    cfg, _ = reference(compose_cfg, lifecycle, tmp_path, "checkpoint_every=2", base=BASE)
    other = compose_cfg(*BASE, "checkpoint_every=2", "client.lr=0.1")
    with pytest.raises(ConfigError, match="config hash mismatch") as err:
        lifecycle.run(other, tmp_path / "reference", resume=True)
    assert "\n" not in str(err.value)
    assert "client.lr is 0.1 now, 0.05 in the checkpoint" in str(err.value)


def test_a_resume_under_another_data_dir_is_refused(compose_cfg, lifecycle, tmp_path, monkeypatch):
    # .hydra/config.yaml keeps ${oc.env:FEDEXP_DATA_DIR,...}: it resolves anew in a resume
    cfg = compose_cfg(*BASE)
    run_dir = tmp_path / "run"
    lifecycle.run(cfg, run_dir, callbacks=[lifecycle.SignalAfter(1)])
    monkeypatch.setenv("FEDEXP_DATA_DIR", str(tmp_path / "other-data"))
    with pytest.raises(ConfigError, match="config hash mismatch: paths.data_root is") as err:
        lifecycle.run(cfg, run_dir, resume=True)
    assert str(tmp_path / "other-data") in str(err.value) and "\n" not in str(err.value)


def test_a_resume_on_other_data_is_refused(compose_cfg, lifecycle, tmp_path):
    # same config, other data (a file rewritten in place): the checkpoint's data digest differs
    cfg = compose_cfg(*BASE)
    run_dir = tmp_path / "run"
    lifecycle.run(cfg, run_dir, callbacks=[lifecycle.SignalAfter(1)])
    path = run_dir / CHECKPOINT_FILE
    payload = torch.load(path, weights_only=True)
    assert len(payload["data_digest"]) == 40
    payload["data_digest"] = "0" * 40
    save_checkpoint(path, {k: v for k, v in payload.items() if k != "checksum"})  # resealed
    rows = lifecycle.rows(run_dir)
    with pytest.raises(ConfigError, match="resume: the data differs from the data the checkpoint"):
        lifecycle.run(cfg, run_dir, resume=True)
    assert lifecycle.rows(run_dir) == rows  # refused before anything is written


def test_the_wandb_run_id_survives_a_resume(compose_cfg, lifecycle, tmp_path, monkeypatch):
    from fedexp.loggers.wandb_logger import WandbLogger

    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = compose_cfg(*BASE)
    run_dir = tmp_path / "w"
    first = WandbLogger(run_dir, **wandb_options(mode="offline"))
    lifecycle.run(cfg, run_dir, callbacks=[lifecycle.SignalAfter(1)], loggers=[first])
    saved = torch.load(run_dir / CHECKPOINT_FILE, weights_only=True)["loggers"]
    run_id = saved["WandbLogger"]["run_id"]
    second = WandbLogger(run_dir, **wandb_options(mode="offline"))
    lifecycle.run(cfg, run_dir, resume=True, loggers=[second])
    assert second.resume_id == run_id
    runs = sorted(p.name for p in (run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(name.endswith(run_id) for name in runs)


def save_hydra_config(cfg, run_dir: Path) -> None:
    """What Hydra writes into every run dir, and what `resume=` reads back."""
    (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
    (run_dir / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))


def cli_main(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    """`python -m fedexp args...` in this process: (exit code, stderr)."""
    return main_in_process(monkeypatch, capsys, *args)


def test_resume_on_the_command_line_continues_the_run_in_place(
    compose_cfg, lifecycle, tmp_path, monkeypatch, capsys
):
    cfg, ref = reference(compose_cfg, lifecycle, tmp_path)
    run_dir = tmp_path / "stopped"
    save_hydra_config(cfg, run_dir)
    lifecycle.run(cfg, run_dir, callbacks=[lifecycle.SignalAfter(1, signal.SIGINT)])
    # device= is allowed with resume= (the run was `device=auto`; `executor.device` repeats it)
    code, err = cli_main(monkeypatch, capsys, f"resume={run_dir}", "device=cpu")
    assert code == 0, err
    resumed = json.loads((run_dir / "summary.json").read_text())
    assert resumed["status"] == "completed" and resumed["resumed_from_round"] == 1
    assert lifecycle.final(resumed) == lifecycle.final(ref)
    assert lifecycle.rows(run_dir) == lifecycle.rows(tmp_path / "reference")


# the `_target_`s of a run dir saved before engine/ and runtime/ existed (executor=auto under
# debug=smoke); their modules stay as re-exports of the new ones for a release
ENGINE = "fedexp.engine.executors"
PRE_MOVE_TARGETS = {
    f"{ENGINE}.select.auto_executor": "fedexp.core.executors.auto_executor",
    f"{ENGINE}.sequential.SequentialExecutor": "fedexp.core.executors.SequentialExecutor",
    f"{ENGINE}.vectorized.VectorizedExecutor": "fedexp.core.vectorized.VectorizedExecutor",
    "fedexp.runtime.run_dir.RunDirGuard": "fedexp.core.run_dir.RunDirGuard",
}


@pytest.mark.parametrize("executor", ["auto", "sequential", "vectorized"])
def test_a_run_dir_saved_before_the_move_resumes(
    compose_cfg, lifecycle, tmp_path, monkeypatch, capsys, executor
):
    cfg, ref = reference(compose_cfg, lifecycle, tmp_path, f"executor={executor}")
    run_dir = tmp_path / "stopped"
    text = OmegaConf.to_yaml(cfg)
    old = [new for new in PRE_MOVE_TARGETS if f"_target_: {new}" in text]
    assert len(old) == 1  # the executor's target, written as an old path
    for new, before in PRE_MOVE_TARGETS.items():
        text = text.replace(f"_target_: {new}", f"_target_: {before}")
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text(text)
    # the run itself built its executor from the old path, and checkpointed that config
    old_cfg = OmegaConf.create(text)
    lifecycle.run(old_cfg, run_dir, callbacks=[lifecycle.SignalAfter(1, signal.SIGINT)])
    code, err = cli_main(monkeypatch, capsys, f"resume={run_dir}")
    assert code == 0, err
    assert PRE_MOVE_TARGETS[old[0]] in (run_dir / ".hydra" / "config.yaml").read_text()
    resumed = json.loads((run_dir / "summary.json").read_text())
    assert resumed["status"] == "completed" and resumed["resumed_from_round"] == 1
    assert lifecycle.final(resumed) == lifecycle.final(ref)


@pytest.mark.parametrize(
    ("prepare", "args", "expected"),
    [
        ("nothing", (), "is not a run dir (no .hydra/config.yaml)"),
        ("no_checkpoint", (), "has no checkpoint.pt"),
        ("completed", (), "already completed all its rounds"),
        ("corrupt", (), "is not a readable checkpoint"),
        ("stopped", ("client.lr=1",), "client.lr: a resumed run keeps its config"),
    ],
)
def test_a_bad_resume_is_one_line_and_leaves_the_run_dir_alone(
    compose_cfg, lifecycle, tmp_path, monkeypatch, capsys, prepare, args, expected
):
    cfg = compose_cfg(*BASE)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if prepare != "nothing":
        save_hydra_config(cfg, run_dir)
    if prepare in ("completed", "corrupt", "stopped"):
        lifecycle.run(cfg, run_dir, callbacks=[lifecycle.SignalAfter(1)])
    if prepare == "completed":
        (run_dir / "summary.json").write_text(json.dumps({"status": "completed"}))
    if prepare == "corrupt":
        data = (run_dir / CHECKPOINT_FILE).read_bytes()
        (run_dir / CHECKPOINT_FILE).write_bytes(data[: len(data) // 2])
    before = {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()}
    code, err = cli_main(monkeypatch, capsys, f"resume={run_dir}", *args)
    assert code == 2
    assert err.startswith("fedexp: error: ") and err.count("\n") == 1 and expected in err
    after = {
        p.name: p.stat().st_mtime_ns
        for p in run_dir.iterdir()
        if p.name not in ("__main__.log", LOCK_FILE)  # the lock is taken before the log is opened
    }
    assert after == before  # nothing removed, nothing rewritten


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_gives_the_same_final_metrics(cli, lifecycle):
    import os
    import subprocess
    import time

    overrides = ["debug=smoke", "rounds=8", "eval_every=1", "checkpoint_every=3", "seed=3"]
    one_thread = {"OMP_NUM_THREADS": "1"}  # same thread count in all three processes
    cli(*overrides, "hydra.run.dir=ref", env=one_thread)
    env = dict(os.environ, WANDB_MODE="offline", FEDEXP_CACHE_DIR=str(cli.cwd / "cache"))
    env.update(one_thread)
    env["PYTHONPATH"] = os.pathsep.join([str(lifecycle.repo / "src"), str(lifecycle.tests_dir)])
    slow = ["attack._target_=slow_attack.SleepEachRound", "+attack.seconds=0.4"]
    args = [sys.executable, "-m", "fedexp", *overrides, *slow, "hydra.run.dir=killed"]
    proc = subprocess.Popen(args, cwd=cli.cwd, env=env, stdout=subprocess.DEVNULL)
    run_dir = cli.cwd / "killed"
    deadline = time.monotonic() + 300
    # kill after the round-3 checkpoint and at least one more logged round
    while time.monotonic() < deadline and proc.poll() is None:
        log = run_dir / "metrics.jsonl"
        rows = log.read_text().splitlines() if log.exists() else []
        if (run_dir / CHECKPOINT_FILE).exists() and len(rows) >= 4:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (run_dir / "summary.json").exists()
    resumed = subprocess.run(
        [sys.executable, "-m", "fedexp", f"resume={run_dir}"],
        cwd=cli.cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr
    ref, got = (json.loads((cli.cwd / d / "summary.json").read_text()) for d in ("ref", "killed"))
    assert got["status"] == "completed" and got["resumed_from_round"] in (3, 6)
    assert lifecycle.final(got) == lifecycle.final(ref)
    assert got["client_acc"] == ref["client_acc"]
    assert lifecycle.rows(run_dir) == lifecycle.rows(cli.cwd / "ref")


@pytest.mark.parametrize(
    ("algorithm", "added"),
    [("fedhenn", ("align_layer",)), ("frl", ("round_lr_decay", "local_lr_schedule"))],
)
def test_a_run_dir_saved_before_an_option_was_added_resumes(
    compose_cfg, lifecycle, tmp_path, monkeypatch, capsys, algorithm, added
):
    from fedexp.runtime.fingerprint import config_hash

    cfg, ref = reference(compose_cfg, lifecycle, tmp_path, f"algorithm={algorithm}")
    run_dir = tmp_path / "stopped"
    lifecycle.run(cfg, run_dir, callbacks=[lifecycle.SignalAfter(1, signal.SIGINT)])
    # the run dir as a version without the options saved it: their keys absent
    old = OmegaConf.create(OmegaConf.to_container(cfg))
    for key in added:
        del old.algorithm[key]
    assert config_hash(old) == config_hash(cfg)  # at their old behaviour, they hash as absent
    changed = OmegaConf.create(OmegaConf.to_container(cfg))
    changed.algorithm[added[0]] = "output" if algorithm == "fedhenn" else 0.9
    assert config_hash(changed) != config_hash(cfg)  # another value is another config
    (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
    (run_dir / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(old))
    code, err = cli_main(monkeypatch, capsys, f"resume={run_dir}")
    assert code == 0, err
    resumed = json.loads((run_dir / "summary.json").read_text())
    assert resumed["status"] == "completed" and resumed["resumed_from_round"] == 1
    assert lifecycle.final(resumed) == lifecycle.final(ref)


@pytest.mark.parametrize(("local_epochs", "refused"), [(1, True), (2, False)])
def test_a_fedrep_checkpoint_of_the_old_head_rule_resumes_only_where_it_trains_alike(
    compose_cfg, lifecycle, tmp_path, monkeypatch, capsys, local_epochs, refused
):
    # checkpoints saved before FedRep recorded its phase epochs: head_epochs: auto was then
    # E − body_epochs, 0 at E = 1 (the head gets 1 now), the same as now at E = 2
    cfg = compose_cfg(*SHORT, "algorithm=fedrep", f"client.local_epochs={local_epochs}")
    run_dir = tmp_path / "stopped"
    save_hydra_config(cfg, run_dir)
    lifecycle.run(cfg, run_dir, callbacks=[lifecycle.SignalAfter(1, signal.SIGINT)])
    path = run_dir / CHECKPOINT_FILE
    payload = torch.load(path, weights_only=True)
    del payload["server"]["buffers"]["phase_epochs"]
    save_checkpoint(path, {k: v for k, v in payload.items() if k != "checksum"})  # resealed
    code, err = cli_main(monkeypatch, capsys, f"resume={run_dir}")
    if refused:
        assert code == 2 and "trained 0 head + 1 body epochs" in err and len(err.splitlines()) == 1
    else:
        assert code == 0, err
