"""`logger=tensorboard`: event files read back with TensorBoard's own reader hold every round's
scalars as the CSV logger wrote them, the config as text, the partition plot as an image; one
event dir per job of a sweep; a resumed run's rounds once each; a bad option refused."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest

# runs through the command line's main
pytestmark = pytest.mark.cli


def accumulator(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    kinds = ("scalars", "images", "tensors", "histograms")
    acc = EventAccumulator(str(log_dir), size_guidance=dict.fromkeys(kinds, 0))
    acc.Reload()
    return acc


def text(acc, tag: str) -> list[tuple[int, str]]:
    """(step, text) of every `add_text(tag, ...)`."""
    return [
        (e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(f"{tag}/text_summary")
    ]


def csv_rows(run_dir) -> list[dict]:
    with (run_dir / "metrics.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def same(stored: float, cell: str) -> bool:
    """TensorBoard's 32-bit scalar equals the CSV's value, as a 32-bit float."""
    expected = float(np.float32(float(cell)))
    return (math.isnan(stored) and math.isnan(expected)) or stored == expected


def test_every_round_the_config_and_the_partition_plot_are_in_the_event_files(cli_in_process):
    cli_in_process("debug=smoke", "logger=tensorboard", "hydra.run.dir=t")
    run_dir = cli_in_process.cwd / "t"
    events = list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1
    acc = accumulator(run_dir / "tensorboard")
    rows = csv_rows(run_dir)  # logger=tensorboard writes metrics.csv too, as logger=wandb does
    assert [int(r["round"]) for r in rows] == [1, 2]
    # every scalar the CSV has, under its name, and no other; `round` is the step
    assert set(acc.Tags()["scalars"]) == set(rows[0]) - {"round"}
    for name in acc.Tags()["scalars"]:
        logged = {e.step: e.value for e in acc.Scalars(name)}
        expected = {int(r["round"]): r[name] for r in rows if r[name] != ""}
        assert sorted(logged) == sorted(expected), name
        assert all(same(logged[step], cell) for step, cell in expected.items()), name
    # the config as text at step 0: the run's label and the resolved config
    [(step, config)] = text(acc, "config")
    assert step == 0 and "**fedavg debug=smoke s0**" in config
    assert "    rounds: 2\n" in config and "    objective: eval/val/global/acc\n" in config
    [(step, summary)] = text(acc, "summary")
    assert step == 2 and "- status: completed" in summary
    # the partition plot the run drew, as an image at step 0
    from PIL import Image

    [image] = acc.Images("partition/label_distribution")
    with Image.open(run_dir / "partition_labels.png") as png:
        assert (image.width, image.height) == png.size
    assert image.step == 0 and image.encoded_image_string.startswith(b"\x89PNG")
    # each evaluation's per-client accuracies, as W&B's histogram
    hists = acc.Histograms("eval/global/client_acc_hist")
    assert [h.step for h in hists] == [1, 2] and hists[0].histogram_value.num == 6


def test_each_job_of_a_sweep_has_its_own_event_dir(cli_in_process):
    cli_in_process(
        "debug=smoke", "logger=tensorboard", "seed=0,1", "hydra.sweep.dir=s", multirun=True
    )
    sweep = cli_in_process.cwd / "s"
    dirs = sorted(p.parent for p in sweep.rglob("events.out.tfevents.*"))
    assert dirs == [sweep / "0" / "tensorboard", sweep / "1" / "tensorboard"]
    heads = [text(accumulator(d), "config")[0][1].splitlines()[0] for d in dirs]
    group = " (group `fedavg debug=smoke digits shards`)"  # the seed told apart, not pooled
    assert heads == ["**fedavg s0**" + group, "**fedavg s1**" + group]
    losses = [[e.value for e in accumulator(d).Scalars("train/loss")] for d in dirs]
    assert all(len(loss) == 2 for loss in losses) and losses[0] != losses[1]


def test_a_resumed_run_logs_the_rounds_after_its_checkpoint_once(cli_in_process):
    overrides = ("debug=smoke", "rounds=3", "checkpoint_every=2", "logger=tensorboard")
    cli_in_process(*overrides, "hydra.run.dir=r")
    run_dir = cli_in_process.cwd / "r"
    (run_dir / "summary.json").unlink()  # killed after the checkpoint of round 2
    cli_in_process(f"resume={run_dir}")
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 2
    acc = accumulator(run_dir / "tensorboard")
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2, 3]
    rows = csv_rows(run_dir)
    assert [e.value for e in acc.Scalars("train/loss")] == [
        float(np.float32(float(r["train/loss"]))) for r in rows
    ]
    assert len(text(acc, "config")) == 1 and len(acc.Images("partition/label_distribution")) == 1


def test_an_unknown_option_is_one_line_and_exit_2_before_training(cli_in_process):
    proc = cli_in_process(
        "debug=smoke",
        "logger=tensorboard",
        "logger.tensorboard.flush_secs=5",
        "hydra.run.dir=x",
        check=False,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedexp: error: logger.tensorboard.flush_secs")
    assert not (cli_in_process.cwd / "x").exists()  # nothing trained, nothing written
