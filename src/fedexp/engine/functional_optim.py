"""SGD and Adam as pure functions over stacked per-client tensors, for the vectorised executor.

Each client of a cohort keeps its own optimizer state (momentum buffer, Adam moments) along the
leading dimension. The update follows `torch.optim.SGD` / `torch.optim.Adam` (single-tensor
path) step for step, and a per-client `active` mask leaves a client's parameters and state
untouched on the padded steps after its own last batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from fedexp.core.types import ConfigError


@dataclass(frozen=True)
class GroupSpec:
    """The hyperparameters of one optimizer param group."""

    kind: str  # "sgd" | "adam"
    lr: float
    weight_decay: float = 0.0
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8


def spec_from_optimizer(
    optimizer: torch.optim.Optimizer, names: Mapping[int, str]
) -> dict[str, GroupSpec]:
    """Parameter name -> its group's hyperparameters, read off a torch optimizer.

    Args:
        optimizer: what the module's `configure_optimizers` returned: SGD, Adam, or an object
            holding several of them in `.optimizers` (e.g. SGD for weights, Adam for
            variational parameters).
        names: id(parameter) -> its name in the module.
    """
    if not isinstance(optimizer, torch.optim.Optimizer) and hasattr(optimizer, "optimizers"):
        out: dict[str, GroupSpec] = {}
        for part in optimizer.optimizers:
            out.update(spec_from_optimizer(part, names))
        return out
    if isinstance(optimizer, torch.optim.SGD):
        kind = "sgd"
    elif isinstance(optimizer, torch.optim.Adam) and not isinstance(optimizer, torch.optim.AdamW):
        kind = "adam"
    else:
        raise ConfigError(
            f"executor: the vectorized executor has SGD and Adam, not {type(optimizer).__name__}"
        )
    out: dict[str, GroupSpec] = {}
    for group in optimizer.param_groups:
        if group.get("maximize") or group.get("amsgrad"):
            raise ConfigError("executor: maximize/amsgrad have no vectorized form")
        lr = float(group["lr"])
        if kind == "sgd":
            spec = GroupSpec(
                "sgd",
                lr,
                float(group["weight_decay"]),
                float(group["momentum"]),
                float(group["dampening"]),
                bool(group["nesterov"]),
            )
        else:
            betas = (float(group["betas"][0]), float(group["betas"][1]))
            spec = GroupSpec(
                "adam", lr, float(group["weight_decay"]), betas=betas, eps=float(group["eps"])
            )
        for p in group["params"]:
            out[names[id(p)]] = spec
    return out


def _mask(active: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The [C] client mask shaped to broadcast against a stacked [C, ...] tensor."""
    return active.view(-1, *([1] * (like.dim() - 1)))


class FunctionalOptimizer:
    """One optimizer per client, stacked: `step` updates params[name] of shape [C, ...].

    SGD follows `torch.optim.SGD`'s arithmetic op for op (`add(grad, alpha=-lr)`, the momentum
    buffer's `mul` then `add`). The first step of a parameter writes a new tensor (its input may
    be a view of state that is not the optimizer's); later steps update the tensors the
    optimizer made in place, as do the momentum buffers: a cohort's stacked parameters are not
    allocated again at every step."""

    def __init__(self, specs: Mapping[str, GroupSpec]):
        self.specs = dict(specs)
        self.state: dict[str, dict[str, torch.Tensor]] = {name: {} for name in specs}
        self.steps = 0
        self._own: dict[str, torch.Tensor] = {}  # name -> the tensor the last step made

    @torch.no_grad()
    def step(
        self,
        params: dict[str, torch.Tensor],
        grads: Mapping[str, torch.Tensor],
        active: torch.Tensor | None,
        in_place: bool = False,
    ) -> None:
        """Update `params` in the dict: a new tensor, or in place where the last step made it
        (`in_place`: always, the parameters are the caller's to update)."""
        self.steps += 1
        for name, spec in self.specs.items():
            g = grads.get(name)
            if g is None:  # no gradient (unused this step): no step, as torch.optim skips it
                continue
            p = params[name]
            if spec.weight_decay:
                g = g.add(p, alpha=spec.weight_decay)
            owned = active is None and (in_place or self._own.get(name) is p)
            if spec.kind == "sgd":
                new_p, new_state = self._sgd(spec, p, g, self.state[name], owned)
            else:
                new_p, new_state = self._adam(spec, p, g, self.state[name])
            if active is not None:
                m = _mask(active, p)
                new_p = torch.where(m, new_p, p)
                old = self.state[name]
                new_state = {
                    k: torch.where(m, v, old[k]) if k in old else v for k, v in new_state.items()
                }
            if in_place and new_p is not p:
                new_p = p.copy_(new_p)
            params[name] = self._own[name] = new_p
            self.state[name] = new_state

    def _sgd(self, spec: GroupSpec, p, g, state, in_place: bool):
        if spec.momentum:
            buf = state.get("momentum")
            if buf is None:  # torch.optim.SGD: the first buffer is the gradient itself
                buf = g.clone()
            elif in_place:
                buf.mul_(spec.momentum).add_(g, alpha=1 - spec.dampening)
            else:
                buf = buf.mul(spec.momentum).add_(g, alpha=1 - spec.dampening)
            state = {"momentum": buf}
            g = g.add(buf, alpha=spec.momentum) if spec.nesterov else buf
        if in_place:
            return p.add_(g, alpha=-spec.lr), state
        return p.add(g, alpha=-spec.lr), state

    def _adam(self, spec: GroupSpec, p, g, state):
        beta1, beta2 = spec.betas
        m = state.get("exp_avg", torch.zeros_like(p))
        v = state.get("exp_avg_sq", torch.zeros_like(p))
        m = torch.lerp(m, g, 1 - beta1)
        v = v * beta2 + (1 - beta2) * g * g
        # every client active at a step has taken the same number of steps (padding is a tail)
        step_size = spec.lr / (1 - beta1**self.steps)
        denom = v.sqrt() / (1 - beta2**self.steps) ** 0.5 + spec.eps
        return p - step_size * m / denom, {"exp_avg": m, "exp_avg_sq": v}
