"""Running statistics: model state that gradients do not train (BatchNorm's running mean, running
variance and batch count) but that belongs to the model as much as its weights do.

A model evaluated without them uses whatever statistics its module last held: the initial ones
(mean 0, variance 1) for a server model never given any, the previous client's for a resident
module shared by the clients of a round. So they travel with the layers they normalise: an
algorithm that shares a norm layer's parameters shares its statistics too, averaged with the same
weights (`fedexp.algorithms.fedavg.FedAvg`), and an algorithm that keeps a model on a client keeps
its statistics with it. On the wire they are floats (`fedexp.metrics.comm.stats_bits`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

_NORM = nn.modules.batchnorm._NormBase  # BatchNorm*d, SyncBatchNorm, InstanceNorm*d
_STATS = ("running_mean", "running_var", "num_batches_tracked")


def norm_layers(model: nn.Module) -> list[nn.Module]:
    """The model's layers that keep running statistics, in module order."""
    return [m for m in model.modules() if isinstance(m, _NORM) and m.track_running_stats]


def running_buffers(layers: Sequence[nn.Module]) -> list[torch.Tensor]:
    """The running statistics of `layers` (read afresh: `.to()` replaces buffer tensors)."""
    return [b for m in layers for name in _STATS if (b := getattr(m, name, None)) is not None]


def flat_stats(buffers: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The buffers as one float32 vector (a copy), or None for no buffers."""
    if not buffers:
        return None
    return torch.cat([b.detach().reshape(-1).to(torch.float32) for b in buffers])


def stats_views(buffers: Sequence[torch.Tensor], flat: torch.Tensor) -> list[torch.Tensor]:
    """`flat` cut into the buffers' shapes (views; what `load_stats` copies, integer buffers'
    entries rounded)."""
    out, offset = [], 0
    for b in buffers:
        chunk = flat[offset : offset + b.numel()].view_as(b)
        out.append(chunk if b.is_floating_point() else chunk.round())
        offset += b.numel()
    if offset != flat.numel():
        raise ValueError(f"running statistics: {flat.numel()} values for {offset} buffer entries")
    return out


@torch.no_grad()
def load_stats(buffers: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy `flat` into the buffers in place; integer buffers (the batch count) are rounded
    (an average of counts is not an integer)."""
    offset = 0
    for b in buffers:
        n = b.numel()
        chunk = flat[offset : offset + n].view_as(b)
        b.copy_(chunk if b.is_floating_point() else chunk.round())
        offset += n
    if offset != flat.numel():
        raise ValueError(f"running statistics: {flat.numel()} values for {offset} buffer entries")


def model_state(model: nn.Module) -> torch.Tensor:
    """All of a model a client keeps: its parameters, then its running statistics (a copy)."""
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    stats = flat_stats(running_buffers(norm_layers(model)))
    return params if stats is None else torch.cat([params, stats.to(params.dtype)])


@torch.no_grad()
def load_model_state(model: nn.Module, flat: torch.Tensor) -> None:
    """Load `model_state`'s vector into `model` in place (a vector of the parameters alone, as
    stored before statistics were kept, leaves the statistics as they are)."""
    offset = 0
    for p in model.parameters():
        n = p.numel()
        p.copy_(flat[offset : offset + n].view_as(p))
        offset += n
    if offset < flat.numel():
        load_stats(running_buffers(norm_layers(model)), flat[offset:])


def state_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """What `model_state` holds, in its order, by name: the parameters, then the running
    statistics."""
    names = {id(t): n for n, t in [*model.named_parameters(), *model.named_buffers()]}
    tensors = [*model.parameters(), *running_buffers(norm_layers(model))]
    return [(names[id(t)], t) for t in tensors]


def state_rows(model: nn.Module, rows: torch.Tensor, prefix: str = "") -> dict[str, torch.Tensor]:
    """`model_state` vectors [C, D] cut into what they hold, [C, *shape] by `prefix` + name
    (integer buffers' entries rounded; a vector of the parameters alone, as stored before
    statistics were kept, gives the parameters alone)."""
    out, offset = {}, 0
    for name, t in state_tensors(model):
        if offset >= rows.shape[1]:
            break
        piece = rows[:, offset : offset + t.numel()].reshape(rows.shape[0], *t.shape)
        out[prefix + name] = piece if t.is_floating_point() else piece.round()
        offset += t.numel()
    return out


def state_of_rows(model: nn.Module, params, prefix: str = "") -> torch.Tensor:
    """`model_state` of each client of stacked `params` (`prefix` + name -> [C, ...]): [C, D]."""
    dtype = next(model.parameters()).dtype
    count = next(iter(params.values())).shape[0]
    rows = []
    for name, t in state_tensors(model):
        row = params[prefix + name].reshape(count, -1)
        # statistics as `flat_stats` has them (float32), then the parameters' dtype
        rows.append(row if isinstance(t, nn.Parameter) else row.to(torch.float32).to(dtype))
    return torch.cat(rows, 1)
