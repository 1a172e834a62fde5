"""One writer per run dir: an OS lock for the run's life, and no fresh run over finished results.

A run holds an exclusive `fcntl.flock` on `<run dir>/.fedexp.lock` from before Hydra writes
anything into the dir until the process exits; the OS releases it on any exit, SIGKILL included.
A second writer (a fresh run or a `resume=` into the same dir) is refused while it is held. A
fresh run is also refused in a dir that already holds results (`RESULT_FILES`): Hydra's own
`.hydra/` and log files do not count, so an empty dir, or one left by a run refused before
training, can be used again.

Hydra writes `.hydra/` into the run dir before the app runs, so the claim is made by a Hydra
callback (`RunDirGuard`, registered in conf/config.yaml) before Hydra touches the dir; the same
callback refuses a sweep into a sweep dir that holds another sweep (the same sweep continues:
`fedexp.runtime.continuation`), and sets the sweep's exit code from its jobs' summaries.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from fedexp.core.summary import RunSummary
from fedexp.errors import ConfigError, check_directory

LOCK_FILE = ".fedexp.lock"
RESULT_FILES = ("metrics.jsonl", "summary.json", "checkpoint.pt")
EXIT_CONFIG, EXIT_FAILED = 2, 1

_held: dict[Path, int] = {}  # run dir -> open lock fd, for this process
_created: dict[Path, set[str] | None] = {}  # run dir -> names it held before (None: new dir)
sweep_exit_code = 0  # set by RunDirGuard.on_multirun_end


def holds_results(run_dir: str | Path) -> list[str]:
    """The result files present in `run_dir` (metrics.jsonl, summary.json, checkpoint.pt)."""
    return [name for name in RESULT_FILES if (Path(run_dir) / name).exists()]


def claim(run_dir: str | Path, fresh: bool, key: str = "hydra.run.dir") -> Path:
    """Take the run dir's lock (creating the dir if needed); raise ConfigError if another process
    holds it or, for a `fresh` run, if the dir already holds results. Idempotent in a process."""
    if run_dir is None or not str(run_dir).strip():
        raise ConfigError(f"{key}: empty; give the run's own directory (not the current one)")
    run_dir = Path(run_dir).resolve()
    if run_dir not in _held:
        check_directory(key, run_dir)  # a file, or under a file
        try:
            existed = run_dir.is_dir()
            before = {p.name for p in run_dir.iterdir()} if existed else None
            run_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise ConfigError(f"{key}: cannot write into {run_dir} ({cause(err)})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise ConfigError(
                f"{key}: {run_dir} is being written by another fedexp process (pid {owner}); "
                "wait for it to end or choose another dir"
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            probe_space(run_dir)
        except OSError as err:
            os.close(fd)
            if before is None:  # this call made the dir: take it away again
                shutil.rmtree(run_dir, ignore_errors=True)
            raise ConfigError(f"{key}: cannot write into {run_dir} ({cause(err)})") from None
        _held[run_dir] = fd
        _created[run_dir] = before
    found = holds_results(run_dir) if fresh else []
    if found:
        release(run_dir)
        raise ConfigError(
            f"{key}: {run_dir} already holds the results of a run ({', '.join(found)}); "
            f"continue it with resume={run_dir}, or choose another dir"
        )
    return run_dir


PROBE_BYTES = 1 << 16  # more than Hydra writes into .hydra/ before a run starts


def probe_space(run_dir: Path) -> None:
    """Write, sync and remove a small file: a full disk or a read-only mount fails here, at
    the start, not in the middle of a run's first files (raises OSError)."""
    probe = run_dir / f".fedexp.probe-{os.getpid()}"
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = memoryview(bytes(PROBE_BYTES))
        while left:  # a nearly full disk writes a part and refuses the rest (ENOSPC)
            written = os.write(fd, left)
            if written <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(probe))
            left = left[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)


def cause(err: OSError) -> str:
    """`No space left on device`, `Read-only file system`, ... of an OSError."""
    return err.strerror or type(err).__name__


def os_error_line(err: OSError, run_dir: Path) -> str:
    """`<path>: <cause>` of a failed file operation (`... (the run dir is gone)` if it is)."""
    path = err.filename if err.filename is not None else run_dir
    line = f"{path}: {err.strerror or one_line(err)}"
    if not Path(run_dir).is_dir():
        line += f" (the run dir {run_dir} is gone)"
    return line


def one_line(err: BaseException) -> str:
    first = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {first}" if first else type(err).__name__


def resume_hint(run_dir: Path) -> str:
    """How to continue a run that stopped: from its checkpoint, if it has one."""
    if (Path(run_dir) / "checkpoint.pt").is_file():
        return f"continue from its last checkpoint with: python -m fedexp resume={run_dir}"
    return "no checkpoint was written, so the run cannot be resumed"


def release(run_dir: str | Path) -> None:
    """Drop this process's lock on `run_dir` (no-op if not held). The lock file stays: removing
    it could let two later writers lock two different files."""
    global _hydra_writes_into
    run_dir = Path(run_dir).resolve()
    fd = _held.pop(run_dir, None)
    _created.pop(run_dir, None)
    if _hydra_writes_into == run_dir:
        _hydra_writes_into = None
    if fd is not None:
        os.close(fd)


