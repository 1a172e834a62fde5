"""Measure every algorithm on the bundled digits, two splits (docs/baselines.md's table).

    OMP_NUM_THREADS=1 nice python scripts/baselines_digits.py [--out DIR] [--seeds 0,1,2]

The defaults of `python -m fedexp` (digits, 20 clients, 10 a round, 50 rounds, MLP, each client's
data split 70/10/20 into train/validation/test) on two splits: `partition=shards` (2 classes per
client) and `partition=multimodal` (WAFFLe's majority/minority groups); FedBN on `model=mlp_bn`
(the MLP with BatchNorm). One Hydra multirun per split over every algorithm and seed (skipped
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
# algorithms that need a model of their own: run in a multirun of their own (<split>_<algorithm>)
OWN_MODEL = {"fedbn": ["model=mlp_bn"]}
COLUMNS = [
    ("global (pooled test)", ["eval/global/acc"]),
    ("personal (mean)", ["eval/personal/acc_mean"]),
    ("worst 10 % of clients", ["eval/personal/acc_p10", "eval/global/client_acc_p10"]),
]


def available() -> list[str]:
    conf = Path(__file__).resolve().parent.parent / "conf" / "algorithm"
    return [a for a in ALGORITHMS if (conf / f"{a}.yaml").exists()]


def run_sweep(name: str, overrides: list[str], algorithms: list[str], seeds: str, out: Path):
    target = out / name
    if any(target.rglob("summary.json")):
        return
    args = [
        *overrides,
        "algorithm=" + ",".join(algorithms),
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
    by_split = {
        s: find_runs(
            [out / s, *(out / f"{s}_{a}" for a in OWN_MODEL if (out / f"{s}_{a}").exists())]
        )
        for s in SPLITS
    }
    head = "| algorithm | " + " | ".join(f"{s}: {c}" for s in SPLITS for c, _ in COLUMNS) + " |"
    rows = [head, "|---" * (1 + len(SPLITS) * len(COLUMNS)) + "|"]
    for algo in algorithms:
        cells = []
        for split in SPLITS:
            runs = [r for r in by_split[split] if r.summary.choices.get("algorithm") == algo]
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
    shared = [a for a in algorithms if a not in OWN_MODEL]
    for name, overrides in SPLITS.items():
        run_sweep(name, overrides, shared, args.seeds, out)
        for algo in [a for a in algorithms if a in OWN_MODEL]:
            run_sweep(f"{name}_{algo}", overrides + OWN_MODEL[algo], [algo], args.seeds, out)
    print("\n".join(table(out, algorithms)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
