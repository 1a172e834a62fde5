"""Evaluation over all clients: the global model (pooled test set and each client's local test
split), each client's personal model and each client's fine-tuned copy of the global model on
its local test split; accuracy, and the mean cross-entropy beside it from the same logits."""

from __future__ import annotations

import math

import numpy as np
import torch

from fedexp.core.algorithm import Algorithm
from fedexp.core.types import ServerState
from fedexp.engine.eval.finetuned import Finetune, finetuned_outcomes
from fedexp.engine.eval.hits import (
    accuracies_from_hits,
    losses_from_samples,
    mean_of,
    sample_outcomes,
)
from fedexp.engine.eval.personal import personal_outcomes

PERSONAL_SAMPLE_STREAM = 7177  # the seed stream of the `eval.personal_clients` sample


def distribution(prefix: str, accs: np.ndarray) -> dict[str, float]:
    """mean/std/var/min/p10/max of per-client accuracies under `prefix` (var: the fairness
    measure of WAFFLe and q-FFL, the population variance over clients). Clients with an empty
    local test split (NaN) are left out; NaN only when no client has a test sample."""
    accs = accs[~np.isnan(accs)]
    if accs.size == 0:
        accs = np.array([np.nan])
    return {
        f"{prefix}/acc_mean": float(accs.mean()),
        f"{prefix}/acc_std": float(accs.std()),
        f"{prefix}/acc_var": float(accs.var()),
        f"{prefix}/acc_min": float(accs.min()),
        f"{prefix}/acc_p10": float(np.percentile(accs, 10)),
        f"{prefix}/acc_max": float(accs.max()),
    }


def group_metrics(accs: np.ndarray, groups: list[str]) -> dict[str, float]:
    """Per-group mean accuracy and the gap between the best and the worst group."""
    names = sorted(set(groups))
    labels = np.array(groups)
    means = {g: float(np.nanmean(accs[labels == g])) for g in names}
    out = {f"eval/group/{g}/acc_mean": m for g, m in means.items()}
    out["eval/group/gap"] = max(means.values()) - min(means.values())
    return out


def mean_hits(hits: torch.Tensor) -> float:
    return float(hits.float().mean()) if len(hits) else math.nan


def client_mean(values: np.ndarray) -> float:
    """The mean over clients of per-client values, clients with an empty split (NaN) left out
    (as `distribution`'s acc_mean); NaN when no client has a sample."""
    values = values[~np.isnan(values)]
    return float(values.mean()) if values.size else math.nan


def personal_sample(num_clients: int, count: int | None, seed: int) -> np.ndarray:
    """The clients whose personal models are evaluated: all (`count` None), or a sorted sample
    of `count` drawn from the seed alone, so every evaluation of a run sees the same clients."""
    if count is None or count >= num_clients:
        return np.arange(num_clients)
    rng = np.random.default_rng([seed, PERSONAL_SAMPLE_STREAM])
    return np.sort(rng.choice(num_clients, count, replace=False))


def _global_metrics(model, data, splits, prefix: dict) -> tuple[dict[str, float], list[float]]:
    """`evaluate`'s measures of the global model, on the pooled sets and on each client's local
    splits, and each client's test accuracy."""
    metrics: dict[str, float] = {}
    # one pass over each local split gives both the pooled measures (the union of the
    # local splits) and every client's
    outcomes = {s: sample_outcomes(model, data.x, data.y, data.local_index(s)[0]) for s in splits}
    for split in splits:
        hits, losses = outcomes[split]
        if split == "test" and not data.test_is_pooled:
            hits, losses = sample_outcomes(model, data.test_x, data.test_y)
        metrics[f"{prefix[split]}/global/acc"] = mean_hits(hits)
        metrics[f"{prefix[split]}/global/loss"] = mean_of(losses)
    for split in splits:
        hits, losses = outcomes[split]
        accs = accuracies_from_hits(hits, data, split)
        # the global model on each client's split: eval/global/client_acc_mean|std|...
        spread = distribution(f"{prefix[split]}/global/client", accs)
        metrics.update({k.replace("client/acc", "client_acc"): v for k, v in spread.items()})
        client_losses = losses_from_samples(losses, data, split)
        metrics[f"{prefix[split]}/global/client_loss_mean"] = client_mean(client_losses)
        if split == "test":
            test_accs = accs.tolist()
    return metrics, test_accs


def _per_client_metrics(kind: str, found, splits, prefix: dict) -> tuple[dict, np.ndarray]:
    """`eval/<kind>/acc_*` and `loss_mean` (and their `eval/val/` forms) of per-client
    (accuracies, mean losses) by split; returns them and the test accuracies."""
    metrics: dict[str, float] = {}
    for split in splits:
        accs, losses = found[split]
        metrics.update(distribution(f"{prefix[split]}/{kind}", accs))
        metrics[f"{prefix[split]}/{kind}/loss_mean"] = client_mean(losses)
    return metrics, found["test"][0]


def evaluate(
    algorithm: Algorithm,
    state: ServerState,
    data,
    personal_clients: int | None = None,
    seed: int = 0,
    finetune: Finetune | None = None,
) -> tuple[dict, dict]:
    """Returns (scalar metrics, per-client accuracy lists).

    Test metrics are `eval/global/...`, `eval/personal/...` and `eval/finetuned/...`; where the
    clients have validation splits the same measures on validation data are
    `eval/val/global/...` (the pooled validation set is the union of the local validation
    splits), `eval/val/personal/...` and `eval/val/finetuned/...`. Personal models are evaluated
    in batched passes (`fedexp.engine.eval.personal`), of every client or, with
    `personal_clients`, of a seeded sample of that many (`personal_sample`; their ids are then
    listed under `personal_clients`). With `finetune` (and a global model) the same clients each
    fine-tune a copy of the global model on their training split (`fedexp.engine.eval.finetuned`)
    and the copies are measured as personal models are.

    Beside each mean accuracy is the mean cross-entropy, from the logits of the same passes:
    `eval/global/loss` (over the samples of the pooled set, as `eval/global/acc`),
    `eval/global/client_loss_mean`, `eval/personal/loss_mean` and `eval/finetuned/loss_mean`
    (each client's mean, then the mean over clients, as the acc_mean beside them), and their
    `eval/val/` forms.
    """
    metrics: dict[str, float] = {}
    per_client: dict[str, list[float]] = {}
    splits = ("test", "val") if getattr(data, "has_val", False) else ("test",)
    prefix = {"test": "eval", "val": "eval/val"}
    model = algorithm.global_model(state)
    if model is not None:
        found, per_client["global"] = _global_metrics(model, data, splits, prefix)
        metrics.update(found)
    clients = personal_sample(data.num_clients, personal_clients, seed)
    # fine-tuned first: an algorithm may load personal models into its global model's module
    finetuned = finetuned_outcomes(model, data, clients, splits, finetune, seed)
    personal = personal_outcomes(algorithm, state, data, clients, splits)
    per_model = {"personal": personal, "finetuned": finetuned}
    for kind, found in per_model.items():
        if found is not None:
            scalars, accs = _per_client_metrics(kind, found, splits, prefix)
            metrics.update(scalars)
            per_client[kind] = accs.tolist()
            if personal_clients is not None:
                per_client["personal_clients"] = clients.tolist()
    if data.groups is not None and per_client:
        if "personal" in per_client:
            accs, groups = np.array(per_client["personal"]), np.array(data.groups)[clients]
        else:
            accs, groups = np.array(per_client["global"]), data.groups
        metrics.update(group_metrics(accs, list(groups)))
    return metrics, per_client
