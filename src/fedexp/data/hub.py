"""Any Hugging Face Hub dataset of images, text or numeric features, read through `datasets`.

`dataset.path` names a Hub dataset (`org/name`), a local directory holding either a
`save_to_disk` copy (a `DatasetDict` or a single `Dataset`) or data files (`train.parquet`,
`train-00000-of-00001.parquet`, `data/train-*.parquet` as the Hub stores them, a `train/`
folder of them; CSV, TSV, JSON and JSON-lines files alike: `train.csv`, `test.csv`), or one data
file, which is the training split (`fedexp.data.hub_local`). A Hub name is read from its local
copy under `dataset.data_dir` (`<data_dir>/<org>___<name>`, written by `save_to_disk`);
`dataset.download=true` fetches it first when that copy is missing. Nothing else touches the
network.

The input is one image column (`image_key`: images of one size, mapped to [0, 1] by the pixel
rule of `fedexp.data.pixels` (uint8 / 255, floats in [0, 1] kept, anything else refused unless
`dataset.pixel_range` declares the stored range) and standardised with the training images'
per-channel mean and std), one text column (`text_key`: strings, tokenised to `seq_len` token ids
with a vocabulary fitted on the clients' training rows only, as Sent140's), or numeric columns
(`feature_keys`: a vector, standardised per feature with the training rows' mean and std; `*`:
every column of numbers but the label and the owner, `fedexp.data.hub_features`). One column is
the label (`label_key`: a `ClassLabel`, integers, booleans or strings; strings become class ids
in sorted order, and the names are kept as `Dataset.class_names`), and optionally one the
natural owner (`client_key`: a writer or user id, for `partition=natural`).

A problem with the data names the option that located it: `dataset.path` for a file or
directory given there, `dataset.data_dir` for a Hub name's copy kept under it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedexp.data.datasets import Dataset
from fedexp.data.files import data_error, data_key
from fedexp.data.hub_features import column as _column
from fedexp.data.hub_features import feature_keys as _feature_keys
from fedexp.data.hub_features import features as _features
from fedexp.data.hub_local import dataset_root, splits_used
from fedexp.data.leaf import owner_ids
from fedexp.data.pixels import check_pixel_range, decode_image, to_unit
from fedexp.data.text import Sent140Encoder, tokenize
from fedexp.errors import ConfigError

TOKENIZERS = {"word": tokenize, "char": list}


def _images(values: list, where: str, pixel_range) -> np.ndarray:
    """One column of images -> float32 NCHW in [0, 1] by the pixel rule (see `pixels.py`)."""
    if not values:
        raise data_error(where, "no rows (an empty split)")
    arrays = [decode_image(v, f"{where}: row {i}") for i, v in enumerate(values)]
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        sizes = ", ".join(sorted("x".join(map(str, s)) for s in shapes)[:4])
        raise data_error(where, f"images of different sizes ({sizes}); resize them to one size")
    if len({a.dtype for a in arrays}) == 1:  # one check of the whole column, its row named
        unit = to_unit(np.stack(arrays), where, pixel_range)
    else:  # each image by the rule of its own dtype
        rows = [to_unit(a, f"{where}: row {i}", pixel_range) for i, a in enumerate(arrays)]
        unit = np.stack(rows)
    return unit[:, None] if unit.ndim == 3 else unit.transpose(0, 3, 1, 2)


def _class_names(splits: dict[str, Any], label_key: str, used: list[str]) -> list | None:
    """The ClassLabel names, or None when labels are plain values."""
    feature = splits[used[0]].features.get(label_key)
    return list(feature.names) if hasattr(feature, "names") else None


def _encode_labels(
    columns: list[list], names: list | None, num_classes: int | None, where: list[str]
) -> tuple[list[np.ndarray], int, tuple[str, ...] | None]:
    """Label columns -> int64 arrays in [0, C), C and the class names (a ClassLabel's, or the
    label strings, which map to ids in sorted order; None for numbers)."""
    values = [v for column in columns for v in column]
    for split, column in zip(where, columns):
        if None in column:
            row = list(column).index(None)
            raise ConfigError(f"dataset.label_key: a missing label (null) in {split}, row {row}")
    if names is not None:
        count = len(names)
        encoded = [np.asarray(c, dtype=np.int64) for c in columns]
    elif values and all(isinstance(v, str) for v in values):
        names = sorted(set(values))
        index = {c: i for i, c in enumerate(names)}
        encoded = [np.array([index[v] for v in c], dtype=np.int64) for c in columns]
        count = len(names)
    else:
        try:
            encoded = [np.asarray(c).astype(np.int64) for c in columns]
        except (TypeError, ValueError):
            raise ConfigError(
                "dataset.label_key: labels must be integers, booleans, strings or a ClassLabel"
            ) from None
        if any(not np.array_equal(e, np.asarray(c)) for e, c in zip(encoded, columns)):
            raise ConfigError("dataset.label_key: labels must be whole numbers")
        count = int(max((e.max(initial=-1) for e in encoded), default=-1)) + 1
    if num_classes is not None:
        if num_classes < count:
            named = f" ({names[-1]!r})" if names is not None else ""
            raise ConfigError(
                f"dataset.num_classes: {num_classes}, but a label is {count - 1}{named}"
            )
        if names is not None:  # the classes no label names keep their ids as names
            names = [*names, *map(str, range(count, num_classes))]
        count = num_classes
    if any(e.min(initial=0) < 0 for e in encoded):
        raise ConfigError("dataset.label_key: a negative label")
    return encoded, count, None if names is None else tuple(map(str, names))


def load_hf(
    path: str,
    data_dir: str,
    label_key: str,
    image_key: str | None,
    text_key: str | None,
    feature_keys: list[str] | str | None,
    client_key: str | None,
    name: str | None,
    revision: str | None,
    download: bool,
    train_split: str,
    test_split: str | None,
    test_fraction: float,
    num_classes: int | None,
    tokenizer: str,
    seq_len: int,
    min_count: int,
    max_vocab: int | None,
    pixel_range,
    seed: int = 0,
    **_,
) -> Dataset:
    """A Hub (or local `datasets`) dataset as a `Dataset`; see the module docstring.

    Args:
        path: a Hub name (`org/name`), a local directory (save_to_disk, parquet or data
            files) or a data file (`.csv`, `.tsv`, `.json`, `.jsonl`, `.parquet`: the train split).
        data_dir: where Hub copies are kept (`<data_dir>/<org>___<name>`).
        label_key, image_key, text_key, client_key: the columns (exactly one input: an image
            column, a text column or `feature_keys`).
        feature_keys: numeric columns forming a vector input, or `*`: every column but the
            label, the owner and those without numbers (`hub_features.star_keys`).
        name, revision: the Hub config and revision (`download=true` only).
        download: fetch a Hub dataset whose local copy is missing.
        train_split, test_split: split names; a missing test split (or null) gives no pooled
            test set, unless `test_fraction` > 0 holds that share of the training rows out.
        num_classes: the number of classes when the labels do not show it (null: inferred).
        tokenizer, seq_len, min_count, max_vocab: text only (`word` or `char` tokens).
        pixel_range: images only: null (the pixel rule by dtype) or [lo, hi], the stored range
            mapped to [0, 1] (values outside refused).
        seed: the holdout split's seed.
    """
    _check_options(path, image_key, text_key, feature_keys, tokenizer, seq_len, test_fraction)
    pixel_range = check_pixel_range(pixel_range)
    with data_key(_located_by(path)):
        root = dataset_root(str(path), data_dir, download, name, revision)
        splits, used = splits_used(root, train_split, test_split)
        labels, count, names = _labels(splits, used, label_key, num_classes)
        owners = _owners(splits[train_split], root, client_key, train_split)
        held = (labels, count, owners, test_fraction, seed)
        if feature_keys is not None:
            data = _vector_input(root, splits, used, (feature_keys, label_key, client_key), held)
        elif image_key is not None:
            data = _image_input(root, splits, used, image_key, pixel_range, held)
        else:
            text = (tokenizer, seq_len, min_count, max_vocab)
            data = _text_input(root, splits, used, text_key, text, held)
        data.class_names = names
        return data


def _located_by(path) -> str:
    """The option a problem with the data names: `dataset.path` for the file or directory given
    there, `dataset.data_dir` where a Hub name's copy is kept."""
    return "dataset.path" if Path(str(path)).expanduser().exists() else "dataset.data_dir"


