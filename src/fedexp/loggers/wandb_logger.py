"""Weights & Biases: one run per job; `round` is the step of every metric.

Group, name, job type and tags come from the Hydra job (`wandb_labels`): the seeds of one
setting share a group, so W&B's grouped mean ± std compares methods, not a pool of them. Each
evaluation also logs a histogram of the per-client accuracies; the partition statistics go in as
a table; accuracies keep their best-so-far value in the run summary (`<key>.max`, with `.last`).
W&B's own console output is off unless `verbose`.

The config holds the resolved `objective` (`eval/val/global/acc`, not `auto`). Offline when no
API key is configured; an offline single run logs one line saying so, with the command that
uploads it (`wandb sync <run dir>/wandb/offline-run-*`); a sweep says it once at its end
(`fedexp.sweep.SweepSummary`). Any W&B failure is a warning: it never stops a run. An
online `wandb.init` that gets no answer within `init_timeout` seconds (no network, a server down)
goes on offline, with one warning line saying how to upload the run later (`wandb sync`); later
jobs of the same process then go offline at once instead of waiting again.
"""

from __future__ import annotations

import csv
import logging
import os
import re
import shlex
from pathlib import Path

import numpy as np

from fedexp.core.callbacks import RoundReport, RunInfo
from fedexp.core.summary import RunSummary
from fedexp.core.types import ConfigError
from fedexp.loggers.base import Logger
from fedexp.loggers.wandb_labels import labels_from_run_dir

log = logging.getLogger(__name__)
_unreachable: str | None = None  # why the last online init failed in this process, if it did
# accuracies whose best-so-far value a summary keeps (not spreads, gaps or attack accuracies)
ACCURACY = re.compile(r"eval/.*(^|/)(client_)?acc(_mean|_min|_max|_p\d+)?")
HIST_BINS = 20  # per-client accuracy histogram: 20 bins of width 0.05 over [0, 1]
HIST_KEYS = {"global": "eval/global/client_acc_hist", "personal": "eval/personal/acc_hist"}


