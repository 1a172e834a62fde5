"""Supermask layers (edge-popup, Ramanujan et al., 2020), the model FRL trains.

A supermask layer holds frozen random weights θ^w (a buffer: they never train and never travel)
and trainable scores θ^s of the same shape. The forward pass uses W_eff = θ^w ⊙ m, where m keeps
the top `k` fraction of the layer's edges by |θ^s|. The backward pass is straight-through:
∂L/∂|θ^s| = ∂L/∂W_eff ⊙ θ^w, then through |·| to θ^s.

`to_supermask` turns a dense model of Linear/Conv2d layers (MLP, LeNet, Conv8, ...) into its
supermask twin, biases dropped, so FRL and its dense baselines share one architecture.

Rankings: a layer's ranking lists its edge ids from the lowest to the highest rank key. The key
is |θ^s| (`rank_key: abs`, default: then the top k of a ranking is exactly the kept subnetwork)
or θ^s (`rank_key: signed`, FRL's reference code, which ranks signed scores but masks on |θ^s|).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fedexp.errors import ConfigError

WEIGHT_INITS = ("signed_constant", "kaiming_normal", "kaiming_uniform")
RANK_KEYS = ("abs", "signed")


def num_kept(numel: int, k: float) -> int:
    """Edges kept of `numel`: all but int((1 - k) numel), as the edge-popup reference counts."""
    return numel - int((1 - k) * numel)


def edge_mask(scores: torch.Tensor, k: float) -> torch.Tensor:
    """0/1 mask of the top-k |scores|, with the straight-through gradient of |scores|.

    Written without a custom autograd Function so that torch.func can vmap it. The value is
    exactly the 0/1 mask: `key - key.detach()` is exactly 0.
    """
    key = scores.abs()
    flat = key.detach().reshape(-1)
    top = torch.topk(flat, num_kept(flat.numel(), k), sorted=False).indices
    hard = torch.zeros_like(flat).scatter(0, top, 1.0).view_as(key)
    return hard + (key - key.detach())


class SupermaskLinear(nn.Module):
    """A bias-free Linear layer whose edges are chosen by scores; the weights are frozen."""

    def __init__(self, in_features: int, out_features: int, k: float = 0.5):
        super().__init__()
        self.in_features, self.out_features, self.k = in_features, out_features, k
        self.register_buffer("weight", torch.empty(out_features, in_features))
        self.scores = nn.Parameter(torch.empty(out_features, in_features))

    def effective_weight(self) -> torch.Tensor:
        return self.weight * edge_mask(self.scores, self.k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.effective_weight())

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, k={self.k}"


class SupermaskConv2d(nn.Module):
    """A bias-free Conv2d whose edges are chosen by scores; the weights are frozen."""

    def __init__(self, conv: nn.Conv2d, k: float = 0.5):
        super().__init__()
        self.k = k
        self.stride, self.padding = conv.stride, conv.padding
        self.dilation, self.groups = conv.dilation, conv.groups
        self.register_buffer("weight", torch.empty_like(conv.weight, requires_grad=False))
        self.scores = nn.Parameter(torch.empty_like(conv.weight, requires_grad=False))

    def effective_weight(self) -> torch.Tensor:
        return self.weight * edge_mask(self.scores, self.k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(
            x, self.effective_weight(), None, self.stride, self.padding, self.dilation, self.groups
        )

    def extra_repr(self) -> str:
        return f"weight={tuple(self.weight.shape)}, k={self.k}"


SUPERMASK_LAYERS = (SupermaskLinear, SupermaskConv2d)


@torch.no_grad()
def init_supermask(layer: nn.Module, dense_weight: torch.Tensor, weight_init: str) -> None:
    """θ^w from the dense layer's (seeded) init; θ^s Kaiming uniform as in the reference code.

    signed_constant: θ^w = sign(w0) sqrt(2 / fan_in); kaiming_normal / kaiming_uniform: fresh
    Kaiming draws (fan_in, ReLU gain).
    """
    fan_in = dense_weight[0].numel()
    if weight_init == "signed_constant":
        layer.weight.copy_(torch.sign(dense_weight) * math.sqrt(2.0 / fan_in))
    elif weight_init == "kaiming_normal":
        nn.init.kaiming_normal_(layer.weight, mode="fan_in", nonlinearity="relu")
    else:
        nn.init.kaiming_uniform_(layer.weight, mode="fan_in", nonlinearity="relu")
    nn.init.kaiming_uniform_(layer.scores, a=math.sqrt(5))


def _convert(module: nn.Module, k: float, weight_init: str) -> None:
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            layer = SupermaskLinear(child.in_features, child.out_features, k)
        elif isinstance(child, nn.Conv2d):
            layer = SupermaskConv2d(child, k)
        else:
            _convert(child, k, weight_init)
            continue
        layer = layer.to(child.weight.device)
        init_supermask(layer, child.weight.detach(), weight_init)
        setattr(module, name, layer)


def to_supermask(model: nn.Module, k: float = 0.5, weight_init: str = "signed_constant"):
    """Replace every Linear/Conv2d of `model` (in place) by its supermask twin; returns `model`.

    Draws from torch's global RNG (the caller seeds it). Raises ConfigError if any trainable
    parameter other than scores remains (BatchNorm, embeddings, recurrent layers...).
    """
    if weight_init not in WEIGHT_INITS:
        raise ConfigError(
            f"algorithm.weight_init: must be one of {WEIGHT_INITS}, got {weight_init!r}"
        )
    if not 0 < k <= 1:
        raise ConfigError(f"algorithm.k: must be in (0, 1], got {k}")
    _convert(model, k, weight_init)
    others = [n for n, _ in model.named_parameters() if not n.endswith("scores")]
    if others:
        raise ConfigError(
            f"model: FRL needs a model of Linear/Conv2d layers only; {others[0]} cannot be masked"
        )
    return model


def supermask_layers(model: nn.Module) -> list[nn.Module]:
    """The model's supermask layers, in module order (the order of a Ranking's layers)."""
    return [m for m in model.modules() if isinstance(m, SUPERMASK_LAYERS)]


def rank_key(scores: torch.Tensor, kind: str) -> torch.Tensor:
    """The flat key edges are ranked by: |scores| (`abs`) or scores (`signed`)."""
    flat = scores.detach().reshape(-1)
    return flat.abs() if kind == "abs" else flat


def ranking(scores: torch.Tensor, kind: str) -> torch.Tensor:
    """Edge ids from the lowest to the highest key (ties: the lower id ranks lower)."""
    return torch.sort(rank_key(scores, kind), stable=True).indices


def rankings(stacked: torch.Tensor, kind: str) -> torch.Tensor:
    """`ranking` of each row of stacked scores [C, ...]: [C, edges]."""
    flat = stacked.detach().reshape(stacked.shape[0], -1)
    key = flat.abs() if kind == "abs" else flat
    return torch.sort(key, dim=1, stable=True).indices


def sorted_scores(scores: torch.Tensor, kind: str) -> torch.Tensor:
    """S0: the score values ordered by their key, lowest first."""
    return scores.detach().reshape(-1)[ranking(scores, kind)].clone()


@torch.no_grad()
def write_ranking(scores: torch.Tensor, edge_ranking: torch.Tensor, values: torch.Tensor) -> None:
    """θ^s[ranking[i]] = values[i]: the i-th ranked edge gets the i-th lowest value (in place)."""
    scores.view(-1)[edge_ranking] = values