def _labels(splits: dict[str, Any], used: list[str], label_key: str, num_classes: int | None):
    """(label arrays of the used splits, the class count, the class names): `_encode_labels`."""
    return _encode_labels(
        [_column(splits[s], label_key, "label_key", s) for s in used],
        _class_names(splits, label_key, used),
        num_classes,
        used,
    )


def _owners(split: Any, root: Path, client_key: str | None, split_name: str) -> np.ndarray | None:
    """Each training row's owner id (`client_key`; None without one); a row without one is
    refused."""
    if client_key is None:
        return None
    column = list(_column(split, client_key, "client_key", split_name))
    if None in column:  # str(None) would make one client of every row without an owner
        raise data_error(
            f"{root}: split {split_name}, column {client_key}",
            f"row {column.index(None)} has no owner (null)",
        )
    return owner_ids([str(v) for v in column])


def _vector_input(root: Path, splits: dict[str, Any], used: list[str], keys, held) -> Dataset:
    """`feature_keys` ((feature_keys, label_key, client_key)) as vectors: `_vector_dataset`."""
    feature_keys, label_key, client_key = keys
    columns = _feature_keys(feature_keys, splits[used[0]], label_key, client_key, used[0])
    tables = [_features(splits[s], columns, root, s) for s in used]
    return _vector_dataset(root, tables, *held)


