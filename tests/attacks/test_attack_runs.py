"""IPM and the backdoor through the real CLI (slow tier: whole runs).

The backdoor's measure on the default digits setting (20 clients, 10 a round, 50 rounds, seed 0):
without attackers (`attack.fraction=0`, the same run as `attack=none`) the triggered non-target
test inputs go to the target class about 1 % of the time; with 30 % of the clients poisoning,
FedAvg's global model sends nearly all of them there, under the mean and the median alike
(measured over seeds 0-2: 0.009 -> 0.996 under the mean, 0.020 -> 1.000 under the median).
"""

from __future__ import annotations

import pytest

from conftest import summaries

ASR = "attack/backdoor_asr"


@pytest.mark.slow
def test_the_backdoor_succeeds_against_fedavg_under_mean_and_median(cli):
    cli("attack=backdoor", "attack.fraction=0,0.3", "aggregator=mean,median", "logger={}",
        "seed=0", multirun=True)  # fmt: skip
    runs = summaries(cli.cwd)
    assert [r["status"] for r in runs] == ["completed"] * 4
    asr = {
        (r["choices"]["aggregator"], r["config"]["attack"]["fraction"]): r["metrics"][ASR]
        for r in runs
    }
    for aggregator in ("mean", "median"):
        clean, attacked = asr[(aggregator, 0)], asr[(aggregator, 0.3)]
        assert clean <= 0.1 and attacked >= 0.8 and attacked - clean >= 0.7, (aggregator, asr)


@pytest.mark.slow
def test_ipm_and_the_backdoor_run_with_robust_aggregators(cli):
    small = ("debug=smoke", "num_clients=10", "clients_per_round=5", "logger={}")
    cli(*small, "attack=ipm,backdoor", "attack.fraction=0.2",
        "aggregator=mean,median,multikrum", multirun=True)  # fmt: skip
    runs = summaries(cli.cwd)
    assert [r["status"] for r in runs] == ["completed"] * 6
    for run in runs:
        name = run["describe"]["attack/name"]
        assert run["describe"]["attack/num_malicious"] == 2
        assert (ASR in run["metrics"]) == (name == "backdoor")
        if name == "ipm":
            assert run["describe"]["attack/epsilon"] == 0.1


@pytest.mark.slow
def test_bad_values_exit_2_before_training(cli):
    for overrides, line in [
        (("attack=ipm", "attack.epsilon=-1"), "attack.epsilon"),
        (("attack=backdoor", "attack.poison_fraction=2"), "attack.poison_fraction"),
        (("attack=backdoor", "attack.target_label=10"), "attack.target_label: 10, but digits"),
        (("attack=backdoor", "attack.trigger_size=9"), "attack.trigger_size: 9 does not fit"),
    ]:
        proc = cli("debug=smoke", *overrides, check=False)
        assert proc.returncode == 2 and line in proc.stderr, proc.stderr
        assert "round 1/" not in proc.stdout
