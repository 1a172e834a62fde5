"""HeteroFL's width slicing (Diao, Ding, Tarokh, ICLR 2021, Sec. 3.1): the sub-model of capability
rate p holds the first ceil(p * width) units (channels) of every hidden layer of one global network.

The input width of the first layer and the output width of the head (the classes) stay whole. A
hidden layer's weight keeps the rows of its first units and the columns of the units its input
layer kept; a convolution keeps its first output and input channels (every kernel position); a
flattened convolution output keeps the features of its first channels, which, channels coming
first in the flattened order, are its first features. So every kept block is a prefix along each
axis (`positions`): W_l^p = W_l[:ceil(p d_l), :ceil(p k_l)] of the paper.

Two layers of the method go into the width-scaled network (`plan`):

- the Scaler (Sec. 3.2): the output of each hidden Linear or Conv2d divided by p in training
  (identity in evaluation, as the reference code's `Scaler`), so that a sub-model's next layer,
  which sums over p of the units, sees inputs as large as the full network's; none at p = 1;
- static BatchNorm (sBN, Sec. 3.2): BatchNorm without running statistics while clients train
  (`static=True`: batch statistics); the global network's BatchNorm keeps a cumulative average
  (momentum None) that the server fills at evaluation. `sbn=True` puts one after each hidden
  layer's Scaler (the reference code's conv -> Scaler -> BN -> ReLU) where the model has none
  there; BatchNorm layers the model has are made static likewise.

Networks sliced: `BodyHead` models whose body is a sequence of Linear, Conv2d (groups 1),
BatchNorm1d/2d, ReLU, Tanh, MaxPool2d, AvgPool2d, Flatten and Identity layers and whose head is
one Linear (model=mlp, cnn, lenet5, mlp_bn, cnn_bn, femnist_cnn and every member of mlp_family and
cnn_family).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import nn

from fedexp.core.types import ConfigError
from fedexp.models.mlp import BodyHead

WIDE = (nn.Linear, nn.Conv2d)  # layers whose output units are sliced
NORMS = (nn.BatchNorm1d, nn.BatchNorm2d)
PLAIN = (nn.ReLU, nn.Tanh, nn.MaxPool2d, nn.AvgPool2d, nn.Flatten, nn.Identity)


class Scaler(nn.Module):
    """A width-scaled layer's output divided by its rate in training; identity in evaluation."""

    def __init__(self, rate: float):
        super().__init__()
        self.rate = float(rate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / self.rate if self.training else x

    def extra_repr(self) -> str:
        return f"rate={self.rate}"


class _Static:
    """BatchNorm without running statistics: batch statistics in training and evaluation alike.

    While `rows` ([batch] bool) is set, the statistics are those of the rows it marks (the real
    samples of a vectorized cohort's padded batch; `SubModelModule` sets it from the labels);
    a batch of one sample then normalises to the bias (its variance is 0) where
    `nn.BatchNorm1d` would raise (a client's last batch may hold one sample)."""

    rows: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rows is None:
            cudnn = torch.backends.cudnn.enabled
            return torch.batch_norm(
                x, self.weight, self.bias, None, None, True, 0.0, self.eps, cudnn
            )
        dims = [0, *range(2, x.dim())]
        channel = (1, -1, *([1] * (x.dim() - 2)))
        v = self.rows.to(x.dtype).view(-1, *([1] * (x.dim() - 1)))
        count = (v.sum() * (x[0].numel() // x.shape[1])).clamp(min=1)
        mean = (x * v).sum(dims, keepdim=True) / count
        var = ((x - mean).square() * v).sum(dims, keepdim=True) / count  # biased, as BatchNorm's
        out = (x - mean) * torch.rsqrt(var + self.eps)
        if self.weight is not None:
            out = out * self.weight.view(channel) + self.bias.view(channel)
        return out


class StaticBatchNorm1d(_Static, nn.BatchNorm1d):
    pass


class StaticBatchNorm2d(_Static, nn.BatchNorm2d):
    pass


STATIC = (StaticBatchNorm1d, StaticBatchNorm2d)


def kept(width: int, rate: float) -> int:
    """ceil(rate * width), at least 1 (rounded to 9 decimals first: 0.1 x 30 is 3, not 4)."""
    return max(1, math.ceil(round(rate * width, 9)))


@dataclass(frozen=True)
class Layer:
    """A body layer of the global network and the shape of its input (no batch axis)."""

    module: nn.Module
    in_shape: tuple[int, ...]


@dataclass(frozen=True)
class Spec:
    """One layer of a width-scaled network: `kind` wide | norm | scaler | plain | head; the
    global network's layer it comes from (None for one HeteroFL puts in); its widths."""

    kind: str
    source: nn.Module | None
    inp: int = 0
    out: int = 0
    rate: float = 1.0


def body_layers(model: nn.Module, input_shape: tuple[int, ...]) -> tuple[list[Layer], nn.Linear]:
    """The body's layers with their input shapes, and the head; a ConfigError for a network
    HeteroFL cannot slice."""
    body, head = getattr(model, "body", None), getattr(model, "head", None)
    if body is None or not isinstance(head, nn.Linear):
        raise ConfigError(
            f"model: algorithm=heterofl slices a body and a Linear head (model=mlp, cnn, ...); "
            f"got {type(model).__name__}"
        )
    modules = list(body) if isinstance(body, nn.Sequential) else [body]
    layers, x = [], torch.zeros(1, *input_shape)
    with torch.no_grad():
        for m in modules:
            ok = isinstance(m, WIDE + NORMS + PLAIN) and getattr(m, "groups", 1) == 1
            if not ok:
                raise ConfigError(
                    f"model: algorithm=heterofl cannot slice a {type(m).__name__} layer by width "
                    "(it slices Linear, Conv2d, BatchNorm, ReLU, Tanh, pooling and Flatten "
                    "layers: model=mlp, cnn, lenet5, mlp_bn, cnn_bn, mlp_family, cnn_family)"
                )
            layers.append(Layer(m, tuple(x.shape[1:])))
            x = x if isinstance(m, NORMS) else m(x)
    return layers, head


def plan(
    layers: list[Layer], head: nn.Linear, rate: float, *, scaler: bool, sbn: bool
) -> list[Spec]:
    """The layers of the network at `rate` (1: the global network)."""
    specs: list[Spec] = []
    width: int | None = None  # the kept units of the feature axis; None: the input's, whole
    for i, layer in enumerate(layers):
        m = layer.module
        if isinstance(m, WIDE):
            full_in, full_out = (
                (m.in_features, m.out_features)
                if isinstance(m, nn.Linear)
                else (m.in_channels, m.out_channels)
            )
            width_in = full_in if width is None else width
            width = kept(full_out, rate)
            specs.append(Spec("wide", m, width_in, width))
            if scaler and rate != 1.0:
                specs.append(Spec("scaler", None, width, width, rate))
            followed = i + 1 < len(layers) and isinstance(layers[i + 1].module, NORMS)
            if sbn and not followed:
                dims = 1 if isinstance(m, nn.Linear) else 2
                specs.append(Spec("norm", None, dims, width))
        elif isinstance(m, NORMS):
            size = m.num_features if width is None else width
            specs.append(Spec("norm", m, 1 if isinstance(m, nn.BatchNorm1d) else 2, size))
        else:
            if isinstance(m, nn.Flatten) and width is not None:
                width *= math.prod(layer.in_shape[1:])  # a channel's positions, channel-major
            specs.append(Spec("plain", m))
    specs.append(
        Spec("head", head, head.in_features if width is None else width, head.out_features)
    )
    return specs


def param_count(specs: list[Spec]) -> int:
    """The parameters of the network `specs` describe (without building it)."""
    total = 0
    for s in specs:
        m = s.source
        if s.kind in ("wide", "head"):
            per = math.prod(m.kernel_size) if isinstance(m, nn.Conv2d) else 1
            total += s.inp * s.out * per + (s.out if m.bias is not None else 0)
        elif s.kind == "norm" and (m is None or m.affine):
            total += 2 * s.out
    return total


def _make(s: Spec, static: bool) -> nn.Module:
    m = s.source
    if s.kind == "scaler":
        return Scaler(s.rate)
    if s.kind == "plain":
        return copy.deepcopy(m)
    if s.kind == "norm":
        eps, affine = (1e-5, True) if m is None else (m.eps, m.affine)
        if static:
            kind = StaticBatchNorm1d if s.inp == 1 else StaticBatchNorm2d
            return kind(s.out, eps=eps, affine=affine, track_running_stats=False)
        # momentum None: the global network's statistics are a cumulative average
        kind = nn.BatchNorm1d if s.inp == 1 else nn.BatchNorm2d
        return kind(s.out, eps=eps, momentum=None, affine=affine)
    if isinstance(m, nn.Conv2d):
        return nn.Conv2d(
            s.inp, s.out, m.kernel_size, m.stride, m.padding, m.dilation,
            bias=m.bias is not None, padding_mode=m.padding_mode,
        )  # fmt: skip
    return nn.Linear(s.inp, s.out, bias=m.bias is not None)


def build(specs: list[Spec], *, static: bool, copy_values: bool = False) -> BodyHead:
    """The network `specs` describe. `static`: its BatchNorm keeps no running statistics (a
    client's sub-model); `copy_values`: its layers take the values of the layers they come
    from (the global network, at rate 1, from a freshly initialised model). Fresh layers are
    made without drawing from torch's global random stream."""
    with torch.random.fork_rng(devices=[]):
        made = [_make(s, static) for s in specs]
    if copy_values:
        with torch.no_grad():
            for s, m in zip(specs, made):
                if s.source is not None and s.kind != "plain":
                    for mine, theirs in zip(m.parameters(), s.source.parameters(), strict=True):
                        mine.copy_(theirs)
    return BodyHead(nn.Sequential(*made[:-1]), made[-1])


def positions(whole: nn.Module, sub: nn.Module) -> torch.Tensor:
    """The positions in the global network's flat parameter vector (`whole.parameters()` in
    order) of the sub-model's parameters, in the sub-model's flat order: each parameter's first
    rows, columns (and channels) along every axis."""
    out, offset = [], 0
    for g, s in zip(whole.parameters(), sub.parameters(), strict=True):
        grid = torch.arange(g.numel()).view(g.shape)[tuple(slice(0, n) for n in s.shape)]
        out.append(grid.reshape(-1) + offset)
        offset += g.numel()
    return torch.cat(out)


def head_classes(whole: BodyHead) -> torch.Tensor:
    """For each entry of the global network's flat parameter vector, the class whose output row
    of the head it belongs to (the head's weight rows and bias entries), else -1."""
    parts = []
    head = {id(p) for p in whole.head.parameters()}
    for p in whole.parameters():
        if id(p) in head:
            rows = torch.arange(p.shape[0]).view(-1, *([1] * (p.dim() - 1)))
            parts.append(rows.expand(p.shape).reshape(-1))
        else:
            parts.append(torch.full((p.numel(),), -1))
    return torch.cat(parts)


def matched_rate(layers: list[Layer], head: nn.Linear, budget: int) -> float:
    """The largest rate whose sub-model has at most `budget` parameters of the model's own
    layers (the BatchNorm sBN adds, 2 values a unit, left out): a client's rate where its budget
    is another architecture's size (`rates: family`). The count only grows with the rate and
    changes only at the rates k / w (k of a hidden layer's w units kept), so the answer is one
    of those (1 where the whole network fits; where not even one unit a layer fits, the
    smallest, one unit of the widest layer)."""
    full = plan(layers, head, 1.0, scaler=False, sbn=False)
    widths = {s.out for s in full if s.kind == "wide"}
    rates = sorted({k / w for w in widths for k in range(1, w + 1)} | {1.0})
    count = lambda r: param_count(plan(layers, head, r, scaler=False, sbn=False))  # noqa: E731
    lo, hi = 0, len(rates)  # the first rate over the budget lies in [lo, hi]
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if count(rates[mid]) <= budget else (lo, mid)
    return rates[max(lo - 1, 0)]
