"""Presets run with each of their paper's baselines end to end at smoke size, in this process.

The tiny datasets are written in their real on-disk formats (CIFAR pickles, MNIST IDX, LEAF
FEMNIST JSON, the Sentiment140 CSV). One Hydra multirun per preset runs its methods; the
networks are narrowed (same layers, fewer channels) to keep each run to a second or two.
tests/config/test_presets_baselines.py composes every preset with every baseline.
"""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path

import numpy as np
import pytest

from conftest import main_in_process, write_sent140_csv
from datafiles import write_cifar100, write_leaf_femnist, write_mnist

pytestmark = pytest.mark.experiment

REPO = Path(__file__).resolve().parents[2]
NARROW = {  # same architecture, fewer units
    "conv8": ["model.channels=[4,4,4,4,8,8,8,8]", "model.hidden=[16,16]"],
    "lenet": ["model.channels=[4,8]", "model.hidden=16"],
    "cnn": ["model.channels=[4,8]", "model.hidden=[16,16]"],
    "lstm": ["model.embed_dim=8", "model.hidden=8", "model.fc_hidden=8"],
}
# preset: (its model, its methods, FedAvg's robust aggregators to run)
RUNS = {
    "fedhenn_cifar10_heterogeneous": ("cnn", "fedhenn,fedavg,fedprox,fedrep", ()),
    "fedhenn_cifar100_homogeneous": ("cnn", "fedhenn,fedavg,fedprox,fedrep", ()),
    "fedhenn_sent140_heterogeneous": ("lstm", "fedhenn,fedavg,fedprox,fedrep", ()),
    "waffle_cifar10_multimodal": ("lenet5", "waffle,fedavg,fedprox", ()),
    "waffle_fmnist_unimodal": ("lenet5", "waffle,fedavg,fedprox", ()),
    "frl_cifar10_attack20": ("conv8", "frl,signsgd", ("trimmed_mean", "multikrum")),
    "frl_mnist_dir1": ("lenet", "frl,fedavg,signsgd,topk", ("trimmed_mean", "multikrum")),
    "frl_femnist_attack20": ("lenet", "frl,signsgd,topk", ("trimmed_mean", "multikrum")),
    "fedprox_synthetic": ("mlp", "fedprox,fedavg", ()),
}


def write_cifar10(root: Path, n_per_batch: int) -> None:
    """The python-pickle layout: data_batch_1..5 and test_batch, labels cycling 0..9."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        entry = {
            "data": rng.integers(0, 256, (n_per_batch, 3072), dtype=np.uint8),
            "labels": [i % 10 for i in range(n_per_batch)],
        }
        (folder / name).write_bytes(pickle.dumps(entry))


# make test runs one preset per paper (~10 s of CPU each); make test-full runs them all
FAST = {"fedhenn_cifar10_heterogeneous", "waffle_fmnist_unimodal", "frl_femnist_attack20"}
CASES = [p if p in FAST else pytest.param(p, marks=pytest.mark.slow) for p in sorted(RUNS)]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """Every dataset the presets above read, a few hundred samples each."""
    data = tmp_path_factory.mktemp("data")
    write_cifar10(data / "cifar10", n_per_batch=40)
    write_cifar100(data / "cifar100", n_train=200, n_test=40)
    write_mnist(data / "mnist", "MNIST", n_train=200, n_test=40)
    write_mnist(data / "fmnist", "FashionMNIST", n_train=200, n_test=40, gz=True)
    write_leaf_femnist(data / "femnist", {f"f{k:04d}_{k}": 12 for k in range(8)})
    write_sent140_csv(data / "sent140", users=8, per_user=8)
    return data


def sweep(monkeypatch, capsys, out: Path, *args: str) -> list[dict]:
    code, err = main_in_process(
        monkeypatch, capsys, "-m", *args, "debug=smoke", f"hydra.sweep.dir={out}"
    )
    assert code == 0, err[-3000:]
    return [json.loads(p.read_text()) for p in sorted(out.rglob("summary.json"))]


@pytest.mark.parametrize("preset", CASES)
def test_preset_runs_with_each_baseline(preset, data_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FEDEXP_DATA_DIR", str(data_dir))
    monkeypatch.setenv("FEDEXP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    model, methods, robust = RUNS[preset]
    common = [f"experiment={preset}", *NARROW.get(model, [])]
    summaries = sweep(monkeypatch, capsys, tmp_path / "a", *common, f"algorithm={methods}")
    expected = [(m, None) for m in methods.split(",")]
    if robust:
        aggregators = ",".join(robust)
        args = [*common, "algorithm=fedavg", f"aggregator={aggregators}"]
        summaries += sweep(monkeypatch, capsys, tmp_path / "c", *args)
        expected += [("fedavg", agg) for agg in robust]
    ran = []
    for summary in summaries:
        assert summary["status"] == "completed" and summary["rounds_completed"] == 2
        choices = summary["choices"]
        assert choices["experiment"] == preset
        if preset.startswith("frl_"):  # each client's test split: the clients' accuracies
            assert math.isfinite(summary["metrics"]["eval/global/client_acc_mean"])
        robust_agg = choices["aggregator"] if choices["aggregator"] in robust else None
        ran.append((choices["algorithm"], robust_agg))
    assert sorted(ran, key=str) == sorted(expected, key=str)
