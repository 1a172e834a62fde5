"""Fine-tune, then evaluate (`eval.finetune_epochs=K`): each evaluated client trains a copy of
the global model on its own training split for K local epochs, then that copy is evaluated on
the client's local test and validation splits (`eval/finetuned/*`, `eval/val/finetuned/*`).

The copy trains as a FedAvg client would (`ClientModule`: the task loss; `client.batch_size`,
`client.optimizer`, `lr`, `momentum`, `weight_decay`; the dataset's training augmentation) through
`train_local`, from a fresh optimizer, with only `local_epochs` replaced by K. Its data order and
any use of torch's global RNG come from streams of its own, derived from (seed, round, client)
with `FINETUNE_STREAM` (never the client's training streams), and torch's global RNG is put back
afterwards: the run trains exactly as it would without fine-tuning. Nothing of the algorithm is
written: one deep copy of the global model is reset to the global weights before each client.

The fine-tuned copies are handed to the personal-model evaluation as `personal_model` hooks
(`FinetunedModels`), so they are evaluated in the same batched passes, with the same measures
and names, as personal models.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedexp.core.client import ClientModule
from fedexp.core.client_loop import train_local
from fedexp.core.local import ClientConfig
from fedexp.core.seeding import derive_seed, rng_devices, seed_global_rng
from fedexp.core.types import ConfigError
from fedexp.engine.eval.personal import personal_outcomes

FINETUNE_STREAM = 71  # derive_seed tag of fine-tuning's data order and global-RNG seed


@dataclass(frozen=True)
class Finetune:
    """Fine-tuning at one evaluation: `epochs` local epochs (K >= 1) with the run's client
    settings `client` (its `local_epochs` is not read), at round `round` (the streams' key)."""

    epochs: int
    client: ClientConfig
    round: int


def finetune_streams(seed: int, round_idx: int, client_id: int) -> tuple[int, torch.Generator]:
    """(seed of torch's global RNG, the data-order generator) of a client's fine-tuning at an
    evaluation of round `round_idx`: apart from its training streams (`client_streams`)."""
    own = derive_seed(seed, FINETUNE_STREAM, round_idx, client_id)
    global_seed = derive_seed(seed, FINETUNE_STREAM, round_idx, client_id, 1)
    return global_seed, torch.Generator().manual_seed(own)


def check_finetune(epochs: int, algorithm, objective: str) -> None:
    """Before training: fine-tuning needs a global model to start from, and a `finetuned`
    objective needs fine-tuning on. One-line ConfigErrors."""
    if epochs > 0 and not algorithm.has_global_model:
        raise ConfigError(
            f"eval.finetune_epochs: {epochs}, but {type(algorithm).__name__} has no global model "
            "to fine-tune; set eval.finetune_epochs=0 (its personal models are eval/personal/*)"
        )
    if "/finetuned/" in objective and epochs == 0:
        raise ConfigError(f"objective: {objective} needs eval.finetune_epochs >= 1")


class FinetunedModels:
    """Personal-model hooks over fine-tuned copies of `model` (the global model): each call of
    `personal_model(state, c)` resets one resident deep copy to the global weights and trains
    it on client `c`'s training split (`personal_outcomes` snapshots it before the next call)."""

    batches_personal_models = False

    def __init__(self, model: nn.Module, data, settings: Finetune, seed: int):
        self.model = copy.deepcopy(model)
        tensors = (*self.model.parameters(), *self.model.buffers())
        self.start = [(t, t.detach().clone()) for t in tensors]
        self.client = dataclasses.replace(settings.client, local_epochs=settings.epochs)
        self.module = ClientModule(self.model, self.client)
        # the evaluated round, as the round's clients train in it (a module reads it where the
        # client lr follows a schedule across rounds)
        self.module.__dict__["round_idx"] = settings.round
        self.data, self.round, self.seed = data, settings.round, seed

    def personal_models(self, state, client_ids):
        return None  # read client by client: `personal_model`

    def personal_model(self, state, client_id: int) -> nn.Module:
        with torch.no_grad():
            for tensor, start in self.start:
                tensor.copy_(start)
        x, y = self.data.train(client_id)
        global_seed, generator = finetune_streams(self.seed, self.round, client_id)
        seed_global_rng(global_seed, x.device)
        self.module.generator = generator
        self.module.set_local_data((x, y))
        with torch.enable_grad():  # `python -m fedexp.evaluate` evaluates under no_grad
            train_local(
                self.module, x, y, self.client.batch_size, generator, self.data.batch_transform
            )
        self.module.set_local_data(None)
        return self.model


def finetuned_outcomes(
    model: nn.Module | None,
    data,
    clients: np.ndarray,
    splits: tuple[str, ...],
    settings: Finetune | None,
    seed: int,
) -> dict[str, tuple[np.ndarray, np.ndarray]] | None:
    """(accuracy, mean cross-entropy) of each of `clients`' fine-tuned copy of the global
    `model` on its local `splits`, in `clients` order (`personal_outcomes`' form); None without
    a global model or fine-tuning. Torch's global RNG is where it stood on return."""
    if model is None or settings is None or settings.epochs == 0:
        return None
    models = FinetunedModels(model, data, settings, seed)
    with torch.random.fork_rng(devices=rng_devices(data.x.device)):
        return personal_outcomes(models, None, data, clients, splits)
