"""Sentiment140 (Go et al., 2009; LEAF's Sent140): tweets, binary sentiment, one client per user.

The vocabulary must come from the clients' *training* samples only: neither their local test
splits nor users outside the federation (dropped by `min_samples`/`max_clients`, or LEAF's test
files) may contribute a word. The partition is only known after loading, so the loader returns
a dataset whose `train_x` holds row numbers into the raw tweets and a `prepare` hook; `fedexp.run`
calls `prepare(dataset, partition)` once, which fits the vocabulary on the rows in
`partition.train` and replaces every row number by its `seq_len` token ids (LongTensor; 0 pads,
1 is the unknown word). Rows no client uses stay all-padding.
"""

from __future__ import annotations

import csv
import dataclasses
import re
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch

from fedexp.data.datasets import Dataset
from fedexp.data.files import data_error, one_line
from fedexp.data.leaf import leaf_files, owner_ids, read_leaf_json, regular_file
from fedexp.errors import ConfigError

PAD, UNK = 0, 1
SENT140_CLASSES = 2  # negative (polarity 0), positive (polarity 4)
# LEAF's Sent140 split_line: words (with apostrophes) and the punctuation marks . , ! ? ;
TOKEN_RE = re.compile(r"[\w']+|[.,!?;]")
LEAF_TEXT_FIELD = 4  # LEAF x rows: [id, date, query, user, text]


def tokenize(text: str) -> list[str]:
    """Lower-cased words and punctuation marks (GloVe's vocabularies are lower case)."""
    return TOKEN_RE.findall(text.lower())


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """Word -> id, ids 2.. in order of decreasing training frequency (0: padding, 1: unknown)."""

    words: tuple[str, ...]

    @classmethod
    def fit(
        cls,
        token_lists: Iterable[list[str]],
        min_count: int = 1,
        max_size: int | None = None,
        allowed: set[str] | None = None,
    ) -> Vocabulary:
        counts = Counter(t for tokens in token_lists for t in tokens)
        kept = [
            w
            for w, c in sorted(counts.items(), key=lambda wc: (-wc[1], wc[0]))
            if c >= min_count and (allowed is None or w in allowed)
        ]
        return cls(tuple(kept[:max_size] if max_size else kept))

    def __len__(self) -> int:
        return len(self.words) + 2

    @property
    def index(self) -> dict[str, int]:
        return {w: i + 2 for i, w in enumerate(self.words)}

    def encode(
        self, texts: Iterable[str], seq_len: int, split: Callable[[str], list[str]] = tokenize
    ) -> torch.Tensor:
        """(n, seq_len) token ids: the first seq_len tokens (`split` cuts), padded at the end."""
        index = self.index
        rows = []
        for text in texts:
            ids = [index.get(t, UNK) for t in split(text)[:seq_len]]
            rows.append(ids + [PAD] * (seq_len - len(ids)))
        return torch.tensor(rows, dtype=torch.long).reshape(-1, seq_len)


def read_glove(path: Path, words: set[str]) -> dict[str, np.ndarray]:
    """Vectors of `words` from a GloVe-format text file (`word v1 ... vd` per line).

    A vector used that holds something other than a finite number, or none, is one ConfigError
    naming the file, the line and the value.
    """
    vectors: dict[str, np.ndarray] = {}
    try:
        with open(path, encoding="utf8", errors="replace") as fh:
            for line_no, line in enumerate(fh, 1):
                word, _, rest = line.rstrip().partition(" ")
                if word in words:
                    vectors[word] = _glove_vector(path, line_no, word, rest.split())
    except OSError as err:
        raise ConfigError(f"dataset.glove_path: {path}: cannot be read ({one_line(err)})") from None
    if not vectors:
        raise ConfigError(f"dataset.glove_path: no training word found in {path}")
    dims = {len(v) for v in vectors.values()}
    if len(dims) != 1:
        raise ConfigError(f"dataset.glove_path: {path} has vectors of sizes {sorted(dims)}")
    return vectors


