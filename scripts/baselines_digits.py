"""Measure every algorithm on the bundled digits, two splits (docs/baselines.md's table).

    OMP_NUM_THREADS=1 nice python scripts/baselines_digits.py [--out DIR] [--seeds 0,1,2]

The defaults of `python -m fedexp` (digits, 20 clients, 10 a round, 50 rounds, MLP, each client's
data split 70/10/20 into train/validation/test) on two splits: `partition=shards` (2 classes per
client) and `partition=multimodal` (WAFFLe's majority/minority groups). Each algorithm with its own
defaults (FedHeNN, WAFFLe and FRL bring their papers' local training), except the `OWN`
overrides below. One Hydra multirun per split and algorithm over the seeds (skipped
when its runs are already under --out); the script prints the table's markdown rows: final
accuracy as mean ± std (population) over the seeds of

- the global model on the pooled test set (`eval/global/acc`), where the algorithm has one;
- the personal models on their clients' tests (`eval/personal/acc_mean`), where it has them;
- the worst tenth of the clients (`eval/personal/acc_p10`, else `eval/global/client_acc_p10`):
  the fairness figure q-FFL and Ditto report.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
from pathlib import Path

from fedexp.report import find_runs, mean_std

ALGORITHMS = [
    "local",
    "centralised",
    "fedavg",
    "fedprox",
    "scaffold",
    "fedopt",
    "qffl",
    "dp_fedavg",
    "fedbn",
    "fedper",
    "fedrep",
    "ditto",
    "fedproto",
    "fedhenn",
    "waffle",
    "frl",
    "signsgd",
    "topk",
]
SPLITS = {"shards": ["partition=shards"], "multimodal": ["partition=multimodal"]}
# per-algorithm overrides: FedBN needs BatchNorm layers; FedHeNN's own client (20 local epochs, the
# paper's) would cost 20x FedAvg's compute here, so it trains 5 (as docs/fedhenn.md's comparison)
OWN = {"fedbn": ["model=mlp_bn"], "fedhenn": ["client.local_epochs=5"]}
COLUMNS = [
    ("global (pooled test)", ["eval/global/acc"]),
    ("personal (mean)", ["eval/personal/acc_mean"]),
    ("worst 10 % of clients", ["eval/personal/acc_p10", "eval/global/client_acc_p10"]),
]


def available() -> list[str]:
    conf = Path(__file__).resolve().parent.parent / "conf" / "algorithm"
    return [a for a in ALGORITHMS if (conf / f"{a}.yaml").exists()]


def run_sweep(split: str, algorithm: str, seeds: str, out: Path) -> None:
    """One multirun over the seeds into <out>/<split>/<algorithm> (skipped when it has runs)."""
    target = out / split / algorithm
    if any(target.rglob("summary.json")):
        return
    args = [
        *SPLITS[split],
        f"algorithm={algorithm}",
        *OWN.get(algorithm, []),
        f"seed={seeds}",
        f"hydra.sweep.dir={target}",
        "progress=false",
    ]
    print("python -m fedexp -m " + " ".join(args), file=sys.stderr)
    subprocess.run(  # the runs' own output goes to stderr: stdout is the table
        [sys.executable, "-m", "fedexp", "-m", *args], check=True, env=os.environ, stdout=sys.stderr
    )


def cell(runs, keys: list[str]) -> str:
    for key in keys:
        values = [r.summary.metrics.get(key) for r in runs]
        values = [v for v in values if v is not None and not math.isnan(v)]
        if values:
            mean, std = mean_std(values, ddof=0)  # population std, as the doc says
            return f"{mean:.3f} ± {std:.3f}"
    return "—"


def table(out: Path, algorithms: list[str]) -> list[str]:
    head = "| algorithm | " + " | ".join(f"{s}: {c}" for s in SPLITS for c, _ in COLUMNS) + " |"
    rows = [head, "|---" * (1 + len(SPLITS) * len(COLUMNS)) + "|"]
    for algo in algorithms:
        cells = []
        for split in SPLITS:
            runs = find_runs([out / split / algo]) if (out / split / algo).exists() else []
            cells += [cell(runs, keys) if runs else "not run" for _, keys in COLUMNS]
        rows.append(f"| {algo} | " + " | ".join(cells) + " |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="outputs/baselines_digits", help="multirun root")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--algorithms", default=None, help="comma list (default: all present)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    algorithms = args.algorithms.split(",") if args.algorithms else available()
    for split in SPLITS:
        for algorithm in algorithms:
            run_sweep(split, algorithm, args.seeds, out)
    print("\n".join(table(out, algorithms)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
