"""Your own data in one try: a CSV with an owner column and string labels runs with
`feature_keys='*'` and `partition=natural`; errors name the key the user set; the partition
report names the classes; a failed download says why. Files are written here; nothing downloads.
"""

from __future__ import annotations

import csv
import logging

import numpy as np
import pytest
import torch
import yaml

from conftest import REPO, main_in_process, run_cli
from fedexp.data import hub
from fedexp.data.datasets import Dataset, load_cifar10, load_mnist
from fedexp.data.federated import FederatedData
from fedexp.data.files import data_error
from fedexp.data.hub_local import local_copy
from fedexp.data.partition import Partition
from fedexp.data.partition_report import label_figure, start_partition_stats
from fedexp.data.schemes import check_client_count
from fedexp.errors import ConfigError

DEFAULTS = yaml.safe_load((REPO / "conf" / "dataset" / "hf.yaml").read_text())["dataset"]


def load_hf(path, data_dir, **options):
    """`hub.load_hf` with conf/dataset/hf.yaml's defaults for the options not given."""
    kept = {k: v for k, v in DEFAULTS.items() if k not in ("_target_", "path", "data_dir")}
    return hub.load_hf(str(path), str(data_dir), **{**kept, **options})


def write_tumours(path, rows: int, sites: int = 4):
    """Row i: age 30 + i % 40, size i % 7, site `site<i % sites>`, diagnosis `malignant` when
    i % 3 == 0 else `benign`."""
    lines = ["age,size,site,diagnosis"]
    for i in range(rows):
        label = "malignant" if i % 3 == 0 else "benign"
        lines.append(f"{30 + i % 40},{i % 7},site{i % sites},{label}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_star_leaves_out_the_label_the_owner_and_columns_without_numbers(tmp_path, caplog):
    path = write_tumours(tmp_path / "tumours.csv", 6)
    with caplog.at_level(logging.INFO, logger="fedexp.data.hub_features"):
        # no client_key: `site` (site0, site1, ...) holds no number, so it is no feature
        data = load_hf(path, tmp_path, feature_keys="*", label_key="diagnosis")
    assert data.input_shape == (2,) and data.train_client_ids is None
    # age 30..35: mean 32.5, population std sqrt(35/12); size 0..5 alike
    std = np.sqrt(35 / 12)
    expected = [(i - 2.5) / std for i in range(6)]
    assert data.train_x[:, 0].tolist() == pytest.approx(expected, rel=1e-6)
    assert data.train_x[:, 1].tolist() == pytest.approx(expected, rel=1e-6)
    assert data.train_y.tolist() == [1, 0, 0, 1, 0, 0]  # benign 0, malignant 1 (sorted)
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "dataset.feature_keys='*': 2 feature columns (age, size); left out site (no numbers), "
        "diagnosis (dataset.label_key)"
    ]
    # the owner named: left out as the owner, and each row's site is its client
    owned = load_hf(path, tmp_path, feature_keys="*", label_key="diagnosis", client_key="site")
    assert owned.input_shape == (2,) and torch.equal(owned.train_x, data.train_x)
    assert owned.train_client_ids.tolist() == [0, 1, 2, 3, 0, 1]


def test_star_leaves_out_an_empty_column_and_names_that_read_as_nan(tmp_path, caplog):
    # `notes` is empty on every row; `name` holds "Nan" and "Ann", which no reader takes as data
    lines = ["age,notes,name,diagnosis"]
    lines += [f"{30 + i},,{'Nan' if i % 2 else 'Ann'},{'benign' if i % 3 else 'malignant'}"
              for i in range(6)]  # fmt: skip
    path = tmp_path / "people.csv"
    path.write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.INFO, logger="fedexp.data.hub_features"):
        data = load_hf(path, tmp_path, feature_keys="*", label_key="diagnosis")
    assert data.input_shape == (1,)  # age alone
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "1 feature columns (age)" in said
    assert "notes (no numbers)" in said and "name (no numbers)" in said


