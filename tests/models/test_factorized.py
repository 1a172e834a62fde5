"""WAFFLe's factorised layers and IBP pieces, each on its own."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fedexp.models.cnn import lenet5
from fedexp.models.factorized import (
    FactorizedConv2d,
    FactorizedLinear,
    IBPPosterior,
    binary_concrete_rsample,
    dense_param_count,
    factorize,
    factorized_layers,
    ibp_prior_pi,
    kl_bernoulli,
    kl_kumaraswamy_beta,
    kumaraswamy_log_rsample,
    kumaraswamy_mean,
    set_factor_masks,
    waffle_lenet,
)


@pytest.mark.parametrize("c,d,alpha", [(2.0, 3.0, 5.0), (0.7, 1.5, 1.0), (5.0, 0.8, 10.0)])
def test_kumaraswamy_beta_kl_closed_form_matches_monte_carlo(c, d, alpha):
    c_t, d_t = torch.tensor(c, dtype=torch.float64), torch.tensor(d, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    u = torch.rand(400_000, generator=g, dtype=torch.float64).clamp(1e-12, 1 - 1e-12)
    log_v = kumaraswamy_log_rsample(c_t, d_t, u)
    log_1m_vc = torch.log(-torch.expm1(c * log_v))  # log(1 - v^c)
    log_q = math.log(c * d) + (c - 1) * log_v + (d - 1) * log_1m_vc
    log_p = math.log(alpha) + (alpha - 1) * log_v  # Beta(alpha, 1)
    samples = log_q - log_p
    mc, se = samples.mean(), samples.std() / math.sqrt(len(samples))
    closed = kl_kumaraswamy_beta(c_t, d_t, alpha)
    assert abs(float(closed - mc)) < 4 * float(se) + 1e-3


def test_kl_is_zero_at_the_prior():
    # Kumaraswamy(alpha, 1) is Beta(alpha, 1)
    assert float(kl_kumaraswamy_beta(torch.tensor(3.0), torch.tensor(1.0), 3.0)) == pytest.approx(
        0.0, abs=1e-6
    )


@pytest.mark.parametrize("c,d", [(2.0, 3.0), (0.5, 0.5), (10.0, 1.0)])
def test_kumaraswamy_sampler_mean_matches_formula(c, d):
    c_t, d_t = torch.tensor(c, dtype=torch.float64), torch.tensor(d, dtype=torch.float64)
    u = torch.rand(200_000, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    v = kumaraswamy_log_rsample(c_t, d_t, u.clamp(1e-12, 1 - 1e-12)).exp()
    se = v.std() / math.sqrt(len(v))
    assert abs(float(v.mean() - kumaraswamy_mean(c_t, d_t))) < 4 * float(se)
    # Kumaraswamy(1, d) is Beta(1, d): mean 1 / (1 + d), by hand
    assert float(kumaraswamy_mean(torch.tensor(1.0), torch.tensor(3.0))) == pytest.approx(0.25)


def test_binary_concrete_exceeds_half_with_the_bernoulli_probability():
    logits = torch.tensor([-2.0, 0.0, 1.5]).expand(100_000, 3)
    u = torch.rand(100_000, 3, generator=torch.Generator().manual_seed(2)).clamp(1e-6, 1 - 1e-6)
    b = binary_concrete_rsample(logits, 0.5, u)
    frac = (b > 0.5).float().mean(0)
    assert torch.allclose(frac, torch.sigmoid(logits[0]), atol=0.01)


def test_bernoulli_kl_by_hand():
    q, p = 0.8, 0.5
    expected = q * math.log(q / p) + (1 - q) * math.log((1 - q) / (1 - p))
    got = kl_bernoulli(torch.logit(torch.tensor(q)), torch.tensor(math.log(p)))
    assert float(got) == pytest.approx(expected, rel=1e-5)


def test_ibp_prior_mean_by_hand():
    assert torch.allclose(ibp_prior_pi(1.0, 3), torch.tensor([0.5, 0.25, 0.125]))


def test_factorised_linear_reproduces_dense_layer_from_its_svd():
    torch.manual_seed(0)
    dense = nn.Linear(12, 7)
    fact = FactorizedLinear.from_dense(dense, num_factors=7)  # F = rank
    x = torch.randn(5, 12)
    assert torch.allclose(fact(x), dense(x), atol=1e-5)
    fact.factor_mask = torch.ones(7)  # b = 1 explicitly
    assert torch.allclose(fact(x), dense(x), atol=1e-5)
    fact.factor_mask = torch.zeros(7)  # no factor: the bias alone
    assert torch.allclose(fact(x), dense.bias.expand(5, 7))


def test_factorised_conv_reproduces_dense_conv_from_its_svd():
    torch.manual_seed(0)
    dense = nn.Conv2d(3, 4, 3, padding=1, stride=2)
    fact = FactorizedConv2d.from_dense(dense, num_factors=4)  # rank of the 4 x 27 kernel
    x = torch.randn(2, 3, 9, 9)
    assert torch.allclose(fact(x), dense(x), atol=1e-5)


def test_mask_selects_factors():
    layer = FactorizedLinear(3, 2, num_factors=2, bias=False)
    with torch.no_grad():
        layer.w_a.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
        layer.w_b.copy_(torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]]))
        layer.strength.copy_(torch.tensor([3.0, 5.0]))
    layer.factor_mask = torch.tensor([1.0, 0.0])
    assert torch.equal(layer.composed_weight(), torch.tensor([[3.0, 0, 0], [0, 0, 0]]))


def test_calibrated_strengths_keep_the_expected_energy():
    torch.manual_seed(0)
    layer = FactorizedLinear(10, 10, num_factors=4)
    keep = torch.tensor([1.0, 0.5, 0.5, 0.0])

    def energy() -> torch.Tensor:
        a, b, r = layer.w_a.detach(), layer.w_b.detach(), layer.strength.detach()
        return (a**2).sum(0) * (b**2).sum(1) * r**2

    before = energy().sum()
    layer.calibrate_strengths(keep)
    assert float((keep * energy()).sum()) == pytest.approx(float(before), rel=1e-5)


def test_waffle_lenet_factorises_every_layer_and_counts_params():
    dense = lenet5((3, 32, 32), 10)
    model = waffle_lenet((3, 32, 32), 10, num_factors=8)
    assert len(factorized_layers(model)) == 5
    assert dense_param_count(model) == sum(p.numel() for p in dense.parameters())
    # conv1 6 x 75, conv2 16 x 150, fc 120 x 400, 84 x 120, 10 x 84: F (J + M + 1) + J each
    shapes = [(6, 75), (16, 150), (120, 400), (84, 120), (10, 84)]
    expected = sum(8 * (j + m + 1) + j for j, m in shapes)
    assert sum(p.numel() for p in model.parameters()) == expected
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert hasattr(model, "body") and hasattr(model, "head")


def test_factorize_leaves_factorised_layers_alone():
    model = factorize(nn.Sequential(FactorizedLinear(4, 3, 2), nn.Linear(3, 2)), 5)
    assert [layer.num_factors for layer in factorized_layers(model)] == [2, 5]
    set_factor_masks(model, [torch.ones(2), None])
    assert torch.equal(factorized_layers(model)[0].factor_mask, torch.ones(2))


def test_posterior_starts_at_the_prior_with_zero_stick_kl():
    post = IBPPosterior([3, 5], alpha=4.0)
    assert float(post.kl_sticks().detach()) == pytest.approx(0.0, abs=1e-4)
    assert torch.allclose(torch.sigmoid(post.pi_logit[1]), ibp_prior_pi(4.0, 5), atol=1e-6)
    b, log_pi = post.rsample(0.5, torch.Generator().manual_seed(0))
    assert b.shape == log_pi.shape == (2, 5)
    assert [m.numel() for m in post.layer_masks(b)] == [3, 5]
    assert bool((log_pi.diff(dim=1) <= 0).all())  # pi_k = prod v_j decreases with k
