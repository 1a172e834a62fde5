"""`python -m fedexp.evaluate <run dir> [split=test|val] [dataset=<name>] [device=...]`: evaluate
the final models a run saved (`model.pt`, `personal_models/`; `fedexp.runtime.final_model`).

The run's components are rebuilt from its `.hydra/config.yaml` (the data, partitioned as in
the run, and the algorithm, whose evaluation modules take the saved weights), and the saved
global and personal models are evaluated exactly as a run evaluates them (fine-tuned copies of
the global model too, where the run set `eval.finetune_epochs`)
(`fedexp.engine.eval.all_clients.evaluate`): the same metric names (`eval/global/acc`,
`eval/personal/acc_mean`, ...; `eval/val/...` with `split=val`), and on the run's own data the
same values as the run's final evaluation. They go to `<run dir>/evaluate/<split>.json`
(`<split>-<tag>.json` on other data: `dataset=<name>` evaluates on another dataset of
conf/dataset, its `dataset` node with the run's model, partition and seed, and
`dataset.<key>=<value>` changes one option of the data; the tag is `<name>` and
`<key>=<value>` joined by `-`) and into a table. Bad input is one line on stderr, exit 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table
from torch.utils._pytree import tree_map

from fedexp.config.build import find_conf
from fedexp.config.pool import resolve_server_pool
from fedexp.config.saved import add_new_keys, read_yaml
from fedexp.core.algorithm import PersonalBatch
from fedexp.engine.eval.all_clients import evaluate
from fedexp.engine.eval.backdoor import backdoor_metrics
from fedexp.engine.eval.finetuned import Finetune
from fedexp.errors import ConfigError
from fedexp.loggers.files import write_json_atomic
from fedexp.runtime.checkpoint import config_hash
from fedexp.runtime.final_model import MODEL_FILE, load_attrs

SPLITS = ("test", "val")
OVERRIDABLE = ("split", "dataset", "device", "threads")
EXIT_CONFIG = 2
USAGE = (
    "usage: python -m fedexp.evaluate <run dir> [split=test|val] [dataset=<name>] "
    "[dataset.<key>=<value>] [device=auto|cpu|cuda] [threads=<n>]"
)
HELP = f"""{USAGE}

Evaluate the final models a run saved (model.pt, personal_models/) as the run evaluates them,
on the data of its .hydra/config.yaml: the same metrics as the run's final evaluation. Prints a
table and writes <run dir>/evaluate/<split>.json.

  <run dir>               a run dir with model.pt (every run writes it when it ends)
  split=test|val          the split evaluated (default test; val where the run has one)
  dataset=<name>          another dataset of conf/dataset/ that fits the model
  dataset.<key>=<value>   one option of the data changed (written as <split>-<tag>.json)
  device=..., threads=... where and with how many CPU threads it runs

