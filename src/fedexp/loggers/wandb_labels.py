"""How a job appears in W&B: its group, name, job type, tags and the Hydra facts in its config.

Everything is read from the files Hydra writes before a job starts (`<run dir>/.hydra/hydra.yaml`
and, in a multirun, `<sweep dir>/multirun.yaml`), so a resumed run gets the same labels as the
run it continues.

- group: the config without the seed, readable (`fedprox mu=0.01 digits shards`): the
  algorithm, the command-line overrides that define results (not the seed, nor `eval_every`,
  `checkpoint_every`, logger, device, thread, executor or path keys: `NOT_A_SETTING`), then the
  dataset and partition. The seeds of one setting share a group; different methods or values
  never do.
- name: the algorithm, the overrides that differ between the jobs of the sweep (all the
  overrides for a single run) and the seed (`fedprox mu=0.01 s1`).
- job_type: the algorithm. Tags: `sweep:<name>`, `experiment:<preset>`, `dataset:<name>`.

`swept_values` gives the values a sweep varies to the progress lines' run label too.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# overrides that never change results (or are the seeds being pooled): not in group or name;
# the logging, checkpointing, evaluation schedule, file and device keys, and the executor (every
# executor trains the same models)
NOT_A_SETTING = ("seed", "hydra", "logger", "progress", "device", "threads", "paths", "resume")
NOT_A_SETTING += ("progress_every_s",)
NOT_A_SETTING += ("checkpoint_every", "client_store", "hparams_search", "objective")
NOT_A_SETTING += ("eval_every", "executor")
# choices shown after the overrides, in this order, whether overridden or not
TRAILING = ("dataset", "partition")
MAX_GROUP = 128  # W&B's limit on a group name
MAX_TAG = 64  # W&B's limit on a tag


@dataclass(frozen=True)
class WandbLabels:
    """The group, name, job type, tags and config extras of one W&B run."""

    group: str | None
    name: str
    job_type: str | None
    tags: tuple[str, ...] = ()
    config: dict[str, Any] = field(default_factory=dict)
    multirun: bool = False  # a job of a sweep


def short_value(value: str, digits: int = 4) -> str:
    """An override's value as shown: floats to `digits` significant digits (0.0187381 ->
    0.01874), anything else as written."""
    try:
        number = float(value)
    except ValueError:
        return value
    if re.fullmatch(r"[+-]?\d+", value.strip()):
        return value.strip()
    return f"{number:.{digits}g}"


def _split(override: str) -> tuple[str, str]:
    key, _, value = override.partition("=")
    return key.lstrip("+~"), value


def _is_setting(key: str) -> bool:
    return key.split(".")[0].split("@")[0] not in NOT_A_SETTING


def short_keys(keys: list[str]) -> dict[str, str]:
    """Each dotted key's last part (`algorithm.mu` -> `mu`), the full key where two would clash."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: s if last.count(s) == 1 else k for k, s in zip(keys, last)}


def _words(overrides: list[str], choices: dict, keys: set[str] | None) -> list[str]:
    """`key=value` words of the overrides (only `keys` if given), the algorithm and TRAILING
    choices left out (they are shown on their own)."""
    pairs = [_split(o) for o in overrides]
    pairs = [
        (k, v)
        for k, v in pairs
        if _is_setting(k) and k != "algorithm" and k not in TRAILING and (keys is None or k in keys)
    ]
    short = short_keys([k for k, _ in pairs])
    return [f"{short[k]}={short_value(v)}" for k, v in pairs]


def group_name(overrides: list[str], choices: dict) -> str:
    """The config without the seed, readable: algorithm, overrides, dataset, partition."""
    words = [str(choices.get("algorithm") or "run"), *_words(overrides, choices, None)]
    words += [str(choices[k]) for k in TRAILING if choices.get(k)]
    name = " ".join(words)
    if len(name) > MAX_GROUP:  # keep it unique: a digest of the whole name at the end
        digest = hashlib.sha1(name.encode()).hexdigest()[:8]
        name = name[: MAX_GROUP - 10] + ".." + digest
    return name


