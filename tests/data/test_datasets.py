"""Image loaders (MNIST, Fashion-MNIST, CIFAR-10/100, FEMNIST) read small files written here in
their real on-disk layouts; the CLI loads them through `dataset.data_dir`."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from components import with_yaml
from conftest import REPO, main_in_process, run_dirs, summaries
from datafiles import (
    cifar10_batch,
    py2_cifar_pickle,
    write_cifar10,
    write_cifar100,
    write_idx,
    write_leaf_femnist,
    write_mnist,
)
from fedexp.core.types import ConfigError
from fedexp.data import datasets, partition_report
from fedexp.data.augment import CropFlip
from fedexp.data.datasets import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    Dataset,
    digits_arrays,
    load_cifar10,
    load_cifar100,
    load_fmnist,
    load_mnist,
)
from fedexp.data.federated import FederatedData
from fedexp.data.leaf import load_femnist
from fedexp.data.partition import Partition
from fedexp.data.partition_report import draw_once, start_partition_stats

load_mnist = with_yaml(load_mnist, "dataset", "mnist")
load_fmnist = with_yaml(load_fmnist, "dataset", "fmnist")
load_cifar10 = with_yaml(load_cifar10, "dataset", "cifar10")
load_cifar100 = with_yaml(load_cifar100, "dataset", "cifar100")
load_femnist = with_yaml(load_femnist, "dataset", "femnist", cache_dir=None)


def test_digits_are_read_from_sklearns_file_without_sklearn_datasets(monkeypatch):
    images, labels = digits_arrays()
    assert images.shape == (1797, 8, 8) and images.dtype == np.float64 and labels.dtype == int
    assert images[0, 0].tolist() == [0, 0, 5, 13, 9, 1, 0, 0] and labels[0] == 0  # first row
    assert images[-1, -1].tolist() == [0, 1, 8, 12, 14, 12, 1, 0] and labels[-1] == 8  # last
    # the class sizes scikit-learn's description gives (about 180 images a digit)
    assert np.bincount(labels).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    monkeypatch.setattr(datasets.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", SimpleNamespace(load_digits=lambda: 0))
    with pytest.raises(AttributeError, match="images"):  # no file found: sklearn's loader
        digits_arrays()


@pytest.mark.slow
def test_digits_read_from_sklearns_file_equal_sklearns_loader(monkeypatch):
    # here, not at the top: collecting this file stays free of sklearn.datasets (seconds)
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images, labels = digits_arrays()  # the file, read without sklearn.datasets
    assert images.dtype == bunch.images.dtype and labels.dtype == bunch.target.dtype
    assert np.array_equal(images, bunch.images) and np.array_equal(labels, bunch.target)
    monkeypatch.setattr(datasets.importlib.util, "find_spec", lambda name: None)
    fallback = digits_arrays()  # no file found: sklearn's loader
    assert np.array_equal(fallback[0], images) and np.array_equal(fallback[1], labels)


def test_mnist_idx_plain_and_gz(tmp_path):
    write_mnist(tmp_path, "MNIST", gz=False)
    ds = load_mnist(str(tmp_path))
    assert ds.train_x.shape == (30, 1, 28, 28) and ds.test_x.shape == (10, 1, 28, 28)
    assert ds.train_y.tolist() == [i % 10 for i in range(30)]
    assert ds.num_classes == 10 and ds.input_shape == (1, 28, 28)
    write_mnist(tmp_path / "gz", "FashionMNIST", gz=True)
    fm = load_fmnist(str(tmp_path / "gz"))
    assert fm.name == "fmnist" and fm.train_x.shape == (30, 1, 28, 28)
    assert fm.train_x.min() >= -0.2860 / 0.3530 - 1e-6


def test_idx_pixels_are_normalised_by_hand(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    img = np.zeros((1, 28, 28), dtype=np.uint8)
    img[0, 0, 0] = 255
    for prefix in ("train", "t10k"):
        write_idx(raw / f"{prefix}-images-idx3-ubyte", img)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", np.array([3]))
    ds = load_mnist(str(tmp_path))
    assert ds.train_x[0, 0, 0, 0].item() == pytest.approx((1 - 0.1307) / 0.3081)
    assert ds.train_x[0, 0, 0, 1].item() == pytest.approx(-0.1307 / 0.3081)
    assert ds.train_y.tolist() == [3]


def test_cifar100_pickles(tmp_path):
    write_cifar100(tmp_path)
    ds = load_cifar100(str(tmp_path))
    assert ds.train_x.shape == (40, 3, 32, 32) and ds.test_x.shape == (10, 3, 32, 32)
    assert ds.num_classes == 100 and ds.train_y.max() < 100
    assert ds.train_y[:3].tolist() == [0, 7, 14]
    assert ds.batch_transform is None
    assert load_cifar100(str(tmp_path), augment=True).batch_transform is not None


def test_cifar10_reads_pickles_without_md5(tmp_path):
    write_cifar10(tmp_path)
    ds = load_cifar10(str(tmp_path))
    assert ds.train_x.shape == (30, 3, 32, 32) and ds.train_y[:6].tolist() == list(range(6))


@pytest.mark.parametrize(("protocol", "byte_keys"), [(2, True), (2, False), (5, True), (5, False)])
def test_cifar_batches_load_with_str_or_bytes_keys_and_any_protocol(tmp_path, protocol, byte_keys):
    write_cifar10(tmp_path, n_per_batch=4, protocol=protocol, byte_keys=byte_keys)
    ds = load_cifar10(str(tmp_path))
    first, test = cifar10_batch(4, seed=0), cifar10_batch(4, seed=5)
    assert ds.train_y.tolist() == first["labels"] * 5 and ds.test_y.tolist() == test["labels"]
    # pixel 0 of image 0's red plane, and pixel 0 of its blue plane (row offset 2048), by hand
    red, blue = first["data"][0, 0], first["data"][0, 2048]
    assert ds.train_x[0, 0, 0, 0].item() == pytest.approx(
        (red / 255 - CIFAR10_MEAN[0]) / CIFAR10_STD[0]
    )
    assert ds.train_x[0, 2, 0, 0].item() == pytest.approx(
        (blue / 255 - CIFAR10_MEAN[2]) / CIFAR10_STD[2]
    )


def test_cifar_reads_the_python2_pickles_as_published(tmp_path):
    write_cifar10(tmp_path, n_per_batch=2)
    data = np.arange(2 * 3072).reshape(2, 3072) % 251
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (tmp_path / "cifar-10-batches-py" / name).write_bytes(py2_cifar_pickle(data, [3, 9]))
    ds = load_cifar10(str(tmp_path))
    assert ds.train_y.tolist() == [3, 9] * 5 and ds.test_y.tolist() == [3, 9]
    # image 1, green plane (offset 1024), row 0, column 1: byte 3072 + 1024 + 1 of the data
    expected = ((3072 + 1024 + 1) % 251 / 255 - CIFAR10_MEAN[1]) / CIFAR10_STD[1]
    assert ds.test_x[1, 1, 0, 1].item() == pytest.approx(expected)


def test_dataset_labels_must_fit_num_classes_and_inputs():
    x = torch.zeros(4, 3)
    with pytest.raises(ConfigError, match=r"^dataset.data_dir: toy: test label 2 outside \[0, 2\)"):
        Dataset("toy", x, torch.tensor([0, 1, 0, 1]), x, torch.tensor([0, 2, 1, 1]), 2, (3,))
    with pytest.raises(ConfigError, match=r"^dataset.data_dir: toy: 4 training inputs but 3"):
        Dataset("toy", x, torch.tensor([0, 1, 0]), None, None, 2, (3,))
    with pytest.raises(ConfigError, match=r"^dataset.data_dir: toy: 2 client ids for 4 training"):
        Dataset("toy", x, torch.tensor([0, 1, 0, 1]), None, None, 2, (3,), np.zeros(2))
    assert Dataset("toy", x, torch.tensor([0, 1, 0, 1]), None, None, 2, (3,)).num_classes == 2
    bad = x.clone()
    bad[2, 1] = float("nan")
    with pytest.raises(ConfigError, match=r"^dataset.data_dir: toy: test input 2 holds a non-fin"):
        Dataset("toy", x, torch.tensor([0, 1, 0, 1]), bad, torch.tensor([0, 1, 0, 1]), 2, (3,))


@pytest.mark.parametrize(
    "loader", [load_mnist, load_fmnist, load_cifar10, load_cifar100, load_femnist]
)
def test_missing_files_one_line_error(tmp_path, loader):
    with pytest.raises(ConfigError, match=r"^dataset\.data_dir: .*not found") as err:
        loader(str(tmp_path / "absent"))
    assert "\n" not in str(err.value)


def test_crop_flip_by_hand():
    x = torch.arange(9.0).view(1, 1, 3, 3).repeat(64, 1, 1, 1)
    out = CropFlip(padding=1, fill=(-1.0,))(x, torch.Generator().manual_seed(0))
    assert out.shape == x.shape
    # each output is a 3x3 window of the padded image, possibly mirrored: the centre pixel of
    # the input (4) appears in every window; padding shows up as -1 only
    assert all((o == 4).any() for o in out)
    assert set(out.unique().tolist()) <= set(range(9)) | {-1.0}
    assert any(torch.equal(o[0], x[0, 0].flip(-1)) for o in out)  # unshifted, mirrored
    again = CropFlip(padding=1, fill=(-1.0,))(x, torch.Generator().manual_seed(0))
    assert torch.equal(out, again)


def test_femnist_leaf_json_natural_clients(tmp_path):
    write_leaf_femnist(tmp_path, {"f0001_41": 5, "f0002_42": 3, "f0003_43": 4}, test_per_writer=2)
    ds = load_femnist(str(tmp_path))
    assert ds.train_x.shape == (12, 1, 28, 28) and ds.test_x.shape == (6, 1, 28, 28)
    assert ds.num_classes == 62 and ds.train_y.min() >= 0 and ds.train_y.max() < 62
    assert ds.train_client_ids.tolist() == [0] * 5 + [1] * 3 + [2] * 4
    assert ds.train_x.min() >= 0.0 and ds.train_x.max() <= 1.0


def test_femnist_parsed_once_then_read_from_the_cache(tmp_path, monkeypatch):
    write_leaf_femnist(tmp_path / "f", {"w1": 3, "w2": 2}, test_per_writer=1)
    first = load_femnist(str(tmp_path / "f"), cache_dir=str(tmp_path / "cache"))
    assert len(list((tmp_path / "cache" / "femnist").glob("*.npz"))) == 1

    def no_parsing(*_a, **_k):
        raise AssertionError("parsed again")

    monkeypatch.setattr("fedexp.data.leaf.read_leaf_json", no_parsing)
    again = load_femnist(str(tmp_path / "f"), cache_dir=str(tmp_path / "cache"))
    assert torch.allclose(first.train_x, again.train_x, atol=1e-6)  # 3-decimal pixels: float32
    assert torch.equal(first.test_y, again.test_y)
    assert first.train_client_ids.tolist() == again.train_client_ids.tolist() == [0] * 3 + [1] * 2


def test_femnist_hf_parquet_layout(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    def png(value: int) -> bytes:
        buf = io.BytesIO()
        Image.fromarray(np.full((28, 28), value, dtype=np.uint8)).save(buf, format="PNG")
        return buf.getvalue()

    table = pa.table(
        {
            "image": [{"bytes": png(v), "path": None} for v in (0, 255, 51)],
            "writer_id": ["f0000_14", "f0000_14", "f0001_41"],
            "hsf_id": [0, 0, 0],
            "character": [53, 28, 0],
        }
    )
    (tmp_path / "data").mkdir()
    pq.write_table(table, tmp_path / "data" / "train-00000-of-00001.parquet")
    ds = load_femnist(str(tmp_path))
    assert ds.train_y.tolist() == [53, 28, 0]
    assert ds.train_client_ids.tolist() == [0, 0, 1]
    assert ds.train_x[:, 0, 0, 0].tolist() == pytest.approx([0.0, 1.0, 0.2])
    assert ds.test_x is None


def compose_and_run(tmp_path: Path, monkeypatch, *overrides: str) -> tuple[dict, Path]:
    """Compose the real config in-process (no interpreter start) and run it; (summary, dir)."""
    from hydra import compose, initialize_config_dir

    from fedexp.run import Experiment

    monkeypatch.setenv("FEDEXP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FEDEXP_DATA_DIR", str(tmp_path / "data"))
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    run_dir = tmp_path / "run" / "_".join(o.replace("/", "-") for o in overrides)
    run_dir.mkdir(parents=True)
    return Experiment(cfg, run_dir).run().to_dict(), run_dir


@pytest.mark.experiment
@pytest.mark.parametrize("dataset", ["mnist", "fmnist", "cifar100", "femnist"])
def test_config_runs_each_image_dataset(tmp_path, monkeypatch, dataset):
    data = tmp_path / "data"
    write_mnist(data / "mnist", "MNIST", n_train=60, n_test=20)
    write_mnist(data / "fmnist", "FashionMNIST", n_train=60, n_test=20, gz=True)
    write_cifar100(data / "cifar100", n_train=200)
    writers = {f"f{k:04d}_{k}": 4 + k for k in range(8)}
    write_leaf_femnist(data / "femnist", writers)
    overrides = ["debug=smoke", f"dataset={dataset}", "rounds=1"]
    if dataset == "femnist":  # 60 samples of 8 writers: every one goes to the clients
        overrides.append("partition.server_pool=0")
    if dataset == "cifar100":
        overrides.append("dataset.augment=true")
    summary, run_dir = compose_and_run(tmp_path, monkeypatch, *overrides)
    assert summary["status"] == "completed"
    assert 0.0 <= summary["metrics"]["eval/global/acc"] <= 1.0
    assert (run_dir / "partition_labels.png").stat().st_size > 1000
    model = summary["config"]["model"]["_target_"].split(".")[-1]
    assert model == {"cifar100": "cnn", "femnist": "femnist_cnn"}.get(dataset, "lenet5")
    if dataset == "femnist":
        # the natural split: 6 (= num_clients) of the 8 writers, each a client with all of its
        # samples (local train + local test)
        rows = (run_dir / "partition_stats.csv").read_text().splitlines()[1:]
        sizes = [sum(int(n) for n in r.split(",")[2:5]) for r in rows]  # train + test + val
        assert len(sizes) == 6 == len(set(sizes)) and set(sizes) <= set(writers.values())


@pytest.mark.experiment
def test_label_distribution_png_goes_to_every_logger(tmp_path, monkeypatch):
    from hydra import compose, initialize_config_dir

    from fedexp.loggers.base import Logger
    from fedexp.run import Experiment

    class Recording(Logger):
        def __init__(self):
            self.artifacts = []

        def log_metrics(self, metrics, step):
            pass

        def log_artifact(self, path, kind):  # the file is complete when it is handed over
            self.artifacts.append((Path(path).name, kind, Path(path).read_bytes()[:4]))

        def finish(self, summary):
            pass

    monkeypatch.setenv("FEDEXP_CACHE_DIR", str(tmp_path / "cache"))
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["debug=smoke", "rounds=1"])
    logger = Recording()
    Experiment(cfg, tmp_path).run([logger])
    png = ("partition_labels.png", "partition/label_distribution", b"\x89PNG")
    assert png in logger.artifacts


def test_the_partition_plot_drawn_in_the_background_raises_its_error_when_waited_for(tmp_path):
    x, y = torch.zeros(8, 2), torch.arange(8) % 2
    train = [np.arange(4), np.arange(4, 8)]
    data = FederatedData(Dataset("hand", x, y, x, y, 2, (2,)), Partition(train, train), "cpu")
    (tmp_path / "partition_labels.png").mkdir()  # the PNG cannot be written
    stats = start_partition_stats(data, tmp_path, "hand")
    assert (tmp_path / "partition_stats.csv").read_text().splitlines()[1] == "0,,4,4,0,2,2"
    with pytest.raises(IsADirectoryError):
        stats.wait()


def test_a_plot_drawn_before_in_the_process_is_written_again_without_drawing(tmp_path, monkeypatch):
    drawn = []

    def counting(counts, path, title=""):
        drawn.append(title)
        return plot(counts, path, title)

    plot = partition_report.plot_label_distribution
    monkeypatch.setattr(partition_report, "plot_label_distribution", counting)
    monkeypatch.setattr(partition_report, "_DRAWN", {})
    monkeypatch.setattr(partition_report, "_DRAWN_KEPT", 1)  # the most recent plot only
    counts = np.array([[3, 1], [0, 4]])
    draw_once(counts, tmp_path / "a.png", "t")
    draw_once(counts.copy(), tmp_path / "b.png", "t")  # the same plot: the bytes of a.png
    draw_once(counts, tmp_path / "c.png", "u")  # another title: drawn, and t is forgotten
    draw_once(counts, tmp_path / "d.png", "t")
    assert drawn == ["t", "u", "t"]
    png = [(tmp_path / f"{name}.png").read_bytes() for name in "abcd"]
    assert png[0] == png[1] == png[3] != png[2] and png[0][:4] == b"\x89PNG"


@pytest.mark.experiment
def test_natural_split_on_a_dataset_without_client_ids_is_one_line(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"^partition: natural split needs .*iid") as e:
        compose_and_run(tmp_path, monkeypatch, "debug=smoke", "partition=natural")
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_cli_every_image_dataset_from_its_default_data_dir(cli):
    """One multirun (one interpreter start) over the image datasets, each reading the small
    files written under FEDEXP_DATA_DIR=<cwd>/data in its real layout, default partition."""
    data = cli.cwd / "data"
    write_mnist(data / "mnist", "MNIST", n_train=60, n_test=20)
    write_mnist(data / "fmnist", "FashionMNIST", n_train=60, n_test=20, gz=True)
    write_cifar100(data / "cifar100", n_train=200)
    writers = {f"f{k:04d}_{k}": 4 + k for k in range(8)}
    write_leaf_femnist(data / "femnist", writers)
    cli(
        "debug=smoke",
        "dataset=mnist,fmnist,cifar100,femnist",
        multirun=True,
    )
    runs = summaries(cli.cwd / "outputs")
    assert [s["choices"]["dataset"] for s in runs] == ["mnist", "fmnist", "cifar100", "femnist"]
    assert [s["status"] for s in runs] == ["completed"] * 4
    assert [s["config"]["model"]["_target_"].split(".")[-1] for s in runs] == [
        "lenet5",
        "lenet5",
        "cnn",
        "femnist_cnn",
    ]
    dirs = run_dirs(cli.cwd / "outputs")
    for run_dir in dirs:
        assert (run_dir / "partition_labels.png").stat().st_size > 1000
    # FEMNIST's natural split: 6 (= num_clients) of the 8 writers, each a client with all of
    # its samples (local train + test + validation)
    rows = (dirs[3] / "partition_stats.csv").read_text().splitlines()[1:]
    sizes = [sum(int(n) for n in r.split(",")[2:5]) for r in rows]  # train + test + val
    assert len(sizes) == 6 and set(sizes) <= set(writers.values())
    assert len(set(sizes)) == 6


@pytest.mark.experiment
def test_cli_missing_data_dir_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ("debug=smoke", "dataset=mnist", "dataset.data_dir=/nonexistent/x")
    code, err = main_in_process(monkeypatch, capsys, *args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1
    assert lines[0].startswith("fedexp: error: dataset.data_dir: MNIST")
    assert not list((tmp_path / "outputs").rglob("*.json"))
    assert not any(p.is_dir() for p in (tmp_path / "outputs" / "runs").glob("*/*"))


def _offline(*_a, **_k):
    raise ConnectionError("no network")


@pytest.mark.parametrize(
    "loader,patch",
    [
        (load_mnist, "torchvision.datasets.MNIST"),
        (load_cifar100, "torchvision.datasets.CIFAR100"),
        (load_femnist, "datasets.load_dataset"),
    ],
)
def test_failed_download_is_one_line(tmp_path, monkeypatch, loader, patch):
    monkeypatch.setattr(patch, _offline)
    with pytest.raises(ConfigError, match=r"^dataset\.data_dir: .*download .*failed") as err:
        loader(str(tmp_path), download=True)
    assert "ConnectionError" in str(err.value) and "\n" not in str(err.value)
