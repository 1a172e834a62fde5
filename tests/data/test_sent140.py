"""Sent140: the original CSV and LEAF JSON layouts, written here; the vocabulary is fitted on
the clients' local training samples only; the LSTM model family."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from components import partition_dataset, with_yaml
from fedexp.core.types import ConfigError
from fedexp.data.text import PAD, UNK, Vocabulary, load_sent140, read_glove, tokenize
from fedexp.models.lstm import lstm, lstm_family

load_sent140 = with_yaml(load_sent140, "dataset", "sent140")
lstm_family = with_yaml(lstm_family, "model", "lstm_family")
lstm = with_yaml(lstm, "model", "lstm")

COMMON = ["tweet", "is", "fine"]  # in every tweet: always in the vocabulary


def tweet(user: int, i: int) -> str:
    """Three shared words and one word unique to this tweet (`u<user>x<i>`)."""
    return f"Tweet u{user}x{i} is FINE"


def write_sentiment140_csv(path: Path, tweets_per_user: list[int]) -> None:
    """polarity,id,date,query,user,text; latin-1, every field quoted, no header; a neutral row."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="latin-1", newline="") as fh:
        writer = csv.writer(fh, quoting=csv.QUOTE_ALL)
        for user, n in enumerate(tweets_per_user):
            for i in range(n):
                polarity = "4" if (user + i) % 2 else "0"
                date = "Mon Apr 06 22:19:45 PDT 2009"
                writer.writerow(
                    [polarity, 1000 * user + i, date, "NO_QUERY", f"user{user}", tweet(user, i)]
                )
        writer.writerow(
            ["2", 99, "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", "user0", "neutral café"]
        )


def write_leaf_sent140(root: Path, train: list[int], test: list[int]) -> None:
    for split, counts, offset in (("train", train, 0), ("test", test, 100)):
        (root / split).mkdir(parents=True)
        blob = {"users": [], "num_samples": [], "user_data": {}}
        for user, n in enumerate(counts):
            name = f"user{user}"
            rows = [[str(i), "date", "NO_QUERY", name, tweet(user, offset + i)] for i in range(n)]
            blob["users"].append(name)
            blob["num_samples"].append(n)
            blob["user_data"][name] = {"x": rows, "y": [i % 2 for i in range(n)]}
        (root / split / f"all_data_niid_0_keep_3_{split}_8.json").write_text(json.dumps(blob))


def unique_token_ids(ds, rows: np.ndarray) -> list[int]:
    """The id each row's tweet-unique word got (position 1: after 'tweet')."""
    return ds.train_x[rows, 1].tolist()


def natural_prepared(ds, num_clients: int, params: dict | None = None, test_fraction=0.0):
    """One client per user, then the loader's post-partition step (vocabulary, encoding)."""
    part = partition_dataset(
        ds.train_y.numpy(),
        num_clients,
        "natural",
        0,
        params or {},
        client_ids=ds.train_client_ids,
        test_fraction=test_fraction,
    )
    return ds.prepare(ds, part), part


def test_tokenize_like_leaf():
    assert tokenize("Hello, World! it's 2 GOOD;ok?") == [
        "hello",
        ",",
        "world",
        "!",
        "it's",
        "2",
        "good",
        ";",
        "ok",
        "?",
    ]


def test_vocabulary_by_hand():
    vocab = Vocabulary.fit([["b", "a", "b"], ["c", "b", "a"]], max_size=2)
    assert vocab.words == ("b", "a") and len(vocab) == 4
    assert vocab.encode(["a c b b b"], 4).tolist() == [[3, UNK, 2, 2]]
    assert vocab.encode(["b"], 3).tolist() == [[2, PAD, PAD]]


def test_csv_loader_and_the_vocabulary_sees_only_training_clients(tmp_path):
    tweets_per_user = [5, 4, 6, 1, 3]  # user3 has 1 tweet: dropped by min_samples=2
    write_sentiment140_csv(tmp_path / "training.1600000.processed.noemoticon.csv", tweets_per_user)
    ds = load_sent140(str(tmp_path))
    assert len(ds.train_y) == 19 and set(ds.train_y.tolist()) == {0, 1}  # neutral row dropped
    assert ds.train_client_ids.tolist() == [0] * 5 + [1] * 4 + [2] * 6 + [3] + [4] * 3
    assert ds.num_classes == 2 and ds.input_shape == (25,)
    # users 0, 1, 2 and 4 have >= 2 tweets; max_clients=3 keeps a seeded 3 of them
    ds, part = natural_prepared(ds, 3, {"min_samples": 2, "max_clients": 3}, test_fraction=0.34)
    train_rows, test_rows = np.concatenate(part.train), np.concatenate(part.test)
    used = set(train_rows) | set(test_rows)
    assert ds.train_x.shape == (19, 25) and ds.train_x.dtype == torch.long
    # one client per user: each client's rows belong to one user, all of that user's tweets
    for tr, te in zip(part.train, part.test):
        owners = set(ds.train_client_ids[np.concatenate([tr, te])].tolist())
        assert len(owners) == 1
        assert len(tr) + len(te) == tweets_per_user[owners.pop()]
    # the vocabulary: 3 shared words + the unique word of each local *training* tweet, no more
    assert ds.model_kwargs["vocab_size"] == 2 + len(COMMON) + len(train_rows)
    assert min(unique_token_ids(ds, train_rows)) >= 2
    assert unique_token_ids(ds, test_rows) == [UNK] * len(test_rows)  # local test: unseen
    held_out = [r for r in range(19) if r not in used]  # users outside the federation
    assert held_out and ds.train_x[held_out].eq(PAD).all()
    assert ds.prepare is None and ds.model_kwargs["pretrained_embeddings"] is None


