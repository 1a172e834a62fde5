"""Evaluation records the mean cross-entropy beside each mean accuracy: by hand on fixed logits,
and in a run's metrics.jsonl."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import smoke_experiment
from fedexp.core.algorithm import Algorithm
from fedexp.data.datasets import Dataset
from fedexp.data.federated import FederatedData
from fedexp.data.partition import Partition
from fedexp.engine.eval.all_clients import evaluate

LOG3 = math.log(3)
LOSS_KEYS = [
    f"eval/{split}{name}"
    for split in ("", "val/")
    for name in ("global/loss", "global/client_loss_mean", "personal/loss_mean")
]


class Scaled(nn.Module):
    """Logits [0, scale * x]: CE log 2 at x = 0, log(1 + 3^-s) for class 1 at x = log 3."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.tensor(1.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([torch.zeros_like(x[:, 0]), self.scale * x[:, 0]], 1)


class FixedLogits(Algorithm):
    """A global model of scale 1 and each client's personal model of its own scale."""

    has_global_model = has_personal_models = True

    def __init__(self, scales: list[float]):
        self.scales, self.model = scales, Scaled()

    def global_model(self, state):
        self.model.scale.fill_(1.0)
        return self.model

    def personal_model(self, state, client_id):
        self.model.scale.fill_(self.scales[client_id])
        return self.model


def hand_data() -> FederatedData:
    """Client 0 tests (0, y0) and (0, y1) and validates (log 3, y0); client 1 tests (log 3, y1)
    and validates (0, y1) and (0, y0); client 2 has neither split. (x, label) per sample."""
    samples = [
        (0.0, 0), (0.0, 1),  # client 0 test
        (LOG3, 1),  # client 1 test
        (LOG3, 0),  # client 0 val
        (0.0, 1), (0.0, 0),  # client 1 val
        (1.0, 0), (1.0, 1), (1.0, 0),  # clients 0, 1, 2 train
    ]  # fmt: skip
    x = torch.tensor([[a] for a, _ in samples])
    y = torch.tensor([label for _, label in samples])
    none = np.array([], dtype=np.int64)
    part = Partition(
        train=[np.array([6]), np.array([7]), np.array([8])],
        test=[np.array([0, 1]), np.array([2]), none],
        val=[np.array([3]), np.array([4, 5]), none],
    )
    return FederatedData(Dataset("hand", x, y, None, None, 2, (1,)), part, torch.device("cpu"))


def test_loss_beside_accuracy_by_hand():
    # global model (scale 1): logits [0, 0] give CE log 2 (argmax 0); [0, log 3] give
    # softmax [1/4, 3/4]: CE log(4/3) for class 1, log 4 for class 0 (argmax 1)
    # personal: client 0 scale 0 (every logit 0: log 2), client 1 scale 2 ([0, log 9]: class 1
    # log(10/9)), client 2 scale 5 (no test or validation sample: left out of the means)
    metrics, _ = evaluate(FixedLogits([0.0, 2.0, 5.0]), None, hand_data())
    log2, expected = math.log(2), {}
    # test: pooled over the 3 samples, and client 0's mean (log 2) and client 1's (log 4/3)
    expected["eval/global/acc"] = 2 / 3
    expected["eval/global/loss"] = (2 * log2 + math.log(4 / 3)) / 3
    expected["eval/global/client_acc_mean"] = (1 / 2 + 1) / 2
    expected["eval/global/client_loss_mean"] = (log2 + math.log(4 / 3)) / 2
    expected["eval/personal/acc_mean"] = (1 / 2 + 1) / 2
    expected["eval/personal/loss_mean"] = (log2 + math.log(10 / 9)) / 2
    # validation: client 0 holds (log 3, class 0): log 4, a miss; client 1 two samples at 0
    expected["eval/val/global/acc"] = 1 / 3
    expected["eval/val/global/loss"] = (math.log(4) + 2 * log2) / 3
    expected["eval/val/global/client_acc_mean"] = (0 + 1 / 2) / 2
    expected["eval/val/global/client_loss_mean"] = (math.log(4) + log2) / 2
    expected["eval/val/personal/acc_mean"] = (1 + 1 / 2) / 2
    expected["eval/val/personal/loss_mean"] = log2  # every personal logit there is 0
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, rel=1e-6), key


def test_uniform_logits_give_log_2():
    class Uniform(FixedLogits):
        def global_model(self, state):
            self.model.scale.fill_(0.0)
            return self.model

    metrics, _ = evaluate(Uniform([0.0, 0.0, 0.0]), None, hand_data())
    for key in LOSS_KEYS:
        assert metrics[key] == pytest.approx(math.log(2), rel=1e-6), key


@pytest.mark.experiment
def test_a_run_records_the_losses_beside_the_accuracies(tmp_path):
    exp = smoke_experiment(tmp_path, "algorithm=ditto")  # a global and personal models
    exp.run()
    rows = [json.loads(line) for line in (exp.run_dir / "metrics.jsonl").read_text().splitlines()]
    evaluated = [r for r in rows if "eval/global/acc" in r]
    assert evaluated
    for row in evaluated:
        assert set(LOSS_KEYS) <= row.keys()
        assert all(0 < row[k] < 10 for k in LOSS_KEYS)
    summary = json.loads((exp.run_dir / "summary.json").read_text())
    assert set(LOSS_KEYS) <= summary["metrics"].keys()


@pytest.mark.experiment
@pytest.mark.parametrize("algorithm", ["fedavg", "fedrep"])
def test_losses_equal_a_per_client_loop(tmp_path, algorithm):
    # the batched passes (one over every client's split; vmapped personal models) against each
    # client's model on each client's samples, one at a time
    exp = smoke_experiment(tmp_path, f"algorithm={algorithm}")
    orch = exp.orchestrator()
    orch.run()
    metrics, _ = evaluate(exp.algorithm, orch.state, exp.data)
    data, clients = exp.data, range(exp.data.num_clients)
    if algorithm == "fedavg":
        name, models = "global/client_loss_mean", lambda c: exp.algorithm.global_model(orch.state)
    else:
        name, models = "personal/loss_mean", lambda c: exp.algorithm.personal_model(orch.state, c)
    for split, prefix in (("test", "eval"), ("val", "eval/val")):
        with torch.no_grad():
            losses = [
                float(F.cross_entropy(models(c).eval()(x), y))
                for c in clients
                for x, y in [data.local(c, split)]
                if len(y)
            ]
        assert metrics[f"{prefix}/{name}"] == pytest.approx(np.mean(losses), rel=1e-5)
    if algorithm == "fedavg":  # the pooled test set: every sample weighs the same
        model = exp.algorithm.global_model(orch.state).eval()
        with torch.no_grad():
            pooled = float(F.cross_entropy(model(data.test_x), data.test_y))
        assert metrics["eval/global/loss"] == pytest.approx(pooled, rel=1e-5)
