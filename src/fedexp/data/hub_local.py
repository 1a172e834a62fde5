"""The local copies `dataset=hf` reads: a `save_to_disk` directory, parquet files, or data files
(CSV, TSV, JSON, JSON lines) read by the `datasets` library's own file builders (`csv`, `json`,
`parquet`), offline; a file given as `dataset.path` is the training split.

Files in a directory are grouped into splits by name: `<split>[-*].<ext>` (`train.csv`,
`test-00000-of-00001.parquet`) or `<split>/*.<ext>`, a `data/` folder between being ignored (the
Hub's layout). Parquet files are preferred where a directory holds both. `dataset_root` finds
the copy (or fetches a Hub dataset into it with `download=true`), `splits_used` reads its splits.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

from fedexp.data.files import data_error, one_line
from fedexp.data.leaf import regular_file
from fedexp.errors import ConfigError

# file suffix -> (the `datasets` builder, its extra options)
BUILDERS: dict[str, tuple[str, dict]] = {
    ".csv": ("csv", {}),
    ".tsv": ("csv", {"sep": "\t"}),
    ".json": ("json", {}),
    ".jsonl": ("json", {}),
    ".parquet": ("parquet", {}),
}


def local_copy(data_dir: str, path: str) -> Path:
    """Where a Hub dataset's `save_to_disk` copy lives: `<data_dir>/<org>___<name>`."""
    return Path(data_dir).expanduser() / path.replace("/", "___")


def _splits(root: Path, suffixes: tuple[str, ...]) -> dict[str, list[Path]]:
    """Files under root with one of `suffixes`, by split: `<split>[-*].<ext>` or `<split>/*`."""
    splits: dict[str, list[Path]] = {}
    found = (p for p in root.rglob("*") if p.suffix.lower() in suffixes and not p.is_dir())
    for f in sorted(regular_file(p) for p in found):
        rel = f.relative_to(root).parts
        folder = [p for p in rel[:-1] if p != "data"]
        name = folder[-1] if folder else re.split(r"[-.]", f.name, maxsplit=1)[0]
        splits.setdefault(name, []).append(f)
    return splits


def read_local(root: Path, train_split: str) -> dict[str, Any]:
    """{split: datasets.Dataset} from a data file (the `train_split`), a save_to_disk directory,
    or parquet / CSV / TSV / JSON files under a directory."""
    if root.is_file():
        if root.suffix.lower() not in BUILDERS:
            raise ConfigError(
                f"dataset.path: {root} is a file but not one of {', '.join(BUILDERS)}; give a "
                "data file, a directory of them, or a save_to_disk copy"
            )
        return read_files({train_split: [root]})
    if (root / "dataset_dict.json").is_file() or (root / "state.json").is_file():
        import datasets

        try:
            loaded = datasets.load_from_disk(str(root))
        except Exception as err:
            raise data_error(root, f"not a readable save_to_disk copy ({one_line(err)})") from None
        return dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
    splits = _splits(root, (".parquet",)) or _splits(root, tuple(BUILDERS))
    if not splits:
        raise ConfigError(
            f"dataset.path: {root} holds neither a save_to_disk copy (dataset_dict.json or "
            f"state.json) nor data files ({', '.join(BUILDERS)})"
        )
    return read_files(splits)


def read_files(splits: dict[str, list[Path]]) -> dict[str, Any]:
    """{split: datasets.Dataset} from data files, each split's files of one format."""
    import datasets

    found = {}
    for name, files in splits.items():
        kinds = sorted({f.suffix.lower() for f in files})
        if len({BUILDERS[k][0] for k in kinds}) > 1:
            raise data_error(files[0].parent, f"split {name!r} mixes {', '.join(kinds)} files")
        builder, options = BUILDERS[kinds[0]]
        if builder == "parquet":  # read as stored: no conversion, no cache
            found[name] = datasets.concatenate_datasets([_parquet(f) for f in files])
            continue
        shown = datasets.is_progress_bar_enabled()
        datasets.disable_progress_bars()  # one bar a split of a few rows: noise in the log
        try:
            with tempfile.TemporaryDirectory(prefix="fedexp-hf-") as cache:  # nothing is kept
                loaded = datasets.load_dataset(
                    builder,
                    data_files={name: [str(f) for f in files]},
                    cache_dir=cache,
                    keep_in_memory=True,
                    **options,
                )
        except Exception as err:
            where = files[0] if len(files) == 1 else files[0].parent
            raise data_error(where, f"not a readable {builder} file ({one_line(err)})") from None
        finally:
            if shown:
                datasets.enable_progress_bars()
        found[name] = loaded[name]
    return found


def _parquet(path: Path) -> Any:
    import datasets
    import pyarrow.parquet as pq

    try:
        return datasets.Dataset(pq.read_table(path))
    except Exception as err:
        raise data_error(path, f"not a readable parquet file ({one_line(err)})") from None


def fetch(path: str, name: str | None, revision: str | None, target: Path) -> None:
    """Download a Hub dataset with `datasets.load_dataset` and keep it as a save_to_disk copy."""
    try:
        import datasets

        loaded = datasets.load_dataset(
            path, name, revision=revision, cache_dir=str(target.parent / "hf_cache")
        )
        loaded.save_to_disk(str(target))
    except Exception as err:
        raise ConfigError(
            f"dataset.path: download of {path} from the Hugging Face Hub failed "
            f"({one_line(err, 400)})"
        ) from None


def dataset_root(path: str, data_dir: str, download: bool, name, revision) -> Path:
    """The local directory or file holding the dataset: `path` itself, or the Hub copy under
    `data_dir` (fetched with `download`)."""
    root = Path(path).expanduser()
    local = root.suffix.lower() in BUILDERS or str(path).startswith(("/", ".", "~"))
    if local and not root.exists():  # a path, not a Hub name: no Hub copy to look for
        raise ConfigError(f"dataset.path: no file or directory {root}")
    if not root.exists():
        root = local_copy(data_dir, path)
        if not root.is_dir():
            if not download:
                raise ConfigError(
                    f"dataset.path: {path} is no local file or directory, and no Hub copy of "
                    f"it is at {root} (under dataset.data_dir); "
                    "set dataset.download=true on a machine with internet, or give "
                    "dataset.path=<dir> holding a save_to_disk copy or data files, or "
                    "dataset.path=<file.csv|.json|.parquet>"
                )
            fetch(path, name, revision, root)
    return root


def splits_used(root: Path, train_split: str, test_split: str | None) -> tuple[dict, list[str]]:
    """The splits read from `root` and the names of those the dataset uses (train, and test
    where there is one); a missing train split or an empty used one is refused."""
    splits = read_local(root, train_split)
    if train_split not in splits:
        raise ConfigError(
            f"dataset.train_split: no split {train_split!r} in {root} (found {', '.join(splits)})"
        )
    used = [train_split] + ([test_split] if test_split in splits else [])
    for s in used:
        if len(splits[s]) == 0:
            raise ConfigError(
                f"dataset.{'train' if s == train_split else 'test'}_split: "
                f"split {s!r} of {root} is empty (0 rows)"
            )
    return splits, used
