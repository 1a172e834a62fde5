"""A sweep over two keys as one table (`python -m fedexp.report <dir> --grid aggregator,attack
--baseline attack=none`), on hand-made sweep dirs whose cells are checked by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedexp.report import find_runs, main
from fedexp.report.grid import Grid, grid_table
from fedexp.sweep import SweepSummary, print_grid


def make_job(
    root: Path, num: int, aggregator: str, attack: str, seed: int, acc, asr=None, **kw
) -> Path:
    """One job dir of a multirun as fedexp writes it: summary.json, metrics.jsonl and Hydra's
    overrides.yaml (the swept values as typed)."""
    job = root / str(num)
    (job / ".hydra").mkdir(parents=True)
    typed = [f"aggregator={aggregator}", f"attack={attack}", f"seed={seed}"]
    typed += [f"{k}={v}" for k, v in kw.get("typed", {}).items()]
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {t}\n" for t in typed))
    metrics = {"round": 3, "eval/global/acc": acc}
    if asr is not None:
        metrics["attack/backdoor_asr"] = asr
    (job / "metrics.jsonl").write_text(json.dumps(metrics) + "\n")
    config = {"seed": seed, "attack": {"fraction": 0.0 if attack == "none" else 0.2}}
    config["client"] = {"lr": kw.get("typed", {}).get("client.lr", 0.05)}
    summary = {
        "status": kw.get("status", "completed"),
        "rounds_completed": 3,
        "metrics": metrics,
        "choices": {"aggregator": aggregator, "attack": attack, "algorithm": "fedavg"},
        "config": config,
    }
    (job / "summary.json").write_text(json.dumps(summary))
    return job


# (aggregator, attack) -> final accuracy of seeds 0 and 1 (and the backdoor's success rates)
ACC = {
    ("mean", "none"): (0.8, 0.9),
    ("mean", "sign_flip"): (0.1, 0.3),
    ("mean", "backdoor"): (0.84, 0.86),
    ("median", "none"): (0.7, 0.7),
    ("median", "sign_flip"): (0.6, 0.8),
    ("median", "backdoor"): (0.5, 0.6),
}
ASR = {("mean", "backdoor"): (0.9, 1.0), ("median", "backdoor"): (0.2, 0.2)}


def make_sweep(root: Path) -> Path:
    """12 jobs in a sweep's order (attack outermost, seed innermost), so job 10 runs after 2."""
    num = 0
    for attack in ("none", "sign_flip", "backdoor"):
        for aggregator in ("mean", "median"):
            for seed in (0, 1):
                asr = ASR.get((aggregator, attack), (None, None))[seed]
                acc = ACC[(aggregator, attack)][seed]
                make_job(root, num, aggregator, attack, seed, acc, asr)
                num += 1
    return root


def rows_of(table: str) -> list[list[str]]:
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines]


def test_cells_by_hand_clean_attacked_drop_and_asr(tmp_path):
    runs = find_runs([make_sweep(tmp_path)])
    table = grid_table(runs, Grid.parse("aggregator,attack", "attack=none"))
    head, mean, median = rows_of(table)
    assert head == ["aggregator", "attack=none", "attack=sign_flip", "attack=backdoor"]
    # mean, clean: 0.85 ± sqrt(0.005) = 0.0707; sign flip 0.2 ± sqrt(0.02) = 0.1414, 0.2 - 0.85;
    # backdoor 0.85 ± sqrt(0.0002) = 0.0141, no drop, ASR 0.95 ± 0.0707
    assert mean == [
        "mean",
        "0.850 ± 0.071",
        "0.200 ± 0.141 (Δ -0.650)",
        "0.850 ± 0.014 (Δ +0.000), ASR 0.950 ± 0.071",
    ]
    # median: equal seeds have a std of 0; 0.7 - 0.7 = 0; 0.55 - 0.7 = -0.15; ASR 0.2 ± 0
    assert median == [
        "median",
        "0.700 ± 0.000",
        "0.700 ± 0.141 (Δ +0.000)",
        "0.550 ± 0.071 (Δ -0.150), ASR 0.200 ± 0.000",
    ]
    assert "attack=none in its row (a drop is negative)" in table


