"""`python -m fedexp [overrides]`: compose the config with Hydra, run, print the final table.

The imports of fedexp inside this module's functions are there for start-up time: `--help`, a
config error and tab completion answer without importing torch or the run's modules.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import signal
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from fedexp.cli_table import best_round, print_table, run_title
from fedexp.config.build import find_conf, labelled_choices
from fedexp.core.summary import RunSummary
from fedexp.errors import ConfigError

EXIT_FAILED, EXIT_CONFIG, EXIT_DIVERGED = 1, 2, 3


@hydra.main(version_base="1.3", config_path=find_conf(), config_name="config")
def app(cfg: DictConfig) -> float | None:
    hc = HydraConfig.get()
    run_dir = Path(hc.runtime.output_dir)
    choices = {k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra")}
    # a dataset._target_ of the user's own labels the run (title, W&B, reports) by its name
    choices = labelled_choices(choices, OmegaConf.select(cfg, "dataset._target_"))
    multirun = hc.mode == RunMode.MULTIRUN
    if multirun:
        from fedexp.runtime.ranks import spread_jobs_over_gpus

        spread_jobs_over_gpus(hc.job.num)
    group = Path(hc.sweep.dir).name if multirun else None
    # the overrides as typed: `key=${...}` is text here, resolved (or refused) with the config
    overrides = OmegaConf.to_container(hc.overrides.task, resolve=False)
    title = run_title(choices, overrides)
    if multirun:  # a continued sweep: this job's dir from before
        return continue_job(cfg, run_dir, choices, group, title, overrides)
    return execute(cfg, run_dir, choices, multirun=multirun, group=group, title=title)


def continue_job(cfg, run_dir: Path, choices: dict, group, title, overrides) -> float | None:
    """A sweep job: kept if it finished in an earlier run of the sweep (its objective, nothing
    written), resumed from its checkpoint if it stopped after one (as `resume=<job dir>`), else
    run from the start (`fedexp.runtime.continuation.prepare_job`)."""
    from fedexp.runtime.continuation import prepare_job

    state, saved = prepare_job(run_dir, overrides)
    if state == "finished":
        return saved
    if state == "fresh":
        return execute(cfg, run_dir, choices, multirun=True, group=group, title=title)
    from fedexp.config.saved import load_run_config

    try:
        if saved is not None:  # the checkpoint cannot be resumed: the job fails
            raise saved
        cfg, choices, group = load_run_config(run_dir)
    except ConfigError as err:
        print(f"fedexp: error: {err}", file=sys.stderr)
        record_error(err, cfg, run_dir, choices, status="failed")
        return None
    return execute(cfg, run_dir, choices, multirun=True, group=group, resume=True, title=title)


def execute(
    cfg: DictConfig,
    run_dir: Path,
    choices: dict,
    *,
    multirun: bool,
    group: str | None,
    resume: bool = False,
    title: str | None = None,
) -> float | None:
    """Build, run and report one job; returns the `objective` metric (None if diverged or, in
    a multirun, refused). The run holds its run dir's lock until it returns."""
    from fedexp.runtime import run_dir as rundir

    try:
        rundir.claim(run_dir, fresh=not resume)
    except ConfigError as err:
        if multirun:  # the dir belongs to another run: fail this job, write nothing there
            raise
        rundir.refuse(err)
    spills: list[Path] = []
    try:
        return _execute(cfg, run_dir, choices, multirun, group, resume, title, spills)
    finally:
        for spill in spills:
            shutil.rmtree(spill, ignore_errors=True)
        rundir.release(run_dir)


def _execute(
    cfg: DictConfig,
    run_dir: Path,
    choices: dict,
    multirun: bool,
    group,
    resume: bool,
    title,
    spills: list[Path],
) -> float | None:
    """The job in three parts: build everything or refuse, run or fail, report and exit."""
    built = _build_or_refuse(cfg, run_dir, choices, multirun, resume, spills)
    if built is None:  # a sweep job refused
        return None
    from fedexp.runtime.ranks import is_output_rank

    output_rank = is_output_rank()  # under torchrun only rank 0 logs and prints
    ran = _run_or_fail(*built, cfg, run_dir, choices, multirun, group, output_rank)
    if ran is None:  # a sweep job failed
        return None
    summary, callbacks = ran
    return _report_and_exit(summary, callbacks, run_dir, choices, multirun, title, output_rank)


