"""The YAML values of a component option, for tests that call a constructor directly.

Defaults live in `conf/<group>/<option>.yaml` only, so a test that builds a component by hand
starts from those values and overrides what it is about.
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path

from omegaconf import OmegaConf

from fedexp.config.build import accepted_options

CONF = Path(__file__).resolve().parents[1] / "conf"


def yaml_options(group: str, option: str, **overrides) -> dict:
    """The keyword arguments `conf/<group>/<option>.yaml` gives its `_target_` (its partial
    configs included), updated with `overrides`; interpolations are left unresolved."""
    node = OmegaConf.load(CONF / group / f"{option}.yaml")
    merged = OmegaConf.create()
    for entry in node.get("defaults", []):
        if isinstance(entry, str) and entry != "_self_":  # a partial config of the group
            merged = OmegaConf.merge(merged, OmegaConf.load(CONF / group / f"{entry}.yaml"))
    merged = OmegaConf.merge(merged, node)
    if "_target_" not in merged and group in merged:  # a `_global_` option: its group's node
        merged = merged[group]
    options = OmegaConf.to_container(merged, resolve=False)
    for key in ("defaults", "_target_", "_partial_"):
        options.pop(key, None)
    options.update(overrides)
    return options


def with_yaml(target, group: str, option: str, **fixed):
    """`target` with the values of `conf/<group>/<option>.yaml` (and `fixed`) as defaults: a call
    passes what it names, positionally or by keyword, and the YAML gives the rest."""
    options = {
        k: v
        for k, v in yaml_options(group, option, **fixed).items()
        if not (isinstance(v, str) and "${" in v)  # a run-time interpolation: the call's
    }
    names, _ = accepted_options(target)
    options = {k: v for k, v in options.items() if k in names}
    signature = inspect.signature(target)

    @functools.wraps(target)
    def make(*args, **kwargs):
        bound = signature.bind_partial(*args, **kwargs).arguments
        given = set(bound) | set(kwargs)
        return target(*args, **kwargs, **{k: v for k, v in options.items() if k not in given})

    return make


def partition_dataset(
    labels,
    num_clients: int,
    scheme: str,
    seed: int,
    params: dict,
    client_ids=None,
    test_fraction: float = 0.2,
    val_fraction: float = 0.0,
    cache_dir=None,
    cache_key=None,
):
    """The partition `conf/partition/<scheme>.yaml` gives with `params` (its scheme options,
    reduce_fraction, reduce_factor, num_classes) and the local split fractions."""
    from fedexp.data import schemes

    params = dict(params)
    num_classes = params.pop("num_classes", None)
    options = yaml_options("partition", scheme, test_fraction=test_fraction)
    options.update(val_fraction=val_fraction, **params)
    if scheme == "natural" and "max_clients" not in params:
        options["max_clients"] = None
    cls = {s.name: s for s in schemes.Scheme.__subclasses__()}[scheme]
    return cls(**options)(
        labels,
        num_clients,
        seed,
        client_ids=client_ids,
        num_classes=num_classes,
        cache_dir=cache_dir,
        cache_key=cache_key,
    )


def wandb_options(**overrides) -> dict:
    """The keyword arguments `conf/logger/wandb.yaml` gives `WandbLogger`, updated with
    `overrides`."""
    node = OmegaConf.to_container(OmegaConf.load(CONF / "logger" / "wandb.yaml"))["wandb"]
    node.pop("_target_")
    return {**node, **overrides}
