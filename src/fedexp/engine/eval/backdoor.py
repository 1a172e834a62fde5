"""The attack success rate of an attack with a test-time task (`attack=backdoor`), measured at
every evaluation beside the clean accuracy.

The task (`attack.poisoned_test`) takes the test samples whose true label is not the attacker's
target, puts the trigger on them and wants the target label for each. The rate is the share of
them a model classifies as the target (samples already of the target class are left out: they
would count as successes without any backdoor):

- `attack/backdoor_asr`: the global model on the pooled test set (as `eval/global/acc`), where
  the algorithm has a global model;
- `attack/backdoor_asr_personal`: each honest client's personal model on its own local test split
  (the clients `eval.personal_clients` samples, the malicious ones left out: their own models are
  trained on the trigger), the mean over those clients (as `eval/personal/acc_mean`), where the
  algorithm has personal models.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fedexp.engine.eval.all_clients import client_mean, personal_sample
from fedexp.engine.eval.hits import EVAL_BATCH, sample_outcomes
from fedexp.engine.eval.personal import personal_outcomes


@torch.no_grad()
def success_rate(model, attack, x: torch.Tensor, y: torch.Tensor) -> float:
    """The share of the task's samples of (x, y) that `model` classifies as the attacker wants
    (NaN when none of them is outside the target class), a batch of inputs at a time."""
    hits, count = 0, 0
    for i in range(0, len(y), EVAL_BATCH):
        _, triggered, wanted = attack.poisoned_test(x[i : i + EVAL_BATCH], y[i : i + EVAL_BATCH])
        hits += int(sample_outcomes(model, triggered, wanted)[0].sum())
        count += len(wanted)
    return hits / count if count else math.nan


class _TaskSplits:
    """Every client's local test split reduced to the task's samples, triggered and labelled
    with the target: what `personal_outcomes` reads of FederatedData (`x`, `y`, `split_sizes`,
    `local_index`), so each personal model's "accuracy" on it is its success rate."""

    def __init__(self, attack, data):
        flat, _ = data.local_index("test")
        keep, self.x, self.y = attack.poisoned_test(data.x[flat], data.y[flat])
        owner = data.owners("test")[keep]
        self.sizes = torch.bincount(owner, minlength=data.num_clients).cpu().numpy()
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)])
        self.flat = torch.arange(len(self.y), device=self.y.device)

    def split_sizes(self, split: str = "test") -> np.ndarray:
        return self.sizes

    def local_index(self, split: str = "test") -> tuple[torch.Tensor, np.ndarray]:
        return self.flat, self.offsets


def backdoor_metrics(
    attack, algorithm, state, data, personal_clients: int | None = None, seed: int = 0
) -> dict[str, float]:
    """`attack/backdoor_asr` and `attack/backdoor_asr_personal` (the module doc); nothing for an
    attack without a test-time task."""
    if not attack.test_task:
        return {}
    metrics = {}
    model = algorithm.global_model(state)
    if model is not None:
        metrics["attack/backdoor_asr"] = success_rate(model, attack, data.test_x, data.test_y)
    clients = personal_sample(data.num_clients, personal_clients, seed)
    honest = np.array([c for c in clients.tolist() if c not in attack.malicious], dtype=np.int64)
    if len(honest) and has_personal_models(algorithm, state, int(honest[0])):
        found = personal_outcomes(algorithm, state, _TaskSplits(attack, data), honest, ("test",))
        if found is not None:
            metrics["attack/backdoor_asr_personal"] = client_mean(found["test"][0])
    return metrics


def has_personal_models(algorithm, state, client_id: int) -> bool:
    """Whether the algorithm has personal models (asked of one client, before the task's
    samples are gathered for them all)."""
    if algorithm.personal_models(state, [client_id]) is not None:
        return True
    return algorithm.personal_model(state, client_id) is not None
