"""A researcher's own LightningModule as the model, and as the task loss of every algorithm.

`model._target_` may name a LightningModule class (`model=lightning model._target_=pkg.Mod`).
Its parameters are the model the algorithm shares and evaluates (its `forward` gives class
logits); its `training_step(batch, batch_idx)` is the task loss (`ClientModule.task_loss`), to
which the algorithm adds its own term (FedProx's proximal term, ...). No Trainer is built, so:

- `self.log(name, value)` / `self.log_dict(...)` inside the step are captured by the client
  module (`LogCapture`) and reported as `client/<name>`: each client's mean over its steps,
  averaged over the round's cohort. Only the mean reduction exists (`reduce_fx="mean"`).
- `configure_optimizers` is used with `client.optimizer=module` (an optimizer, a one-element
  list, or a dict with `optimizer`); a learning-rate scheduler is refused: every client builds
  a fresh optimizer each round, so a scheduler would restart every round.
- Trainer-bound attributes (`self.trainer`, `self.global_step`) are not available.

Nothing here imports Lightning: a user module imported it already.
"""

from __future__ import annotations

import inspect
import logging
import sys
from collections.abc import Mapping
from numbers import Number
from typing import Any

import torch
from torch import nn

from fedexp.core.types import ConfigError

MEAN_REDUCTIONS = ("mean", torch.mean)
_TOLD: set[type] = set()  # models whose unused configure_optimizers was logged
log = logging.getLogger(__name__)


def _lightning_module_classes() -> tuple[type, ...]:
    """LightningModule classes of the Lightning packages already imported (none: ())."""
    found = []
    for name in ("lightning.pytorch", "pytorch_lightning"):
        module = sys.modules.get(name)
        cls = getattr(module, "LightningModule", None) if module is not None else None
        if cls is not None:
            found.append(cls)
    return tuple(found)


def is_lightning_class(target: Any) -> bool:
    """Whether `target` (a class, or a partial of one) is a LightningModule subclass."""
    target = getattr(target, "func", target)  # functools.partial
    bases = _lightning_module_classes()
    return inspect.isclass(target) and bool(bases) and issubclass(target, bases)


def is_user_objective(model: nn.Module) -> bool:
    """Whether `model` is a LightningModule whose own `training_step` is the task loss."""
    if not is_lightning_class(type(model)):
        return False
    # a client module (`fedexp.core.client.ClientModule`, which says so) wraps models, is none
    return not getattr(type(model), "is_client_module", False) and _defines(model, "training_step")


def _defines(model: nn.Module, name: str) -> bool:
    """Whether a class of `model` below Lightning's own defines method `name`."""
    for cls in type(model).__mro__:
        if cls.__module__.split(".")[0] in ("lightning", "pytorch_lightning", "torch"):
            return False
        if name in vars(cls):
            return True
    return False


def defines_optimizer(model: nn.Module) -> bool:
    """Whether the user module defines its own `configure_optimizers`."""
    return is_user_objective(model) and _defines(model, "configure_optimizers")


def check_model(objective: str, uses_task_loss: bool, model: nn.Module, optimizer: str) -> None:
    """Before any training: `model` can be the task loss of client module `objective`, and
    `client.optimizer` (`optimizer`) can be honoured."""
    user = is_user_objective(model)
    if user and not uses_task_loss:
        raise ConfigError(
            f"model: {objective} has its own data term; a LightningModule's training_step "
            "cannot be its task loss"
        )
    if optimizer == "module":
        if not defines_optimizer(model):
            raise ConfigError(
                f"client.optimizer: module needs a model with its own configure_optimizers "
                f"(a LightningModule); {type(model).__name__} has none: use sgd or adam"
            )
        user_optimizer(model)  # its return form is checked here, not in the first round
    elif user and defines_optimizer(model) and type(model) not in _TOLD:
        _TOLD.add(type(model))
        log.info(
            "client.optimizer=%s trains %s (its configure_optimizers is used with "
            "client.optimizer=module)",
            optimizer,
            type(model).__name__,
        )


def factory_arguments(factory: Any, model_args: dict) -> dict:
    """The data-derived arguments (input_shape, num_classes, ...) a LightningModule factory
    names in its `__init__`; every one for fedexp's own model factories (unchanged)."""
    if not is_lightning_class(factory):
        return model_args
    cls = getattr(factory, "func", factory)
    params = inspect.signature(cls.__init__).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return model_args
    names = {p.name for p in params}
    return {k: v for k, v in model_args.items() if k in names}


