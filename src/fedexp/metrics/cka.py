"""Representation similarity: kernels, HSIC, CKA and orthogonal Procrustes distance.

Usable on its own for analysis: every function takes representation matrices `reps` of shape
(L, d) (L instances, d features; extra trailing dims are flattened) or L x L kernel matrices, is
differentiable, and compares representations of different widths d.

    K = kernel_matrix(reps_a, "rbf", rbf_sigma=1.0)
    cka(K, kernel_matrix(reps_b, "rbf"))               # 1.0 for identical geometry
    linear_cka(reps_a, reps_b)                          # the same as kernel_matrix(.., "linear")
    procrustes_distance(reps_a, reps_b)                 # in [0, 2]

Definitions (Kornblith et al., 2019; Makhija et al., 2022): H = I - (1/L) 11^T,
HSIC(K, M) = tr(K H M H) / (L - 1)^2, CKA(K, M) = HSIC(K, M) / sqrt(HSIC(K, K) HSIC(M, M)).
"""

from __future__ import annotations

import torch

KERNELS = ("linear", "rbf")
DEFAULT_EPS = 1e-12


def _as_matrix(reps: torch.Tensor) -> torch.Tensor:
    if reps.dim() < 2 or reps.shape[0] < 2:
        raise ValueError(f"representations must be (L >= 2, d...), got shape {tuple(reps.shape)}")
    return reps.flatten(1)


def linear_kernel(reps: torch.Tensor) -> torch.Tensor:
    """K = A A^T."""
    a = _as_matrix(reps)
    return a @ a.T


def squared_distances(reps: torch.Tensor) -> torch.Tensor:
    """D_ab = ||a_a - a_b||^2, clamped at 0 against round-off."""
    a = _as_matrix(reps)
    gram = a @ a.T
    sq = gram.diagonal()
    return (sq[:, None] + sq[None, :] - 2 * gram).clamp_min(0)


def median_squared_distance(sq_dist: torch.Tensor) -> torch.Tensor:
    """Lower median of the squared distances over distinct pairs (a != b).

    Each pair appears twice off the diagonal, so the lower median of the off-diagonal entries is
    exactly the lower median over pairs; its square root is the median pairwise distance.
    """
    n = sq_dist.shape[0]
    off_diagonal = ~torch.eye(n, dtype=torch.bool, device=sq_dist.device)
    return sq_dist[off_diagonal].median()


def rbf_kernel(
    reps: torch.Tensor, rbf_sigma: float = 1.0, eps: float = DEFAULT_EPS
) -> torch.Tensor:
    """K_ab = exp(-||a_a - a_b||^2 / (2 s^2)), s = rbf_sigma x median pairwise distance.

    The bandwidth follows the representations (no detach), so the kernel, and CKA on it, is
    invariant to isotropic scaling of `reps` in value and in gradient.
    """
    sq_dist = squared_distances(reps)
    bandwidth_sq = (rbf_sigma**2) * median_squared_distance(sq_dist)
    return torch.exp(-sq_dist / (2 * bandwidth_sq.clamp_min(eps)))


def kernel_matrix(reps: torch.Tensor, kernel: str = "linear", rbf_sigma: float = 1.0):
    """The L x L kernel of `reps`: `linear` or `rbf` (bandwidth rbf_sigma x median distance)."""
    if kernel == "linear":
        return linear_kernel(reps)
    if kernel == "rbf":
        return rbf_kernel(reps, rbf_sigma)
    raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")


def center_kernel(kernel: torch.Tensor) -> torch.Tensor:
    """H K H, computed without forming H."""
    return kernel - kernel.mean(0, keepdim=True) - kernel.mean(1, keepdim=True) + kernel.mean()


def hsic(kernel_a: torch.Tensor, kernel_b: torch.Tensor) -> torch.Tensor:
    """tr(K H M H) / (L - 1)^2 for symmetric kernels K, M."""
    n = kernel_a.shape[0]
    # tr(K H M H) = <H K H, H M H>_F because H is symmetric and idempotent
    return (center_kernel(kernel_a) * center_kernel(kernel_b)).sum() / (n - 1) ** 2


def cka(kernel_a: torch.Tensor, kernel_b: torch.Tensor, eps: float = DEFAULT_EPS) -> torch.Tensor:
    """Centred kernel alignment of two L x L kernels, in [0, 1] for PSD kernels.

    `eps` floors the squared norms so that a collapsed (constant) representation gives CKA 0
    with a finite gradient instead of 0/0.
    """
    ca, cb = center_kernel(kernel_a), center_kernel(kernel_b)
    cross = (ca * cb).sum()
    norm_a = (ca * ca).sum().clamp_min(eps).sqrt()
    norm_b = (cb * cb).sum().clamp_min(eps).sqrt()
    return cross / (norm_a * norm_b)


def cka_distance(
    kernel_a: torch.Tensor, kernel_b: torch.Tensor, eps: float = DEFAULT_EPS
) -> torch.Tensor:
    """1 - CKA: FedHeNN's alignment distance."""
    return 1 - cka(kernel_a, kernel_b, eps)


def linear_cka(reps_a: torch.Tensor, reps_b: torch.Tensor, eps: float = DEFAULT_EPS):
    """Linear CKA in feature space: ||A^T B||_F^2 / (||A^T A||_F ||B^T B||_F) on centred features.

    Equal to `cka(linear_kernel(A), linear_kernel(B))` at O(L d^2) instead of O(L^2 d).
    """
    a, b = _as_matrix(reps_a), _as_matrix(reps_b)
    a = a - a.mean(0, keepdim=True)
    b = b - b.mean(0, keepdim=True)
    cross = (a.T @ b).square().sum()
    norm_a = (a.T @ a).square().sum().clamp_min(eps).sqrt()
    norm_b = (b.T @ b).square().sum().clamp_min(eps).sqrt()
    return cross / (norm_a * norm_b)


def representation_cka(
    reps_a: torch.Tensor, reps_b: torch.Tensor, kernel: str = "linear", rbf_sigma: float = 1.0
) -> torch.Tensor:
    """CKA between two representation matrices under the named kernel."""
    if kernel == "linear":
        return linear_cka(reps_a, reps_b)
    return cka(kernel_matrix(reps_a, kernel, rbf_sigma), kernel_matrix(reps_b, kernel, rbf_sigma))


def procrustes_distance(
    reps_a: torch.Tensor, reps_b: torch.Tensor, center: bool = True, eps: float = DEFAULT_EPS
) -> torch.Tensor:
    """Orthogonal Procrustes distance min_R ||A - B R||_F^2 after centring and unit norm.

    With ||A||_F = ||B||_F = 1 this is 2 - 2 ||A^T B||_* (nuclear norm; Ding et al., 2021),
    in [0, 2], 0 iff A = B R for an orthogonal R. Widths may differ (B is zero-padded implicitly).
    """
    a, b = _as_matrix(reps_a), _as_matrix(reps_b)
    if center:
        a = a - a.mean(0, keepdim=True)
        b = b - b.mean(0, keepdim=True)
    a = a / a.square().sum().clamp_min(eps).sqrt()
    b = b / b.square().sum().clamp_min(eps).sqrt()
    # svdvals has a stable gradient even with repeated (or zero) singular values
    nuclear = torch.linalg.svdvals(a.T @ b).sum()
    return (2 - 2 * nuclear).clamp_min(0)
