"""A sweep that continues: the same multirun command with the same `hydra.sweep.dir` again.

Jobs keep their numbers (`hydra.sweep.subdir` is `${hydra.job.num}`, and the same overrides
expand into the same jobs in the same order), so each job finds its own dir from before:

- a job that finished (`summary.json` says completed, diverged, pruned or config_error) is kept:
  nothing runs, its dir is not written (Hydra's `.hydra/` files stay as they were);
- an interrupted job (a checkpoint, no finished summary) resumes from its checkpoint as
  `python -m fedexp resume=<job dir>` does;
- a job that never started (or stopped before its first checkpoint) runs from the start.

A re-run whose sweep differs from the stored one (`<sweep dir>/multirun.yaml`: other overrides,
in another order, another sweeper) is refused before anything is written (`check_same_sweep`).
A stopped sweep names the one command that continues it (`continue_line`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shlex
import signal
import sys
from pathlib import Path
from typing import Any

from fedexp.errors import ConfigError

FINISHED = ("completed", "diverged", "pruned", "config_error")
LEFTOVERS = ("metrics.jsonl", "metrics.csv", "summary.json", "partition_stats.csv")
LEFTOVERS += ("partition_labels.png", "model.pt")

sweep_dir: Path | None = None  # the sweep this process runs (set when it starts)


def job_state(job_dir: Path) -> str:
    """`finished`, `resume` (a checkpoint to continue from) or `fresh` (run from the start)."""
    try:
        status = json.loads((job_dir / "summary.json").read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        status = None
    if status in FINISHED:
        return "finished"
    return "resume" if (job_dir / "checkpoint.pt").is_file() else "fresh"


def saved_objective(job_dir: Path) -> float | None:
    """The objective a finished job reported (what the sweeper is handed again)."""
    from fedexp.core.summary import RunSummary  # start-up: read only when a sweep continues

    try:
        summary = RunSummary.from_dict(json.loads((job_dir / "summary.json").read_text()))
    except (OSError, ValueError, AttributeError, TypeError):
        return None
    return summary.objective.value if summary.objective is not None else None


def clear_leftovers(job_dir: Path) -> None:
    """The files of a job that stopped before its first checkpoint: it starts again."""
    for name in LEFTOVERS:
        (job_dir / name).unlink(missing_ok=True)


def _saved_sweep(path: Path) -> dict:
    from omegaconf import OmegaConf

    try:
        saved = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except Exception as err:  # a damaged multirun.yaml: the sweep cannot be compared
        raise ConfigError(
            f"hydra.sweep.dir: {path} cannot be read ({err}); choose another dir"
        ) from None
    return saved if isinstance(saved, dict) else {}


def sweep_key(hydra: Any) -> tuple[list[str], str, Any]:
    """(the task overrides as typed, the sweeper's target, its search space) of a sweep."""
    hydra = hydra if isinstance(hydra, dict) else {}
    overrides = [str(o) for o in (hydra.get("overrides") or {}).get("task") or []]
    sweeper = hydra.get("sweeper") or {}
    return overrides, str(sweeper.get("_target_", "")), sweeper.get("params")


def difference(saved: tuple, now: tuple) -> str | None:
    """The first difference between two `sweep_key`s, in words; None when they are the same."""
    (old, old_sweeper, old_params), (new, new_sweeper, new_params) = saved, now
    if old != new:
        gone = [o for o in old if o not in new]
        added = [o for o in new if o not in old]
        if not gone and not added:
            return f"the same overrides in another order ({' '.join(old)}); the jobs would renumber"
        parts = [
            f"it ran {' '.join(gone)}" if gone else "",
            f"now {' '.join(added)}" if added else "",
        ]
        return "; ".join(p for p in parts if p)
    if old_sweeper != new_sweeper:
        return f"it ran with the sweeper {old_sweeper or '?'}, now {new_sweeper or '?'}"
    if old_params != new_params:
        return f"hydra.sweeper.params: it searched {old_params}, now {new_params}"
    return None


def check_same_sweep(sweep: Path, config: Any) -> bool:
    """Whether `sweep` holds a sweep to continue (False: a new one); a stored sweep that differs
    from this one is a one-line ConfigError naming the difference."""
    from omegaconf import OmegaConf

    stored = sweep / "multirun.yaml"
    jobs = [p.parent.name for p in sweep.glob("*/.hydra")]
    if not stored.exists():
        if jobs:
            raise ConfigError(
                f"hydra.sweep.dir: {sweep} holds jobs but no multirun.yaml; choose another dir "
                "(or resume its jobs one at a time with resume=<sweep dir>/<job>)"
            )
        return False
    saved = sweep_key(_saved_sweep(stored).get("hydra"))
    now = sweep_key(OmegaConf.to_container(config.hydra, resolve=False))
    differs = difference(saved, now)
    if differs is not None:
        raise ConfigError(
            f"hydra.sweep.dir: {sweep} holds another sweep ({differs}); continue it with its "
            "own overrides, or choose another dir"
        )
    return True


def prepare_job(job_dir: Path, overrides: list[str]) -> tuple[str, Any]:
    """What a sweep job does with its dir: (`finished`, its objective), (`fresh`, None) with the
    leftovers of a start without a checkpoint removed, or (`resume`, None) checked as
    `resume=<job dir>` checks it (`resume`, a ConfigError: it cannot be resumed). The dir of
    another job stops the sweep (one line, exit 2)."""
    try:
        check_same_job(job_dir, overrides)
    except ConfigError as err:  # the dir of another job: the sweep stops, the dir untouched
        print(f"fedexp: error: {err}", file=sys.stderr)
        sys.exit(2)
    state = job_state(job_dir)
    if state == "finished":
        return state, saved_objective(job_dir)
    if state == "fresh":
        clear_leftovers(job_dir)
        return state, None
    from fedexp.runtime.resume import check_resumable  # start-up: only a job that resumes

    logging.getLogger(__name__).info("the sweep continues: this job resumes from its checkpoint")
    try:
        check_resumable(job_dir)
    except ConfigError as err:
        return state, err
    return state, None


def check_same_job(job_dir: Path, overrides: list[str]) -> None:
    """A job dir from before holds the job of these overrides (else a ConfigError)."""
    from omegaconf import OmegaConf

    path = job_dir / ".hydra" / "overrides.yaml"
    try:
        saved = [str(o) for o in OmegaConf.to_container(OmegaConf.load(path)) or []]
    except Exception:
        return  # nothing readable from before: the job is run as Hydra gives it
    if saved != [str(o) for o in overrides]:
        raise ConfigError(
            f"hydra.sweep.dir: job dir {job_dir} holds the job {' '.join(saved)}, not "
            f"{' '.join(map(str, overrides))}; choose another dir"
        )


def continue_command(sweep: Path, argv: list[str] | None = None) -> str:
    """`python -m fedexp -m <the sweep's arguments> hydra.sweep.dir=<its dir>`."""
    args = list(sys.argv[1:] if argv is None else argv)
    args = [a for a in args if not a.lstrip("+").startswith("hydra.sweep.dir=")]
    if "-m" not in args and "--multirun" not in args:
        args.insert(0, "-m")
    args.append(f"hydra.sweep.dir={Path(sweep).resolve()}")
    return shlex.join(["python", "-m", "fedexp", *args])


def continue_line(what: str) -> str | None:
    """`fedexp: <what>; continue it with: <command>` for the sweep this process runs."""
    if sweep_dir is None:
        return None
    return f"fedexp: {what}; continue it with: {continue_command(sweep_dir)}"


STOP_SIGNALS = (signal.SIGINT.value, signal.SIGTERM.value)


@contextlib.contextmanager
def stopped_sweep():
    """A sweep stopped by SIGINT/SIGTERM (a job's graceful stop, or the launcher's process
    between jobs) ends with the one line on stderr that continues it, and 128 + the signal."""

    def stop(signum, frame):
        raise KeyboardInterrupt(signum)

    previous = signal.signal(signal.SIGTERM, stop)  # a job's run installs its own meanwhile
    try:
        yield
    except (KeyboardInterrupt, SystemExit) as err:
        code = err.code if isinstance(err, SystemExit) else None
        if isinstance(err, KeyboardInterrupt):
            code = 128 + (err.args[0] if err.args else signal.SIGINT.value)
        if not isinstance(code, int) or code - 128 not in STOP_SIGNALS:
            raise
        line = continue_line(f"{signal.Signals(code - 128).name}: the sweep stopped")
        if line is None:  # stopped before the sweep started
            raise
        print(line, file=sys.stderr)
        sys.exit(code)
    finally:
        signal.signal(signal.SIGTERM, previous)