def discard(run_dir: str | Path) -> None:
    """After a refused config: remove what this run put in `run_dir` (the whole dir if this
    run created it, else only the entries that were not there before), and release the lock."""
    run_dir = Path(run_dir).resolve()
    if run_dir not in _held:
        return
    before = _created.get(run_dir)
    if before is None:
        shutil.rmtree(run_dir, ignore_errors=True)
    else:
        for entry in run_dir.iterdir():
            if entry.name not in before and entry.name != LOCK_FILE:
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink(missing_ok=True)
    release(run_dir)


def refuse(err: ConfigError) -> None:
    """The one-line refusal: `fedexp: error: ...` on stderr, exit 2."""
    print(f"fedexp: error: {err}", file=sys.stderr)
    sys.exit(EXIT_CONFIG)


def sweep_status(sweep_dir: str | Path) -> int:
    """Exit code of a finished sweep from its jobs' summary.json: 2 if a job's config was refused,
    else 1 if a job failed while it ran, else 0 (a diverged job is a result, recorded as such)."""
    code = 0
    for path in Path(sweep_dir).rglob("summary.json"):
        try:
            status = RunSummary.from_dict(json.loads(path.read_text())).status
        except (OSError, ValueError):  # JSONDecodeError is a ValueError
            continue
        if status == "config_error":
            return EXIT_CONFIG
        if status == "failed":
            code = EXIT_FAILED
    return code


_hydra_writes_into: Path | None = None  # the fresh run dir whose .hydra/ Hydra writes next


def guard_hydra_files(run_dir: Path) -> None:
    """Hydra writes `.hydra/` into the run dir after `RunDirGuard.on_run_start`, outside any
    hook: a write there that fails (the disk filled since `probe_space`) is refused like a run
    dir that cannot be written, in one line, exit 2, the run dir discarded. Only this run dir's
    writes are caught; Hydra's other files (a sweep's jobs) fail as Hydra lets them."""
    global _hydra_writes_into
    _hydra_writes_into = Path(run_dir).resolve()
    install_save_guard()


def install_save_guard() -> None:
    """Wrap Hydra's `_save_config` (once a process): the run dir's failed write is refused
    (`guard_hydra_files`), and a sweep job's `.hydra/` file from before is kept as it was (a
    continued sweep: the job's dir from the earlier run, its overrides the same)."""
    import hydra.core.utils as hydra_utils

    save = getattr(hydra_utils, "_save_config", None)
    if save is None or getattr(save, "guarded_by_fedexp", False):
        return

    def guarded(cfg: Any, filename: str, output_dir: Path) -> None:
        if _kept(Path(output_dir) / filename):
            return
        try:
            save(cfg, filename, output_dir)
        except OSError as err:
            run_dir = _hydra_writes_into
            if run_dir is None or not Path(output_dir).resolve().is_relative_to(run_dir):
                raise
            close_file_logs(run_dir)  # Hydra's job log, opened in the run dir
            discard(run_dir)
            refuse(ConfigError(f"hydra.run.dir: cannot write into {run_dir} ({cause(err)})"))

    guarded.guarded_by_fedexp = True  # type: ignore[attr-defined]
    hydra_utils._save_config = guarded


def _kept(path: Path) -> bool:
    """A sweep job's saved file from an earlier run of the same sweep: it stays as it was."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not path.is_file() or not HydraConfig.initialized():
        return False
    return HydraConfig.get().mode == RunMode.MULTIRUN


def close_file_logs(run_dir: Path) -> None:
    """Close and remove the log handlers writing into `run_dir`, which is about to go."""
    import logging

    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        for handler in list(getattr(logger, "handlers", [])):
            name = getattr(handler, "baseFilename", None)
            if name is not None and Path(name).resolve().is_relative_to(Path(run_dir).resolve()):
                handler.close()
                logger.removeHandler(handler)


try:
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover - Hydra is a dependency
    Callback = object  # type: ignore[assignment,misc]


class RunDirGuard(Callback):
    """Hydra callback: claim the run dir (or check the sweep dir) before Hydra writes into it."""

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        try:
            run_dir = claim(config.hydra.run.dir, fresh=True)
        except ConfigError as err:
            refuse(err)
        guard_hydra_files(run_dir)

    def __init__(self) -> None:
        self.keep_saved_job_files = True  # a state to unpickle: `__setstate__` runs

    def __setstate__(self, state: dict) -> None:
        """Unpickled in a launcher's worker process (joblib): keep the jobs' saved files there
        too."""
        self.__dict__.update(state)
        install_save_guard()

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        global sweep_exit_code
        from fedexp.runtime import continuation  # start-up: only a multirun reads it

        sweep_exit_code = 0
        sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
        try:
            claim(sweep_dir, fresh=False, key="hydra.sweep.dir")
            if not (sweep_dir / "optuna.db").exists():  # a stored Optuna study continues itself
                try:
                    continuation.check_same_sweep(sweep_dir, config)
                except ConfigError:
                    release(sweep_dir)
                    raise
        except ConfigError as err:
            refuse(err)
        continuation.sweep_dir = sweep_dir
        install_save_guard()

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        global sweep_exit_code
        sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
        sweep_exit_code = sweep_status(sweep_dir)
        release(sweep_dir)
