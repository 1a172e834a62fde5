"""Run FRL's authors' reference code (SPIN-UMass/FRL) on a client split exported by fedexp.

    python scripts/frl_reference_shim.py --reference CHECKOUT --split SPLIT.npz --out RUN.json \\
        --seed 0 --rounds 40 --clients-per-round 10 --attack-fraction 0.2

Started by `scripts/frl_reference.py`, one process a run (the reference code parses its options
from the command line when its `args` module is imported, and keeps them in that module). The
reference is imported from CHECKOUT as it is; nothing of it is copied or edited. Its own
`FL_train.FRL_train` runs the rounds: client sampling and the re-draw of malicious-majority
rounds, the clients' local training (SGD, lr·lrdc^e, cosine over the local epochs), the vote,
the rank-reversal attack with its pool, the test. What the shim supplies:

- the data: the reference's `data.<set>()` downloads a torchvision dataset and splits it by its
  own Dirichlet draw; instead, its loop gets one `DataLoader` a client over the exported
  training split (batch `--batch-size`, the client's samples shuffled by `SubsetRandomSampler`,
  as its `get_train`), and the exported test set (batch 128, in order, as its `te_loader`);
- the model: `MLP`, the exported model's layers as the reference's own 1x1 `MaskConv` layers
  (`models.builder.Builder().conv1x1`, the way its LeNet and Conv8 build their linear layers),
  ReLU between them, registered as `models.MLP` for `--model MLP`;
- seeds: `random`, `torch` as its `main.py` seeds them, and numpy's global generator too (its
  `main.py` leaves it unseeded, so its round draws would change from process to process);
- the record: its `test` wrapped to keep each round's accuracy at full precision; the round's
  number of malicious clients read from the line its loop writes to `output.txt`.

The exported client at position p is the reference's client p: its attackers are positions
0 .. int(nClients·at_fractions) − 1 (`round_users < n_attackers`).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import random
import re
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

LINE = re.compile(r"^e (\d+) \| malicious users: (\d+) \| test acc")


def reference_argv(opts, n_clients: int, log_dir: str) -> list[str]:
    """The reference's command line (`args.py`) for this run."""
    values = {
        "--seed": opts.seed,
        "--set": "fedexp_split",
        "--FL_type": "FRL",
        "--model": "MLP",
        "--nClients": n_clients,
        "--round_nclients": opts.clients_per_round,
        "--rand_mal_clients": opts.pool_size,
        "--at_fractions": opts.attack_fraction,
        "--FL_global_epochs": opts.rounds - 1,  # its loop runs e = 0 .. FL_global_epochs
        "--local_epochs": opts.local_epochs,
        "--batch_size": opts.batch_size,
        "--lr": opts.lr,
        "--lrdc": opts.lrdc,
        "--momentum": opts.momentum,
        "--wd": opts.wd,
        "--sparsity": opts.sparsity,
        "--log-dir": log_dir,
    }
    return ["frl-reference", *(str(v) for kv in values.items() for v in kv)]


def make_mlp(builder_cls, sizes: list[int]) -> type:
    """The exported MLP (sizes: inputs, hidden..., classes) in the reference's own layers."""

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            builder = builder_cls()
            layers: list[nn.Module] = []
            for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
                layers.append(builder.conv1x1(a, b, first_layer=i == 0))
                if i < len(sizes) - 2:
                    layers.append(nn.ReLU())
            self.linear = nn.Sequential(*layers)

        def forward(self, x):
            return self.linear(x.reshape(x.size(0), sizes[0], 1, 1)).squeeze()

    return MLP


def loaders(split, batch_size: int):
    """One training loader a client (in the exported order) and the test loader."""
    from torch.utils.data import DataLoader, SubsetRandomSampler, TensorDataset

    x, y, offsets = split["x"], split["y"], split["offsets"]
    train = []
    for c in range(len(offsets) - 1):
        lo, hi = int(offsets[c]), int(offsets[c + 1])
        data = TensorDataset(torch.from_numpy(x[lo:hi]), torch.from_numpy(y[lo:hi]))
        sampler = SubsetRandomSampler(list(range(hi - lo)))
        train.append(DataLoader(data, batch_size=batch_size, sampler=sampler))
    test = TensorDataset(torch.from_numpy(split["test_x"]), torch.from_numpy(split["test_y"]))
    return train, DataLoader(test, batch_size=128, shuffle=False)


def run(opts) -> dict:
    split = dict(np.load(opts.split))
    n_clients = len(split["offsets"]) - 1
    sizes = [int(s) for s in split["sizes"]]
    log_dir = tempfile.mkdtemp(prefix="frl_reference_")
    sys.path.insert(0, str(Path(opts.reference).resolve()))
    sys.argv = reference_argv(opts, n_clients, log_dir)
    args = importlib.import_module("args").args  # parses sys.argv when first imported
    fl_train = importlib.import_module("FL_train")
    models = importlib.import_module("models")
    models.MLP = make_mlp(importlib.import_module("models.builder").Builder, sizes)
    random.seed(opts.seed)  # as its main.py
    torch.manual_seed(opts.seed)
    np.random.seed(opts.seed)  # added: its round draws use numpy's global generator
    args.device = torch.device("cpu")
    args.output_size = sizes[-1]
    run_dir = Path(log_dir) / "run"
    run_dir.mkdir()
    (run_dir / "output.txt").write_text(str(args))
    args.run_base_dir = run_dir
    accs: list[float] = []
    test = fl_train.test

    def recorded_test(*a, **k):
        loss, acc = test(*a, **k)
        accs.append(float(acc))
        return loss, acc

    fl_train.test = recorded_test
    train_loaders, test_loader = loaders(split, opts.batch_size)
    with contextlib.redirect_stdout(sys.stderr):
        fl_train.FRL_train(train_loaders, test_loader)
    malicious = [
        int(m.group(2))
        for line in (run_dir / "output.txt").read_text().splitlines()
        if (m := LINE.match(line))
    ]
    if len(accs) != opts.rounds or len(malicious) != opts.rounds:
        raise RuntimeError(f"expected {opts.rounds} rounds, got {len(accs)} / {len(malicious)}")
    return {
        "acc": accs,
        "malicious_in_round": malicious,
        "num_attackers": int(n_clients * opts.attack_fraction),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", required=True, help="a checkout of SPIN-UMass/FRL")
    parser.add_argument("--split", required=True, help="the .npz of frl_reference.py")
    parser.add_argument("--out", required=True, help="JSON: the run's per-round record")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--clients-per-round", type=int, default=10)
    parser.add_argument("--attack-fraction", type=float, default=0.0)
    parser.add_argument("--pool-size", type=int, default=25)
    parser.add_argument("--local-epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.4)
    parser.add_argument("--lrdc", type=float, default=0.999)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--wd", type=float, default=1e-4)
    parser.add_argument("--sparsity", type=float, default=0.5)
    opts = parser.parse_args(argv)
    torch.set_num_threads(1)
    Path(opts.out).write_text(json.dumps(run(opts)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
