"""`dataset=hf`: Hugging Face datasets read from the two on-disk layouts the tests write here
(`save_to_disk` and Hub-style parquet); nothing is downloaded."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from tests.conftest import REPO, smoke_experiment

from fedexp.data import hub
from fedexp.data.hub_local import local_copy
from fedexp.errors import ConfigError

if TYPE_CHECKING:  # imported where used: not at collection, by each test worker
    import datasets

DEFAULTS = yaml.safe_load((REPO / "conf" / "dataset" / "hf.yaml").read_text())["dataset"]


def load_hf(path: str, data_dir: str, **options):
    """`hub.load_hf` with conf/dataset/hf.yaml's defaults for the options not given."""
    kept = {k: v for k, v in DEFAULTS.items() if k not in ("_target_", "path", "data_dir")}
    return hub.load_hf(path, data_dir, **{**kept, **options})


def image_split(n: int, offset: int = 0) -> datasets.Dataset:
    """n 4x4 grayscale images; image i has every pixel = 10 * (i + offset) % 256, label i % 3,
    writer i % 4 (as a string, like a writer id)."""
    import datasets

    rows = [(10 * (i + offset)) % 256 for i in range(n)]
    features = datasets.Features(
        {
            "img": datasets.Image(),
            "label": datasets.ClassLabel(names=["a", "b", "c"]),
            "writer": datasets.Value("string"),
        }
    )
    return datasets.Dataset.from_dict(
        {
            "img": [Image.fromarray(np.full((4, 4), v, np.uint8)) for v in rows],
            "label": [(i + offset) % 3 for i in range(n)],
            "writer": [f"w{i % 4}" for i in range(n)],
        },
        features=features,
    )


def text_split(n: int) -> datasets.Dataset:
    """Row i: 'good day' when i is even (label 'pos'), 'bad day' otherwise; user u<i % 3>."""
    import datasets

    return datasets.Dataset.from_dict(
        {
            "text": ["good day" if i % 2 == 0 else "bad day" for i in range(n)],
            "sentiment": ["pos" if i % 2 == 0 else "neg" for i in range(n)],
            "user": [f"u{i % 3}" for i in range(n)],
        }
    )


def write_saved(root: Path) -> Path:
    import datasets

    datasets.DatasetDict(
        {"train": image_split(24), "test": image_split(6, offset=24)}
    ).save_to_disk(str(root))
    return root


def write_parquet(root: Path, splits: dict[str, datasets.Dataset]) -> Path:
    """The Hub's own layout: data/<split>-00000-of-00001.parquet."""
    (root / "data").mkdir(parents=True)
    for name, split in splits.items():
        split.to_parquet(str(root / "data" / f"{name}-00000-of-00001.parquet"))
    return root


@pytest.mark.parametrize("layout", ["save_to_disk", "parquet"])
def test_images_load_with_labels_owners_and_train_statistics(tmp_path, layout):
    root = tmp_path / "ds"
    if layout == "save_to_disk":
        write_saved(root)
    else:
        write_parquet(root, {"train": image_split(24), "test": image_split(6, offset=24)})
    data = load_hf(str(root), str(tmp_path), image_key="img", client_key="writer")
    assert data.input_shape == (1, 4, 4) and data.num_classes == 3
    assert data.train_y.tolist() == [i % 3 for i in range(24)]
    assert data.test_y.tolist() == [(24 + i) % 3 for i in range(6)]
    assert data.train_client_ids.tolist() == [i % 4 for i in range(24)]
    # standardised with the training pixels' mean and std: train is zero-mean, unit-variance
    assert data.train_x.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert data.train_x.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-4)
    # every pixel of an image is one value, so images keep their order: row i brighter than i-1
    means = data.train_x.mean(dim=(1, 2, 3))
    assert bool((means[1:] > means[:-1]).all())
    # test image 0 (pixel 240) scaled by the same statistics as the training images
    raw = np.array([(10 * i) % 256 for i in range(24)], np.float64) / 255.0
    expected = (240 / 255.0 - raw.mean()) / raw.std()
    assert data.test_x[0, 0, 0, 0].item() == pytest.approx(expected, rel=1e-4)