Bad input: one line on stderr, exit code 2. Details: docs/lifecycle.md ("The final model").
"""


def load_saved(run_dir: Path) -> dict:
    """`model.pt` of `run_dir`; a missing or unreadable one is a one-line ConfigError."""
    path = run_dir / MODEL_FILE
    if not path.is_file():
        raise ConfigError(f"{run_dir} has no {MODEL_FILE} (a run writes it when it ends)")
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        first = (str(err).strip().splitlines() or [""])[0][:120]
        raise ConfigError(f"{path} is not readable ({type(err).__name__}: {first})") from None
    if not isinstance(saved, dict) or "meta" not in saved or "state_dict" not in saved:
        raise ConfigError(f"{path} is not a fedexp final model")
    return saved


class SavedModels:
    """The final models of a run dir as an algorithm's evaluation hooks: the saved weights
    loaded into the run's own evaluation modules (`algorithm.global_model` /
    `personal_model`), so `evaluate(models, None, data)` runs exactly as in the run."""

    def __init__(self, algorithm, run_dir: Path, saved: dict):
        self.algorithm = algorithm
        self.saved = saved
        self.state = algorithm.init_state()  # any state: every weight is then loaded
        personal = saved["meta"].get("personal")
        self.personal: dict[int, dict] | None = None
        if personal is not None:
            self.personal = {}
            for name in personal["files"]:
                path = run_dir / personal["dir"] / name
                try:
                    self.personal.update(torch.load(path, map_location="cpu", weights_only=True))
                except Exception as err:
                    raise ConfigError(f"{path}: cannot read it ({type(err).__name__})") from None
        # the personal batch as the algorithm forms it: with its own `personal_models` hook
        # the tensors common to every client are shared (FedRep's body), the rest stacked
        self.own_batches = algorithm.batches_personal_models
        self._common: set[str] | None = None  # the tensors every client's model has equal

    def _load(self, model: torch.nn.Module, record: dict) -> torch.nn.Module:
        device = next(iter(model.state_dict().values()), torch.zeros(0)).device
        model.load_state_dict({k: v.to(device) for k, v in record["state_dict"].items()})
        load_attrs(model, {n: _to(v, device) for n, v in record["attrs"].items()})
        return model

    def global_model(self, state=None):
        if self.saved["state_dict"] is None:
            return None
        model = self.algorithm.global_model(self.state)
        return self._load(model, self.saved)

    def personal_model(self, state=None, client_id: int = 0):
        if self.personal is None:
            return None
        return self._load(
            self.algorithm.personal_model(self.state, client_id), self.personal[client_id]
        )

    def personal_models(self, state, client_ids):
        if self.personal is None or not self.own_batches:
            return None
        model = self.personal_model(state, client_ids[0])
        records = [self.personal[c]["state_dict"] for c in client_ids]
        if self._common is None:
            every = [r["state_dict"] for r in self.personal.values()]
            first = every[0]
            self._common = {n for n, t in first.items() if all(torch.equal(r[n], t) for r in every)}
        device = next(iter(model.state_dict().values())).device
        shared = {n: t.to(device) for n, t in records[0].items() if n in self._common}
        stacked = {
            n: torch.stack([r[n] for r in records]).to(device)
            for n in records[0]
            if n not in self._common
        }
        return PersonalBatch(model, shared, stacked)


def _to(value, device):
    return tree_map(lambda v: v.to(device) if torch.is_tensor(v) else v, value)


def parse_args(args: list[str]) -> tuple[Path, str, list[str]]:
    """(run dir, split, overrides of the run's config)."""
    run_dir, split, overrides = None, "test", []
    for arg in args:
        key, eq, value = arg.partition("=")
        if not eq:
            if run_dir is not None:
                raise ConfigError(f"one run dir at a time (got {run_dir} and {arg})")
            run_dir = Path(arg)
        elif key == "split":
            if value not in SPLITS:
                raise ConfigError(f"split: must be one of {', '.join(SPLITS)}, got {value!r}")
            split = value
        elif key.split(".")[0] in OVERRIDABLE:
            overrides.append(arg)
        else:
            raise ConfigError(f"{key}: only {', '.join(f'{k}=' for k in OVERRIDABLE)} may be given")
    if run_dir is None:
        raise ConfigError(USAGE)
    return run_dir, split, overrides


def run_config(run_dir: Path, overrides: list[str] = ()) -> tuple[DictConfig, str | None]:
    """The run's saved config with `overrides` applied (`dataset=<name>` first, then the keys);
    returns (config, the data's tag: `<name>` and `<key>=<value>` of the dataset overrides,
    joined by `-`; None on the run's own data)."""
    path = run_dir / ".hydra" / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"{run_dir} is not a run dir (no .hydra/config.yaml)")
    cfg = add_new_keys(read_yaml(path, "evaluate"))  # an older run dir: options added since
    named = [o for o in overrides if o.partition("=")[0] == "dataset"]
    tag = []
    for override in named[-1:]:
        value = override.partition("=")[2]
        node = Path(find_conf()) / "dataset" / f"{value}.yaml"
        if not node.is_file():
            names = sorted(p.stem for p in node.parent.glob("*.yaml"))
            raise ConfigError(f"dataset: no dataset {value!r} (one of {', '.join(names)})")
        cfg.dataset = OmegaConf.load(node).dataset
        tag.append(value)
    for override in (o for o in overrides if o.partition("=")[0] != "dataset"):
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([override]))
        if override.startswith("dataset."):
            tag.append(override.removeprefix("dataset.").replace("/", "_"))
    return cfg, "-".join(tag) or None


