"""How many CPU threads torch uses: chosen for the machine unless the user says (`threads`).

Federated clients train small models on small batches, one client after another. On a CPU such a
step is too small for torch's intra-op thread pool to pay: on 2 cores the default (one thread a
core) made the default run 50-160 times slower whenever another process competed for the cores
(a sweep's parallel jobs, a shared node), and it was never faster when idle (figures:
`scripts/bench.py --workload threads`, docs/BENCHMARKS.md). So `threads: auto` gives each
process one thread on a CPU, unless the environment already says how many this process may use.
"""

from __future__ import annotations

import contextlib
import os

import torch

from fedexp.core.types import ConfigError

CUDA_HOST_THREADS = 4  # on a GPU the host threads only feed the device: a few are plenty


def available_cores() -> int:
    """CPUs this process may run on: its affinity mask, capped by a SLURM allocation."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if slurm.isdigit() and int(slurm) >= 1:
        cores = min(cores, int(slurm))
    return max(cores, 1)


def choose_threads(setting, device: torch.device) -> tuple[int, str]:
    """(threads, why): `setting` is "auto" or a positive integer."""
    if setting != "auto":
        if isinstance(setting, bool) or not isinstance(setting, int) or setting < 1:
            raise ConfigError(f"threads: must be auto or an integer >= 1, got {setting!r}")
        return setting, "threads setting"
    cores = available_cores()
    # OMP_NUM_THREADS is how a user, a scheduler or joblib's workers (cores // parallel jobs)
    # say what this process may use
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) >= 1:
        return min(int(env), cores), "OMP_NUM_THREADS"
    if device.type == "cuda":
        return min(cores, CUDA_HOST_THREADS), f"cuda host threads, {cores} cores available"
    return 1, f"cpu: one thread a process ({cores} cores available)"


def apply_threads(setting, device: torch.device) -> tuple[int, str]:
    """Set torch's intra-op (and, where still possible, inter-op) threads; returns the choice."""
    threads, why = choose_threads(setting, device)
    torch.set_num_threads(threads)
    # allowed once per process, before any inter-op work: later runs in-process keep it
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(threads)
    return threads, why