def _image_input(root: Path, splits: dict[str, Any], used, image_key: str, pixel_range, held):
    """The `image_key` column as images: `_image_dataset`."""
    inputs = [_column(splits[s], image_key, "image_key", s) for s in used]
    images = [
        _images(c, f"{root}: split {s}, column {image_key}", pixel_range)
        for c, s in zip(inputs, used)
    ]
    return _image_dataset(root, used, images, *held)


def _text_input(root: Path, splits: dict[str, Any], used, text_key: str, text, held) -> Dataset:
    """The `text_key` column as texts ((tokenizer, seq_len, min_count, max_vocab)):
    `_text_dataset`."""
    inputs = [_column(splits[s], text_key, "text_key", s) for s in used]
    labels, count, owners, test_fraction, seed = held
    return _text_dataset(root, inputs, labels, count, owners, *text, test_fraction, seed)


def _check_options(path, image_key, text_key, feature_keys, tokenizer, seq_len, test_fraction):
    """The options `load_hf` can refuse before reading anything."""
    if not path or str(path) == "???":
        raise ConfigError(
            "dataset.path: required (a Hub name org/name, a local directory or a data file)"
        )
    inputs = {"image_key": image_key, "text_key": text_key, "feature_keys": feature_keys}
    chosen = [k for k, v in inputs.items() if v is not None]
    if not chosen:
        raise ConfigError(
            "dataset.feature_keys: no input column: set dataset.feature_keys (numeric columns, "
            "[a, b] or '*'), dataset.image_key or dataset.text_key"
        )
    if len(chosen) > 1:
        raise ConfigError(
            f"dataset.{chosen[-1]}: set only one of dataset.image_key, dataset.text_key and "
            f"dataset.feature_keys, got {' and '.join(chosen)}"
        )
    if tokenizer not in TOKENIZERS:
        raise ConfigError(f"dataset.tokenizer: {tokenizer!r}, expected one of word, char")
    if text_key is not None and seq_len < 1:
        raise ConfigError(f"dataset.seq_len: must be >= 1, got {seq_len}")
    if not 0 <= test_fraction < 1:
        raise ConfigError(f"dataset.test_fraction: must be in [0, 1), got {test_fraction}")