def _glove_vector(path: Path, line_no: int, word: str, values: list[str]) -> np.ndarray:
    where = f"dataset.glove_path: {path}:{line_no}: word {word!r}"
    if not values:
        raise ConfigError(f"{where}: no vector")
    try:
        vector = np.array(values, dtype=np.float64)
    except ValueError:
        bad = next(v for v in values if not _is_number(v))
        raise ConfigError(f"{where}: {bad!r} is not a number") from None
    if not np.isfinite(vector).all():
        bad = values[int(np.flatnonzero(~np.isfinite(vector))[0])]
        raise ConfigError(f"{where}: {bad!r} is not a finite number")
    too_large = np.abs(vector) > np.finfo(np.float32).max  # finite, but not as float32
    if too_large.any():
        raise ConfigError(
            f"{where}: {values[int(np.flatnonzero(too_large)[0])]!r} overflows float32"
        )
    return vector.astype(np.float32)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def read_sentiment140_csv(files: list[Path]) -> tuple[list[str], list[int], list[str]]:
    """Original Sentiment140 CSV (polarity,id,date,query,user,text; latin-1, no header).

    Polarity 0 -> label 0, 4 -> label 1; neutral (2) rows, only in the manual test set, dropped.
    Every row is one line: a quote not closed on its line (a row spanning lines), a row of
    other fields, or a file that cannot be read is one ConfigError naming the file and line.
    """
    texts, labels, users = [], [], []
    for path in files:
        regular_file(path)
        line_no = 0
        try:
            with open(path, encoding="latin-1", newline="") as fh:
                reader = csv.reader(fh)
                for row in reader:
                    start, line_no = line_no + 1, reader.line_num
                    if line_no != start or any("\n" in f or "\r" in f for f in row):
                        raise data_error(
                            f"{path}:{start}",
                            "a quote opened on this line is not closed on it (a Sentiment140 "
                            "row is one line)",
                        )
                    if len(row) != 6 or row[0] not in ("0", "2", "4"):
                        raise data_error(
                            f"{path}:{line_no}",
                            "not a Sentiment140 row (polarity,id,date,query,user,text)",
                        )
                    if row[0] == "2":
                        continue
                    labels.append(int(row[0] == "4"))
                    users.append(row[4])
                    texts.append(row[5])
        except csv.Error as err:
            raise data_error(f"{path}:{line_no + 1}", f"not CSV ({one_line(err)})") from None
        except OSError as err:
            raise data_error(path, f"cannot be read ({one_line(err)})") from None
    return texts, labels, users


def _leaf_texts(xs: list) -> list[str]:
    """One user's LEAF x rows ([id, date, query, user, text], or the text alone) -> texts."""
    texts = []
    for i, x in enumerate(xs):
        if isinstance(x, list) and len(x) > LEAF_TEXT_FIELD:
            x = x[LEAF_TEXT_FIELD]
        if not isinstance(x, str):
            raise ValueError(f"sample {i} is not an [id, date, query, user, text] row")
        texts.append(x)
    return texts


