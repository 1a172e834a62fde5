"""`partition.server_pool: auto`: the server's pool is set aside only in runs that use it.

The pool (`fedexp.data.server_pool`) takes training samples out of every client's reach. A run
whose algorithm or aggregator never reads it would only lose data, so `auto` (the default) sets
aside what the algorithm or the aggregator declares it needs (`server_pool_need(cfg) -> int` on
its `_target_`; FedHeNN with `rad_source: server` asks for 2 × rad_size, so each round's RAD is
a fresh draw; FLTrust for the paper's root dataset of 100), the larger of the two, and nothing
otherwise. A comparison of FedHeNN with other methods sets one explicit pool for every method
(the FedHeNN presets do), so that all of them train on the same client data; `summary.json`'s
`data_fingerprint` tells whether they did.
"""

from __future__ import annotations

import logging

from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf, open_dict

from fedexp.config.values import GROUP_SCALARS, check_value

KEY = "partition.server_pool"
AUTO = "auto"


def pool_need(cfg: DictConfig) -> int:
    """The pool the run's algorithm and aggregator read (0: none), as their targets declare it;
    they share one pool."""
    needs = [n for n in (_need(cfg, "algorithm"), _need(cfg, "aggregator")) if n is not None]
    return max(needs) if needs else 0


def _need(cfg: DictConfig, group: str) -> int | None:
    """What the group's target declares it needs; None where it declares nothing."""
    target = OmegaConf.select(cfg, f"{group}._target_")
    if not target:
        return None
    try:
        obj = get_object(str(target))
    except Exception:  # an unknown target is refused, naming it, by the type checks
        return None
    need = getattr(obj, "server_pool_need", None)
    return int(need(cfg)) if need is not None else None


CAP = "partition.max_server_pool"  # debug=smoke: a pool tiny test datasets can spare


def resolve_server_pool(cfg: DictConfig) -> None:
    """Replace `partition.server_pool: auto` in `cfg` by the size it stands for, and apply
    `partition.max_server_pool` (set by `debug=smoke`: a preset's pool of 10 000 becomes 16,
    for every method of its comparison alike), which then leaves the config."""
    pool = OmegaConf.select(cfg, KEY)
    cap = OmegaConf.select(cfg, CAP)
    has_cap = "partition" in cfg and "max_server_pool" in cfg.partition
    if pool != AUTO and not has_cap:
        return
    if has_cap and cap is not None:
        check_value(CAP, cap, int, (">=", 0))
    if pool == AUTO:  # the size it stands for, held to the rule a given size is
        pool = pool_need(cfg)
        check_value(KEY, pool, *GROUP_SCALARS[KEY])
    with open_dict(cfg):
        if has_cap:
            del cfg.partition["max_server_pool"]
        if cap is not None and isinstance(pool, int) and pool > int(cap):
            logging.getLogger(__name__).info(
                "%s: %d capped at %d (%s, as debug=smoke sets it)", KEY, pool, int(cap), CAP
            )
            pool = int(cap)
        OmegaConf.update(cfg, KEY, pool, merge=False)
