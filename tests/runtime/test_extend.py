"""A run that extends: `python -m fedexp resume=<run dir> rounds=N` continues a completed or
interrupted run to round N and ends exactly where a run of N rounds from the start ends; what
depends on the total number of rounds is refused in one line, the run dir left as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from conftest import main_in_process
from fedexp.config.extend import check_extension
from fedexp.core.types import ConfigError
from fedexp.runtime.checkpoint import CHECKPOINT_FILE
from fedexp.runtime.run_dir import LOCK_FILE
from saved_runs import same, saved_models

# a checkpoint at every other round: a completed 2-round run ends with one of its last round
BASE = ("eval_every=1", "checkpoint_every=2")
# the summary's values that depend on wall time, or on the run having been resumed
WALL = ("timing", "resumed_from_round")


def summary_values(summary: dict) -> dict:
    """The summary without what depends on wall time (timing, time/* metrics) or on the resume;
    the config without its paths (the run dirs differ)."""
    out = {k: v for k, v in summary.items() if k not in WALL}
    out["metrics"] = {k: v for k, v in summary["metrics"].items() if not k.startswith("time/")}
    out["config"] = {k: v for k, v in summary["config"].items() if k != "paths"}
    return out


def save_hydra_config(cfg, run_dir: Path, overrides=("debug=smoke",)) -> None:
    """What Hydra writes into a run dir, and what `resume=` reads back."""
    (run_dir / ".hydra").mkdir(parents=True, exist_ok=True)
    (run_dir / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    (run_dir / ".hydra" / "overrides.yaml").write_text(OmegaConf.to_yaml(list(overrides)))


def read(run_dir: Path, name: str = "summary.json") -> dict:
    return json.loads((run_dir / name).read_text())


def assert_same_run(lifecycle, run_dir: Path, ref_dir: Path) -> None:
    got, ref = read(run_dir), read(ref_dir)
    assert got["status"] == "completed" and got["rounds_completed"] == ref["rounds_completed"]
    assert lifecycle.final(got) == lifecycle.final(ref)
    assert got["client_acc"] == ref["client_acc"]
    assert summary_values(got) == summary_values(ref)
    assert lifecycle.rows(run_dir) == lifecycle.rows(ref_dir)
    assert same(saved_models(run_dir), saved_models(ref_dir))


@pytest.mark.parametrize("algorithm", ["fedavg", "fedrep", "scaffold", "frl", "waffle"])
def test_a_completed_run_extended_matches_a_run_of_that_many_rounds(
    compose_cfg, lifecycle, tmp_path, monkeypatch, capsys, algorithm
):
    ref_dir, run_dir = tmp_path / "reference", tmp_path / "extended"
    lifecycle.run(compose_cfg(*BASE, "rounds=4", f"algorithm={algorithm}"), ref_dir)
    short = compose_cfg(*BASE, "rounds=2", f"algorithm={algorithm}")
    save_hydra_config(short, run_dir)
    assert lifecycle.run(short, run_dir)["status"] == "completed"
    code, err = main_in_process(monkeypatch, capsys, f"resume={run_dir}", "rounds=4")
    assert code == 0, err
    assert_same_run(lifecycle, run_dir, ref_dir)
    assert read(run_dir)["resumed_from_round"] == 2
    # the run dir says 4 rounds now: the config a later resume reads, its command line
    assert OmegaConf.load(run_dir / ".hydra" / "config.yaml").rounds == 4
    assert OmegaConf.load(run_dir / ".hydra" / "overrides.yaml")[-1] == "rounds=4"
    code, err = main_in_process(monkeypatch, capsys, f"resume={run_dir}")
    assert code == 2 and "already completed all its rounds (4)" in err


def test_rounds_after_the_last_checkpoint_run_again(
    compose_cfg, lifecycle, tmp_path, monkeypatch, capsys
):
    # 3 rounds, a checkpoint at round 2: extended to 5, round 3 is run (and logged) again
    ref_dir, run_dir = tmp_path / "reference", tmp_path / "extended"
    lifecycle.run(compose_cfg(*BASE, "rounds=5"), ref_dir)
    short = compose_cfg(*BASE, "rounds=3")
    save_hydra_config(short, run_dir)
    lifecycle.run(short, run_dir)
    assert torch.load(run_dir / CHECKPOINT_FILE, weights_only=True)["round"] == 2
    code, err = main_in_process(monkeypatch, capsys, f"resume={run_dir}", "rounds=5")
    assert code == 0, err
    assert_same_run(lifecycle, run_dir, ref_dir)
    assert [r["round"] for r in lifecycle.rows(run_dir)] == [1, 2, 3, 4, 5]


def test_the_old_last_rounds_evaluation_is_all_that_differs(
    compose_cfg, lifecycle, tmp_path, monkeypatch, capsys
):
    # eval_every=2: a run of 3 rounds evaluates rounds 2 and 3 (its last), one of 5 rounds 2, 4, 5
    sizes = ("eval_every=2", "checkpoint_every=3")
    ref_dir, run_dir = tmp_path / "reference", tmp_path / "extended"
    ref = lifecycle.run(compose_cfg(*sizes, "rounds=5"), ref_dir)
    short = compose_cfg(*sizes, "rounds=3")
    save_hydra_config(short, run_dir)
    lifecycle.run(short, run_dir)
    code, err = main_in_process(monkeypatch, capsys, f"resume={run_dir}", "rounds=5")
    assert code == 0, err
    assert lifecycle.final(read(run_dir)) == lifecycle.final(ref)
    assert same(saved_models(run_dir), saved_models(ref_dir))
    rows, ref_rows = lifecycle.rows(run_dir), lifecycle.rows(ref_dir)
    assert "eval/global/acc" in rows[2] and "eval/global/acc" not in ref_rows[2]
    assert {k: v for k, v in rows[2].items() if k in ref_rows[2]} == ref_rows[2]
    assert rows[:2] + rows[3:] == ref_rows[:2] + ref_rows[3:]


def test_an_interrupted_run_extends_and_an_extension_stopped_early_resumes(
    compose_cfg, lifecycle, tmp_path, monkeypatch, capsys
):
    ref_dir, run_dir = tmp_path / "reference", tmp_path / "extended"
    lifecycle.run(compose_cfg(*BASE, "rounds=6"), ref_dir)
    short = compose_cfg(*BASE, "rounds=2")
    save_hydra_config(short, run_dir)
    lifecycle.run(short, run_dir, callbacks=[lifecycle.SignalAfter(1)])  # stopped in round 1
    assert read(run_dir)["status"] == "interrupted"
    # extended to 4 and stopped in round 3; the run dir says 4 rounds from the start of it
    extended = compose_cfg(*BASE, "rounds=4")
    lifecycle.run(extended, run_dir, resume=True, callbacks=[lifecycle.SignalAfter(3)])
    assert read(run_dir)["status"] == "interrupted"
    assert OmegaConf.load(run_dir / ".hydra" / "config.yaml").rounds == 4
    code, err = main_in_process(monkeypatch, capsys, f"resume={run_dir}", "rounds=6")
    assert code == 0, err
    assert_same_run(lifecycle, run_dir, ref_dir)


def test_an_extension_killed_before_its_first_checkpoint_resumes_to_its_new_total(
    compose_cfg, lifecycle, tmp_path, monkeypatch, capsys
):
    from fedexp.config.saved import save_rounds

    ref_dir, run_dir = tmp_path / "reference", tmp_path / "extended"
    lifecycle.run(compose_cfg(*BASE, "rounds=4"), ref_dir)
    short = compose_cfg(*BASE, "rounds=2")
    save_hydra_config(short, run_dir)
    lifecycle.run(short, run_dir)
    # what `resume=... rounds=4` killed in round 3 leaves: the 2-round run's summary and
    # checkpoint, the run dir's config of 4 rounds
    save_rounds(run_dir, 4)
    code, err = main_in_process(monkeypatch, capsys, f"resume={run_dir}")
    assert code == 0, err
    assert_same_run(lifecycle, run_dir, ref_dir)


def test_a_sweeps_report_shows_the_extended_runs_total(cli_in_process):
    from fedexp.report import find_runs, group_runs
    from fedexp.report.tables import final_table

    sweep = cli_in_process.cwd / "sweep"
    cli_in_process(*BASE, "debug=smoke", "seed=0,1", f"hydra.sweep.dir={sweep}", multirun=True)
    cli_in_process(f"resume={sweep / '0'}", "rounds=4")
    groups, keys = group_runs(find_runs([sweep]))
    assert keys == ["rounds"] and sorted(groups) == ["rounds=2", "rounds=4"]
    assert [r.summary.rounds_completed for r in groups["rounds=4"]] == [4]
    row = next(line for line in final_table(groups).splitlines() if "rounds=4" in line)
    assert row.split("|")[3].strip() == "4"


def prepare(compose_cfg, lifecycle, run_dir: Path, how: str, *overrides: str) -> None:
    """A run dir of 2 rounds, completed or interrupted after round 1; `killed`: of 3 rounds,
    killed in round 3 (its summary gone, its checkpoint of round 2 there)."""
    cfg = compose_cfg(*BASE, "rounds=3" if how == "killed" else "rounds=2", *overrides)
    save_hydra_config(cfg, run_dir)
    if how == "interrupted":
        lifecycle.run(cfg, run_dir, callbacks=[lifecycle.SignalAfter(1)])
    else:
        lifecycle.run(cfg, run_dir)
    if how == "killed":
        (run_dir / "summary.json").unlink()


# the waffle option annealed over the whole run, as a user might write it
ANNEALED = ("algorithm=waffle", "algorithm.tau_final=0.1", "algorithm.tau_anneal_rounds=${rounds}")
LATE_ATTACK = ("attack._target_=length_attack.AttackFromRound", "+attack.start_fraction=0.5")


@pytest.mark.parametrize(
    ("how", "overrides", "args", "expected"),
    [
        ("completed", (), ("rounds=2",), "rounds: the run has done 2 rounds; rounds=2 does not"),
        ("completed", (), ("rounds=1",), "rounds=1 does not extend it (give more than 2)"),
        ("interrupted", (), ("rounds=1",), "rounds: the run has done 1 rounds; rounds=1 does"),
        ("killed", (), ("rounds=2",), "rounds: the run has done 2 rounds; rounds=2 does not"),
        ("completed", (), ("rounds=4.5",), "rounds: a whole number of rounds >= 1, got '4.5'"),
        ("completed", (), ("rounds=4", "client.lr=1"), "client.lr: a resumed run keeps its"),
        (
            "completed",
            ANNEALED,
            ("rounds=4",),
            "rounds: extending this run from 2 to 4 rounds changes "
            "algorithm.tau_anneal_rounds=${rounds} (2 at 2 rounds, 4 at 4): start a new run",
        ),
        (
            "completed",
            LATE_ATTACK,
            ("rounds=4",),
            "rounds: extending this run from 2 to 4 rounds changes attack.start_fraction=0.5 "
            "(its first round is a share of the total): start a new run",
        ),
    ],
)
def test_an_extension_that_cannot_be_exact_is_one_line_and_leaves_the_run_dir_alone(
    compose_cfg, lifecycle, tmp_path, monkeypatch, capsys, how, overrides, args, expected
):
    run_dir = tmp_path / "run"
    prepare(compose_cfg, lifecycle, run_dir, how, *overrides)
    before = {p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    code, err = main_in_process(monkeypatch, capsys, f"resume={run_dir}", *args)
    assert code == 2
    assert err.startswith("fedexp: error: ") and err.count("\n") == 1 and expected in err, err
    after = {
        p.relative_to(run_dir): p.read_bytes()
        for p in run_dir.rglob("*")
        if p.is_file() and p.name not in ("__main__.log", LOCK_FILE)
    }
    assert after == {k: v for k, v in before.items() if k.name != LOCK_FILE}


def test_a_script_extending_a_run_is_checked_alike(compose_cfg, lifecycle, tmp_path):
    # Experiment(cfg, run_dir, resume=True) with a larger cfg.rounds: the declared hooks too
    run_dir = tmp_path / "run"
    lifecycle.run(compose_cfg(*BASE, "rounds=2", *LATE_ATTACK), run_dir)
    with pytest.raises(ConfigError, match="changes attack.start_fraction=0.5"):
        lifecycle.run(compose_cfg(*BASE, "rounds=4", *LATE_ATTACK), run_dir, resume=True)


def test_the_same_total_is_no_extension(compose_cfg):
    cfg = compose_cfg(*LATE_ATTACK)
    check_extension(cfg, None)  # a checkpoint that does not record its total
    check_extension(cfg, int(cfg.rounds))  # a plain resume
    with pytest.raises(ConfigError, match="from 3 to 2 rounds changes attack.start_fraction"):
        check_extension(cfg, 3)
