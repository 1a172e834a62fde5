"""The saved config of a run dir: read back for `resume=` and `fedexp.evaluate`, with the few keys
a resume may change."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from fedexp.config.build import labelled_choices
from fedexp.core.summary import ADDED_KEYS
from fedexp.errors import ConfigError

RESUME_OVERRIDABLE = (
    "device", "threads", "malloc_keep", "progress", "progress_every_s", "checkpoint_every"
)  # fmt: skip


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
        if key not in RESUME_OVERRIDABLE:
            raise ConfigError(
                f"{key}: a resumed run keeps its config; only {', '.join(RESUME_OVERRIDABLE)} "
                "may be given with resume="
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
