"""The client half of every algorithm: a LightningModule whose training_step is the objective.

Executors drive `training_step` and `configure_optimizers` themselves (no Trainer per client): a
fresh `Trainer.fit` per client costs 1.5-4x a plain loop. A module may train in several phases
(FedRep: head, then body), each with its own trainable parameters and epoch count.
"""

from __future__ import annotations

from dataclasses import dataclass

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn

from fedexp.core.local import OPTIMIZERS, ClientConfig

__all__ = ["OPTIMIZERS", "ClientConfig", "ClientModule", "JointOptimizer", "Phase"]


@dataclass(frozen=True)
class Phase:
    """A stretch of local training over a fixed set of trainable parameters."""

    name: str
    epochs: int
    params: tuple[nn.Parameter, ...]


def make_optimizer(params, spec: tuple[str, dict[str, float]]) -> torch.optim.Optimizer:
    """The optimizer of an `optimizer_spec` over `params` (tensors or param groups)."""
    name, kwargs = spec
    return (torch.optim.SGD if name == "sgd" else torch.optim.Adam)(params, **kwargs)


def build_optimizer(params, client: ClientConfig) -> torch.optim.Optimizer:
    """The client optimizer named by `client.optimizer`."""
    return make_optimizer(params, client.optimizer_spec)


class JointOptimizer:
    """Several optimizers stepped as one (executors drive a single optimizer), e.g. SGD for the
    weights and Adam for variational parameters."""

    def __init__(self, *optimizers: torch.optim.Optimizer):
        self.optimizers = optimizers

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for optimizer in self.optimizers:
            optimizer.step()


class ClientModule(L.LightningModule):
    """Local objective of FedAvg: cross-entropy on the client's data. Subclasses add their term.

    The model's parameter list is read once per model object (walking the module tree costs
    more than a step of a small model): give the module a new model rather than adding or
    removing parameters inside the one it has.
    """

    def __init__(self, model: nn.Module, client: ClientConfig):
        super().__init__()
        self.model = model
        self.client = client
        self.generator: torch.Generator | None = None  # the client's own stream, set per client
        self._phase_params: tuple[nn.Parameter, ...] = tuple(model.parameters())
        self._optimizer_spec = client.optimizer_spec
        self._local_epochs = client.local_epochs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def task_loss(self, batch) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.model(x), y)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        return self.task_loss(batch)

    def model_params(self) -> tuple[nn.Parameter, ...]:
        """`tuple(self.model.parameters())`, cached per model object."""
        if self.__dict__.get("_params_of") is not self.model:
            self.__dict__["_model_params"] = tuple(self.model.parameters())
            self.__dict__["_params_of"] = self.model
        return self.__dict__["_model_params"]

    def phases(self) -> list[Phase]:
        return [Phase("all", self._local_epochs, self.model_params())]

    def start_phase(self, phase: Phase) -> None:
        """Freeze everything but the phase's parameters."""
        keep = {id(p) for p in phase.params}
        for p in self.model_params():
            if p.requires_grad != (id(p) in keep):
                p.requires_grad_(id(p) in keep)
        self._phase_params = phase.params

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return make_optimizer(self._phase_params, self._optimizer_spec)
