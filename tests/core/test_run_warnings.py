"""What changes what a run's numbers mean is shown beside them: the attack's malicious-majority
rounds, FedHeNN's η that never leaves 0, the final table's warnings, data and evaluated round."""

from __future__ import annotations

import json

import pytest
import torch

from fedexp.attacks.transform import SignFlip
from fedexp.core.cohort import RoundResults
from fedexp.core.summary import Objective, RunSummary, Timing, metric_title
from fedexp.core.types import ClientResult, Weights


def cohort(*ids: int) -> RoundResults:
    return RoundResults.of([ClientResult(c, 10, Weights(torch.zeros(1)), 0.5, 3) for c in ids])


def attack_with(malicious: set[int]) -> SignFlip:
    attack = SignFlip(0.2, False)
    attack.malicious = frozenset(malicious)
    attack.realised_fraction = 0.2  # as set up on 15 clients: 3 of them
    return attack


def test_rounds_with_half_or_more_of_the_cohort_malicious_are_counted_and_named():
    attack = attack_with({0, 1, 2})
    # 2 of 4, 1 of 4, 3 of 3, 0 of 2: rounds 1 and 3 have half or more (the re-draw's rule)
    flags = [attack.round_metrics(cohort(*ids))["attack/malicious_majority"]
             for ids in ([0, 1, 5, 6], [0, 5, 6, 7], [0, 1, 2], [8, 9])]  # fmt: skip
    assert flags == [1, 0, 1, 0]
    (line,) = attack.run_warnings(4)
    assert line.startswith("2 of 4 rounds had a malicious majority")
    assert "attack.redraw_majority=true" in line
    again = attack_with({0, 1, 2})  # a resumed run goes on counting from its checkpoint
    again.load_state_dict(attack.state_dict())
    again.round_metrics(cohort(0, 1))
    assert again.run_warnings(5)[0].startswith("3 of 5 rounds")
    assert attack_with({0}).run_warnings(4) == []  # no such round: no warning


@pytest.mark.parametrize(
    ("eta0", "schedule", "rounds", "warned"),
    [
        (0.0, "constant", 50, True),  # η0 = 0: FedHeNN is FedAvg
        (0.01, "sqrt", 1, True),  # √(t−1) = 0 in the only round
        (0.01, "linear", 1, True),
        (0.01, "sqrt", 2, False),  # on from round 2
        (0.01, "constant", 1, False),
    ],
)
def test_fedhenn_says_when_eta_is_zero_in_every_round(eta0, schedule, rounds, warned):
    from fedexp.algorithms.fedhenn_alignment import AlignmentOptions

    opts = AlignmentOptions("linear", 1.0, "cka", eta0, schedule, 1, 0.5, 10, "server", "uniform",
                            "weights", "body")  # fmt: skip
    lines = opts.run_warnings(rounds, "FedAvg")
    assert bool(lines) == warned
    if warned:
        assert f"η(t) = 0 in all {rounds} rounds" in lines[0] and "this run is FedAvg" in lines[0]


def test_metric_titles_say_test_or_validation_and_global_or_personal():
    assert metric_title("eval/global/acc") == "test acc, global model, pooled"
    assert (
        metric_title("eval/global/client_acc_mean") == "test acc, global model, mean over clients"
    )
    assert metric_title("eval/val/personal/acc_mean") == (
        "validation acc, personal models, mean over clients"
    )
    assert (
        metric_title("eval/personal/loss_mean") == "test loss, personal models, mean over clients"
    )
    assert metric_title("train/loss") == "train/loss"


def test_summary_json_keeps_warnings_and_the_data_fingerprint():
    summary = RunSummary("completed", warnings=("a", "b"), data_fingerprint="f00")
    back = RunSummary.from_dict(json.loads(json.dumps(summary.to_dict())))
    assert back.warnings == ("a", "b") and back.data_fingerprint == "f00"
    assert RunSummary.from_dict({"status": "completed"}).warnings == ()  # an older summary


def test_the_final_table_shows_warnings_data_held_and_the_round_of_its_metrics(capsys):
    from fedexp.__main__ import print_table

    summary = RunSummary(
        "interrupted",
        rounds_completed=12,
        metrics={
            "round": 10,
            "eval/global/acc": 0.5,
            "data/held_by_clients": 0.861,
            "data/train_fraction_used": 0.6027,
            "data/server_pool": 200,
        },
        objective=Objective("eval/val/global/acc", None),
        timing=Timing(3.0, 0.25),
        warnings=("7 of 12 rounds had a malicious majority (half or more of the cohort)",),
    )
    print_table(summary, {"algorithm": "frl", "dataset": "digits"})
    out = capsys.readouterr().out
    assert "metrics of round" in out and "10 of 12 run" in out
    assert "test acc, global model, pooled" in out
    assert "86.1% (60.3% in training splits)" in out
    assert "200 samples" in out
    assert "warning: 7 of 12 rounds had a malicious majority" in out


def test_a_fraction_that_int_rounds_down_and_a_shared_rad_are_warnings():
    from types import SimpleNamespace

    from fedexp.algorithms.fedhenn_alignment import AlignmentOptions

    attack = SignFlip(0.25, False)
    attack.setup(SimpleNamespace(seed=0), 10)  # int(0.25 * 10) = 2 malicious: 0.2
    (line,) = attack.run_warnings(5)
    assert line == "attack.fraction=0.25 makes 2 malicious clients, a realised fraction of 0.2"
    attack.setup(SimpleNamespace(seed=0), 20)  # 5 of 20: as asked
    assert attack.run_warnings(5) == []
    shared = AlignmentOptions("linear", 1.0, "cka", 0.01, "sqrt", 1, 0.5, 10, "train", "uniform",
                              "weights", "body")  # fmt: skip
    assert "rad_source=train" in shared.run_warnings(5, "FedAvg")[0]
