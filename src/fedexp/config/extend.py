"""A run that extends: `python -m fedexp resume=<run dir> rounds=N` continues a run (completed or
interrupted) from its last checkpoint to round N, with the result of a run of N rounds from the
start, so long as nothing in the run depends on its total number of rounds.

What does is refused before anything is written, one line naming the option
(`check_extension`):

- an option whose value follows the total (`algorithm.tau_anneal_rounds: ${rounds}`): the config
  resolved at the old total and at the new one differ there;
- what a component declares: a `_target_` (an algorithm, attack, audit or executor class, a
  model factory, ...) may define `depends_on_rounds(cfg)` (a classmethod or staticmethod)
  returning its options whose effect depends on the run's length, as `key=value` lines (a
  learning rate annealed to 0 at the last round: `["algorithm.lr_schedule=to_zero"]`), and so
  do the owners of settings that are no component (`OWNERS`: `client.*`'s `ClientConfig`).
  fedexp's own: the cosine schedules over the run (`client.lr_schedule=cosine`, FedAvg's and
  FedOpt's `algorithm.server_lr_schedule=cosine`); its other schedules count rounds from the
  first (`tau_anneal_rounds`, `eta_schedule`, `round_lr_decay`, the other lr schedules).

The checkpoint's config hash is compared at the total it was written with
(`fedexp.runtime.checkpoint.check_config_hash`); the rounds the run has done are checked against
the new total by `fedexp.runtime.resume` (its summary, its checkpoint's round).
"""

from __future__ import annotations

import copy
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from fedexp.config.saved import EXTENDS, RESUME_OVERRIDABLE
from fedexp.config.validation import components
from fedexp.core.local import ClientConfig
from fedexp.errors import ConfigError

HOOK = "depends_on_rounds"
# the total itself, and keys that change no result: whatever they follow, not refused
IGNORED = (EXTENDS, "resume", *RESUME_OVERRIDABLE)
# owners of settings that are no component (no `_target_`), asked as components are
OWNERS = (ClientConfig,)


def check_extension(cfg: DictConfig, old: int | None) -> None:
    """Refuse in one line a run of `old` rounds continued to `cfg.rounds` where something in it
    depends on the total (no-op where the total stays or `old` is unknown)."""
    new = int(cfg.rounds)
    if old is None or old == new:
        return
    changed = rounds_dependent(cfg, old)
    if changed:
        raise ConfigError(
            f"rounds: extending this run from {old} to {new} rounds changes {changed[0]}: "
            "start a new run"
        )


def rounds_dependent(cfg: DictConfig, old: int) -> list[str]:
    """What in `cfg` depends on its total number of rounds, one `key=value` line each: the
    options that resolve otherwise at the total `old`, then what the components declare."""
    found = [
        f"{key}={raw_value(cfg, key)} ({then!r} at {old} rounds, {now!r} at {cfg.rounds})"
        for key, then, now in differences(resolved(with_rounds(cfg, old)), resolved(cfg))
        if key.split(".")[0] not in IGNORED
    ]
    for obj in (*OWNERS, *(obj for _key, obj in components(cfg))):
        hook = getattr(obj, HOOK, None)
        if callable(hook):
            found += [str(line) for line in hook(cfg) or ()]
    return found


def with_rounds(cfg: DictConfig, rounds: int) -> DictConfig:
    """A copy of `cfg` whose total is `rounds` (its interpolations resolve with it)."""
    out = copy.deepcopy(cfg)
    with open_dict(out):
        out.rounds = rounds
    return out


def resolved(cfg: DictConfig) -> dict:
    """`cfg` resolved ({} where it does not resolve: the config's own checks say why)."""
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception:
        return {}


def differences(before: Any, after: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, value before, value after) of every leaf that differs."""
    if isinstance(before, dict) and isinstance(after, dict):
        out = []
        for key in sorted(set(before) | set(after), key=str):
            out += differences(before.get(key), after.get(key), f"{prefix}{key}.")
        return out
    return [] if before == after else [(prefix.rstrip("."), before, after)]


def raw_value(cfg: DictConfig, key: str) -> Any:
    """`key`'s value as the config writes it (`${rounds}`, not what it resolves to)."""
    node: Any = OmegaConf.to_container(cfg, resolve=False)
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node
