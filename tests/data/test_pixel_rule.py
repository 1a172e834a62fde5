"""The pixel rule (`fedexp.data.pixels`): every image loader maps its stored pixels to [0, 1] by
dtype (uint8 / 255, floats in [0, 1] kept) or by `dataset.pixel_range`, and refuses anything
else in one line naming the file, the row and the value; nothing is clipped or cast silently."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from tests.conftest import smoke_experiment
from tests.data.test_hub_dataset import load_hf

from components import with_yaml
from datafiles import leaf_blob
from fedexp.data.leaf import load_femnist
from fedexp.data.pixels import to_unit
from fedexp.errors import ConfigError

load_femnist = with_yaml(load_femnist, "dataset", "femnist", cache_dir=None)


def write_hf(root: Path, images, dtype: str = "float32", n_test: int = 4) -> Path:
    """A save_to_disk copy whose `img` column holds the given 8x8 arrays (Array2D of dtype),
    label i % 2; the last n_test rows are the test split."""
    import datasets

    features = datasets.Features(
        {"img": datasets.Array2D((8, 8), dtype), "label": datasets.Value("int64")}
    )
    rows = {
        "img": [np.asarray(a).tolist() for a in images],
        "label": [i % 2 for i in range(len(images))],
    }
    full = datasets.Dataset.from_dict(rows, features=features)
    n = len(images) - n_test
    datasets.DatasetDict(
        {"train": full.select(range(n)), "test": full.select(list(range(n, len(images))))}
    ).save_to_disk(str(root))
    return root


def unit_images(seed: int, n: int = 40) -> np.ndarray:
    """n 8x8 float images in [0, 1]: class 1 bright on the left half, class 0 on the right."""
    rng = np.random.default_rng(seed)
    x = rng.random((n, 8, 8)) * 0.5
    x[1::2, :, :4] += 0.5
    x[0::2, :, 4:] += 0.5
    return x


def test_float_images_in_unit_range_keep_their_values(tmp_path):
    images = unit_images(0, 8)
    data = load_hf(str(write_hf(tmp_path / "a", images)), str(tmp_path), image_key="img")
    # standardised with the training pixels' mean and std: undo it and the stored values return
    train = images[:4].astype(np.float32)
    mean, std = train.mean(dtype=np.float64), train.std(dtype=np.float64)
    restored = data.train_x[:, 0].numpy() * std + mean
    np.testing.assert_allclose(restored, train, atol=1e-6)


@pytest.mark.experiment
def test_two_different_valid_image_sets_never_give_identical_runs(tmp_path):
    results = []
    for seed in (1, 2):
        root = write_hf(tmp_path / f"set{seed}", unit_images(seed))
        exp = smoke_experiment(
            tmp_path / f"run{seed}",
            "dataset=hf",
            f"dataset.path={root}",
            "dataset.image_key=img",
            "model=mlp",
            "partition=iid",
            "partition.server_pool=0",
            "num_clients=2",
            "clients_per_round=2",
            "rounds=1",
        )
        results.append((exp.data.dataset.train_x, exp.run().to_dict()["metrics"]))
    (x1, m1), (x2, m2) = results
    assert x1.std() > 0.5 and x2.std() > 0.5  # the pixels were not discarded
    assert not torch.equal(x1, x2)
    assert m1["train/loss"] != m2["train/loss"]


def test_integer_pixels_are_divided_by_255_like_uint8(tmp_path):
    values = np.arange(64, dtype=np.int64).reshape(8, 8) * 4  # 0..252
    as_int = load_hf(
        str(write_hf(tmp_path / "i", [values] * 6, "int32")), str(tmp_path), image_key="img"
    )
    as_u8 = load_hf(
        str(write_hf(tmp_path / "u", [values] * 6, "uint8")), str(tmp_path), image_key="img"
    )
    assert torch.equal(as_int.train_x, as_u8.train_x)
    by_hand = values.astype(np.float32) / np.float32(255)  # float32 division, as torch does
    np.testing.assert_array_equal(to_unit(values.astype(np.uint8), "x"), by_hand)


@pytest.mark.parametrize(
    ("dtype", "bad", "message"),
    [
        ("float32", np.nan, "row 2: pixel value nan is not finite"),
        ("float32", np.inf, "row 2: pixel value inf is not finite"),
        ("float32", 255.0, "row 2: pixel value 255.0 outside [0, 1] for float"),
        ("float32", -0.5, "row 2: pixel value -0.5 outside [0, 1] for float"),
        ("int32", 1000, "row 2: pixel value 1000 outside 0..255 for int"),
        ("int32", -1, "row 2: pixel value -1 outside 0..255 for int"),
    ],
)
def test_a_value_outside_its_dtype_range_is_refused_naming_file_row_and_rule(
    tmp_path, dtype, bad, message
):
    images = [np.full((8, 8), 0.5 if dtype == "float32" else 100) for _ in range(6)]
    images[2] = images[2].astype(np.float64)
    images[2][3, 4] = bad
    root = write_hf(tmp_path / "bad", images, dtype, n_test=2)
    with pytest.raises(ConfigError) as err:
        load_hf(str(root), str(tmp_path), image_key="img")
    text = str(err.value)
    # the data are the directory given as dataset.path: that key is named
    assert text.startswith(f"dataset.path: {root}: split train, column img: "), text
    assert message in text and "\n" not in text, text
    if "finite" not in message:
        assert "dataset.pixel_range" in text  # the rule, and the option that maps another range


def test_pixel_range_maps_a_declared_range_and_refuses_values_outside_it(tmp_path):
    levels = np.arange(64, dtype=np.float64).reshape(8, 8) * 4
    u8 = load_hf(
        str(write_hf(tmp_path / "u", [levels] * 6, "uint8")), str(tmp_path), image_key="img"
    )
    root = write_hf(tmp_path / "f", [levels] * 6, "float32")  # float levels 0..252
    mapped = load_hf(str(root), str(tmp_path), image_key="img", pixel_range=[0, 255])
    torch.testing.assert_close(mapped.train_x, u8.train_x, rtol=0, atol=1e-6)
    with pytest.raises(
        ConfigError, match=r"row 0: pixel value 104.0 outside dataset.pixel_range \[0, 100\]"
    ):
        load_hf(str(root), str(tmp_path), image_key="img", pixel_range=[0, 100])
    for bad in ([1, 0], [0], [0, float("nan")], "0-255"):
        with pytest.raises(ConfigError, match=r"^dataset.pixel_range: must be null or \[lo, hi\]"):
            load_hf(str(root), str(tmp_path), image_key="img", pixel_range=bad)


def test_a_16_bit_png_is_not_clipped_but_refused(tmp_path):
    import datasets

    pixels = np.full((8, 8), 1000, dtype=np.uint16)
    features = datasets.Features({"img": datasets.Image(), "label": datasets.Value("int64")})
    image = Image.fromarray(pixels)  # mode I;16
    split = datasets.Dataset.from_dict({"img": [image] * 3, "label": [0, 1, 0]}, features=features)
    datasets.DatasetDict({"train": split}).save_to_disk(str(tmp_path / "png"))
    with pytest.raises(ConfigError, match=r"row 0: pixel value 1000 outside 0\.\.255"):
        load_hf(str(tmp_path / "png"), str(tmp_path), image_key="img")
    data = load_hf(str(tmp_path / "png"), str(tmp_path), image_key="img", pixel_range=[0, 65535])
    assert data.train_x.shape == (3, 1, 8, 8)


@pytest.mark.parametrize(("empty", "key"), [("test", "test_split"), ("train", "train_split")])
def test_an_empty_split_is_refused_naming_it(tmp_path, empty, key):
    import datasets

    saved = write_hf(tmp_path / "saved", unit_images(0, 6), n_test=2)
    root = tmp_path / "parquet"
    root.mkdir()
    for name in ("train", "test"):
        split = datasets.load_from_disk(str(saved))[name]
        split = split.select([]) if name == empty else split
        split.to_parquet(str(root / f"{name}.parquet"))
    with pytest.raises(ConfigError, match=rf"^dataset.{key}: split '{empty}' of {root} is empty"):
        load_hf(str(root), str(tmp_path), image_key="img")


def write_leaf(root: Path, scale: float) -> None:
    """LEAF train/ JSON whose pixels are levels k/255 times `scale` (1: LEAF's own [0, 1])."""
    blob = leaf_blob({"w1": 3, "w2": 2})
    rng = np.random.default_rng(0)
    for user in blob["user_data"].values():
        levels = rng.integers(0, 256, (len(user["y"]), 784))
        user["x"] = (levels / 255 * scale).tolist() if scale != 255 else levels.tolist()
    (root / "train").mkdir(parents=True)
    (root / "train" / "data.json").write_text(json.dumps(blob))


def test_leaf_pixels_in_0_255_are_refused_or_mapped_by_pixel_range(tmp_path):
    write_leaf(tmp_path / "unit", 1)
    write_leaf(tmp_path / "levels", 255)
    with pytest.raises(ConfigError) as err:
        load_femnist(str(tmp_path / "levels"))
    text = str(err.value)
    assert text.startswith(f"dataset.data_dir: {tmp_path / 'levels' / 'train' / 'data.json'}: ")
    assert "user w1: sample 0: pixel value" in text and "outside [0, 1]" in text
    assert "LEAF JSON pixels must be in [0, 1]" in text and "pixel_range" in text
    mapped = load_femnist(str(tmp_path / "levels"), pixel_range=[0, 255])
    assert torch.equal(mapped.train_x, load_femnist(str(tmp_path / "unit")).train_x)
