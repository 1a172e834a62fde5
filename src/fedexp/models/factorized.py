"""WAFFLe's factorised layers and the Indian Buffet Process pieces that select their factors.

A factorised layer holds a dictionary of F rank-1 factors and composes its weight as

    W = W_a · diag(r ⊙ b) · W_b,   W_a ∈ R^{J×F}, W_b ∈ R^{F×M}, r ∈ R^F, b ∈ {0,1}^F

(Hao et al., "WAFFLe", IEEE Access 2022). For a linear layer J × M = out × in. For a 2-D
convolution the kernel (C_out, C_in, k_h, k_w) is factorised as the matrix C_out × (C_in·k_h·k_w),
the layout `F.conv2d` reads after a reshape: each factor is one output-channel direction times
one full receptive-field filter. The client's selection b is not a parameter of the layer: the
caller sets `factor_mask` (None means every factor is on), so one dictionary serves every client.

The IBP pieces (stick-breaking prior, Kumaraswamy posterior, binary Concrete relaxation, their
KL terms) are plain functions on tensors, each usable and tested on its own; `IBPPosterior` holds
one layer's variational parameters {π̃, c, d}.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fedexp.models.cnn import cnn, lenet5
from fedexp.models.mlp import mlp

EULER_GAMMA = 0.5772156649015329
UNIFORM_EPS = 1e-6  # keeps uniform noise off {0, 1} so logs stay finite
MAX_LOG_PI = -1e-6  # keeps π < 1 so log(1 - π) in the Bernoulli KL stays finite


# ---- layers ------------------------------------------------------------------------------------
class FactorizedLayer(nn.Module):
    """A dictionary of `num_factors` rank-1 factors composing a J×M weight matrix."""

    def __init__(self, rows: int, cols: int, num_factors: int, bias: bool):
        super().__init__()
        if num_factors < 1:
            raise ValueError(f"num_factors must be >= 1, got {num_factors}")
        self.w_a = nn.Parameter(torch.empty(rows, num_factors))
        self.w_b = nn.Parameter(torch.empty(num_factors, cols))
        self.strength = nn.Parameter(torch.ones(num_factors))  # r: global factor strengths
        self.bias = nn.Parameter(torch.zeros(rows)) if bias else None
        self.factor_mask: torch.Tensor | None = None  # b: set by the caller per client/sample
        self.reset_parameters()

    @property
    def num_factors(self) -> int:
        return self.strength.numel()

    @property
    def dense_shape(self) -> tuple[int, int]:
        return self.w_a.shape[0], self.w_b.shape[1]

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Random factors whose composed weight has variance 1/fan_in with half the factors on."""
        rows, cols = self.dense_shape
        self.w_a.normal_(0.0, 1.0 / math.sqrt(self.num_factors))
        self.w_b.normal_(0.0, math.sqrt(2.0 / cols))
        self.strength.fill_(1.0)
        if self.bias is not None:
            self.bias.uniform_(-1.0 / math.sqrt(cols), 1.0 / math.sqrt(cols))

    @torch.no_grad()
    def load_dense(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        """Set the factors from a dense J×M matrix by its SVD split evenly: W_a = U√S, W_b = √S Vᵀ,
        r = 1, so the layer reproduces `weight` exactly (with b = 1) when F >= rank.

        Truncation keeps the F largest singular directions, which also matches the IBP's ordering
        (early factors are the ones most clients use). Factors beyond the rank get random unit
        directions scaled like the smallest kept singular value, so that they can still train.
        """
        u, s, vh = torch.linalg.svd(weight.detach().float(), full_matrices=False)
        k = min(self.num_factors, s.numel())
        root = s[:k].sqrt()
        self.w_a[:, :k] = u[:, :k] * root
        self.w_b[:k] = root[:, None] * vh[:k]
        if k < self.num_factors:
            extra = self.num_factors - k
            scale = root[-1] if k else 1.0
            a = torch.randn(self.w_a.shape[0], extra, device=self.w_a.device)
            b = torch.randn(extra, self.w_b.shape[1], device=self.w_b.device)
            self.w_a[:, k:] = scale * a / a.norm(dim=0, keepdim=True)
            self.w_b[k:] = scale * b / b.norm(dim=1, keepdim=True)
        self.strength.fill_(1.0)
        if bias is not None and self.bias is not None:
            self.bias.copy_(bias)

    @torch.no_grad()
    def calibrate_strengths(self, keep_prob: torch.Tensor) -> None:
        """Scale r so that the composed weight's expected energy when factor k is kept with
        probability keep_prob[k] equals its energy with every factor on: a sparse selection then
        starts with the signal scale of the dense layer it was factorised from."""
        energy = (self.w_a**2).sum(0) * (self.w_b**2).sum(1) * self.strength**2
        kept = (keep_prob.to(energy) * energy).sum().clamp_min(1e-12)
        self.strength.mul_(torch.sqrt(energy.sum() / kept))

    def composed_weight(self) -> torch.Tensor:
        """W_a diag(r ⊙ b) W_b as a J×M matrix."""
        scale = self.strength if self.factor_mask is None else self.strength * self.factor_mask
        return (self.w_a * scale) @ self.w_b


class FactorizedLinear(FactorizedLayer):
    """`nn.Linear` whose weight (out × in) is composed from factors."""

    def __init__(self, in_features: int, out_features: int, num_factors: int, bias: bool = True):
        super().__init__(out_features, in_features, num_factors, bias)

    @classmethod
    def from_dense(cls, layer: nn.Linear, num_factors: int) -> FactorizedLinear:
        out = cls(layer.in_features, layer.out_features, num_factors, layer.bias is not None)
        out.to(layer.weight.device).load_dense(layer.weight, layer.bias)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.composed_weight(), self.bias)