def open_run(run_dir: str | Path, overrides: list[str] = ()):
    """(config, components, `SavedModels`, the data's tag or None) of a run dir's final models,
    its components rebuilt from its saved config with `overrides`; a one-line ConfigError when
    it is not a run dir, has no (readable) model.pt, or was written for another config."""
    # here for start-up time: a bad command line is answered before the run's modules load
    from fedexp.run import build_components

    run_dir = Path(run_dir)
    cfg, dataset = run_config(run_dir, list(overrides))
    resolve_server_pool(cfg)  # as the run resolved it before hashing its config
    saved = load_saved(run_dir)
    if dataset is None and saved["meta"].get("config_hash") != str(config_hash(cfg)):
        # e.g. under another FEDEXP_DATA_DIR; the weights are still checked against the model
        print(
            f"fedexp.evaluate: warning: {run_dir / MODEL_FILE} was written for a config other "
            "than the one the run dir's .hydra/config.yaml resolves to now",
            file=sys.stderr,
        )
    components = build_components(cfg, run_dir)
    return cfg, components, SavedModels(components.algorithm, run_dir, saved), dataset


def load_models(run_dir: str | Path, overrides: list[str] = ()) -> SavedModels:
    """The final models of a run dir in the run's own modules: `.global_model()` (None where the
    algorithm has none) and `.personal_model(client_id=i)` (None without personal models)."""
    return open_run(run_dir, overrides)[2]


def evaluate_run(
    run_dir: str | Path, split: str = "test", overrides: list[str] = ()
) -> tuple[dict, dict]:
    """Evaluate a run dir's final models; returns (metrics of `split`, the report written)."""
    run_dir = Path(run_dir)
    if split not in SPLITS:
        raise ConfigError(f"split: must be one of {', '.join(SPLITS)}, got {split!r}")
    cfg, c, models, dataset = open_run(run_dir, overrides)
    if split == "val" and not c.data.has_val:
        raise ConfigError(
            "split: val, but the run has no validation split (partition.val_fraction)"
        )
    personal_clients = OmegaConf.select(cfg, "eval.personal_clients", default=None)
    epochs = OmegaConf.select(cfg, "eval.finetune_epochs", default=0) or 0
    # the run's fine-tuning, keyed by the saved model's round: its final eval/finetuned/*
    finetune = Finetune(epochs, c.client, models.saved["meta"]["round"]) if epochs else None
    try:
        with torch.no_grad():
            scalars, per_client = evaluate(
                models, None, c.data, personal_clients, cfg.seed, finetune
            )
            scalars.update(
                backdoor_metrics(c.attack, models, None, c.data, personal_clients, cfg.seed)
            )
    except RuntimeError as err:  # weights that do not fit the model built for this data
        first = (str(err).strip().splitlines() or [""])[0][:160]
        raise ConfigError(f"the saved model does not fit this data ({first})") from None
    val = split == "val"
    metrics = {k: v for k, v in scalars.items() if k.startswith("eval/val/") == val}
    report = {
        "run_dir": str(run_dir),
        "split": split,
        "dataset": dataset,
        "round": models.saved["meta"]["round"],
        "metrics": metrics,
        "client_acc": per_client if split == "test" else {},
    }
    out = run_dir / "evaluate"
    out.mkdir(exist_ok=True)
    write_json_atomic(out / f"{split}{f'-{dataset}' if dataset else ''}.json", report)
    return metrics, report


def print_report(report: dict) -> None:
    on = f" on {report['dataset']}" if report["dataset"] else ""
    table = Table(title=f"{report['run_dir']}: round {report['round']}, {report['split']}{on}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in sorted(report["metrics"].items()):
        table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    Console().print(table)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if any(arg in ("-h", "--help") for arg in args):
        print(HELP, end="")
        return
    try:
        run_dir, split, overrides = parse_args(args)
        _, report = evaluate_run(run_dir, split, overrides)
    except (ConfigError, OSError) as err:
        print(f"fedexp.evaluate: error: {err}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    print_report(report)


if __name__ == "__main__":
    main()