class LogCapture:
    """What `self.log` records during one step, and its running sums over a client's steps.

    The sequential loop folds each step in with `end_step`; under vmap the step's values are
    batched and leave the vmapped function as outputs instead (`take_step`).
    """

    def __init__(self):
        self.step: dict[str, torch.Tensor] = {}
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, int] = {}

    def log(self, name: str, value, *args, reduce_fx="mean", **kwargs) -> None:
        """`LightningModule.log`'s signature; the other options do not apply without a
        Trainer (values are always averaged over the client's steps)."""
        if not isinstance(name, str):
            raise ConfigError(f"model.log: the name must be a string, got {name!r}")
        if not any(reduce_fx is r or reduce_fx == r for r in MEAN_REDUCTIONS):
            raise ConfigError(f"model.log: {name}: only reduce_fx='mean' exists in fedexp")
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ConfigError(f"model.log: {name}: a scalar is needed, got {value.shape}")
            value = value.detach().reshape(())
        elif isinstance(value, Number):
            value = torch.tensor(float(value))
        else:
            raise ConfigError(f"model.log: {name}: a number or a scalar tensor is needed")
        self.step[name] = value

    def log_dict(self, dictionary: Mapping[str, Any], *args, **kwargs) -> None:
        for name, value in dictionary.items():
            self.log(name, value, **kwargs)

    def reset(self) -> None:
        self.step, self.sums, self.counts = {}, {}, {}

    def take_step(self) -> dict[str, torch.Tensor]:
        """This step's values, cleared."""
        step, self.step = self.step, {}
        return step

    def end_step(self) -> None:
        """Fold this step's values into the client's sums."""
        if not self.step:
            return
        for name, value in self.take_step().items():
            value = value.float()
            # the loop's own loss total starts from a zero tensor: the same sum, bit for bit
            self.sums[name] = self.sums[name] + value if name in self.sums else 0.0 + value
            self.counts[name] = self.counts.get(name, 0) + 1

    def means(self) -> dict[str, torch.Tensor]:
        """Each logged name's mean over the steps that logged it."""
        return {name: self.sums[name] / self.counts[name] for name in self.sums}


def route_logs(model: nn.Module, capture: LogCapture) -> None:
    """Make `model.log` / `model.log_dict` write into `capture` (this instance only)."""
    vars(model)["log"] = capture.log
    vars(model)["log_dict"] = capture.log_dict


def step_loss(model: nn.Module, batch, batch_idx: int) -> torch.Tensor:
    """The loss of the user's `training_step`: a tensor, or the `loss` of a dict."""
    out = model.training_step(batch, batch_idx)
    if isinstance(out, Mapping):
        if "loss" not in out:
            raise ConfigError("model.training_step: a returned dict needs a 'loss' entry")
        out = out["loss"]
    if out is None:
        raise ConfigError(
            "model.training_step: returned None; fedexp trains on every batch "
            "(skipping a batch is not supported)"
        )
    if not isinstance(out, torch.Tensor):
        raise ConfigError(
            f"model.training_step: must return a loss tensor, got {type(out).__name__}"
        )
    return out


def user_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    """The single optimizer of the user's `configure_optimizers` (refusing schedulers)."""
    name = f"{type(model).__name__}.configure_optimizers"
    out = model.configure_optimizers()
    if isinstance(out, (list, tuple)):
        if len(out) == 2 and all(isinstance(part, (list, tuple)) for part in out):
            optimizers, schedulers = out
            if schedulers:
                raise _no_scheduler(name)
            out = list(optimizers)
        if len(out) != 1:
            raise ConfigError(
                f"client.optimizer: {name} returned {len(out)} optimizers; fedexp drives one "
                "(several need Lightning's manual optimization)"
            )
        out = out[0]
    if isinstance(out, Mapping):
        if out.get("lr_scheduler") is not None:
            raise _no_scheduler(name)
        if "optimizer" not in out:
            raise ConfigError(f"client.optimizer: {name} returned a dict without 'optimizer'")
        out = out["optimizer"]
    if not isinstance(out, torch.optim.Optimizer):
        raise ConfigError(
            f"client.optimizer: {name} must return a torch optimizer, got {type(out).__name__}"
        )
    return out


def _no_scheduler(name: str) -> ConfigError:
    return ConfigError(
        f"client.optimizer: {name} returned an LR scheduler; each client builds a fresh "
        "optimizer every round, so a scheduler would restart every round: return the "
        "optimizer alone"
    )


def check_head_body(model: nn.Module, algorithm: str) -> None:
    """`head` and `body` submodules holding every parameter (FedRep's split)."""
    parts = [getattr(model, part, None) for part in ("head", "body")]
    if not all(isinstance(part, nn.Module) for part in parts):
        raise ConfigError(
            f"model: {algorithm} trains a personal `head` and a shared `body`; "
            f"{type(model).__name__} needs both as submodules"
        )
    covered = {id(p) for part in parts for p in part.parameters()}
    outside = [n for n, p in model.named_parameters() if id(p) not in covered]
    if outside:
        raise ConfigError(
            f"model: {algorithm}: parameters outside `head` and `body` would never train: "
            + ", ".join(outside[:5])
        )