def _number(text: str):
    """A CSV cell as int or float where it is one."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def sync_command(run_dir: str | Path) -> str:
    """The command that uploads the offline W&B runs of a run dir (a resumed run has two)."""
    return f"wandb sync {shlex.quote(str(run_dir))}/wandb/offline-run-*"


class WandbLogger(Logger):
    """Logs every round to a W&B run (offline without an API key).

    Args:
        run_dir: the run directory (W&B writes its `wandb/` folder there).
        project: the W&B project.
        entity: the W&B entity (user or team); None: the API key's default.
        mode: online, offline or disabled; None: online with an API key, else offline.
        tags: tags added to the ones derived from the job (sweep, experiment, dataset).
        init_timeout: seconds an online `wandb.init` waits for the server, then offline.
        verbose: W&B's own console output (off: one warning line at most per job).
        log_checkpoint: at the end, log the run's checkpoint file as a `model` artifact.
    """

    def __init__(
        self,
        run_dir: str | Path,
        project: str,
        entity: str | None,
        mode: str | None,
        tags: list[str] | None,
        init_timeout: float,
        verbose: bool,
        log_checkpoint: bool,
    ):
        if init_timeout <= 0:
            raise ConfigError(f"logger.wandb.init_timeout: must be > 0, got {init_timeout}")
        self.init_timeout = float(init_timeout)
        self.run_dir = Path(run_dir)
        self.project, self.entity, self.tags = project, entity, list(tags or [])
        self.mode = mode or os.environ.get("WANDB_MODE") or self._default_mode()
        self.verbose, self.log_checkpoint = bool(verbose), bool(log_checkpoint)
        self.run = None
        self.best: set[str] = set()  # metrics defined with a best-so-far summary
        self.resume_id: str | None = None  # set on resume: continue this W&B run
        self.objective: str | None = None  # the run's resolved objective (`on_run_start`)
        self.choices: dict | None = None  # its group choices, the dataset labelled (idem)
        self.checkpoint_file: str | None = None  # its checkpoint's file name (idem)

    def state_dict(self) -> dict:
        """The W&B run id, saved in checkpoints so a resumed run continues the same W&B run."""
        run_id = getattr(self.run, "id", None) or self.resume_id
        return {"run_id": run_id} if run_id else {}

    def load_state_dict(self, state: dict) -> None:
        self.resume_id = state.get("run_id")

    def on_run_start(self, info: RunInfo) -> None:
        self.objective = info.objective
        self.choices = dict(info.choices) or None
        self.checkpoint_file = info.checkpoint_file
        super().on_run_start(info)

    @staticmethod
    def _default_mode() -> str:
        if os.environ.get("WANDB_API_KEY"):
            return "online"
        netrc = Path.home() / ".netrc"
        if netrc.exists() and "api.wandb.ai" in netrc.read_text(errors="ignore"):
            return "online"
        return "offline"

    def _guard(self, what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # W&B must never stop a run
            log.warning("W&B %s failed (%s: %s); the run goes on", what, type(err).__name__, err)
            return None

    def start(self, config: dict, run_name: str, group: str | None) -> None:
        global _unreachable
        labels = labels_from_run_dir(self.run_dir, config.get("seed"), self.choices)
        job_type, tags = None, list(self.tags)
        multirun = labels is not None and labels.multirun
        if labels is not None:  # a Hydra job: the labels of its setting
            run_name, group, job_type = labels.name, labels.group, labels.job_type
            config = {**config, **labels.config}
            tags += [t for t in labels.tags if t not in tags]
        if self.objective is not None:  # the metric, not `auto`
            config = {**config, "objective": self.objective}

        def _init(mode: str):
            import wandb

            return wandb.init(
                project=self.project,
                entity=self.entity,
                mode=mode,
                dir=str(self.run_dir),
                config=config,
                name=run_name,
                group=group,
                job_type=job_type,
                tags=tags,
                reinit="finish_previous",
                settings=wandb.Settings(init_timeout=self.init_timeout, silent=not self.verbose),
                # rounds re-run after the checkpoint are logged again with the same values
                **({"id": self.resume_id, "resume": "allow"} if self.resume_id else {}),
            )

        if self.mode != "online":
            self.run = self._guard("init", _init, self.mode)
            self._define_metrics()
            if self.run is not None and self.mode == "offline" and not multirun:
                log.info("W&B: offline; upload with: %s", sync_command(self.run_dir))
            return
        reason = _unreachable
        if reason is None:
            try:
                self.run = _init("online")
                self._define_metrics()
                return
            except Exception as err:  # W&B must never stop a run
                first = str(err).strip().splitlines()[0] if str(err).strip() else ""
                reason = f"{type(err).__name__}: {first[:160]}"
                _unreachable = f"as earlier in this process: {reason}"
        self.mode = "offline"
        self.run = self._guard("init", _init, "offline")
        self._define_metrics()
        if self.run is not None:
            log.warning(
                "W&B: online init failed (%s); logging offline; upload later with: wandb sync %s",
                reason,
                Path(self.run.dir).parent,
            )

    def _define_metrics(self) -> None:
        """`round` is the x-axis of every metric (W&B's charts and summaries use it)."""
        if self.run is not None:
            self._guard("define_metric", self.run.define_metric, "round")
            self._guard("define_metric", self.run.define_metric, "*", step_metric="round")

    def on_round_end(self, report: RoundReport) -> None:
        """Every round's metrics; an evaluated round's with a histogram of each kind of
        per-client accuracy (`eval/global/client_acc_hist`, `eval/personal/acc_hist`) in the
        same row."""
        metrics = {"round": report.round, **report.metrics}
        if self.run is not None and report.evaluated:
            for kind, accs in report.client_accs.items():
                hist = self._guard("histogram", self.histogram, accs)
                if hist is not None:
                    metrics[HIST_KEYS.get(kind, f"eval/{kind}/acc_hist")] = hist
        self.log_metrics(metrics, step=report.round)

    @staticmethod
    def histogram(accs):
        """A W&B histogram of accuracies on fixed bins (0.05 wide over [0, 1]), so that the
        rounds' histograms line up."""
        import wandb

        counts, edges = np.histogram(np.asarray(accs, dtype=float), HIST_BINS, range=(0.0, 1.0))
        return wandb.Histogram(np_histogram=(counts, edges))

    def log_metrics(self, metrics: dict, step: int) -> None:
        if self.run is None:
            return
        for key in metrics:  # an accuracy's summary keeps its best and its last value
            if key not in self.best and ACCURACY.fullmatch(key):
                self.best.add(key)
                self._guard(
                    "define_metric",
                    self.run.define_metric,
                    key,
                    step_metric="round",
                    summary="max,last",
                )
        self._guard("log", self.run.log, dict(metrics), step=step)

    def log_artifact(self, path: str | Path, kind: str) -> None:
        """A PNG as an image, a CSV (the partition statistics) as a table, at step 0 (before
        round 1); a resumed run logged them when it started."""
        if self.run is None or self.resume_id:
            return

        def _log():
            import wandb

            if str(path).endswith(".png"):
                self.run.log({kind: wandb.Image(str(path))}, step=0)
            elif str(path).endswith(".csv"):  # a table to sort and plot in the UI
                with open(path, newline="") as f:
                    rows = list(csv.reader(f))
                data = [[_number(cell) for cell in row] for row in rows[1:]]
                self.run.log({kind: wandb.Table(columns=rows[0], data=data)}, step=0)
            else:
                self.run.save(str(path), base_path=str(Path(path).parent), policy="now")

        self._guard("artifact", _log)

    def finish(self, summary: RunSummary) -> None:
        if self.run is None:
            return
        # an accuracy's summary already holds its best and last values
        final = {
            k: v
            for k, v in summary.metrics.items()
            if isinstance(v, int | float) and k not in self.best
        }
        # what changes what the numbers mean, beside them on the dashboard too
        facts = {
            "status": summary.status,
            "warnings": " | ".join(summary.warnings) or "none",
            "data_fingerprint": summary.data_fingerprint or "",
        }
        self._guard("summary", self.run.summary.update, {**final, **facts})
        if self.log_checkpoint:
            self._guard("checkpoint", self._log_checkpoint, summary)
        self._guard("finish", self.run.finish, exit_code=0 if summary.completed else 1)
        self.run = None

    def _log_checkpoint(self, summary: RunSummary) -> None:
        """The run dir's checkpoint as a `model` artifact (metadata: its round)."""
        import wandb

        if self.checkpoint_file is None:
            log.warning("W&B: the run named no checkpoint file; none logged")
            return
        path = self.run_dir / self.checkpoint_file
        if not path.exists():
            log.warning("W&B: no %s to log (checkpoint_every=0 and no stop signal)", path.name)
            return
        round_ = summary.checkpoint_round
        if round_ is not None and round_ != summary.rounds_completed:
            log.warning(
                "W&B: the checkpoint holds round %s of %s (checkpoint_every does not divide "
                "rounds)",
                round_,
                summary.rounds_completed,
            )
        artifact = wandb.Artifact(
            f"checkpoint-{self.run.id}", type="model", metadata={"round": round_}
        )
        artifact.add_file(str(path))
        self.run.log_artifact(artifact)