@dataclasses.dataclass
class Sent140Encoder:
    """The `prepare` hook: fit the vocabulary on the clients' training rows, encode all rows."""

    train_texts: list[str]
    test_texts: list[str]
    seq_len: int
    min_count: int
    max_vocab: int | None
    glove_path: str | None
    split: Callable[[str], list[str]] = tokenize  # text -> tokens (words; `list`: characters)

    def __call__(self, dataset: Dataset, partition) -> Dataset:
        rows = dataset.train_x.numpy()  # row numbers into train_texts, aligned with train_y
        fit = rows[partition.train.flat]
        fit_tokens = [self.split(self.train_texts[r]) for r in fit]
        pretrained = None
        if self.glove_path:
            path = Path(self.glove_path).expanduser()
            if not path.is_file():
                raise ConfigError(f"dataset.glove_path: no file at {path}")
            glove = read_glove(path, {t for tokens in fit_tokens for t in tokens})
            vocab = Vocabulary.fit(fit_tokens, self.min_count, self.max_vocab, set(glove))
            dim = len(next(iter(glove.values())))
            table = np.zeros((len(vocab), dim), dtype=np.float32)  # pad and unknown: zeros
            for i, word in enumerate(vocab.words):
                table[i + 2] = glove[word]
            pretrained = torch.from_numpy(table)
        else:
            vocab = Vocabulary.fit(fit_tokens, self.min_count, self.max_vocab)
        val = [] if partition.val is None else [partition.val.flat]
        used = np.concatenate([partition.train.flat, *val, partition.test.flat])
        train_x = torch.zeros(len(rows), self.seq_len, dtype=torch.long)
        train_x[used] = vocab.encode(
            (self.train_texts[r] for r in rows[used]), self.seq_len, self.split
        )

        def encode_rows(x: torch.Tensor | None, texts: list[str]) -> torch.Tensor | None:
            if x is None:
                return None
            return vocab.encode((texts[r] for r in x.numpy()), self.seq_len, self.split)

        return dataclasses.replace(
            dataset,
            train_x=train_x,
            test_x=encode_rows(dataset.test_x, self.test_texts),
            server_x=encode_rows(dataset.server_x, self.train_texts),
            model_kwargs={
                **dataset.model_kwargs,
                "vocab_size": len(vocab),
                "pretrained_embeddings": pretrained,
            },
            prepare=None,
        )


def load_sent140(
    data_dir: str,
    seq_len: int,
    min_count: int,
    max_vocab: int | None,
    glove_path: str | None,
    **_,
) -> Dataset:
    """Sent140 from the original CSV (*.csv in data_dir but testdata*) or LEAF JSON.

    LEAF's test/ files, when present, are the pooled test set; otherwise (and for the CSV) the
    pooled test set is the union of the clients' local test splits, as in LEAF.
    """
    root = Path(data_dir).expanduser()
    csvs = [p for p in sorted(root.glob("*.csv")) if not p.name.startswith("testdata")]
    train_json, test_json = leaf_files(root) if root.is_dir() else ([], [])
    test_texts: list[str] = []
    test_y = None
    if csvs:
        texts, labels, users = read_sentiment140_csv(csvs)
    elif train_json:
        chunks, labels, users = read_leaf_json(train_json, _leaf_texts, SENT140_CLASSES)
        texts = [t for chunk in chunks for t in chunk]
        if test_json:
            test_chunks, tys, _users = read_leaf_json(test_json, _leaf_texts, SENT140_CLASSES)
            test_texts = [t for chunk in test_chunks for t in chunk]
            test_y = torch.tensor([int(v) for v in tys], dtype=torch.long)
    else:
        raise ConfigError(
            f"dataset.data_dir: Sent140 not found at {root} (expected the Sentiment140 CSV "
            "training.1600000.processed.noemoticon.csv, or LEAF train/*.json and test/*.json)"
        )
    if seq_len < 1:
        raise ConfigError(f"dataset.seq_len: must be >= 1, got {seq_len}")
    train_y = torch.tensor([int(v) for v in labels], dtype=torch.long)
    if len(train_y) == 0:
        raise ConfigError(f"dataset.data_dir: Sent140 at {root} has no labelled tweets")
    encoder = Sent140Encoder(texts, test_texts, seq_len, min_count, max_vocab, glove_path)
    return Dataset(
        "sent140",
        torch.arange(len(train_y)),
        train_y,
        torch.arange(len(test_y)) if test_y is not None else None,
        test_y,
        SENT140_CLASSES,
        (seq_len,),
        train_client_ids=owner_ids(users),
        prepare=encoder,
    )
