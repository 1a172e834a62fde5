"""Where an image dataset's files are under `dataset.data_dir`, and what is near when they are not.

A layout is a folder of named files (CIFAR's `cifar-10-batches-py/`, torchvision's `MNIST/raw/`)
and, for CIFAR, the archive it is published as. `dataset.data_dir` may be the torchvision root
(`<dir>` holding `cifar-10-batches-py/` or `MNIST/raw/`), the folder itself, any folder between
(`<dir>/MNIST`), a folder holding the archive, or the archive. Archives are read in place: the
members are read as bytes from the compressed stream (no extraction, so nothing is written into
the data dir, a read-only copy works, and an interrupted run can never leave a folder that looks
complete). An archive with a member whose path is absolute or climbs out with `..` is refused.

When nothing usable is found, the error names the files expected and what it found nearby: the
layout one level up or down (with the `dataset.data_dir` to set), or another dataset's layout.
"""

from __future__ import annotations

import gzip
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from fedexp.data.files import data_error, one_line
from fedexp.errors import ConfigError

MAX_CHILDREN = 200  # folders looked into one level down for the missing-files hint


@dataclass(frozen=True)
class Layout:
    """A dataset's files on disk.

    Attributes:
        title: how messages name the dataset ("CIFAR-10").
        dataset: its `dataset=` name.
        folder: the folder holding the files, relative to the torchvision root ("MNIST/raw").
        files: the files the loader reads, in `folder`.
        archive: the published archive holding `folder/<files>`, if there is one.
        gz: whether each file may instead be gzipped (`<name>.gz`, as torchvision keeps IDX).
        not_under: folder names that mark another dataset with the same file names: a folder
            other than `<root>/<folder>` named so (or `raw` in one) is not this dataset's
            (Fashion-MNIST's IDX files are named like MNIST's, so `.../MNIST/raw` is not them).
    """

    title: str
    dataset: str
    folder: str
    files: tuple[str, ...]
    archive: str | None = None
    gz: bool = False
    not_under: tuple[str, ...] = ()

    def candidates(self, root: Path) -> list[Path]:
        """Folders that may hold the files: root/MNIST/raw, root/raw, root (deepest first)."""
        parts = PurePosixPath(self.folder).parts
        found = [root.joinpath(*parts[k:]) for k in range(len(parts))] + [root]
        return found[:1] + [f for f in found[1:] if not self._foreign(f.absolute())]

    def _foreign(self, folder: Path) -> bool:
        """Whether folder is named as another dataset's (`.../MNIST`, `.../MNIST/raw`)."""
        names = {folder.name, folder.parent.name} if folder.name == "raw" else {folder.name}
        return bool(names & set(self.not_under))

    def file(self, folder: Path, name: str) -> Path | None:
        """The file `name` (or, where allowed, `name.gz`) in folder, if it is there."""
        for path in (folder / name, folder / f"{name}.gz") if self.gz else (folder / name,):
            if path.is_file():
                return path
        return None

    def missing(self, folder: Path) -> list[str]:
        return [f for f in self.files if self.file(folder, f) is None]

    def archive_at(self, root: Path) -> Path | None:
        """The archive: root/<archive>, or root itself when data_dir names the archive."""
        if self.archive is None:
            return None
        if root.is_file() and root.name == self.archive:
            return root
        return root / self.archive if (root / self.archive).is_file() else None

    def find(self, root: Path) -> Path | None:
        """The complete folder (preferred) or the archive under root; None if neither is there."""
        if root.is_dir():
            for folder in self.candidates(root):
                if folder.is_dir() and not self.missing(folder):
                    return folder
        return self.archive_at(root)


def read_archive(archive: Path, layout: Layout) -> dict[str, bytes]:
    """The layout's files from a (gzipped) tar archive, read in place: {file name: bytes}.

    Members are `<folder>/<file>` as published (a leading `./` is allowed). Every member name is
    checked, so an archive naming an absolute path or `..` anywhere is refused, and the archive
    is read to its end, so a truncated or corrupt one is refused with one line naming it.
    """
    wanted = {f"{layout.folder}/{f}": f for f in layout.files}
    found: dict[str, bytes] = {}
    try:
        with open(archive, "rb") as raw:
            gzipped = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            # one pass over the stream ("r|"): a seekable tar over gzip would re-decompress from
            # the start at every backward seek it makes between members
            stream = gzip.GzipFile(fileobj=raw) if gzipped else raw
            with tarfile.open(fileobj=stream, mode="r|") as tar:
                for member in tar:
                    name = member.name.removeprefix("./")
                    if PurePosixPath(name).is_absolute() or ".." in PurePosixPath(name).parts:
                        raise data_error(
                            archive, f"refused: member {member.name!r} has an absolute path or '..'"
                        )
                    if name in wanted and member.isfile():
                        handle = tar.extractfile(member)
                        found[wanted[name]] = handle.read() if handle is not None else b""
            while stream.read(1 << 20):  # to the end: gzip checks its CRC and length there
                pass
    except ConfigError:
        raise
    except (tarfile.TarError, EOFError, OSError, zlib.error) as err:
        raise data_error(archive, f"not a complete tar archive ({one_line(err)})") from None
    missing = [f"{layout.folder}/{f}" for f in layout.files if f not in found]
    if missing:
        raise data_error(
            archive,
            f"no member {', '.join(missing)} (truncated, or not the {layout.title} archive)",
        )
    return found


def _named(layout: Layout, source: Path) -> str:
    return layout.folder if source.is_dir() else source.name


def nearby(layout: Layout, root: Path, others: tuple[Layout, ...] = ()) -> list[str]:
    """What is near a data_dir that lacks the layout, as hints for the missing-files message."""
    hints: list[str] = []
    parent = root.parent
    source = layout.find(parent) if parent != root and parent.is_dir() else None
    if source is not None:
        hints.append(f"found {_named(layout, source)} one level up: set dataset.data_dir={parent}")
    try:
        children = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    except OSError:  # unreadable: nothing to suggest
        return hints
    for child in children[:MAX_CHILDREN]:
        source = layout.find(child)
        if source is not None:
            name = _named(layout, source)
            hints.append(f"found {name} one level down: set dataset.data_dir={child}")
            break
    for other in others if root.is_dir() else ():
        named = root / other.folder
        archive = other.archive_at(root)
        if (named.is_dir() and not other.missing(named)) or archive is not None:
            seen = other.folder if archive is None else archive.name
            hints.append(f"found {seen} here, which is {other.title} (dataset={other.dataset})")
    return hints


def missing_error(
    layout: Layout, root: Path, hint: str, others: tuple[Layout, ...] = ()
) -> ConfigError:
    """One line: the files expected (from the most complete folder found) and what is nearby."""
    folders = [f for f in layout.candidates(root) if f.is_dir()] if root.is_dir() else []
    best = min(folders, key=lambda f: len(layout.missing(f)), default=None)
    if best is None or len(layout.missing(best)) == len(layout.files):
        best = layout.candidates(root)[0]
    names = ", ".join(layout.missing(best))
    alternatives = f"; no {layout.archive} either" if layout.archive else ""
    text = f"{layout.title} not found at {best} (missing {names}{alternatives})"
    parts = [text, *nearby(layout, root, others), hint]
    return ConfigError(f"dataset.data_dir: {'; '.join(parts)}")