def _build_or_refuse(
    cfg: DictConfig, run_dir: Path, choices: dict, multirun: bool, resume: bool, spills: list[Path]
):
    """(the experiment, its loggers): the config composed, checked and built before any training,
    or refused: one line and exit 2, nothing half-written (a sweep job: None, its summary.json
    says why). Adds the run's own spill dir to `spills`."""
    try:
        from fedexp.config.values import check_config_values

        # before torch is imported: the config as values, refused in a moment when bad (the
        # one run of these checks: the build is handed what they found)
        checked = check_config_values(cfg)
        spills += [d for d in [own_spill_dir(cfg, run_dir)] if d is not None]
        from fedexp.run import Experiment
        from fedexp.run.callbacks import config_loggers

        experiment = Experiment(cfg, run_dir, resume=resume, checked=checked)
        loggers = config_loggers(cfg, run_dir, experiment.objective, multirun)
    except (ConfigError, OSError) as err:  # OSError: a file the build reads or writes
        from fedexp.runtime.run_dir import os_error_line

        if isinstance(err, OSError):
            err = ConfigError(os_error_line(err, run_dir))
        print(f"fedexp: error: {err}", file=sys.stderr)
        if multirun:  # this job fails; the sweep goes on with the others
            record_error(err, cfg, run_dir, choices)
            return None
        _detach_file_logs(run_dir)
        if not resume:
            from fedexp.runtime.run_dir import discard

            discard(run_dir)  # nothing half-written; a dir that existed keeps its old entries
        else:
            _resume_log(keep=False)  # a refused resume leaves the run dir as it was
        sys.exit(EXIT_CONFIG)
    _resume_log(keep=True)
    return experiment, loggers


def _run_or_fail(
    experiment, loggers, cfg, run_dir: Path, choices: dict, multirun: bool, group, output_rank
):
    """(the run's summary, its callbacks): the rounds trained (a diverging run stops at its
    round and its summary says so), or a failure: a second stop signal, a full disk, a removed
    run dir (in a sweep, any error) is one line and its exit code (a sweep job: None)."""
    from fedexp.run.callbacks import build_callbacks
    from fedexp.runtime.run_dir import one_line, os_error_line, resume_hint
    from fedexp.runtime.signals import StoppedAtOnce

    callbacks = build_callbacks(
        experiment.components, loggers, progress=True, output_rank=output_rank
    )
    try:
        with callbacks.bar or contextlib.nullcontext():
            summary = experiment.run(callbacks, choices=choices, group=group)
    except StoppedAtOnce as err:  # a second SIGINT/SIGTERM during the graceful stop
        print(f"fedexp: {err}; {resume_hint(run_dir)}", file=sys.stderr)
        sys.exit(128 + err.signum)
    except Exception as err:  # a full disk, a removed run dir; in a sweep, anything
        if not (isinstance(err, OSError) or multirun):
            raise  # a bug: its traceback
        if isinstance(err, OSError):
            line = os_error_line(err, run_dir)
        else:  # a sweep job's bug: its traceback in the job's log, one line in the summary
            line = one_line(err)
            logging.getLogger(__name__).error("the job failed", exc_info=True)
        print(f"fedexp: error: {line}; {resume_hint(run_dir)}", file=sys.stderr)
        if not multirun:
            sys.exit(EXIT_FAILED)
        record_error(ConfigError(line), cfg, run_dir, choices, status="failed")
        return None  # the sweep goes on with the other jobs
    return summary, callbacks


