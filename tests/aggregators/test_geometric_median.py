"""The smoothed-Weiszfeld geometric median (RFA) on configurations whose median is known."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch

from components import with_yaml
from fedexp.aggregators.geometric_median import geometric_median
from fedexp.core.types import ConfigError, Weights
from fedexp.engine.aggregation import check_aggregator

geometric_median = with_yaml(geometric_median, "aggregator", "geometric_median")

CORNERS = [[1.0, 1.0], [-1.0, -1.0], [1.0, -1.0], [-1.0, 1.0]]


@pytest.mark.parametrize("far", [100.0, 1.0e4])
def test_square_corners_and_a_far_outlier_on_the_diagonal(far):
    # on the diagonal (t, t) the corners' unit vectors sum to -2t / sqrt(1 + t^2) (1, 1) / sqrt(2)
    # and the outlier adds (1, 1) / sqrt(2): zero at t = 1/sqrt(3), wherever the outlier is
    x = torch.tensor([*CORNERS, [far, far]], dtype=torch.float64)
    out = geometric_median(x, torch.ones(5), nu=1e-9, iterations=300, tolerance=0.0)
    t = 1 / math.sqrt(3)
    assert torch.allclose(out, torch.tensor([t, t], dtype=torch.float64), atol=1e-6)
    assert x.mean(0)[0] > 19  # the mean goes with the outlier


def test_collinear_points_have_the_middle_one_as_median():
    # (0,0), (1,2), (10,20) on a line: the median is the middle point (the mean is (11/3, 22/3))
    x = torch.tensor([[0.0, 0.0], [1.0, 2.0], [10.0, 20.0]], dtype=torch.float64)
    out = geometric_median(x, torch.ones(3), iterations=100, tolerance=0.0)
    assert torch.allclose(out, torch.tensor([1.0, 2.0], dtype=torch.float64), atol=1e-6)
    # weight 5 on the far point (more than the other two together): the median moves to it
    out = geometric_median(x, torch.tensor([1.0, 1.0, 5.0]), iterations=100, tolerance=0.0)
    assert torch.allclose(out, torch.tensor([10.0, 20.0], dtype=torch.float64), atol=1e-6)


def test_one_iteration_from_the_weighted_mean_by_hand():
    # points 0, 3, 10 with weights 1, 1, 2 (alpha = 1/4, 1/4, 1/2): the start is the weighted
    # mean 23/4; distances 23/4, 11/4, 17/4; beta_i = alpha_i / d_i
    x = torch.tensor([[0.0], [3.0], [10.0]], dtype=torch.float64)
    beta = [0.25 / (23 / 4), 0.25 / (11 / 4), 0.5 / (17 / 4)]
    expected = (3 * beta[1] + 10 * beta[2]) / sum(beta)
    out = geometric_median(x, torch.tensor([1.0, 1.0, 2.0]), iterations=1)
    assert out.item() == pytest.approx(expected, abs=1e-12)
    # equal weights: another start (13/3) and other betas
    beta = [1 / (13 / 3), 1 / (4 / 3), 1 / (17 / 3)]
    equal = geometric_median(x, torch.ones(3), iterations=1)
    assert equal.item() == pytest.approx((3 * beta[1] + 10 * beta[2]) / sum(beta), abs=1e-12)


def test_nu_bounds_the_weight_of_an_update_at_the_estimate():
    # 0, 1, 3 with weights 2, 1, 1 (alpha 1/2, 1/4, 1/4) start at their weighted mean 1, the
    # second point, whose distance 0 counts as nu: beta = (1/2)/1, (1/4)/nu, (1/4)/2
    x = torch.tensor([[0.0], [1.0], [3.0]], dtype=torch.float64)
    weights = torch.tensor([2.0, 1.0, 1.0])
    nu = 0.5
    beta = [0.5, 0.25 / nu, 0.125]
    expected = (1 * beta[1] + 3 * beta[2]) / sum(beta)  # 0.875 / 1.125
    out = geometric_median(x, weights, nu=nu, iterations=1)
    assert out.item() == pytest.approx(expected, abs=1e-12)
    # a small nu holds the estimate at the point
    near = geometric_median(x, weights, nu=1e-9, iterations=1)
    assert near.item() == pytest.approx(1.0, abs=1e-8)


def test_the_tolerance_stops_early():
    x = torch.tensor([*CORNERS, [100.0, 100.0]], dtype=torch.float64)
    one = geometric_median(x, torch.ones(5), iterations=1, tolerance=0.0)
    # a fall of less than 100% of the objective: stop after the first step
    assert torch.equal(geometric_median(x, torch.ones(5), iterations=50, tolerance=1.0), one)
    three = geometric_median(x, torch.ones(5), iterations=3, tolerance=0.0)
    assert not torch.allclose(three, one)


class _Vectors:
    upload_type = Weights
    aggregator_inputs = ()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"nu": 0.0}, "aggregator.nu: must be a number > 0, got 0.0"),
        ({"nu": -1e-6}, "aggregator.nu: must be a number > 0, got -1e-06"),
        ({"iterations": 0}, "aggregator.iterations: must be an int >= 1, got 0"),
        ({"iterations": "many"}, "aggregator.iterations: must be an int >= 1, got 'many'"),
        ({"tolerance": -0.1}, "aggregator.tolerance: must be a number >= 0, got -0.1"),
    ],
)
def test_bad_options_are_refused_in_one_line(options, message):
    options = {"nu": 1e-5, "iterations": 4, "tolerance": 1e-6, **options}
    with pytest.raises(ConfigError) as err:
        check_aggregator(partial(geometric_median.__wrapped__, **options), _Vectors())
    assert str(err.value) == message