def _holdout(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, test rows): a seeded random `fraction` of n rows held out."""
    rng = np.random.default_rng([seed, 7919])
    perm = rng.permutation(n)
    n_test = int(round(fraction * n))
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def _splits(inputs, labels, owners, test_fraction: float, seed: int):
    """(train x, train y, test x, test y, owners): the test split where the data have one, else
    a seeded `test_fraction` of the training rows held out (None without either)."""
    train_x, train_y = inputs[0], labels[0]
    if len(inputs) > 1:
        return train_x, train_y, inputs[1], labels[1], owners
    if test_fraction <= 0:
        return train_x, train_y, None, None, owners
    keep, held = _holdout(len(train_y), test_fraction, seed)
    owners = owners[keep] if owners is not None else None
    return train_x[keep], train_y[keep], train_x[held], train_y[held], owners


def _image_dataset(root, used, images, labels, count, owners, test_fraction, seed) -> Dataset:
    if len(images) > 1 and images[0].shape[1:] != images[1].shape[1:]:
        raise data_error(root, f"{used[1]} images differ in size from the {used[0]} images")
    train_x, train_y, test_x, test_y, owners = _splits(images, labels, owners, test_fraction, seed)
    # per-channel statistics of the training images (the pooled test set is scaled alike)
    mean = train_x.mean(axis=(0, 2, 3), dtype=np.float64)
    std = np.maximum(train_x.std(axis=(0, 2, 3), dtype=np.float64), 1e-6)

    def scale(x: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(x)
        m = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
        s = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
        return (t - m) / s

    return Dataset(
        root.name,
        scale(train_x),
        torch.from_numpy(train_y),
        scale(test_x) if test_x is not None else None,
        torch.from_numpy(test_y) if test_y is not None else None,
        count,
        tuple(train_x.shape[1:]),
        train_client_ids=owners,
    )


def _vector_dataset(root, tables, labels, count, owners, test_fraction, seed) -> Dataset:
    """Vectors standardised per feature with the training rows' mean and std."""
    train_x, train_y, test_x, test_y, owners = _splits(tables, labels, owners, test_fraction, seed)
    mean = train_x.mean(axis=0, dtype=np.float64)
    std = np.maximum(train_x.std(axis=0, dtype=np.float64), 1e-6)

    def scale(x):
        return None if x is None else torch.from_numpy(((x - mean) / std).astype(np.float32))

    def tensor(y):
        return None if y is None else torch.from_numpy(y)

    shape = (train_x.shape[1],)
    return Dataset(
        root.name, scale(train_x), tensor(train_y), scale(test_x), tensor(test_y), count, shape,
        train_client_ids=owners,
    )  # fmt: skip


def _texts(column: list, where: str) -> list[str]:
    for i, v in enumerate(column):
        if not isinstance(v, str):
            raise data_error(where, f"row {i} is a {type(v).__name__}, expected a string")
    return column


def _text_dataset(
    root,
    inputs,
    labels,
    count,
    owners,
    tokenizer,
    seq_len,
    min_count,
    max_vocab,
    test_fraction,
    seed,
) -> Dataset:
    texts = _texts(inputs[0], f"{root}: text")
    test_texts = _texts(inputs[1], f"{root}: test text") if len(inputs) > 1 else []
    train_y = labels[0]
    test_y = labels[1] if len(labels) > 1 else None
    if test_y is None and test_fraction > 0:
        keep, held = _holdout(len(train_y), test_fraction, seed)
        test_texts, test_y = [texts[i] for i in held], train_y[held]
        texts, train_y = [texts[i] for i in keep], train_y[keep]
        owners = owners[keep] if owners is not None else None
    encoder = Sent140Encoder(
        texts, test_texts, seq_len, min_count, max_vocab, None, TOKENIZERS[tokenizer]
    )
    return Dataset(
        root.name,
        torch.arange(len(train_y)),  # row numbers until `prepare` fits the vocabulary
        torch.from_numpy(train_y),
        torch.arange(len(test_y)) if test_y is not None else None,
        torch.from_numpy(test_y) if test_y is not None else None,
        count,
        (seq_len,),
        train_client_ids=owners,
        prepare=encoder,
    )
