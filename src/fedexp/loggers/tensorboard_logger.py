"""TensorBoard: one event-file directory per job, `<run dir>/tensorboard/`; `round` is the step.

Written with `torch.utils.tensorboard.SummaryWriter` (the `tensorboard` package), so
`tensorboard --logdir outputs` shows every run, and `--logdir <sweep dir>` every job of a sweep
(runs `0/tensorboard`, `1/tensorboard`, ...: Hydra's job dirs).

- Scalars: every numeric metric of every round under the name the CSV and W&B loggers give it
  (`train/loss`, `eval/global/acc`, `comm/up_bits`, ...), at step = the round; `round` itself
  is the step, not a scalar. TensorBoard keeps scalars as 32-bit floats.
- Histograms: each evaluation's per-client accuracies (`eval/global/client_acc_hist`,
  `eval/personal/acc_hist`; 20 bins of 0.05 over [0, 1], as W&B's).
- Images: the partition's label-distribution plot (`partition/label_distribution`, the PNG the
  run drew, `fedexp.data.partition_report`) at step 0.
- Text: `config` (the run's label and the resolved config as YAML, `objective` resolved), at
  step 0; `summary` (status, warnings, data fingerprint) at the last round.

Events are flushed after every round, so a running job shows its rounds as they end. A resumed
run purges the events after its checkpoint's round (`purge_step`) and logs those rounds again.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf

from fedexp.core.callbacks import RoundReport, RunInfo
from fedexp.core.summary import RunSummary
from fedexp.core.types import ConfigError
from fedexp.loggers.base import Logger
from fedexp.loggers.wandb_labels import labels_from_run_dir
from fedexp.loggers.wandb_logger import HIST_BINS, HIST_KEYS

SUBDIR = "tensorboard"  # the event files' directory in the run dir


def _scalar(value) -> float | None:
    """A metric as a TensorBoard scalar: ints, floats and bools; None for anything else."""
    if isinstance(value, bool | int | float | np.integer | np.floating):
        return float(value)
    return None


def _indented(text: str) -> str:
    """`text` as a Markdown code block (TensorBoard's text tab renders Markdown)."""
    return "".join(f"    {line}\n" for line in text.splitlines())


class TensorBoardLogger(Logger):
    """Logs every round to TensorBoard event files in `<run dir>/tensorboard/`.

    Args:
        run_dir: the run directory.
    """

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.log_dir = self.run_dir / SUBDIR
        self.writer = None
        self.purge_step: int | None = None  # set on resume: the first round logged again
        self.objective: str | None = None  # the run's resolved objective (`on_run_start`)
        self.choices: dict | None = None  # its group choices, the dataset labelled (idem)

    @classmethod
    def check_config(cls, cfg: DictConfig) -> None:
        """The `tensorboard` package is there (torch's SummaryWriter writes with it)."""
        if importlib.util.find_spec("tensorboard") is None:
            raise ConfigError(
                "logger.tensorboard: needs the tensorboard package (pip install tensorboard)"
            )

    def on_run_start(self, info: RunInfo) -> None:
        self.objective = info.objective
        self.choices = dict(info.choices) or None
        super().on_run_start(info)

    def truncate(self, last_round: int) -> None:
        """The rounds after `last_round` run again: their events are purged when it starts."""
        self.purge_step = last_round + 1

    def start(self, config: dict, run_name: str, group: str | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(self.log_dir), purge_step=self.purge_step)
        if self.purge_step is None:  # a resumed run logged its config when it started
            self.writer.add_text("config", self.config_text(config, run_name, group), 0)

    def config_text(self, config: dict, run_name: str, group: str | None) -> str:
        """The run's label (the W&B name and group of a Hydra job) and its config as YAML."""
        labels = labels_from_run_dir(self.run_dir, config.get("seed"), self.choices)
        if labels is not None:
            run_name, group = labels.name, labels.group
            config = {**config, **labels.config}
        if self.objective is not None:  # the metric, not `auto`
            config = {**config, "objective": self.objective}
        head = f"**{run_name}**" + (f" (group `{group}`)" if group else "")
        return f"{head}\n\n{_indented(OmegaConf.to_yaml(OmegaConf.create(config)))}"

    def on_round_end(self, report: RoundReport) -> None:
        """Every round's scalars; an evaluated round's per-client accuracy histograms."""
        self.log_metrics(dict(report.metrics), step=report.round)
        if self.writer is not None and report.evaluated:
            bins = np.linspace(0.0, 1.0, HIST_BINS + 1)
            for kind, accs in report.client_accs.items():
                values = np.asarray(accs, dtype=float)
                values = values[np.isfinite(values)]  # a client with no test data: NaN
                if values.size:
                    tag = HIST_KEYS.get(kind, f"eval/{kind}/acc_hist")
                    self.writer.add_histogram(tag, values, report.round, bins=bins)
        if self.writer is not None:
            self.writer.flush()

    def log_metrics(self, metrics: dict, step: int) -> None:
        if self.writer is None:
            return
        for key, value in metrics.items():
            number = _scalar(value)
            if key != "round" and number is not None:
                self.writer.add_scalar(key, number, step)

    def log_artifact(self, path: str | Path, kind: str) -> None:
        """A PNG (the partition's label-distribution plot) as an image at step 0; a resumed run
        logged it when it started. Other files stay in the run dir only."""
        if self.writer is None or self.purge_step is not None or not str(path).endswith(".png"):
            return
        from PIL import Image

        with Image.open(path) as image:
            pixels = np.asarray(image.convert("RGB"))
        self.writer.add_image(kind, pixels, 0, dataformats="HWC")

    def finish(self, summary: RunSummary) -> None:
        if self.writer is None:
            return
        facts = {
            "status": summary.status,
            "rounds completed": summary.rounds_completed,
            "warnings": " | ".join(summary.warnings) or "none",
            "data fingerprint": summary.data_fingerprint or "",
        }
        text = "\n".join(f"- {key}: {value}" for key, value in facts.items())
        self.writer.add_text("summary", text, summary.rounds_completed)
        self.writer.close()
        self.writer = None