def test_star_keeps_a_column_of_numbers_with_a_bad_value_and_names_its_row(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("a,b,y\n1,2,0\nn/a,3,1\n")  # `a` holds numbers and one `n/a`
    with pytest.raises(ConfigError, match=r"^dataset.path: .*t.csv: split train, column a: row 1"):
        load_hf(path, tmp_path, feature_keys="*", label_key="y")
    path.write_text("name,y\nann,0\nbob,1\n")
    with pytest.raises(ConfigError, match=r"^dataset.feature_keys: '\*' found no column of number"):
        load_hf(path, tmp_path, feature_keys="*", label_key="y")


def test_class_names_come_from_label_strings_and_a_class_label(tmp_path):
    import datasets

    path = write_tumours(tmp_path / "tumours.csv", 6)
    data = load_hf(path, tmp_path, feature_keys=["age"], label_key="diagnosis")
    assert data.class_names == ("benign", "malignant") and data.num_classes == 2
    wider = load_hf(path, tmp_path, feature_keys=["age"], label_key="diagnosis", num_classes=3)
    assert wider.class_names == ("benign", "malignant", "2")  # the unnamed class keeps its id
    with pytest.raises(
        ConfigError, match=r"^dataset.num_classes: 1, but a label is 1 \('malignant'\)"
    ):
        load_hf(path, tmp_path, feature_keys=["age"], label_key="diagnosis", num_classes=1)
    numbers = load_hf(path, tmp_path, feature_keys=["age"], label_key="size")
    assert numbers.class_names is None and numbers.num_classes == 6  # sizes 0..5
    rows = {"v": [0.0, 1.0, 2.0], "kind": [2, 0, 1]}
    features = datasets.Features(
        {"v": datasets.Value("float32"), "kind": datasets.ClassLabel(names=["cat", "dog", "eel"])}
    )
    split = datasets.Dataset.from_dict(rows, features=features)
    datasets.DatasetDict({"train": split}).save_to_disk(str(tmp_path / "saved"))
    labelled = load_hf(tmp_path / "saved", tmp_path, feature_keys=["v"], label_key="kind")
    assert labelled.class_names == ("cat", "dog", "eel") and labelled.train_y.tolist() == [2, 0, 1]


def two_clients(class_names=None) -> FederatedData:
    """8 samples, labels 0,1,0,1,...: client 0 holds samples 0-3, client 1 samples 4-7, each
    2 of each class (local train = local test = its samples)."""
    x, y = torch.zeros(8, 2), torch.arange(8) % 2
    parts = [np.arange(4), np.arange(4, 8)]
    dataset = Dataset("hand", x, y, x, y, 2, (2,), class_names=class_names)
    return FederatedData(dataset, Partition(parts, parts), torch.device("cpu"))


def test_partition_stats_and_figure_name_the_classes(tmp_path):
    start_partition_stats(two_clients(["benign", "malignant"]), tmp_path, background=False).wait()
    rows = (tmp_path / "partition_stats.csv").read_text().splitlines()
    assert rows[0] == "client,group,n_train,n_test,n_val,class_benign,class_malignant"
    assert rows[1:] == ["0,,4,4,0,2,2", "1,,4,4,0,2,2"]
    assert (tmp_path / "partition_labels.png").read_bytes()[:4] == b"\x89PNG"
    counts = np.array([[2, 2], [2, 2]])
    ax = label_figure(counts, "t", ("benign", "malignant")).axes[0]
    ax.figure.canvas.draw()  # Agg: the tick labels as drawn
    assert [t.get_text() for t in ax.get_xticklabels()] == ["benign", "malignant"]
    # a name with a comma is one quoted cell; without names the ids stay
    (tmp_path / "b").mkdir()
    start_partition_stats(two_clients(["a,b", "c"]), tmp_path / "b", background=False).wait()
    with open(tmp_path / "b" / "partition_stats.csv", newline="") as f:
        assert next(csv.reader(f))[5:] == ["class_a,b", "class_c"]
    (tmp_path / "c").mkdir()
    start_partition_stats(two_clients(), tmp_path / "c", background=False).wait()
    header = (tmp_path / "c" / "partition_stats.csv").read_text().splitlines()[0]
    assert header.endswith(",class_0,class_1")
    with pytest.raises(ConfigError, match=r"^dataset.data_dir: hand: 1 class names for 2 classes"):
        two_clients(["one"])


def test_data_errors_name_the_key_that_located_the_data(tmp_path):
    import datasets

    path = tmp_path / "t.csv"
    path.write_text('a,y\n"1,0\n')  # a quote never closed
    with pytest.raises(ConfigError, match=r"^dataset.path: .*t.csv: not a readable csv file"):
        load_hf(path, tmp_path, feature_keys=["a"], label_key="y")
    path.write_text("a,y,user\n1,0,u1\n2,1,\n")  # row 1: no owner
    with pytest.raises(ConfigError, match=r"^dataset.path: .*column user: row 1 has no owner"):
        load_hf(path, tmp_path, feature_keys=["a"], label_key="y", client_key="user")
    path.write_text("a,y\n1,b\n2,\n")  # row 1: no label
    with pytest.raises(ConfigError, match=r"^dataset.label_key: a missing label .* train, row 1$"):
        load_hf(path, tmp_path, feature_keys=["a"], label_key="y")
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "train.csv").write_text("a,y\n1,0\n")
    (tmp_path / "mixed" / "train.jsonl").write_text('{"a": 1, "y": 0}\n')
    with pytest.raises(ConfigError, match=r"^dataset.path: .*mixed: split 'train' mixes"):
        load_hf(tmp_path / "mixed", tmp_path, feature_keys=["a"], label_key="y")
    # a Hub name's copy is found through dataset.data_dir: that key is named
    copy = local_copy(str(tmp_path / "hf"), "org/tab")
    rows = datasets.Dataset.from_dict({"a": ["1", "x"], "y": [0, 1]})
    datasets.DatasetDict({"train": rows}).save_to_disk(str(copy))
    with pytest.raises(ConfigError, match=r"^dataset.data_dir: .*org___tab: split train, column a"):
        load_hf("org/tab", tmp_path / "hf", feature_keys=["a"], label_key="y")
    # the key is set for the load only
    assert str(data_error("f", "p")) == "dataset.data_dir: f: p"