def test_leaf_json_test_files_are_the_pooled_test_set_and_never_fit(tmp_path):
    write_leaf_sent140(tmp_path, train=[4, 3, 5], test=[2, 2, 1])
    ds = load_sent140(str(tmp_path))
    assert len(ds.train_y) == 12 and len(ds.test_y) == 5
    ds, part = natural_prepared(ds, 3, {"min_samples": 2})
    assert ds.model_kwargs["vocab_size"] == 2 + len(COMMON) + 12
    assert ds.test_x.shape == (5, 25)
    assert ds.test_x[:, 1].tolist() == [UNK] * 5  # test-file words never enter the vocabulary
    assert ds.test_x[:, 0].tolist() == [ds.train_x[0, 0].item()] * 5  # "tweet" is known


def test_glove_file_gives_frozen_pretrained_vectors(tmp_path):
    write_sentiment140_csv(tmp_path / "data" / "train.csv", [3, 3])
    glove = tmp_path / "glove.txt"
    glove.write_text("tweet 1 2 3\nfine 4 5 6\nu0x1 7 8 9\nabsent 0 0 1\n")
    ds = load_sent140(str(tmp_path / "data"), glove_path=str(glove))
    ds, part = natural_prepared(ds, 2)
    table = ds.model_kwargs["pretrained_embeddings"]
    # vocabulary = training words GloVe has, by frequency: tweet, fine (6 each), u0x1 (1)
    assert ds.model_kwargs["vocab_size"] == 5 and table.shape == (5, 3)
    assert table.tolist() == [[0, 0, 0], [0, 0, 0], [4, 5, 6], [1, 2, 3], [7, 8, 9]]
    model = lstm((25,), 2, **ds.model_kwargs)
    names = [n for n, _ in model.named_parameters()]
    assert not any("embedding" in n for n in names)  # a buffer: never trained, never sent
    assert torch.equal(model.body.frozen_embedding, table)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("fine 4 x 6", "word 'fine': 'x' is not a number"),
        ("fine 4 nan 6", "word 'fine': 'nan' is not a finite number"),
        ("fine 4 -inf 6", "word 'fine': '-inf' is not a finite number"),
        ("fine 4 1e39 6", "word 'fine': '1e39' overflows float32"),
        ("fine", "word 'fine': no vector"),
    ],
)
def test_a_glove_vector_that_is_not_finite_numbers_is_one_line(tmp_path, line, problem):
    glove = tmp_path / "glove.txt"
    glove.write_text(f"tweet 1 2 3\n{line}\nunused 1 nan 3\n")
    with pytest.raises(ConfigError) as err:
        read_glove(glove, {"tweet", "fine"})
    assert str(err.value) == f"dataset.glove_path: {glove}:2: {problem}"
    assert len(read_glove(glove, {"tweet"})) == 1  # a vector no training word uses is not read


def test_missing_sent140_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"^dataset\.data_dir: Sent140 not found") as err:
        load_sent140(str(tmp_path / "absent"))
    assert "\n" not in str(err.value)


def test_lstm_family_and_last_token_readout():
    torch.manual_seed(0)
    one, two = (
        lstm_family((6,), 2, vocab_size=10, arch=0),
        lstm_family((6,), 2, vocab_size=10, arch=1),
    )
    assert one.body.lstm.num_layers == 1 and two.body.lstm.num_layers == 2
    assert lstm((6,), 2, vocab_size=10).body.lstm.num_layers == 2  # no arch: num_layers
    with pytest.raises(ConfigError, match="num_archs"):
        lstm_family((6,), 2, vocab_size=10, arch=2)
    with pytest.raises(ConfigError, match="vocab_size"):
        lstm((6,), 2)
    two.eval()
    padded = torch.tensor([[5, 6, 7, PAD, PAD, PAD]])
    # trailing padding does not change the representation: it reads the last real token
    assert torch.allclose(two(padded), two(padded[:, :3]), atol=1e-6)
    assert two(torch.zeros(2, 6, dtype=torch.long)).shape == (2, 2)


def test_server_pool_rows_are_encoded_but_never_fit(tmp_path):
    from fedexp.data.server_pool import reserve_server_pool

    write_sentiment140_csv(tmp_path / "train.csv", [4, 4, 4])
    ds = reserve_server_pool(load_sent140(str(tmp_path)), 3, seed=0)
    ds, part = natural_prepared(ds, 3)
    assert ds.server_x.shape == (3, 25) and len(ds.train_y) == 9
    assert ds.model_kwargs["vocab_size"] == 2 + len(COMMON) + 9
    assert ds.server_x[:, 1].tolist() == [UNK] * 3  # the pool's own words are not fitted


def test_lstm_yaml_is_one_architecture_and_lstm_family_a_family():
    from omegaconf import OmegaConf

    from conftest import REPO
    from fedexp.config.build import build

    single = build(OmegaConf.load(REPO / "conf/model/lstm.yaml"))
    family = build(OmegaConf.load(REPO / "conf/model/lstm_family.yaml"))
    assert "num_archs" not in single.keywords and family.keywords["num_archs"] == 2
    layers = [family((25,), 2, vocab_size=9, arch=a).body.lstm.num_layers for a in (0, 1)]
    assert layers == [1, 2] and single((25,), 2, vocab_size=9).body.lstm.num_layers == 2
