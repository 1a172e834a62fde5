"""scripts/frl_reference.py: the exported split, the attacker order, the shim's pieces that need no
checkout of the reference code, and the tables generated from a tiny results file by hand."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import frl_reference as fr  # noqa: E402
import frl_reference_shim as shim  # noqa: E402
import frl_reference_table as table  # noqa: E402

SMALL = ["num_clients=10", "clients_per_round=4", "rounds=2"]


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDEXP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FEDEXP_DATA_DIR", str(tmp_path / "data"))
    return fr.compose([f"experiment={fr.PRESET}", "seed=3", *SMALL])


def test_client_order_puts_fedexps_attackers_where_the_reference_looks():
    assert fr.client_order(6, [1, 4], "same") == [1, 4, 0, 2, 3, 5]
    assert fr.client_order(6, [1, 4], "own") == [0, 1, 2, 3, 4, 5]


def test_attackers_are_the_ones_a_fedexp_run_draws(cfg, tmp_path):
    from fedexp.run.components import build_components

    attack = ["attack=rank_reversal", "attack.fraction=0.2"]
    attacked = fr.compose([f"experiment={fr.PRESET}", "seed=3", *SMALL, *attack])
    run = build_components(attacked, tmp_path / "run")
    assert sorted(run.attack.malicious) == fr.attackers_of(3, 0.2, 10)
    assert len(fr.attackers_of(3, 0.2, 10)) == 2  # int(0.2 * 10)
    assert fr.attackers_of(3, 0.2, 10) != fr.attackers_of(4, 0.2, 10)  # a draw of the seed


def test_export_writes_each_clients_training_split_in_the_reference_order(cfg, tmp_path):
    from fedexp.config.pool import resolve_server_pool
    from fedexp.run.components import build_data
    from fedexp.runtime.fingerprint import data_digest

    info = fr.export_split(cfg, 0.2, "same", tmp_path / "split.npz")
    split = dict(np.load(tmp_path / "split.npz"))
    resolve_server_pool(cfg)
    torch.manual_seed(3)
    data = build_data(cfg, torch.device("cpu"))  # what a run with seed 3 trains on
    assert info["fingerprint"] == data_digest(data)
    assert info["order"][:2] == info["malicious"] == fr.attackers_of(3, 0.2, 10)
    assert sorted(info["order"]) == list(range(10))
    offsets = split["offsets"]
    assert offsets[0] == 0 and offsets[-1] == len(split["y"]) == sum(info["train_sizes"])
    for position, client in enumerate(info["order"]):
        x, y = data.train(client)
        lo, hi = offsets[position], offsets[position + 1]
        assert np.array_equal(split["x"][lo:hi], x.numpy())
        assert np.array_equal(split["y"][lo:hi], y.numpy())
    assert np.array_equal(split["test_x"], data.test_x.numpy())
    assert np.array_equal(split["test_y"], data.test_y.numpy())
    assert split["sizes"].tolist() == info["sizes"] == [64, 128, 10]
    assert info["test_size"] == len(data.test_y)


def test_the_shims_command_line_loaders_and_model():
    opts = shim.argparse.Namespace(
        seed=2, clients_per_round=4, pool_size=25, attack_fraction=0.2, rounds=40,
        local_epochs=2, batch_size=3, lr=0.4, lrdc=0.999, momentum=0.9, wd=1e-4, sparsity=0.5,
    )  # fmt: skip
    argv = shim.reference_argv(opts, 10, "/tmp/x")
    pairs = dict(zip(argv[1::2], argv[2::2]))
    assert pairs["--FL_global_epochs"] == "39"  # its loop runs e = 0 .. 39: 40 rounds
    assert pairs["--nClients"] == "10" and pairs["--at_fractions"] == "0.2"
    assert pairs["--model"] == "MLP" and pairs["--FL_type"] == "FRL"

    split = {
        "x": np.arange(7 * 4, dtype=np.float32).reshape(7, 1, 2, 2),
        "y": np.arange(7, dtype=np.int64),
        "offsets": np.array([0, 2, 7]),
        "test_x": np.zeros((5, 1, 2, 2), np.float32),
        "test_y": np.arange(5, dtype=np.int64),
    }
    train, test = shim.loaders(split, 3)
    assert [len(t.dataset) for t in train] == [2, 5]
    seen = sorted(int(v) for _, y in train[1] for v in y)
    assert seen == [2, 3, 4, 5, 6] and [len(y) for _, y in train[1]] == [3, 2]
    assert [int(v) for _, y in test for v in y] == [0, 1, 2, 3, 4]

    class Builder:  # the reference's Builder().conv1x1, as plain 1x1 convolutions
        def conv1x1(self, a, b, first_layer=False):
            return nn.Conv2d(a, b, 1, bias=False)

    model = shim.make_mlp(Builder, [4, 6, 3])()
    assert [type(m) for m in model.linear] == [nn.Conv2d, nn.ReLU, nn.Conv2d]
    assert model(torch.zeros(5, 1, 2, 2)).shape == (5, 3)
    line = "e 7 | malicious users: 3 | test acc 0.8000 test loss 0.5 best test_acc 0.9"
    assert shim.LINE.match(line).groups() == ("7", "3")


def results_by_hand() -> dict:
    def side(clean, attacked, malicious=(0, 0)):
        return {
            str(s): {
                "clean": {"final": c, "last10": c - 0.01},
                "attacked": {"final": a, "last10": a, "malicious_in_round": list(m)},
            }
            for s, (c, a, m) in enumerate(zip(clean, attacked, [malicious] * 3))
        }

    setting = dict.fromkeys(["preset", "num_clients", "local_epochs", "batch_size", "lr"], 1)
    setting.update(
        dict.fromkeys(["momentum", "wd", "k", "sizes", "test_size", "attack_fraction"], 0)
    )
    setting.update(
        seed_list="0, 1, 2", rounds=2, first_last10=1, clients_per_round=4, num_attackers=2,
        pool_size=25, attacker_rule="rule", reference_commit="abc", command="cmd",
        results="r.json", labels={"reference": "ref", "fedexp": "fx"},
    )  # fmt: skip
    return {
        "setting": setting,
        "splits": {},
        "sides": {
            # drops 0.3, 0.1, 0.2 and 0.1, 0.0, 0.2: the paired differences 0.2, 0.1, 0.0
            "reference": side([0.9, 0.8, 0.7], [0.6, 0.7, 0.5], malicious=(2, 1)),
            "fedexp": side([0.9, 0.9, 0.9], [0.8, 0.9, 0.7]),
        },
    }


def test_tables_from_a_tiny_results_file_by_hand(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(fr.dump(results_by_hand()))
    assert json.loads(path.read_text()) == results_by_hand()
    assert fr.main(["--table-only", str(path), "--doc", str(tmp_path / "doc.md")]) == 0
    doc = (tmp_path / "doc.md").read_text()
    assert "| ref | 0.800 ± 0.100 | 0.600 ± 0.100 | **0.200 ± 0.100** |" in doc
    assert "| fx | 0.900 ± 0.000 | 0.800 ± 0.100 | **0.100 ± 0.100** |" in doc
    assert "| 0 | 0.900 → 0.600 (+0.300) | 0.900 → 0.800 (+0.100) |" in doc
    # the paired drops: differences 0.2, 0.1, 0.0; t = 0.1 / (0.1 / √3) = 1.73, df 2:
    # p = 1 − t / √(t² + 2) = 1 − √3/√5 = 0.225
    assert "| fx | drop, final round | 0.100 ± 0.100 | 1.73 | 0.225 | 2 of 3 |" in doc
    # clean accuracies: 0.0, −0.1, −0.2 (the reference lower)
    assert "| fx | clean accuracy, final round | -0.100 ± 0.100 | -1.73 | 0.225 | 0 of 3 |" in doc
    assert "(of 6 per side, both re-drawing such cohorts): ref 3, fx 0." in doc  # 2 of 4: half
    assert "Seeds 0, 1, 2" in doc and "rounds 1 .. 2" in doc


def test_paired_comparison_without_spread_has_no_t():
    same = table.paired({"0": 0.5, "1": 0.75}, {"0": 0.25, "1": 0.5})
    assert same["mean"] == 0.25 and same["std"] == 0.0
    assert same["larger"] == 2 and np.isnan(same["p"])
    one = table.paired({"0": 0.2}, {"0": 0.1, "1": 0.5})
    assert one["n"] == 1 and np.isnan(one["std"])