def test_clients_per_round_above_the_owners_is_clamped_with_one_log_line(caplog):
    with caplog.at_level(logging.INFO, logger="fedexp.data.schemes"):
        assert check_client_count(4, 20, 10) == 4
        assert check_client_count(4, 20, 3) == 3
        assert check_client_count(20, 20, 10) == 10  # as many clients as asked: nothing said
    assert [r.getMessage() for r in caplog.records] == [
        "partition: the data have 4 eligible owners, fewer than num_clients=20: running with "
        "4 clients, 4 a round (clients_per_round=10 asked)",
        "partition: the data have 4 eligible owners, fewer than num_clients=20: running with "
        "4 clients, 3 a round",
    ]


def _torchvision_offline(*_a, **_k):
    """What torchvision's MNIST raises when every mirror fails: a message over lines."""
    raise RuntimeError(
        "Error downloading train-images-idx3-ubyte.gz:\n"
        "Tried https://ossci-datasets.s3.amazonaws.com/mnist/, got:\n"
        "<urlopen error [Errno -3] Temporary failure in name resolution>\n"
    )


@pytest.mark.parametrize(
    ("loader", "patch"),
    [(load_mnist, "torchvision.datasets.MNIST"), (load_cifar10, "torchvision.datasets.CIFAR10")],
)
def test_a_failed_download_gives_its_cause_in_one_line(tmp_path, monkeypatch, loader, patch):
    monkeypatch.setattr(patch, _torchvision_offline)
    with pytest.raises(ConfigError) as err:
        loader(str(tmp_path), download=True, augment=False)
    message = str(err.value)
    assert "\n" not in message and message.startswith("dataset.data_dir: ")
    assert (
        "failed (RuntimeError: Error downloading train-images-idx3-ubyte.gz: Tried "
        "https://ossci-datasets.s3.amazonaws.com/mnist/, got: <urlopen error [Errno -3] "
        "Temporary failure in name resolution>); put " in message
    )


@pytest.mark.experiment
def test_a_failed_download_through_the_cli_exits_2_with_its_cause(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("torchvision.datasets.MNIST", _torchvision_offline)
    args = ("debug=smoke", "dataset=mnist", f"dataset.data_dir={tmp_path / 'm'}")
    code, err = main_in_process(monkeypatch, capsys, *args, "dataset.download=true")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1
    assert lines[0].startswith("fedexp: error: dataset.data_dir: MNIST download to ")
    assert "Temporary failure in name resolution" in lines[0] and "; put the MNIST/raw/" in lines[0]
    assert not list((tmp_path / "outputs").rglob("*.json"))


@pytest.mark.cli
def test_cli_a_csv_with_sites_and_string_labels_runs_in_one_try(tmp_path):
    """The defaults (20 clients, 10 a round) on a CSV of 4 sites: 4 clients, all of them each
    round; `*` leaves out the site and the diagnosis; the report names benign and malignant."""
    path = write_tumours(tmp_path / "tumours.csv", 400)
    proc = run_cli(
        "dataset=hf",
        f"dataset.path={path}",
        "dataset.feature_keys=*",  # what the shell passes for dataset.feature_keys='*'
        "dataset.label_key=diagnosis",
        "dataset.client_key=site",
        "partition=natural",
        "rounds=1",
        cwd=tmp_path,
    )
    said = proc.stdout + proc.stderr
    assert "2 feature columns (age, size); left out site (dataset.client_key)" in said
    assert "running with 4 clients, 4 a round (clients_per_round=10 asked)" in said
    (stats,) = (tmp_path / "outputs").rglob("partition_stats.csv")
    rows = stats.read_text().splitlines()
    assert rows[0] == "client,group,n_train,n_test,n_val,class_benign,class_malignant"
    assert len(rows) == 1 + 4  # one client a site
    assert (stats.parent / "summary.json").is_file()