def sweep_keys(sweep_overrides: list[str], sweeper_params: dict | None) -> set[str]:
    """The keys a sweep varies: overrides with sweep syntax (`a=1,2`, `range(...)`,
    `choice(...)`) and the sweeper's `params` (Optuna's search space)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    keys = {_split(k)[0] for k in (sweeper_params or {})}
    try:
        parsed = OverridesParser.create().parse_overrides(list(sweep_overrides))
    except Exception:  # an override Hydra itself accepted; fall back to the comma test
        return keys | {_split(o)[0] for o in sweep_overrides if "," in _split(o)[1]}
    return keys | {p.key_or_group for p in parsed if p.is_sweep_override()}


def _load(path: Path) -> dict:
    from omegaconf import OmegaConf

    if not path.exists():
        return {}
    return OmegaConf.to_container(OmegaConf.load(path), resolve=False).get("hydra", {}) or {}


def sweep_name(hydra: dict, sweep_dir: Path) -> str:
    """The Optuna study's name, else the sweep dir's name (with its date folder, if any)."""
    study = (hydra.get("sweeper") or {}).get("study_name")
    if study:
        return str(study)
    parent = sweep_dir.parent.name
    dated = re.fullmatch(r"\d{4}-\d{2}-\d{2}", parent) is not None
    return f"{parent}/{sweep_dir.name}" if dated else sweep_dir.name


def labels_from_run_dir(
    run_dir: str | Path, seed: Any, choices: dict | None = None
) -> WandbLabels | None:
    """The labels of the job in `run_dir` from Hydra's files there; None without them.

    `choices`: the run's group choices as the wiring labels them (`RunInfo.choices`, the dataset
    named by an overridden `dataset._target_`); None: Hydra's own choices in the run dir."""
    run_dir = Path(run_dir)
    hydra = _load(run_dir / ".hydra" / "hydra.yaml")
    if not hydra:
        return None
    if choices is None:
        runtime_choices = (hydra.get("runtime") or {}).get("choices") or {}
        choices = {k: v for k, v in runtime_choices.items() if not k.startswith("hydra")}
    overrides = list((hydra.get("overrides") or {}).get("task") or [])
    tags = []
    keys: set[str] | None = None  # a single run: every override tells it apart
    if str(hydra.get("mode")) == "MULTIRUN":
        sweep = _load(run_dir.parent / "multirun.yaml")
        sweep_overrides = list((sweep.get("overrides") or {}).get("task") or [])
        keys = sweep_keys(sweep_overrides, (hydra.get("sweeper") or {}).get("params"))
        tags.append(f"sweep:{sweep_name(hydra, run_dir.parent)}")
    algorithm = choices.get("algorithm")
    if choices.get("experiment"):
        tags.append(f"experiment:{choices['experiment']}")
    if choices.get("dataset"):
        tags.append(f"dataset:{choices['dataset']}")
    swept = [str(choices[k]) for k in TRAILING if keys is not None and k in keys]
    words = [str(algorithm or "run"), *_words(overrides, choices, keys), *swept, f"s{seed}"]
    name = " ".join(words)
    return WandbLabels(
        group=group_name(overrides, choices),
        name=name,
        job_type=str(algorithm) if algorithm else None,
        tags=tuple(t[:MAX_TAG] for t in tags),
        config={"choices": choices, "overrides": overrides},
        multirun=keys is not None,
    )


def swept_values(run_dir: str | Path) -> list[tuple[str, str]]:
    """(short key, value as shown) of each value the sweep of the job in `run_dir` varies: its
    overrides with sweep syntax and Optuna's searched params, then a swept partition (`partition`,
    its choice); the algorithm, dataset and seed left out. [] outside a multirun."""
    run_dir = Path(run_dir)
    hydra = _load(run_dir / ".hydra" / "hydra.yaml")
    if str(hydra.get("mode")) != "MULTIRUN":
        return []
    choices = (hydra.get("runtime") or {}).get("choices") or {}
    overrides = list((hydra.get("overrides") or {}).get("task") or [])
    sweep = _load(run_dir.parent / "multirun.yaml")
    sweep_overrides = list((sweep.get("overrides") or {}).get("task") or [])
    keys = sweep_keys(sweep_overrides, (hydra.get("sweeper") or {}).get("params"))
    pairs = [tuple(word.split("=", 1)) for word in _words(overrides, choices, keys)]
    swept = [k for k in TRAILING if k != "dataset" and k in keys and choices.get(k)]
    return [*pairs, *((k, str(choices[k])) for k in swept)]