def test_rows_and_columns_follow_the_sweep_and_the_baseline_comes_first(tmp_path):
    make_sweep(tmp_path)
    runs = find_runs([tmp_path])
    # without a baseline: the order the sweep ran them (job 10 after job 2), no Δ
    head, mean, _ = rows_of(grid_table(runs, Grid.parse("aggregator,attack")))
    assert head == ["aggregator", "attack=none", "attack=sign_flip", "attack=backdoor"]
    assert mean[2] == "0.200 ± 0.141"
    head, *_ = rows_of(grid_table(runs, Grid.parse("aggregator,attack", "attack=backdoor")))
    assert head == ["aggregator", "attack=backdoor", "attack=none", "attack=sign_flip"]
    # the transposed grid: a row per attack
    head, none, *_ = rows_of(grid_table(runs, Grid.parse("attack,aggregator")))
    assert head == ["attack", "aggregator=mean", "aggregator=median"]
    assert none == ["none", "0.850 ± 0.071", "0.700 ± 0.000"]


def test_a_diverged_seed_is_counted_not_averaged_and_an_empty_cell_is_blank(tmp_path):
    make_job(tmp_path, 0, "mean", "none", 0, 0.8)
    make_job(tmp_path, 1, "mean", "none", 1, 0.6)
    make_job(tmp_path, 2, "mean", "ipm", 0, 0.3)
    make_job(tmp_path, 3, "mean", "ipm", 1, None, status="diverged")
    make_job(tmp_path, 4, "bulyan", "none", 0, 0.5)
    table = grid_table(find_runs([tmp_path]), Grid.parse("aggregator,attack", "attack=none"))
    _, mean, bulyan = rows_of(table)
    assert mean == ["mean", "0.700 ± 0.141", "0.300 (Δ -0.400) (+1 diverged)"]
    assert bulyan == ["bulyan", "0.500", ""]  # one seed: no spread; no ipm run


def test_the_cli_prints_the_grid_and_puts_it_in_the_report(tmp_path, capsys):
    make_job(tmp_path / "sweep", 0, "mean", "none", 0, 0.75)
    make_job(tmp_path / "sweep", 1, "mean", "sign_flip", 0, 0.5)
    out = tmp_path / "out"
    args = [str(tmp_path / "sweep"), "--out", str(out), "--grid", "aggregator,attack"]
    assert main([*args, "--baseline", "attack=none"]) == 0
    printed = capsys.readouterr().out
    assert "| mean | 0.750 | 0.500 (Δ -0.250) |" in printed
    md = (out / "report.md").read_text()
    assert "## Grid: aggregator × attack" in md and "| mean | 0.750 | 0.500 (Δ -0.250) |" in md


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--grid", "aggregator"], "--grid aggregator: two different keys"),
        (["--grid", "attack,attack"], "two different keys"),
        (["--grid", "aggregator,attack", "--baseline", "aggregator=mean"], "a value of the colu"),
        (["--grid", "aggregator,attack", "--baseline", "attack=lie"], "attack=lie: no run has"),
        (["--baseline", "attack=none"], "--baseline and --grid-metric go with --grid"),
        (["--grid", "aggregator,attack", "--grid-metric", "x"], "0: no attack in its summary"),
    ],
)
def test_bad_grids_exit_2_with_one_line_and_write_nothing(tmp_path, capsys, extra, message):
    make_sweep(tmp_path / "sweep")
    out = tmp_path / "out"
    if "--grid-metric" in extra:  # a run whose summary.json lacks the column key
        summary = json.loads((tmp_path / "sweep" / "0" / "summary.json").read_text())
        del summary["choices"]["attack"]
        (tmp_path / "sweep" / "0" / "summary.json").write_text(json.dumps(summary))
    assert main([str(tmp_path / "sweep"), "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedexp.report: error: ") and message in err[0]
    assert not out.exists()


def test_runs_that_differ_in_a_third_key_are_refused(tmp_path, capsys):
    make_job(tmp_path, 0, "mean", "none", 0, 0.8)
    make_job(tmp_path, 1, "mean", "none", 0, 0.6, typed={"client.lr": 0.1})
    with pytest.raises(ValueError, match="differ in client.lr besides aggregator and attack"):
        grid_table(find_runs([tmp_path]), Grid.parse("aggregator,attack"))
    # the sweep's callback prints its usual table and says why there is no grid
    assert print_grid(find_runs([tmp_path]), Grid.parse("aggregator,attack")) is None
    assert "|" not in capsys.readouterr().out


def test_the_sweep_callback_takes_its_grid_from_the_config(tmp_path, capsys):
    callback = SweepSummary(grid="aggregator,attack", baseline="attack=none")
    assert callback.grid == Grid("aggregator", "attack", "eval/global/acc", "none")
    assert SweepSummary().grid is None
    with pytest.raises(ValueError, match="two different keys"):
        SweepSummary(grid="aggregator")
    runs = find_runs([make_sweep(tmp_path)])
    assert print_grid(runs, callback.grid) == callback.grid
    assert "| mean | 0.850 ± 0.071 | 0.200 ± 0.141 (Δ -0.650) |" in capsys.readouterr().out