@pytest.mark.experiment
def test_text_with_string_labels_and_users_runs_a_natural_federation(tmp_path):
    root = write_parquet(tmp_path / "tweets", {"train": text_split(30)})
    data = load_hf(
        str(root),
        str(tmp_path),
        text_key="text",
        label_key="sentiment",
        client_key="user",
        test_split=None,
        seq_len=3,
    )
    assert data.num_classes == 2  # "neg" -> 0, "pos" -> 1 (sorted)
    assert data.train_y.tolist() == [1 - i % 2 for i in range(30)]
    assert data.test_y is None and data.train_client_ids.tolist() == [i % 3 for i in range(30)]
    exp = smoke_experiment(
        tmp_path,
        "dataset=hf",
        f"dataset.path={root}",
        "dataset.text_key=text",
        "dataset.label_key=sentiment",
        "dataset.client_key=user",
        "dataset.seq_len=3",
        "model=lstm",
        "model.embed_dim=4",
        "model.hidden=4",
        "model.fc_hidden=4",
        "partition=natural",
        "partition.server_pool=0",  # 30 rows: every one goes to the clients
        "num_clients=3",
        "clients_per_round=3",
    )
    tokens = exp.data.dataset.train_x
    assert tokens.shape == (30, 3)
    # "good day" / "bad day": 3 words in the vocabulary (ids 2..4), then one padding id 0
    assert set(tokens[:, :2].flatten().tolist()) <= {2, 3, 4} and tokens[:, 2].eq(0).all()
    assert tokens[0, 1] == tokens[1, 1]  # "day" is one id


def test_char_tokens_and_a_holdout_test_split(tmp_path):
    root = write_parquet(tmp_path / "chars", {"train": text_split(20)})
    data = load_hf(
        str(root),
        str(tmp_path),
        text_key="text",
        label_key="sentiment",
        tokenizer="char",
        seq_len=8,
        test_split=None,
        test_fraction=0.25,
    )
    assert len(data.train_y) == 15 and len(data.test_y) == 5
    assert data.prepare.split("ab c") == ["a", "b", " ", "c"]


def test_a_hub_name_reads_its_local_copy_and_never_downloads_by_default(tmp_path):
    write_saved(local_copy(str(tmp_path / "hf"), "someone/digits"))
    data = load_hf("someone/digits", str(tmp_path / "hf"), image_key="img")
    assert len(data.train_y) == 24
    with pytest.raises(
        ConfigError,
        match=r"^dataset.path: someone/other is no local file or directory, and no Hub copy "
        r"of it is at .*someone___other \(under dataset.data_dir\); set dataset.download=true",
    ):
        load_hf("someone/other", str(tmp_path / "hf"), image_key="img")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"image_key": "picture"}, r"dataset.image_key: no column 'picture' .*columns: img"),
        ({"image_key": "img", "label_key": "nope"}, r"dataset.label_key: no column 'nope'"),
        ({}, r"^dataset.feature_keys: no input column: set dataset.feature_keys"),
        (
            {"image_key": "img", "text_key": "writer"},
            r"^dataset.text_key: set only one of .* got image_key and text_key$",
        ),
        ({"image_key": "img", "train_split": "dev"}, r"dataset.train_split: no split 'dev'"),
        ({"image_key": "img", "num_classes": 2}, r"dataset.num_classes: 2, but a label is 2"),
    ],
)
def test_bad_options_are_one_config_error(tmp_path, kwargs, message):
    write_saved(tmp_path / "ds")
    with pytest.raises(ConfigError, match=message):
        load_hf(str(tmp_path / "ds"), str(tmp_path), **kwargs)


def test_a_corrupt_parquet_file_is_named(tmp_path):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "train.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(ConfigError, match=r"^dataset.path: .*train.parquet: not a readable"):
        load_hf(str(tmp_path / "ds"), str(tmp_path), image_key="img")


@pytest.mark.experiment
def test_the_shakespeare_preset_reads_flower_columns(tmp_path):
    """flwrlabs/shakespeare's columns (character_id, x, y), from a local copy of that name."""
    import datasets

    rows = {
        "character_id": [f"ROLE{i % 3}" for i in range(18)],
        "x": ["to be or not to be"[: 5 + i % 4] for i in range(18)],
        "y": ["e", "t", " "][:3] * 6,
    }
    copy = local_copy(str(tmp_path / "hf"), "flwrlabs/shakespeare")
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows)}).save_to_disk(str(copy))
    exp = smoke_experiment(
        tmp_path,
        "dataset=shakespeare",
        f"dataset.data_dir={tmp_path / 'hf'}",
        "model.hidden=8",
        "model.fc_hidden=8",
        "partition.server_pool=0",  # 18 rows: every one goes to the clients
        "num_clients=3",
        "clients_per_round=3",
    )
    assert exp.data.num_classes == 3  # " ", "e", "t"
    assert exp.data.dataset.train_x.shape == (18, 80)
    assert isinstance(exp.data.dataset.train_x, torch.Tensor)


def test_the_path_is_required(tmp_path):
    with pytest.raises(ConfigError, match=r"^dataset.path: required"):
        load_hf("???", str(tmp_path), image_key="img")


def test_a_row_without_an_owner_is_refused_naming_it(tmp_path):
    import datasets

    split = image_split(6).to_dict()
    split["writer"][4] = None
    root = tmp_path / "ds"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(split)}).save_to_disk(str(root))
    with pytest.raises(ConfigError, match=r"split train, column writer: row 4 has no owner"):
        load_hf(str(root), str(tmp_path), image_key="img", client_key="writer")
