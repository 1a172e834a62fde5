"""How many CPU threads torch uses: chosen for the machine unless the user says (`threads`).

Federated clients train small models on small batches, one client after another. On a CPU most
such steps are too small for torch's intra-op thread pool to pay, and threads that compete with
other processes for the cores make a run many times slower (2 threads on 2 busy cores: 3x for
the digits MLP; torch's default of one thread a core made runs 50-160x slower on a shared node).
A convolutional step is large enough that idle cores pay (LeNet-5 and the pfl CNN: 1.4-1.6x
faster with a second idle core). So `threads: auto` on a CPU, unless the environment says how
many this process may use (OMP_NUM_THREADS, a SLURM allocation), counts the model's training
FLOPs per step and the cores idle at start: one thread a process for a step under
`PARALLEL_STEP_FLOPS`, else one thread per idle core (at most one per `PARALLEL_STEP_FLOPS` of
the step, and `MAX_AUTO_THREADS`). Figures: `scripts/bench.py --workload threads`,
docs/BENCHMARKS.md.

The thread count changes the order of floating-point sums (results differ in the last bits), so
a run logs and reports its count (`runtime/threads`), a resumed run keeps the count it started
with, and a run that must match another bit for bit on another machine sets `threads`.
"""

from __future__ import annotations

import contextlib
import os
import time

import torch

from fedexp.core.types import ConfigError

CUDA_HOST_THREADS = 4  # on a GPU the host threads only feed the device: a few are plenty
# training FLOPs of one step from which a second thread pays on an idle core: the digits MLP
# (~10 MFLOP a step at batch 32) is no faster with two, LeNet-5 at batch 32 (~60 MFLOP) is 1.4x
PARALLEL_STEP_FLOPS = 30e6
MAX_AUTO_THREADS = 8  # more threads than this for one small model's step: past the gain
IDLE_WINDOW_S = 0.1  # how long the cores' idle time is sampled at start


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


def omp_threads() -> int | None:
    """The threads OMP_NUM_THREADS gives this process (a user's, a scheduler's, or a parallel
    sweep's launcher's share of the cores), or None where it is unset or not a count >= 1."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    return int(env) if env.isdigit() and int(env) >= 1 else None


def given_cores() -> int:
    """The cores this run may fill: `available_cores`, capped by OMP_NUM_THREADS where a user, a
    scheduler or a parallel sweep's launcher set it (`executor=auto` counts them so)."""
    cores, told = available_cores(), omp_threads()
    return cores if told is None else min(cores, told)


def spare_core(processes: int, threads: int) -> bool:
    """Whether a run of `processes` processes of `threads` torch threads each leaves one of its
    `given_cores` idle."""
    return given_cores() > max(processes, 1) * max(threads, 1)


def idle_cores(window_s: float = IDLE_WINDOW_S) -> float:
    """Cores no process used over `window_s` (Linux: /proc/stat's idle time, system-wide), else
    the CPUs less the 1-minute load average."""

    def times() -> list[int]:
        with open("/proc/stat") as f:
            return [int(v) for v in f.readline().split()[1:]]

    try:
        before = times()
        time.sleep(window_s)
        after = times()
    except (OSError, ValueError):
        return max(0.0, (os.cpu_count() or 1) - os.getloadavg()[0])
    delta = [b - a for a, b in zip(before, after)]
    total = sum(delta[:8])  # user nice system idle iowait irq softirq steal
    idle = delta[3] + delta[4]
    return (os.cpu_count() or 1) * idle / total if total > 0 else 0.0


def step_flops(model_factory, sample: torch.Tensor, batch_size: int) -> float | None:
    """Training FLOPs of one step of a fresh model at `batch_size` (3x the forward's, counted on
    two samples like `sample`); None where the model cannot be built or run that way."""
    from torch.utils.flop_counter import FlopCounterMode  # start-up: only auto on a CPU uses it

    try:
        with torch.random.fork_rng(devices=[]):  # the run's RNG stream stays untouched
            model = model_factory()
            with FlopCounterMode(display=False) as counter, torch.no_grad():
                model(sample[:2])
    except Exception:  # a model family needs its arch, a custom model other inputs: unknown
        return None
    return 3.0 * counter.get_total_flops() / min(2, len(sample)) * batch_size


def choose_threads(
    setting, device: torch.device, flops: float | None = None, idle: float | None = None
) -> tuple[int, str]:
    """(threads, why): `setting` is "auto" or a positive integer. `flops`: the training FLOPs of
    a step (`step_flops`; None: unknown, one thread); `idle`: the idle cores (None: measured
    now, where the step is large enough to use them)."""
    if setting != "auto":
        if isinstance(setting, bool) or not isinstance(setting, int) or setting < 1:
            raise ConfigError(f"threads: must be auto or an integer >= 1, got {setting!r}")
        return setting, "threads setting"
    cores = available_cores()
    # OMP_NUM_THREADS is how a user, a scheduler or joblib's workers (cores // parallel jobs)
    # say what this process may use
    told = omp_threads()
    if told is not None:
        return min(told, cores), "OMP_NUM_THREADS"
    if device.type == "cuda":
        return min(cores, CUDA_HOST_THREADS), f"cuda host threads, {cores} cores available"
    if flops is None or flops < PARALLEL_STEP_FLOPS or cores == 1:
        step = "size unknown" if flops is None else f"{flops / 1e6:.0f} MFLOP"
        return 1, f"cpu: one thread a process, a small step ({step}, {cores} cores available)"
    idle = idle_cores() if idle is None else idle
    cap = min(cores, MAX_AUTO_THREADS, int(flops // PARALLEL_STEP_FLOPS))
    threads = max(1, min(cap, round(idle)))
    return threads, f"cpu: {flops / 1e6:.0f} MFLOP a step, {idle:.1f} of {cores} cores idle"


def measures_step(setting, device: torch.device) -> bool:
    """Whether `choose_threads` would use the model's step size (`auto` on a CPU the environment
    says nothing about)."""
    return setting == "auto" and device.type == "cpu" and omp_threads() is None


def apply_threads(
    setting, device: torch.device, flops: float | None = None, resumed: int | None = None
) -> tuple[int, str]:
    """Set torch's intra-op (and, where still possible, inter-op) threads; returns the choice.
    `resumed`: the count a resumed run started with (kept under `auto`)."""
    if setting == "auto" and resumed is not None:
        threads, why = resumed, "the count the resumed run started with"
    else:
        threads, why = choose_threads(setting, device, flops)
    torch.set_num_threads(threads)
    # allowed once per process, before any inter-op work: later runs in-process keep it
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(threads)
    return threads, why
