"""WAFFLe, the multimodal partition and the MIA audit through the real CLI; presets compose."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from conftest import REPO, summaries

CONF = REPO / "conf"
PRESETS = sorted(p.stem for p in (CONF / "experiment").glob("waffle_*.yaml"))


@pytest.mark.slow  # a two-job CLI multirun (~35 s); every MIA: test_mia_all_algorithms
def test_waffle_and_fedavg_on_multimodal_with_the_mia_audit(cli):
    cli(
        "algorithm=fedavg,waffle",
        "partition=multimodal",
        "privacy=mia",
        "debug=smoke",
        "privacy.num_targets=1",
        multirun=True,
        env={"OMP_NUM_THREADS": "1"},  # tiny models: threads only contend on a shared CPU
    )
    runs = {s["choices"]["algorithm"]: s for s in summaries(cli.cwd)}
    assert set(runs) == {"fedavg", "waffle"}
    for summary in runs.values():
        m = summary["metrics"]
        assert summary["status"] == "completed"
        assert 0.0 <= m["privacy/mia_acc"] <= 1.0
        assert {"eval/group/majority/acc_mean", "eval/group/minority/acc_mean"} <= set(m)
        assert m["eval/group/gap"] >= 0
    assert "eval/global/client_acc_var" in runs["fedavg"]["metrics"]
    assert "eval/personal/acc_var" in runs["waffle"]["metrics"]
    described = runs["waffle"]["describe"]
    assert described["params/uploaded_per_client"] > 0 and "params/fedavg_model" in described
    stats = next(Path(cli.cwd).rglob("partition_stats.csv")).read_text().splitlines()
    assert sum(",minority," in row for row in stats) == 1  # 6 clients at 5 : 1


@pytest.mark.parametrize("preset", PRESETS)
def test_waffle_presets_compose(preset):
    dataset = (CONF / "experiment" / f"{preset}.yaml").read_text().split("override /dataset: ")[1]
    if not (CONF / "dataset" / f"{dataset.split()[0]}.yaml").exists():
        pytest.skip(f"dataset {dataset.split()[0]} is not on this branch")
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={preset}"])
    assert cfg.algorithm._target_.endswith("WAFFLe")
    assert (cfg.client.local_epochs, cfg.client.batch_size, cfg.rounds) == (5, 10, 100)
    assert cfg.clients_per_round * 10 == cfg.num_clients
    assert cfg.model._target_.endswith("lenet5")
