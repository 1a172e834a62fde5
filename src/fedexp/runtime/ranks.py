"""Which process this is: torchrun's rank and world size, a rank's GPU and outputs, and a
multirun job's GPU. The distributed executor itself: `fedexp.engine.executors.distributed`."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import torch


def world() -> tuple[int, int]:
    """(rank, world size) from torchrun's environment; (0, 1) outside torchrun."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def prepare_rank(argv: list[str]) -> list[str]:
    """Before Hydra starts: pin this rank's GPU and keep ranks > 0 from writing outputs.

    Hydra creates a run dir (timestamped, so one per rank) before the app runs; ranks > 0 are
    pointed at a temporary dir, without job logging, which is removed when they exit.
    """
    rank, size = world()
    if size <= 1:
        return argv
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    if rank == 0:
        return argv
    scratch = tempfile.mkdtemp(prefix=f"fedexp-rank{rank}-")
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    return [
        *argv,
        f"hydra.run.dir={scratch}",
        f"hydra.sweep.dir={scratch}",
        "hydra.output_subdir=null",
        "hydra/job_logging=disabled",
        "hydra/hydra_logging=disabled",
    ]


def spread_jobs_over_gpus(job_num: int) -> None:
    """In a multirun on a box with several GPUs, job i trains on GPU i % num_gpus.

    Parallel launchers (joblib) run several jobs at once; without this they would all share
    GPU 0. A SLURM job with one GPU sees one device, so this changes nothing there.
    """
    if world()[1] > 1 or not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        return
    torch.cuda.set_device(job_num % torch.cuda.device_count())


def is_output_rank() -> bool:
    """Whether this process writes outputs (rank 0, or the only process)."""
    return world()[0] == 0
