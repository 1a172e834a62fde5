"""FLTrust (Cao, Fang, Liu and Gong, "FLTrust: Byzantine-robust Federated Learning via Trust
Bootstrapping", NDSS 2021).

The server trains its own update g_0 each round on a small clean root dataset (fedexp's server
pool, `partition.server_pool`; the paper's default root dataset is 100 samples drawn uniformly
from the training data, which `partition.server_pool: auto` sets aside), with the clients' local
training. Each client update g_i gets the trust score TS_i = ReLU(cos(g_i, g_0)), is rescaled to
the norm of g_0, and the aggregate is

    g = sum_i TS_i (||g_0|| / ||g_i||) g_i / sum_i TS_i.

An update of norm zero, or a g_0 of norm zero, has cosine 0 here (score 0). Where every score is
0 (every update points away from g_0, or is orthogonal to it) the paper's quotient is 0/0: the
aggregate is then zero, the global model does not move that round (a server momentum still
steps), and the run's log says so the first time.

The server's update arrives as `reference` (`fedexp.aggregators.INPUTS`): the FedAvg family
trains it with the algorithm's own client round on the server pool, seeded from (seed, round)
(`fedexp.algorithms.trusted`). Client weights are not used: the trust scores replace them.
"""

from __future__ import annotations

import torch

from fedexp.aggregators import warn_once
from fedexp.errors import ConfigError

ROOT_DATASET = 100  # the paper's root dataset (samples): `partition.server_pool: auto`


def trust_scores(updates: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """ReLU(cos(g_i, g_0)) per row of `updates`; 0 where either norm is 0."""
    norms = torch.linalg.vector_norm(updates, dim=1)
    ref_norm = torch.linalg.vector_norm(reference)
    dots = updates @ reference
    denominator = norms * ref_norm
    tiny = torch.finfo(dots.dtype).tiny
    cos = torch.where(denominator > 0, dots / denominator.clamp(min=tiny), 0)
    return cos.clamp(min=0)


def fltrust(
    updates: torch.Tensor,
    weights: torch.Tensor,
    num_malicious: int = 0,
    *,
    reference: torch.Tensor | None = None,
) -> torch.Tensor:
    """FLTrust's aggregate of the rows of `updates` against the server's update `reference`.

    Args:
        updates: [n, d] client updates g_i.
        weights: [n] client weights (not used).
        num_malicious: not used (the rule needs no count).
        reference: [d] the server's update g_0 of the round.
    """
    if reference is None:
        raise ValueError("fltrust needs the server's update of the round (reference)")
    reference = reference.to(updates.dtype)
    scores = trust_scores(updates, reference)
    total = scores.sum()
    if not bool(total > 0):
        warn_once(
            "fltrust.zero",
            "aggregator=fltrust: every update had trust score 0 (cosine with the server's "
            "update <= 0); the aggregate was zero (the model did not move that round)",
        )
        return torch.zeros_like(reference)
    norms = torch.linalg.vector_norm(updates, dim=1)
    # a row with score > 0 has a norm > 0; the others are multiplied by 0
    rescale = torch.where(scores > 0, torch.linalg.vector_norm(reference) / norms, 0)
    return (scores * rescale) @ updates / total


def _check_pool(cfg) -> None:
    """A server pool to train on (`partition.server_pool`, resolved from `auto` by then)."""
    pool = (cfg.get("partition") or {}).get("server_pool", 0)
    if not isinstance(pool, int) or pool <= 0:
        raise ConfigError(
            f"aggregator: fltrust trains the server's update on the server pool, but "
            f"partition.server_pool={pool}; set partition.server_pool={ROOT_DATASET} (the "
            "paper's root dataset) or auto"
        )


def _pool_need(cfg) -> int:
    """`partition.server_pool: auto`: the paper's root dataset of 100 samples."""
    return ROOT_DATASET


fltrust.inputs = ("reference",)
fltrust.check_config = _check_pool
fltrust.server_pool_need = _pool_need
