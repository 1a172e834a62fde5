"""Between the algorithm and the aggregators, which see only tensors and options.

The aggregators (`fedexp.aggregators`) are pure functions over stacked updates; what they need to
know about the algorithm's uploads (rankings or vectors) is read here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fedexp.aggregators import aggregator_name, inputs_of
from fedexp.core.types import RANKING, capabilities
from fedexp.errors import ConfigError

__all__ = ["check_aggregator"]

# what an aggregator's declared inputs are, in words (`fedexp.aggregators.INPUTS`)
INPUT_WORDS = {
    "previous": "its previous output kept between rounds",
    "reference": "the server's own update of each round",
}


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
    missing = [
        i for i in inputs_of(aggregator) if i not in getattr(algorithm, "aggregator_inputs", ())
    ]
    if missing:  # `fedexp.aggregators.INPUTS`: the FedAvg family gives them
        raise ConfigError(
            f"aggregator: {name} needs {' and '.join(INPUT_WORDS[i] for i in missing)}, which "
            f"{algo} does not give it (FedAvg and the algorithms built on it do)"
        )
    check = getattr(fn, "check", None)
    if check is not None:
        check(**_options(aggregator))