class FactorizedConv2d(FactorizedLayer):
    """`nn.Conv2d` (groups = 1) whose kernel, seen as C_out × (C_in·k_h·k_w), is factorised."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        num_factors: int,
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        bias: bool = True,
    ):
        kh, kw = (kernel_size, kernel_size) if isinstance(kernel_size, int) else kernel_size
        super().__init__(out_channels, in_channels * kh * kw, num_factors, bias)
        self.kernel_shape = (out_channels, in_channels, kh, kw)
        self.stride, self.padding, self.dilation = stride, padding, dilation

    @classmethod
    def from_dense(cls, layer: nn.Conv2d, num_factors: int) -> FactorizedConv2d:
        if layer.groups != 1 or not isinstance(layer.padding, (int, tuple)):
            raise ValueError("only groups=1 convolutions with numeric padding are factorised")
        out = cls(
            layer.in_channels,
            layer.out_channels,
            layer.kernel_size,
            num_factors,
            layer.stride,
            layer.padding,
            layer.dilation,
            layer.bias is not None,
        )
        out.to(layer.weight.device).load_dense(layer.weight.flatten(1), layer.bias)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernel = self.composed_weight().view(self.kernel_shape)
        return F.conv2d(x, kernel, self.bias, self.stride, self.padding, self.dilation)


def factorize(model: nn.Module, num_factors: int) -> nn.Module:
    """Replace every `nn.Linear` and groups=1 `nn.Conv2d` in `model` (in place) by a factorised
    layer with `num_factors` factors initialised from the dense layer's SVD; returns `model`.
    Layers that are already factorised keep their own number of factors."""
    for name, child in model.named_children():
        if type(child) is nn.Linear:
            setattr(model, name, FactorizedLinear.from_dense(child, num_factors))
        elif type(child) is nn.Conv2d and child.groups == 1 and child.padding_mode == "zeros":
            setattr(model, name, FactorizedConv2d.from_dense(child, num_factors))
        elif not isinstance(child, FactorizedLayer):
            factorize(child, num_factors)
    return model


def factorized_layers(model: nn.Module) -> list[FactorizedLayer]:
    """The model's factorised layers in module order (the order masks and posteriors follow)."""
    return [m for m in model.modules() if isinstance(m, FactorizedLayer)]


