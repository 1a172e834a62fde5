"""dataset=mnist1d: the package's generator run offline, split as the package splits, cached
under data_dir (atomic writes, read without pickle, a damaged file generated again)."""

from __future__ import annotations

import logging
import random

import numpy as np
import pytest
import torch

from components import with_yaml
from conftest import main_in_process
from fedexp.data import mnist1d
from fedexp.errors import ConfigError

load = with_yaml(mnist1d.load_mnist1d, "dataset", "mnist1d")
N, SEED = 400, 3  # 40 samples of each class; 320 train, 80 test at test_fraction 0.2


@pytest.fixture(scope="module")
def fresh():
    """The 400-sample draw of seed 3, generated without a cache."""
    return load(num_samples=N, generator_seed=SEED, data_dir=None)


def arrays(ds):
    return [t.numpy() for t in (ds.train_x, ds.train_y, ds.test_x, ds.test_y)]


def test_shapes_classes_and_the_packages_own_split(fresh):
    assert fresh.name == "mnist1d" and fresh.num_classes == 10 and fresh.input_shape == (40,)
    assert fresh.train_x.shape == (320, 40) and fresh.test_x.shape == (80, 40)
    assert fresh.train_x.dtype == fresh.test_x.dtype == torch.float32
    assert fresh.train_y.dtype == fresh.test_y.dtype == torch.int64
    labels = np.concatenate([fresh.train_y.numpy(), fresh.test_y.numpy()])
    assert np.bincount(labels).tolist() == [40] * 10  # num_samples / 10 of each class
    assert len(set(fresh.train_y.tolist())) >= 8 and len(set(fresh.test_y.tolist())) >= 8
    # the package standardises train and test together: mean 0, std 1 over all 400 samples
    signals = np.concatenate([fresh.train_x.numpy(), fresh.test_x.numpy()]).astype(np.float64)
    assert abs(signals.mean()) < 1e-6 and abs(signals.std() - 1) < 1e-5
    # exactly the package's own dataset of these arguments, its 0.8 train split included
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples, args.seed, args.train_split = N, SEED, 0.8
    ref = make_dataset(args)
    expected = [ref["x"].astype(np.float32), ref["y"], ref["x_test"].astype(np.float32)]
    for got, want in zip(arrays(fresh), [*expected, ref["y_test"]]):
        np.testing.assert_array_equal(got, want)


def test_cache_hit_equals_fresh_generation(fresh, tmp_path, monkeypatch):
    first = load(num_samples=N, generator_seed=SEED, data_dir=str(tmp_path))
    (path,) = tmp_path.iterdir()  # one file, no temporary left behind
    assert path == mnist1d.cache_path(str(tmp_path), N, SEED)
    assert path.stat().st_mode & 0o777 == 0o644  # readable by the others sharing a data dir

    def no_generation(*_args):
        raise AssertionError("generated again despite the cache")

    monkeypatch.setattr(mnist1d, "generate", no_generation)
    second = load(num_samples=N, generator_seed=SEED, data_dir=str(tmp_path))
    for a, b, c in zip(arrays(first), arrays(second), arrays(fresh)):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
    # another test_fraction splits the same cached arrays
    third = load(num_samples=N, test_fraction=0.5, generator_seed=SEED, data_dir=str(tmp_path))
    assert len(third.train_y) == len(third.test_y) == 200
    np.testing.assert_array_equal(third.train_x.numpy(), fresh.train_x.numpy()[:200])


def test_another_seed_gives_other_data_and_the_global_rngs_are_untouched(fresh):
    np.random.seed(11)
    random.seed(11)
    before = np.random.get_state()[1].copy(), random.getstate()
    other = load(num_samples=N, generator_seed=SEED + 1, data_dir=None)
    assert np.random.get_state()[1].tolist() == before[0].tolist()
    assert random.getstate() == before[1]
    assert other.train_x.shape == fresh.train_x.shape
    assert (other.train_x != fresh.train_x).float().mean() > 0.9


def _truncate(path, x, y):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _objects(path, x, y):  # a pickled object array: np.load(allow_pickle=False) refuses it
    np.savez(path, x=np.array([{"a": 1}], dtype=object), y=y)


def _short(path, x, y):
    np.savez(path, x=x[:-1], y=y[:-1])


@pytest.mark.parametrize("damage", [_truncate, _objects, _short])
def test_damaged_cache_is_generated_again_with_a_log_line(fresh, tmp_path, caplog, damage):
    path = mnist1d.cache_path(str(tmp_path), N, SEED)
    x, y = mnist1d.mnist1d_arrays(N, SEED, None)
    mnist1d.write_cache(path, x, y)
    damage(path, x, y)
    with caplog.at_level(logging.INFO, logger="fedexp.data.mnist1d"):
        again = load(num_samples=N, generator_seed=SEED, data_dir=str(tmp_path))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"cache {path}: " in warnings[0]
    assert "generating it again" in warnings[0]
    for a, b in zip(arrays(again), arrays(fresh)):
        np.testing.assert_array_equal(a, b)
    assert mnist1d.read_cache(path, N) is not None  # rewritten whole


@pytest.mark.experiment
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("dataset.num_samples=605", "dataset.num_samples: must be a multiple of 10 and >= 100"),
        ("dataset.num_samples=many", "dataset.num_samples: must be an int, got 'many'"),
        ("model=lenet5", "model: fedexp.models.cnn.lenet5 needs image inputs"),  # after loading
    ],
)
def test_bad_values_are_one_line_exit_2(tmp_path, monkeypatch, capsys, override, message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDEXP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FEDEXP_DATA_DIR", str(tmp_path / "data"))
    size = () if "num_samples" in override else (f"dataset.num_samples={N}",)
    code, err = main_in_process(
        monkeypatch, capsys, "debug=smoke", "dataset=mnist1d", *size, override
    )
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and message in lines[0], err
    assert not list((tmp_path / "outputs").rglob(".hydra"))  # no run dir left behind
    assert not (tmp_path / "data").exists() or override == "model=lenet5"  # refused unloaded


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ((90, 0.2, 0), "dataset.num_samples: must be a multiple of 10 and >= 100 .*, got 90$"),
        ((-400, 0.2, 0), "dataset.num_samples: must be a multiple of 10 and >= 100 .*, got -400$"),
        (
            (400.0, 0.2, 0),
            "dataset.num_samples: must be a multiple of 10 and >= 100 .*, got 400.0$",
        ),
        ((400, 0.2, -1), r"dataset.generator_seed: must be an integer in \[0, 2\*\*32\)"),
        ((400, 0.2, 2**32), r"dataset.generator_seed: must be an integer in \[0, 2\*\*32\)"),
        ((400, 1.0, 0), r"dataset.test_fraction: must be in \(0, 1\), got 1.0"),
        ((400, 0, 0), r"dataset.test_fraction: must be in \(0, 1\), got 0"),
        ((400, 0.999, 0), "0.999 of 400 samples leaves 0 for training and 400 for the test set"),
    ],
)
def test_the_loader_refuses_bad_values_in_one_line(values, message):
    with pytest.raises(ConfigError, match=message) as err:
        load(*values[:1], test_fraction=values[1], generator_seed=values[2], data_dir=None)
    assert "\n" not in str(err.value)
