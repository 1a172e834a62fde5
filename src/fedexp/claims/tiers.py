"""The claims' tiers: `small` (the bundled digits, minutes) and `paper` (the papers' protocols
on MNIST-1D, about 110 minutes on 2 cores with 2 jobs). Each gives its claims and the settings they
run."""

from __future__ import annotations

from fedexp.claims import catalogue, paper_tier
from fedexp.claims.claim import Claim, Setting

TIERS = ("small", "paper")
DEFAULT_SEEDS = {"small": 5, "paper": 3}


def tier(name: str) -> tuple[list[Claim], dict[str, Setting]]:
    """The claims of tier `name` (catalogue order) and its settings by id."""
    if name == "small":
        return list(catalogue.CLAIMS), catalogue.SETTINGS
    claims = [c for c in map(paper_tier.tier_claim, catalogue.CLAIMS) if c is not None]
    claims += list(paper_tier.EXTRA)
    return claims, paper_tier.SETTINGS