def _report_and_exit(
    summary: RunSummary, callbacks, run_dir: Path, choices: dict, multirun: bool, title, output_rank
) -> float | None:
    """The final table with the run's warnings, then the exit: an interrupted run, a stop signal
    that ends a sweep, a diverged run (exit 3; a sweep job: None) or the objective's value."""
    if output_rank:
        best = best_round(run_dir, summary.objective.name) if summary.objective else None
        print_table(summary, choices, title, best)
        print(f"run dir: {run_dir}")
    if summary.status == "interrupted":
        signum = signal.Signals[summary.stop_signal].value
        if multirun:  # the sweep stops: the line that continues it (`stopped_sweep`)
            sys.exit(128 + signum)
        print(
            f"fedexp: stopped after round {summary.rounds_completed}; continue with: "
            f"python -m fedexp resume={run_dir}",
            file=sys.stderr,
        )
        sys.exit(128 + signum)
    late = callbacks.checkpointer.signals.requested  # came in the last round or after it
    if multirun and late is not None:  # the job ended; the sweep stops here
        sys.exit(128 + late)
    if summary.status == "diverged":
        print(f"fedexp: run diverged at round {summary.diverged_round}", file=sys.stderr)
        if not multirun:
            sys.exit(EXIT_DIVERGED)
        return None  # a sweeper records a failed trial and goes on with the other jobs
    from fedexp.config.validation import NO_OBJECTIVE

    if summary.objective.value is None and summary.objective.name != NO_OBJECTIVE:
        logging.getLogger(__name__).warning(
            "objective %s is not among the final metrics", summary.objective.name
        )
    return summary.objective.value


def record_error(
    err: ConfigError, cfg: DictConfig, run_dir: Path, choices: dict, status: str = "config_error"
) -> None:
    """summary.json of a sweep job that was refused (`status: config_error`) or that failed
    while it ran (`failed`), with its one-line error."""
    from fedexp.loggers.files import RunRecorder

    logging.getLogger(__name__).error("%s: %s", status.replace("_", " "), err)
    try:
        config = OmegaConf.to_container(cfg, resolve=True)
    except Exception:  # the refusal may be about a value that does not resolve
        config = OmegaConf.to_container(cfg, resolve=False)
    summary = RunSummary(status, error=str(err), choices=choices, config=config)
    try:
        RunRecorder(run_dir).write_summary(summary)
    except OSError as write_err:  # the disk that failed the job may fail this too
        from fedexp.runtime.run_dir import os_error_line

        print(f"fedexp: error: {os_error_line(write_err, run_dir)}", file=sys.stderr)


_pending_log: list = []  # a resume's log handler, holding its records until the resume is accepted


def _resume_log(keep: bool) -> None:
    """Write a resume's buffered log into the run dir (`keep`) and log there directly from now
    on, or drop it: a refused resume writes nothing into the run dir."""
    while _pending_log:
        handler = _pending_log.pop()
        if keep:
            handler.flush()
            handler.flushLevel = logging.NOTSET  # every later record goes straight to the file
        else:
            handler.buffer.clear()
            logging.getLogger().removeHandler(handler)
            handler.close()


def own_spill_dir(cfg: DictConfig, run_dir: Path) -> Path | None:
    """Point `client_store.spill_dir` at a subdirectory of its own for this run (parallel jobs
    may share the configured dir); returns it, to be removed when the run ends."""
    store = cfg.get("client_store")
    root = store.get("spill_dir") if store is not None else None
    if not root:
        return None
    tag = hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:10]
    own = Path(str(root)) / f"{Path(run_dir).name}-{tag}"
    cfg.client_store.spill_dir = str(own)
    return own


def _detach_file_logs(run_dir: Path) -> None:
    """Close and remove the log handlers writing into `run_dir` (which is about to go), so that
    nothing later in this process writes a log file into a removed dir."""
    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        for handler in list(getattr(logger, "handlers", [])):
            name = getattr(handler, "baseFilename", None)
            if name is not None and Path(name).resolve().is_relative_to(run_dir.resolve()):
                handler.close()
                logger.removeHandler(handler)


LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # Hydra's, as conf/hydra sets


def resume_main(args: list[str]) -> None:
    """`python -m fedexp resume=<run dir> [device=... progress=... checkpoint_every=...]` (any
    of `RESUME_OVERRIDABLE`), and `rounds=N` to extend the run to N rounds."""
    from fedexp.config.extend import check_extension
    from fedexp.config.saved import extension_rounds, load_run_config, saved_rounds
    from fedexp.runtime.resume import check_resumable
    from fedexp.runtime.run_dir import claim, refuse

    run_dir, overrides = None, []
    for arg in args:
        key, _, value = arg.lstrip("+").partition("=")
        if key == "resume":
            run_dir = Path(value).resolve()
        else:
            overrides.append(arg)
    try:
        if "-m" in overrides or "--multirun" in overrides:
            raise ConfigError("resume: resume one run dir at a time (no -m)")
        check_resumable(run_dir, extension_rounds(overrides))
        cfg, choices, group = load_run_config(run_dir, overrides)
        check_extension(cfg, saved_rounds(run_dir))  # rounds=N: nothing depends on the total
        claim(run_dir, fresh=False, key="resume")  # before the log below writes into it
    except ConfigError as err:
        refuse(err)
    # the log Hydra started in the run dir goes on; Hydra itself is not involved in a resume
    from logging.handlers import MemoryHandler

    from fedexp.loggers.progress import NotProgress

    console = logging.StreamHandler()
    console.addFilter(NotProgress())  # the progress lines go to the file only
    # the file gets the records once the resume is accepted (`_resume_log`)
    file_log = logging.FileHandler(run_dir / "__main__.log", delay=True)
    held = MemoryHandler(1 << 20, flushLevel=logging.CRITICAL + 1, target=file_log)
    held.flushOnClose = False
    _pending_log.append(held)
    file_log.setFormatter(logging.Formatter(LOG_FORMAT))
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, handlers=[console, held])
    overrides = run_dir / ".hydra" / "overrides.yaml"
    try:
        saved = OmegaConf.to_container(OmegaConf.load(overrides)) if overrides.exists() else []
    except Exception:  # only the title of the final table comes from it
        saved = []
    title = run_title(choices, saved if isinstance(saved, list) else [])
    execute(cfg, run_dir, choices, multirun=False, group=group, resume=True, title=title)


def _resume_requested(args: list[str]) -> bool:
    return any(
        a.lstrip("+").startswith("resume=") and a.partition("=")[2] not in ("", "null")
        for a in args
    )


def main() -> None:
    # torch is imported only to run: --help, --cfg, tab completion and config errors go without
    from fedexp.cli_help import help_text, wants_help

    if wants_help(sys.argv[1:]):
        print(help_text(Path(find_conf())), end="")
        return
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:
        from fedexp.runtime.ranks import prepare_rank

        sys.argv = [sys.argv[0], *prepare_rank(sys.argv[1:])]  # torchrun: rank > 0 writes nothing
    if _resume_requested(sys.argv[1:]):
        resume_main(sys.argv[1:])
    else:
        from fedexp.config.build import add_target_keys

        try:  # `algorithm.k=...` missing from the YAML: build() checks it against the target
            sys.argv = [sys.argv[0], *add_target_keys(sys.argv[1:], find_conf())]
        except ConfigError as err:
            print(f"fedexp: error: {err}", file=sys.stderr)
            sys.exit(EXIT_CONFIG)
        from fedexp.runtime import continuation
        from fedexp.runtime import run_dir as run_dir
        from fedexp.runtime.continuation import stopped_sweep

        run_dir.sweep_exit_code, continuation.sweep_dir = 0, None
        multirun = any(a in ("-m", "--multirun") for a in sys.argv[1:])
        with stopped_sweep() if multirun else contextlib.nullcontext():
            app()
        if run_dir.sweep_exit_code:  # a job of the sweep was refused; the others ran
            sys.exit(run_dir.sweep_exit_code)


if __name__ == "__main__":
    main()
