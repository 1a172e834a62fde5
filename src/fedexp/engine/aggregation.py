"""Between the algorithm and the aggregators, which see only tensors and options.

The aggregators (`fedexp.aggregators`) are pure functions over stacked updates; what they need to
know about the algorithm's uploads (rankings or vectors) is read here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fedexp.aggregators import aggregator_name
from fedexp.core.types import RANKING, capabilities
from fedexp.errors import ConfigError

__all__ = ["check_aggregator"]


def _options(aggregator: Callable) -> dict[str, Any]:
    return dict(getattr(aggregator, "keywords", {}) or {})


def check_aggregator(aggregator: Callable, algorithm: Any) -> None:
    """Raise ConfigError when the aggregator cannot take what the algorithm uploads, or when its
    options are bad. `algorithm.upload_type` is the Message class clients upload (None: unknown);
    its `capabilities` say whether it is a ranking."""
    fn = getattr(aggregator, "func", aggregator)
    name = aggregator_name(aggregator)
    takes_rankings = getattr(fn, "accepts", "vectors") == "rankings"
    upload = getattr(algorithm, "upload_type", None)
    algo = type(algorithm).__name__
    rankings = RANKING in capabilities(upload)
    if rankings and not takes_rankings:
        raise ConfigError(
            f"aggregator: {algo} uploads rankings and needs aggregator=rank_vote, got {name}"
        )
    if takes_rankings and not rankings:
        raise ConfigError(
            f"aggregator: {name} aggregates FRL rankings; {algo} uploads "
            f"{getattr(upload, '__name__', 'vectors')} (use mean, trimmed_mean, median, "
            "multikrum or sign_vote)"
        )
    check = getattr(fn, "check", None)
    if check is not None:
        check(**_options(aggregator))