def set_factor_masks(model: nn.Module, masks: list[torch.Tensor | None] | None) -> None:
    """Set (or, with None, clear) the factor selection b of every factorised layer."""
    layers = factorized_layers(model)
    for layer, mask in zip(layers, masks if masks is not None else [None] * len(layers)):
        layer.factor_mask = mask


# ---- models ------------------------------------------------------------------------------------
def waffle_mlp(
    input_shape: tuple[int, ...],
    num_classes: int,
    hidden: tuple[int, ...] = (200, 200),
    num_factors: int = 32,
):
    """The `mlp` model with every linear layer factorised."""
    return factorize(mlp(input_shape, num_classes, hidden), num_factors)


def waffle_lenet(input_shape: tuple[int, ...], num_classes: int, num_factors: int = 32):
    """LeNet-5 with both convolutions and all three linear layers factorised."""
    return factorize(lenet5(input_shape, num_classes), num_factors)


def waffle_cnn(input_shape: tuple[int, ...], num_classes: int, num_factors: int = 32, **cnn_kwargs):
    """The `cnn` model (2 conv + 3 FC) with every layer factorised."""
    return factorize(cnn(input_shape, num_classes, **cnn_kwargs), num_factors)


def dense_param_count(model: nn.Module) -> int:
    """Parameters of the same architecture with dense layers (FedAvg's single model)."""
    total = 0
    for m in model.modules():
        own = list(m.parameters(recurse=False))
        if isinstance(m, FactorizedLayer):
            rows, cols = m.dense_shape
            total += rows * cols + (rows if m.bias is not None else 0)
        else:
            total += sum(p.numel() for p in own)
    return total


# ---- IBP: stick-breaking prior, Kumaraswamy posterior, binary Concrete relaxation ----------------
def ibp_prior_pi(alpha: float, num_factors: int) -> torch.Tensor:
    """E[π_k] = (α/(1+α))^k, k = 1..F, under v_k ~ Beta(α, 1), π_k = Π_{j<=k} v_j."""
    k = torch.arange(1, num_factors + 1, dtype=torch.float64)
    return ((alpha / (1.0 + alpha)) ** k).float()


