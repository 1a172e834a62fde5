"""The "setting here" of a claim, generated from the configuration its runs actually composed.

Written by hand, a setting's description drifts from what runs (a batch size, a learning rate, a
RAD source changed in a YAML file). Here it is read from each setting's resolved configuration:
the `config` and `choices` of a run's `summary.json`, or, for a setting with no summary yet, the
configuration Hydra composes from its overrides. The text gives the keys every compared setting
shares (the essentials: data, population, rounds, local training) and then every key whose value
differs between them, each setting's value named.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedexp.claims.claim import Claim, Setting, settings_of
from fedexp.claims.runner import attack_option, overrides_for
from fedexp.config.build import find_conf
from fedexp.core.summary import RunSummary
from fedexp.core.types import ConfigError

# shown once when every compared setting has the same value (in this order)
ESSENTIALS = (
    "dataset",
    "partition",
    "partition.beta",
    "partition.server_pool",
    "num_clients",
    "clients_per_round",
    "rounds",
    "model",
    "client.local_epochs",
    "client.batch_size",
    "client.optimizer",
    "client.lr",
    "client.momentum",
    "client.weight_decay",
    "aggregator",
    "attack",
    "attack.fraction",
)
# keys that do not change what a run computes, or name what `choices` already names
_IGNORED_PREFIXES = ("paths.", "logger.", "client_store.", "executor.", "eval.")
_IGNORED = {
    "seed",
    "progress",
    "checkpoint_every",
    "resume",
    "device",
    "threads",
    "objective",
    "progress_every_s",
}
GROUPS = (
    "algorithm",
    "dataset",
    "partition",
    "model",
    "client",
    "aggregator",
    "attack",
    "privacy",
    "experiment",
)


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config as {dotted key: leaf value} (lists stay whole)."""
    if not isinstance(node, Mapping):
        return {prefix: node}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _keep(key: str) -> bool:
    last = key.rsplit(".", 1)[-1]
    return (
        key not in _IGNORED
        and not key.startswith(_IGNORED_PREFIXES)
        and not last.startswith("_")  # _target_, _partial_: the group choice names them
    )


def run_config(config: Mapping[str, Any], choices: Mapping[str, Any]) -> dict[str, Any]:
    """A run's keys as the text compares them: its flattened config and its group choices."""
    flat = {k: v for k, v in flatten(config).items() if _keep(k)}
    for group in GROUPS:
        if choices.get(group) is not None:
            flat[group] = choices[group]
    return flat


def composed(setting: Setting, extra: Sequence[str] = ()) -> dict[str, Any]:
    """The configuration Hydra composes from a setting's overrides and `extra` (no run)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(find_conf(), version_base="1.3"):
            cfg = compose(
                "config", overrides=[*setting.overrides, *extra], return_hydra_config=True
            )
    finally:
        GlobalHydra.instance().clear()
    choices = dict(cfg.hydra.runtime.choices)
    OmegaConf.set_struct(cfg, False)
    cfg.pop("hydra", None)
    resolved = OmegaConf.to_container(cfg, resolve=True)  # `paths` resolves the data dirs
    resolved.pop("paths", None)
    return run_config(resolved, choices)


def attacked_settings(settings: Sequence[Setting], extra: Sequence[str]) -> frozenset | None:
    """The ids of the settings whose composed config runs an attack (an `attack=` override or
    a preset's), where `extra` sets an attack's option; None where it sets none (every override
    then applies to every setting)."""
    if not any(attack_option(o) for o in extra):
        return None
    return frozenset(s.id for s in settings if composed(s).get("attack", "none") != "none")


def check_composes(settings: Sequence[Setting], extra: Sequence[str] = ()) -> None:
    """Raise ConfigError naming the first setting whose overrides (with `extra`, the command's
    `--override`s) do not compose: an option a preset selects that does not exist for the
    method, a misspelt key."""
    attacked = attacked_settings(settings, extra)
    for setting in settings:
        try:
            composed(setting, overrides_for(extra, attacked is None or setting.id in attacked))
        except Exception as err:  # Hydra's errors have no common base but Exception
            lines = str(err).strip().splitlines() or [type(err).__name__]
            raise ConfigError(f"setting {setting.id}: does not compose: {lines[0]}") from None


def setting_configs(
    ids: Sequence[str],
    settings: Mapping[str, Setting],
    summaries: Mapping[str, Mapping[int, RunSummary]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Each setting's keys: from the summary of one of its runs, else composed."""
    out = {}
    for sid in ids:
        runs = [r for r in (summaries or {}).get(sid, {}).values() if r is not None and r.config]
        if runs:
            out[sid] = run_config(runs[0].config, runs[0].choices)
        else:
            out[sid] = composed(settings[sid])
    return out


def _fmt(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return str(value)


def common_values(configs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The essentials (`ESSENTIALS`) every one of `configs` has with one value: a tier's
    common settings, shown once above its table."""
    missing = object()
    ids = list(configs)
    if not ids:
        return {}
    first = configs[ids[0]]
    return {
        key: first[key]
        for key in ESSENTIALS
        if key in first and all(configs[s].get(key, missing) == first[key] for s in ids)
    }


def common_text(common: Mapping[str, Any]) -> str:
    return ", ".join(f"{key}={_fmt(value)}" for key, value in common.items())


def describe(
    ids: Sequence[str],
    configs: Mapping[str, Mapping[str, Any]],
    common: Mapping[str, Any] | None = None,
) -> str:
    """`shared: k=v, ...; differs: k (id1 v1 / id2 v2), ...` over the settings `ids`.

    `shared` leaves out what `common` (the tier's common settings, shown once) already says;
    `differs` names every key whose value differs between the sides, except a method's own
    options where the sides run different methods (a key under `algorithm.` that one side does
    not have: the `algorithm` choice, in the list, explains it)."""
    first = configs[ids[0]]
    missing = object()
    common = common or {}
    same = [
        f"{key}={_fmt(first[key])}"
        for key in ESSENTIALS
        if key in first
        and all(configs[s].get(key, missing) == first[key] for s in ids)
        and common.get(key, missing) != first[key]
    ]
    keys = sorted({k for s in ids for k in configs[s]})
    differs = []
    for key in keys:
        values = [configs[s].get(key, missing) for s in ids]
        if not any(v != values[0] for v in values):
            continue
        if key.startswith("algorithm.") and any(v is missing for v in values):
            continue  # an option of one method only
        named = " / ".join(
            f"{sid} {'—' if v is missing else _fmt(v)}" for sid, v in zip(ids, values)
        )
        differs.append(f"{key} ({named})")
    parts = [f"shared beyond the tier's common settings: {', '.join(same)}"] if same else []
    if len(ids) > 1:
        parts.append("differs: " + ("; ".join(differs) if differs else "nothing"))
    return "; ".join(parts) or "the tier's common settings"


def claim_setting_text(
    claim: Claim,
    settings: Mapping[str, Setting],
    summaries: Mapping[str, Mapping[int, RunSummary]] | None = None,
    common: Mapping[str, Any] | None = None,
) -> str:
    """The claim's note (what is measured) and its settings as composed, less the tier's
    `common` settings."""
    ids = settings_of(claim)
    text = describe(ids, setting_configs(ids, settings, summaries), common)
    return f"{claim.note}. {text}" if claim.note else text
