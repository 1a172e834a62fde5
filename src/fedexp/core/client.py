"""The client half of every algorithm: a module whose training_step is the local objective.

Executors drive `training_step` and `configure_optimizers` themselves (no Trainer per client): a
fresh `Trainer.fit` per client costs 1.5-4x a plain loop. A module may train in several phases
(FedRep: head, then body), each with its own trainable parameters and epoch count.

Lightning is in play only when something else imported it (a model of the user's that is a
LightningModule, a model file importing it): a client module built then is a LightningModule
(`lightning_class`, made once per class), one built without it a plain `nn.Module` with the same
methods fedexp calls. Importing Lightning costs seconds (with torchmetrics and torchvision) and
no fedexp client needs it: executors drive `training_step` and `configure_optimizers` themselves.

The task loss is a seam (`task_loss`): cross-entropy of the model, or the model's own
`training_step` when the model is a researcher's LightningModule (`fedexp.core.user_module`);
an algorithm adds its term around it. `self.log` is captured here (no Trainer exists) and
reported as `client/<name>`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fedexp.core.local import OPTIMIZERS, ClientConfig
from fedexp.core.types import ConfigError
from fedexp.core.user_module import (
    LogCapture,
    check_model,
    is_user_objective,
    route_logs,
    step_loss,
    user_optimizer,
)

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
    if name not in ("sgd", "adam"):
        raise ConfigError(f"client.optimizer: must be sgd or adam here, got {name!r}")
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


_LIGHTNING_CLASSES: dict[type, type] = {}


def lightning_in_play() -> bool:
    """Whether Lightning was imported already (by a model of the user's or its file)."""
    return "lightning" in sys.modules or "pytorch_lightning" in sys.modules


def lightning_class(cls: type) -> type:
    """`cls` with `LightningModule` among its bases (made once per class). Its methods come
    first, so it behaves as `cls(LightningModule)` would."""
    made = _LIGHTNING_CLASSES.get(cls)
    if made is None:
        # here for start-up time: Lightning is imported only where a user's module brought it
        import lightning as L

        if issubclass(cls, L.LightningModule):
            made = cls
        else:
            namespace = {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
            made = type(
                cls.__name__, (cls, L.LightningModule), {**namespace, "__doc__": cls.__doc__}
            )
        _LIGHTNING_CLASSES[cls] = made
    return made


class ClientModule(nn.Module):
    """Local objective of FedAvg: the task loss on the client's data. Subclasses add their term.

    An instance is a LightningModule (`lightning_class`) when Lightning is in play
    (`lightning_in_play`), else an `nn.Module` of this class. The model's parameter list is read
    once per model object (walking the module tree costs more than a step of a small model):
    give the module a new model rather than adding or removing parameters inside the one it
    has.
    """

    # False where `training_step` does not go through `task_loss`: such an objective cannot
    # take a LightningModule model's own training_step
    uses_task_loss = True
    is_client_module = True  # wraps the model; never itself a researcher's objective
    # the attributes `Algorithm.begin` gives per client and `training_step` reads (an anchor, a
    # control variate, a temperature): tensors, lists/dicts of tensors, or numbers, stacked over
    # the cohort (`CohortStart.attrs`; `fedexp.core.client_loop` states the rules); every other
    # attribute is the same for every client of a round
    per_client_state: tuple[str, ...] = ()

    def __new__(cls, *args, **kwargs):
        return super().__new__(lightning_class(cls) if lightning_in_play() else cls)

    def __init__(self, model: nn.Module, client: ClientConfig):
        super().__init__()
        self.model = model
        self.client = client
        self.generator: torch.Generator | None = None  # the client's own stream, set per client
        self._phase_params: tuple[nn.Parameter, ...] = tuple(model.parameters())
        # the name of the phase being trained (`Phase.name`), set by every executor before the
        # phase's steps: an objective with several phases may branch on it in `training_step`
        self.current_phase: str | None = None
        # the round being trained (1-based), set by every executor with the client's inputs
        # (`fedexp.core.client_loop.set_round`): the optimizer's lr is `client.lr_at(round_idx)`
        self.round_idx = 1
        self._optimizer_spec = client.optimizer_spec
        self._scheduled = client.lr_schedule != "constant"
        self._local_epochs = client.local_epochs
        self._log_capture = LogCapture()
        self._local_data: tuple[torch.Tensor, torch.Tensor] | None = None
        check_model(type(self).__name__, self.uses_task_loss, model, client.optimizer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def user_objective(self) -> bool:
        """Whether the model is a LightningModule whose `training_step` is the task loss (read
        once per model object; its `self.log` then writes into this module's capture)."""
        if self.__dict__.get("_objective_of") is not self._modules["model"]:
            user = is_user_objective(self.model)
            if user:
                route_logs(self.model, self._log_capture)
            self.__dict__["_user_objective"] = user
            self.__dict__["_objective_of"] = self.model
        return self.__dict__["_user_objective"]

    def task_loss(self, batch, batch_idx: int = 0, model: nn.Module | None = None) -> torch.Tensor:
        """The task's loss of `model` (default: this module's model) on `batch`: the model's own
        `training_step` when it has one (a LightningModule of the user's), else cross-entropy of
        its logits. Another model (e.g. a personal twin of the same class) logs into this
        module's capture too."""
        own = self._modules["model"]  # `self.model` without nn.Module's __getattr__, per step
        if model is None or model is own:
            model, user = own, self.user_objective()
        else:
            user = is_user_objective(model)
            if user:
                route_logs(model, self._log_capture)
        if user:
            return step_loss(model, batch, batch_idx)
        x, y = batch
        return F.cross_entropy(model(x), y)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        return self.task_loss(batch, batch_idx)

    # ---- logging without a Trainer -------------------------------------------------------------
    def log(self, name: str, value, *args, **kwargs) -> None:
        """Record `value` for this step (`LightningModule.log`'s signature); reported as
        `client/<name>`, the cohort's mean of each client's mean over its steps."""
        self._log_capture.log(name, value, *args, **kwargs)

    def log_dict(self, dictionary, *args, **kwargs) -> None:
        self._log_capture.log_dict(dictionary, *args, **kwargs)

    @property
    def local_data(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(x, y): the training data of the client this module trains now, where it trains one
        client at a time (the sequential executor sets it before `begin`); None otherwise.
        `Algorithm.end` reads each client's data from `CohortTraining.data`."""
        return self._local_data

    def set_local_data(self, data: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        # plain attributes (no parameter, buffer or submodule) are written straight into the
        # instance dict: `nn.Module.__setattr__`'s registration checks cost more, per client
        self.__dict__["_local_data"] = data

    @property
    def log_capture(self) -> LogCapture:
        """What `log` recorded (the executors fold it per step and read its means)."""
        return self._log_capture

    def model_params(self) -> tuple[nn.Parameter, ...]:
        """`tuple(self.model.parameters())`, cached per model object."""
        if self.__dict__.get("_params_of") is not self._modules["model"]:
            self.__dict__["_model_params"] = tuple(self.model.parameters())
            self.__dict__["_params_of"] = self.model
        return self.__dict__["_model_params"]

    def named_tensors(self) -> tuple[tuple[str, torch.Tensor], ...]:
        """`named_parameters()` then `named_buffers()`, read once per model object (the client
        half reads them for every client)."""
        if self.__dict__.get("_tensors_of") is not self._modules["model"]:
            tensors = (*self.named_parameters(), *self.named_buffers())
            self.__dict__["_named_tensors"] = tensors
            self.__dict__["_tensor_names"] = {id(t): n for n, t in tensors}
            self.__dict__["_tensors_of"] = self._modules["model"]
        return self.__dict__["_named_tensors"]

    def tensor_names(self) -> dict[int, str]:
        """id(tensor) -> its name in `named_tensors`."""
        self.named_tensors()
        return self.__dict__["_tensor_names"]

    def phases(self) -> list[Phase]:
        return [Phase("all", self._local_epochs, self.model_params())]

    def start_phase(self, phase: Phase) -> None:
        """Freeze everything but the phase's parameters."""
        self.__dict__["current_phase"] = phase.name  # plain attributes (`set_local_data`)
        keep = {id(p) for p in phase.params}
        for p in self.model_params():
            if p.requires_grad != (id(p) in keep):
                p.requires_grad_(id(p) in keep)
        self.__dict__["_phase_params"] = phase.params

    def round_spec(self) -> tuple[str, dict[str, float]]:
        """(name, keyword arguments) of the client optimizer in the round being trained: its lr
        `client.lr_at(round_idx)` (`client.lr` itself under the constant schedule)."""
        if not self._scheduled:
            return self._optimizer_spec
        return self.client.round_spec(self.round_idx)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """`client.optimizer` over the phase's parameters at the round's lr (`round_spec`);
        with `client.optimizer=module` the model's own optimizer (the phase's frozen parameters
        get no gradient, so no step)."""
        if self._optimizer_spec[0] == "module":
            return user_optimizer(self.model)
        return make_optimizer(self._phase_params, self.round_spec())
