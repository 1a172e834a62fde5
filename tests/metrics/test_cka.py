"""CKA, HSIC, kernels and Procrustes distance on numbers checkable by hand."""

from __future__ import annotations

import math

import pytest
import torch

from fedexp.metrics.cka import (
    center_kernel,
    cka,
    cka_distance,
    hsic,
    kernel_matrix,
    linear_cka,
    linear_kernel,
    procrustes_distance,
    rbf_kernel,
    representation_cka,
)

KERNEL_NAMES = ["linear", "rbf"]


def gaussian(*shape: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator, dtype=torch.float64)


def reps(rows: int = 40, cols: int = 6, seed: int = 0) -> torch.Tensor:
    return gaussian(rows, cols, seed=seed)


def random_orthogonal(dim: int, seed: int = 1) -> torch.Tensor:
    q, _ = torch.linalg.qr(gaussian(dim, dim, seed=seed))
    return q


def test_hsic_of_identity_kernels_by_hand():
    # K = M = I: H I H = H, tr(H H) = tr(H) = L - 1, so HSIC = (L - 1) / (L - 1)^2 = 1 / (L - 1)
    for n in (2, 3, 5):
        eye = torch.eye(n, dtype=torch.float64)
        assert hsic(eye, eye).item() == pytest.approx(1 / (n - 1))


def test_centering_matches_explicit_h():
    k = linear_kernel(reps(7, 3))
    h = torch.eye(7, dtype=torch.float64) - torch.full((7, 7), 1 / 7, dtype=torch.float64)
    torch.testing.assert_close(center_kernel(k), h @ k @ h)


def test_rbf_bandwidth_is_median_pairwise_distance():
    # points 0, 1, 3 on a line: pair distances 1, 3, 2 -> median 2 -> s = 2 (rbf_sigma = 1)
    points = torch.tensor([[0.0], [1.0], [3.0]], dtype=torch.float64)
    k = rbf_kernel(points, rbf_sigma=1.0)
    assert k[0, 1].item() == pytest.approx(math.exp(-1 / 8))
    assert k[0, 2].item() == pytest.approx(math.exp(-9 / 8))
    assert k[1, 2].item() == pytest.approx(math.exp(-4 / 8))
    # rbf_sigma scales the bandwidth: s = 0.5 x 2 = 1
    assert rbf_kernel(points, rbf_sigma=0.5)[0, 1].item() == pytest.approx(math.exp(-1 / 2))
    torch.testing.assert_close(k.diagonal(), torch.ones(3, dtype=torch.float64))


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
def test_cka_of_identical_inputs_is_one(kernel):
    k = kernel_matrix(reps(), kernel)
    assert cka(k, k).item() == pytest.approx(1.0)
    assert cka_distance(k, k).item() == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
def test_cka_is_invariant_to_orthogonal_transform_and_scaling(kernel):
    a, b = reps(seed=0), reps(cols=9, seed=2)
    base = representation_cka(a, b, kernel).item()
    q = random_orthogonal(6)
    assert representation_cka(a @ q, b, kernel).item() == pytest.approx(base, rel=1e-9)
    assert representation_cka(3.7 * a, b, kernel).item() == pytest.approx(base, rel=1e-9)
    assert representation_cka(0.01 * a, 250.0 * b, kernel).item() == pytest.approx(base, rel=1e-9)
    assert representation_cka(a @ q, a, kernel).item() == pytest.approx(1.0)


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
def test_cka_is_symmetric(kernel):
    ka, kb = kernel_matrix(reps(seed=3), kernel), kernel_matrix(reps(cols=4, seed=4), kernel)
    assert cka(ka, kb).item() == pytest.approx(cka(kb, ka).item(), rel=1e-12)


def test_linear_cka_equals_feature_space_formula():
    a, b = reps(seed=5), reps(cols=11, seed=6)
    ac, bc = a - a.mean(0), b - b.mean(0)
    by_hand = torch.linalg.norm(ac.T @ bc) ** 2 / (
        torch.linalg.norm(ac.T @ ac) * torch.linalg.norm(bc.T @ bc)
    )
    assert cka(linear_kernel(a), linear_kernel(b)).item() == pytest.approx(by_hand.item())
    assert linear_cka(a, b).item() == pytest.approx(by_hand.item())


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
def test_cka_across_widths(kernel):
    a = reps(cols=5, seed=7)
    # A embedded in 17 dimensions by orthonormal columns keeps its geometry
    wide = a @ random_orthogonal(17)[:5]
    assert wide.shape == (40, 17)
    assert representation_cka(a, wide, kernel).item() == pytest.approx(1.0)
    other = representation_cka(a, reps(cols=23, seed=8), kernel).item()
    assert 0.0 <= other < 1.0


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
def test_cka_gradient_is_finite(kernel):
    a = reps(seed=9).requires_grad_(True)
    target = kernel_matrix(reps(cols=3, seed=10), kernel)
    cka_distance(kernel_matrix(a, kernel), target).backward()
    assert torch.isfinite(a.grad).all() and a.grad.abs().sum() > 0


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
def test_collapsed_representation_gives_finite_values_and_gradient(kernel):
    # dead ReLUs: every instance maps to the same point -> CKA 0, no NaN
    a = torch.zeros(10, 4, dtype=torch.float64, requires_grad=True)
    target = kernel_matrix(reps(10, 3, seed=11), kernel)
    value = cka(kernel_matrix(a, kernel), target)
    value.backward()
    assert value.item() == pytest.approx(0.0)
    assert torch.isfinite(a.grad).all()


def test_procrustes_by_hand():
    a = torch.tensor([[1.0], [-1.0], [0.0], [0.0]], dtype=torch.float64)
    b = torch.tensor([[0.0], [0.0], [1.0], [-1.0]], dtype=torch.float64)
    # centred, unit norm, A^T B = 0 -> nuclear norm 0 -> distance 2
    assert procrustes_distance(a, b).item() == pytest.approx(2.0)
    assert procrustes_distance(a, -a).item() == pytest.approx(0.0, abs=1e-12)  # R = -1


def test_procrustes_invariances_widths_and_gradient():
    a, b = reps(seed=12), reps(cols=9, seed=13)
    base = procrustes_distance(a, b).item()
    assert 0.0 < base <= 2.0
    assert procrustes_distance(5.0 * a @ random_orthogonal(6), b).item() == pytest.approx(base)
    assert procrustes_distance(a, a @ random_orthogonal(17)[:6]).item() == pytest.approx(
        0.0, abs=1e-9
    )
    assert procrustes_distance(a, b).item() == pytest.approx(procrustes_distance(b, a).item())
    leaf = a.clone().requires_grad_(True)
    procrustes_distance(leaf, b).backward()
    assert torch.isfinite(leaf.grad).all()


def test_kernel_rejects_single_instance():
    with pytest.raises(ValueError):
        linear_kernel(torch.ones(1, 3))
