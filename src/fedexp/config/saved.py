"""The saved config of a run dir: read back for `resume=` and `fedexp.evaluate`, with the few keys
a resume may change."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from fedexp.config.build import labelled_choices
from fedexp.core.summary import ADDED_KEYS
from fedexp.errors import ConfigError

RESUME_OVERRIDABLE = (
    "device", "threads", "malloc_keep", "progress", "progress_every_s", "checkpoint_every"
)  # fmt: skip
EXTENDS = "rounds"  # given with resume=, a larger total: the run extends (`fedexp.run.extend`)


def read_yaml(path: Path, who: str = "resume") -> DictConfig:
    """A run dir's saved YAML mapping; anything else is a one-line ConfigError naming it (and
    `who` read it: `resume`, `evaluate`)."""
    try:
        cfg = OmegaConf.load(path)
    except Exception as err:  # YAML syntax, undecodable bytes, unreadable file
        first = (str(err).strip().splitlines() or [""])[0][:120]
        raise ConfigError(
            f"{who}: {path} is not a readable config ({type(err).__name__}: {first})"
        ) from None
    if isinstance(cfg, ListConfig) or not isinstance(cfg, DictConfig):
        raise ConfigError(f"{who}: {path} is not a config (a mapping of keys)")
    return cfg


def add_new_keys(cfg: DictConfig) -> DictConfig:
    """`cfg` with every `ADDED_KEYS` option its components lack, at its old behaviour (an
    older run dir resumes and evaluates as it ran)."""
    for group in ("algorithm",):
        node = cfg.get(group)
        target = node.get("_target_") if isinstance(node, DictConfig) else None
        missing = {k: v for k, v in ADDED_KEYS.get(str(target), {}).items() if k not in node}
        if missing:
            with open_dict(cfg):
                cfg[group] = OmegaConf.merge(node, missing)
    return cfg


def load_run_config(
    run_dir: str | Path, overrides: Sequence[str] = ()
) -> tuple[DictConfig, dict, str | None]:
    """The saved config of a run dir, for `python -m fedexp resume=<run dir>`.

    Returns (config, Hydra group choices, W&B group). Only keys that do not change results
    (`RESUME_OVERRIDABLE`) may be overridden; anything wrong is a one-line ConfigError. Whether
    the run dir can be resumed at all: `fedexp.runtime.resume.check_resumable`.
    """
    run_dir = Path(run_dir)
    cfg_path = run_dir / ".hydra" / "config.yaml"
    if not cfg_path.exists():
        raise ConfigError(f"resume: {run_dir} is not a run dir (no .hydra/config.yaml)")
    cfg = add_new_keys(read_yaml(cfg_path))
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        if key not in (*RESUME_OVERRIDABLE, EXTENDS):
            raise ConfigError(
                f"{key}: a resumed run keeps its config; only {', '.join(RESUME_OVERRIDABLE)} "
                f"may be given with resume= (and {EXTENDS}=N, to extend the run to N rounds)"
            )
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([f"{key}={value}"]))
    OmegaConf.set_struct(cfg, True)
    choices, group = {}, None
    hydra_path = run_dir / ".hydra" / "hydra.yaml"
    if hydra_path.exists():
        hydra = OmegaConf.to_container(read_yaml(hydra_path), resolve=False).get("hydra", {})
        runtime_choices = hydra.get("runtime", {}).get("choices", {})
        choices = {k: v for k, v in runtime_choices.items() if not k.startswith("hydra")}
        choices = labelled_choices(choices, OmegaConf.select(cfg, "dataset._target_"))
        group = run_dir.parent.name if str(hydra.get("mode")) == "MULTIRUN" else None
    return cfg, choices, group


def saved_rounds(run_dir: str | Path) -> int | None:
    """`rounds` in a run dir's `.hydra/config.yaml` (None: not a number there, or unreadable)."""
    try:
        rounds = OmegaConf.load(Path(run_dir) / ".hydra" / "config.yaml").get(EXTENDS)
    except Exception:  # `load_run_config` refuses an unreadable config, naming it
        return None
    return rounds if isinstance(rounds, int) and not isinstance(rounds, bool) else None


def extension_rounds(overrides: Sequence[str]) -> int | None:
    """The `rounds=N` of a resume's overrides (None: not given); N not a whole number >= 1 is
    a one-line ConfigError."""
    given = [o.partition("=")[2] for o in overrides if o.lstrip("+~").partition("=")[0] == EXTENDS]
    if not given:
        return None
    try:
        rounds = int(given[-1])
    except ValueError:
        rounds = 0
    if rounds < 1 or str(rounds) != given[-1].strip():
        raise ConfigError(f"{EXTENDS}: a whole number of rounds >= 1, got {given[-1]!r}")
    return rounds


def save_rounds(run_dir: str | Path, rounds: int) -> None:
    """Record an extended run's new total in its run dir: `rounds` in `.hydra/config.yaml` and
    `rounds=N` in `.hydra/overrides.yaml` (what a later resume, the report and the final table's
    title read). Each file is rewritten only where it says otherwise, through a temp file and a
    rename; a run dir without them (a script's) is left alone."""
    hydra = Path(run_dir) / ".hydra"
    path = hydra / "config.yaml"
    if path.is_file():
        cfg = OmegaConf.load(path)
        if cfg.get(EXTENDS) != rounds:
            cfg[EXTENDS] = rounds
            _replace(path, OmegaConf.to_yaml(cfg))
    path = hydra / "overrides.yaml"
    if path.is_file():
        items = OmegaConf.to_container(OmegaConf.load(path))
        if isinstance(items, list):
            line = f"{EXTENDS}={rounds}"
            at = [i for i, o in enumerate(items) if str(o).lstrip("+").partition("=")[0] == EXTENDS]
            new = [line if i in at else o for i, o in enumerate(items)] + ([] if at else [line])
            if new != items:
                _replace(path, OmegaConf.to_yaml(OmegaConf.create(new)))


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