def kumaraswamy_log_rsample(c: torch.Tensor, d: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """log v for v = (1 − (1 − u)^{1/d})^{1/c}, u ~ U(0, 1): a reparameterised Kumaraswamy(c, d)
    draw, computed in log space (log1p/expm1) so that v near 0 or 1 keeps its gradient."""
    return torch.log(-torch.expm1(torch.log1p(-u) / d)) / c


def kumaraswamy_mean(c: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """E[v] = d · B(1 + 1/c, d) for v ~ Kumaraswamy(c, d)."""
    return d * torch.exp(torch.lgamma(1 + 1 / c) + torch.lgamma(d) - torch.lgamma(1 + 1 / c + d))


def kl_kumaraswamy_beta(c: torch.Tensor, d: torch.Tensor, alpha: float) -> torch.Tensor:
    """KL(Kumaraswamy(c, d) ‖ Beta(α, 1)), elementwise, in closed form (exact for Beta(α, 1)):
    (c − α)/c · (−γ − ψ(d) − 1/d) + log(c·d) − log α − (d − 1)/d."""
    return (
        (c - alpha) / c * (-EULER_GAMMA - torch.digamma(d) - 1 / d)
        + torch.log(c * d)
        - math.log(alpha)
        - (d - 1) / d
    )


def binary_concrete_rsample(logits: torch.Tensor, tau: float, u: torch.Tensor) -> torch.Tensor:
    """Relaxed Bernoulli(sigmoid(logits)) draw at temperature τ (Maddison et al., 2017):
    sigmoid((logits + log u − log(1 − u)) / τ); P(sample > 1/2) = sigmoid(logits) at any τ."""
    return torch.sigmoid((logits + torch.log(u) - torch.log1p(-u)) / tau)


def kl_bernoulli(q_logits: torch.Tensor, log_p: torch.Tensor) -> torch.Tensor:
    """KL(Bernoulli(sigmoid(q_logits)) ‖ Bernoulli(exp(log_p))), elementwise."""
    log_p = log_p.clamp(max=MAX_LOG_PI)
    log_q, log_1mq = F.logsigmoid(q_logits), F.logsigmoid(-q_logits)
    log_1mp = torch.log(-torch.expm1(log_p))
    q = torch.sigmoid(q_logits)
    return q * (log_q - log_p) + (1 - q) * (log_1mq - log_1mp)


def _softplus_inverse(x: float) -> float:
    return x + math.log(-math.expm1(-x))


class IBPPosterior(nn.Module):
    """The variational parameters of a model's factorised layers, all layers in one tensor:
    q(v_lk) = Kumaraswamy(c_lk, d_lk), q(b_lk) = Bern(π̃_lk), rows = layers (padded to the
    largest F; padding is masked out of every KL), so a training step costs a few tensor ops
    whatever the depth.

    Initialised at the prior: c = α, d = 1 (Kumaraswamy(α, 1) is Beta(α, 1), so that KL is 0)
    and π̃_k = E[π_k] = (α/(1+α))^k.
    """

    def __init__(self, factors_per_layer: list[int], alpha: float):
        super().__init__()
        self.alpha = alpha
        self.factors_per_layer = [int(f) for f in factors_per_layer]
        layers, width = len(self.factors_per_layer), max(self.factors_per_layer)
        prior = ibp_prior_pi(alpha, width).expand(layers, width)
        self.pi_logit = nn.Parameter(torch.logit(prior, eps=UNIFORM_EPS).clone())
        self.c_raw = nn.Parameter(torch.full((layers, width), _softplus_inverse(alpha)))
        self.d_raw = nn.Parameter(torch.full((layers, width), _softplus_inverse(1.0)))
        valid = torch.arange(width)[None, :] < torch.tensor(self.factors_per_layer)[:, None]
        self.register_buffer("valid", valid.float(), persistent=False)

    @property
    def c(self) -> torch.Tensor:
        return F.softplus(self.c_raw).clamp_min(1e-4)

    @property
    def d(self) -> torch.Tensor:
        return F.softplus(self.d_raw).clamp_min(1e-4)

    def rsample(self, tau: float, generator: torch.Generator | None) -> tuple[torch.Tensor, ...]:
        """(relaxed b, log π), each layers × F, for one draw of v ~ q(v), b ~ Concrete(π̃, τ)."""
        u = torch.rand(2, *self.pi_logit.shape, generator=generator)
        u = u.clamp(UNIFORM_EPS, 1 - UNIFORM_EPS).to(self.pi_logit.device)
        log_pi = torch.cumsum(kumaraswamy_log_rsample(self.c, self.d, u[0]), dim=1)
        return binary_concrete_rsample(self.pi_logit, tau, u[1]), log_pi

    def kl_sticks(self) -> torch.Tensor:
        """Σ_lk KL(Kuma(c_lk, d_lk) ‖ Beta(α, 1))."""
        return (kl_kumaraswamy_beta(self.c, self.d, self.alpha) * self.valid).sum()

    def kl_selection(self, log_pi: torch.Tensor) -> torch.Tensor:
        """Σ_lk KL(Bern(π̃_lk) ‖ Bern(π_lk)) at one draw of π (its mean over draws estimates E_q)."""
        return (kl_bernoulli(self.pi_logit, log_pi) * self.valid).sum()

    def layer_masks(self, b: torch.Tensor) -> list[torch.Tensor]:
        """Split a layers × F selection into one vector per layer (padding dropped)."""
        return [b[i, :f] for i, f in enumerate(self.factors_per_layer)]

    @torch.no_grad()
    def eval_mask(self, rule: str) -> torch.Tensor:
        """b at evaluation: `threshold` 1[π̃ >= 1/2] (the mode), `mean` π̃ (a soft selection)."""
        if rule == "threshold":
            return (self.pi_logit >= 0).float()
        return torch.sigmoid(self.pi_logit)
