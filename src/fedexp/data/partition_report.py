"""Label-distribution plot of a partition: clients x classes heatmap plus client sizes (PNG).

Classes are shown by name where the data name them (`Dataset.class_names`: a ClassLabel's
names, a CSV's label strings), in the CSV's header (`class_benign`) and on the plot's axis;
otherwise by id (`class_0`).
"""

from __future__ import annotations

import contextlib
import csv
import ctypes
import hashlib
import io
import multiprocessing
import os
import signal
import sys
import threading
from functools import partial
from pathlib import Path

import numpy as np

from fedexp.data.partition import class_counts

MAX_ROWS = 200  # beyond this many clients the plot shows a representative subset of rows
# the PNGs this process drew, by what they show: the jobs of a sweep on one partition (its
# algorithms, or learning rates, at one seed) draw it once; the most recent few are kept
_DRAWN: dict[str, bytes] = {}
_DRAWN_KEPT = 8
_DRAWN_LOCK = threading.Lock()
PR_SET_PDEATHSIG, PR_SET_NAME = 1, 15  # prctl(2) options


def plot_rows(counts: np.ndarray, max_rows: int = MAX_ROWS) -> np.ndarray:
    """The clients the plot shows: all of them up to `max_rows`; beyond, `max_rows` clients
    evenly spaced through the population sorted by dominant class, then by its share (so every
    dominant class appears in proportion and the rows stay readable at any population)."""
    num = len(counts)
    if num <= max_rows:
        return np.arange(num)
    sizes = np.maximum(counts.sum(1), 1)
    top = counts.argmax(1)
    share = counts[np.arange(num), top] / sizes
    order = np.lexsort((-share, top))
    return order[np.linspace(0, num - 1, max_rows).round().astype(np.int64)]


NAMED_TICKS = 40  # up to this many classes, every class's name is on the axis


def plot_label_distribution(
    counts: np.ndarray,
    path: str | Path,
    title: str = "",
    class_names: tuple[str, ...] | None = None,
) -> Path:
    """Write a PNG of per-client class shares (rows sum to 1) and per-client training sizes.

    Shares rather than counts, so that clients of very different sizes (natural splits) are
    comparable; the bar panel on the right gives the sizes. Past `MAX_ROWS` clients, the rows
    are the `plot_rows` subset (labelled with their client ids; the CSV keeps every client).
    The class axis shows `class_names` where given, else class ids.
    """
    fig = label_figure(counts, title, class_names)
    path = Path(path)
    fig.savefig(path, dpi=100)  # a bare Figure saves a PNG through Agg, without a display
    return path


def _name_classes(ax, class_names: tuple[str, ...]) -> None:
    """The class axis labelled by name: every class up to `NAMED_TICKS`, else the ticks
    matplotlib picks; names turned upright where they would overlap."""
    from matplotlib.ticker import FixedLocator, MaxNLocator

    count = len(class_names)
    if count <= NAMED_TICKS:
        ax.xaxis.set_major_locator(FixedLocator(np.arange(count)))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))

    def name(value, _):
        i = int(round(value))
        return class_names[i] if abs(value - i) < 1e-6 and 0 <= i < count else ""

    ax.xaxis.set_major_formatter(name)
    if count * max(map(len, class_names), default=0) > 60:  # about the axis's width
        ax.tick_params(axis="x", labelrotation=90)


def label_figure(counts: np.ndarray, title: str = "", class_names=None):
    """The matplotlib Figure `plot_label_distribution` saves."""
    # here for start-up time (matplotlib: a second); a Figure of its own, not pyplot's global
    # state, so it may be drawn in a thread while the first rounds run (`start_partition_stats`)
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    counts = np.asarray(counts)
    population = len(counts)
    rows = plot_rows(counts)
    counts = counts[rows].astype(np.float64)
    num_clients, num_classes = counts.shape
    sizes = counts.sum(1)
    shares = counts / np.maximum(sizes, 1)[:, None]
    height = min(12.0, 3.0 + 0.18 * num_clients)
    width = min(16.0, 7.0 + 0.08 * num_classes)
    fig = Figure(figsize=(width, height), layout="constrained")
    ax, bar = fig.subplots(1, 2, gridspec_kw={"width_ratios": [4, 1]}, sharey=True)
    image = ax.imshow(shares, aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="none")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    heading = title or f"{population} clients x {num_classes} classes"
    if num_clients < population:
        heading += f"\n{num_clients} of {population} clients shown, by dominant class"
        ax.set_ylabel("client (id)")
    ax.set_title(heading, fontsize=10)
    if class_names is not None and len(class_names) == num_classes:
        _name_classes(ax, tuple(class_names))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=20))
    if num_clients < population:
        ax.yaxis.set_major_formatter(
            lambda v, _: str(rows[int(v)]) if 0 <= int(v) < num_clients else ""
        )
    # one polygon, not a patch per client: the cost stays flat in the number of rows
    bar.fill_betweenx(np.arange(num_clients), 0, sizes, step="mid", color="gray", linewidth=0)
    bar.set_xlim(left=0)
    bar.set_xlabel("training samples")
    fig.colorbar(
        image,
        ax=[ax, bar],  # shrink both panels alike so client rows stay aligned
        orientation="horizontal",
        label="share of the client's training samples",
        fraction=0.05,
        pad=0.08,
    )
    return fig


def draw_once(
    counts: np.ndarray,
    path: str | Path,
    title: str = "",
    class_names: tuple[str, ...] | None = None,
) -> Path:
    """`plot_label_distribution`, or the bytes of the same plot drawn earlier in this process."""
    counts, path = np.asarray(counts), Path(path)
    names = None if class_names is None else tuple(class_names)
    key = _drawn_key(counts, title, names)
    with _DRAWN_LOCK:
        png = _DRAWN.get(key)
    if png is not None:
        path.write_bytes(png)
        return path
    if names is None:
        plot_label_distribution(counts, path, title)
    else:
        plot_label_distribution(counts, path, title, class_names=names)
    with _DRAWN_LOCK:
        _remember(key, path.read_bytes())
    return path


def _drawn_key(counts, title: str, class_names) -> str:
    """What a plot shows, as the key of `_DRAWN`."""
    counts = np.asarray(counts)
    names = None if class_names is None else tuple(class_names)
    key = hashlib.sha1(f"{counts.shape} {counts.dtype} {title!r} {names!r}".encode())
    key.update(np.ascontiguousarray(counts).tobytes())
    return key.hexdigest()


def _remember(key: str, png: bytes) -> None:
    """Keep a drawn PNG (the most recent `_DRAWN_KEPT`); the caller holds `_DRAWN_LOCK`."""
    while len(_DRAWN) >= _DRAWN_KEPT:
        _DRAWN.pop(next(iter(_DRAWN)))
    _DRAWN[key] = png


def write_partition_stats(
    data, run_dir: str | Path, title: str = ""
) -> tuple[tuple[Path, str], ...]:
    """`partition_stats.csv` (each client's group, split sizes and class counts) and the
    label-distribution PNG in `run_dir`; returns (path, kind) of both, the plot first.

    Args:
        data: the FederatedData.
        run_dir: the run directory.
        title: the plot's title.
    """
    return start_partition_stats(data, run_dir, title, background=False).wait()


class PartitionStats:
    """The partition's files (`write_partition_stats`): the CSV written, the PNG drawn by a
    process of its own when `background` (matplotlib's import and the drawing take a second or
    two of CPU). That process runs at the lowest priority: on a machine with a core idle it
    draws there at once; where something else fills the cores it takes what they leave, and
    `wait()` (at the run's end, or where a logger needs the files) draws it in this process if it
    has not finished. (A thread drawing it held the interpreter's lock through the first round,
    which it made seconds slower.) Where processes cannot be forked it draws in a thread.
    `background="end"`: drawn by `wait()` only, for a run whose own processes fill the cores
    (`spare_core`): a lowest-priority process still ran in the gaps of the pool executor's
    rounds (a worker waiting for its next client, the round's end), the rounds were slower and
    their times uneven with it (docs/BENCHMARKS.md, "Every core"), and at 12 rounds it had not
    finished when the run ended.
    `wait()` returns (path, kind) of both, the plot first, once the PNG is written, and raises
    what drawing it raised."""

    def __init__(self, artifacts: tuple[tuple[Path, str], ...], draw, background: bool | str):
        self.artifacts = artifacts
        self._error: BaseException | None = None
        self._thread = None
        self._child = None
        self._later = None
        if draw is None:
            return
        if background == "end":
            self._later = draw
        elif not background:
            draw()
        elif "fork" in multiprocessing.get_all_start_methods():
            self._child = _DrawingProcess(draw)
        else:
            self._thread = threading.Thread(target=self._draw, args=(draw,), name="partition-plot")
            self._thread.start()

    @classmethod
    def none(cls) -> PartitionStats:
        """No files: a torchrun rank above 0, whose outputs nobody reads, writes none."""
        return cls((), None, background=False)

    def _draw(self, draw) -> None:
        try:
            draw()
        except BaseException as err:  # re-raised by wait(), in the thread that waits
            self._error = err

    def wait(self) -> tuple[tuple[Path, str], ...]:
        if self._later is not None:
            draw, self._later = self._later, None
            self._draw(draw)
        if self._thread is not None:
            self._thread.join()
        if self._child is not None:
            self._error = self._child.wait()
            self._child = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return self.artifacts


class _DrawingProcess:
    """`draw` (a `draw_once` partial) in a forked child at the lowest priority; `wait()` returns
    what it raised, or None, and keeps the PNG it drew in this process's `_DRAWN` (a sweep's
    next job on the same partition writes those bytes without drawing)."""

    def __init__(self, draw):
        self._draw = draw
        counts, _, title, names = draw.args
        self._key = _drawn_key(counts, title, names)
        with _DRAWN_LOCK:
            cached = self._key in _DRAWN
        self._conn = self._proc = None
        if cached:  # written now, as draw_once writes a known plot
            draw()
            return
        context = multiprocessing.get_context("fork")
        sys.stdout.flush()  # a forked child must not write this process's buffered output again
        sys.stderr.flush()
        self._conn, theirs = context.Pipe(duplex=False)
        self._proc = context.Process(
            target=_draw_child, args=(theirs, draw), name="partition-plot", daemon=True
        )
        self._proc.start()
        theirs.close()

    def wait(self) -> BaseException | None:
        """The child's PNG if it has drawn it; if it is still drawing (a machine whose cores the
        run and others keep busy leaves a lowest-priority process next to no time), it is
        stopped and the plot drawn here, now: a run's end never waits on a starved process."""
        if self._proc is None:
            return None
        proc, conn, self._proc = self._proc, self._conn, None
        if not conn.poll(0) and proc.is_alive():
            proc.kill()
            proc.join()
            conn.close()
            try:
                self._draw()
            except BaseException as err:  # noqa: BLE001 - raised by PartitionStats.wait
                return err
            return None
        try:
            kind, value = conn.recv()
        except (EOFError, OSError):
            kind, value = (
                "error",
                RuntimeError(
                    f"the process drawing {self._draw.args[1]} ended without drawing it "
                    f"(exit code {proc.exitcode})"
                ),
            )
        conn.close()
        proc.join()
        if kind == "error":
            return value
        with _DRAWN_LOCK:
            _remember(self._key, value)
        return None


def _draw_child(conn, draw) -> None:
    """The drawing process (`partition-plot` in `ps`; it dies with the run): draw at the lowest
    priority, send back the PNG's bytes (or the error), leave."""
    with contextlib.suppress(OSError, AttributeError):  # prctl(2) is Linux's
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        prctl(PR_SET_NAME, b"partition-plot")
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.nice(19)
    _let_go_of_files(keep=conn.fileno())
    try:
        path = draw()
        conn.send(("ok", Path(path).read_bytes()))
    except BaseException as err:  # noqa: BLE001 - the parent raises it from wait()
        try:
            conn.send(("error", err))
        except Exception:  # noqa: BLE001 - an error that does not pickle: its text
            conn.send(("error", RuntimeError(f"{type(err).__name__}: {err}")))


def start_partition_stats(
    data, run_dir: str | Path, title: str = "", background: bool | str = True
) -> PartitionStats:
    """Write `partition_stats.csv` now and start drawing the label-distribution PNG (in a
    background process unless `background=False`, or at `wait()` where `background="end"`;
    `draw_once`); `PartitionStats.wait()` for both files."""
    run_dir = Path(run_dir)
    counts = class_counts(data.train_labels(), data.partition, data.num_classes)
    names = getattr(data, "class_names", None)
    if names is not None and len(names) != counts.shape[1]:
        names = None
    path = run_dir / "partition_stats.csv"
    header = _header(counts.shape[1], names)
    part = data.partition
    num = len(counts)
    n_val = part.val.sizes if part.val is not None else np.zeros(num, dtype=np.int64)
    table = np.column_stack([part.train.sizes, part.test.sizes, n_val, counts])
    if data.groups is None:  # every cell an integer: one C-level format of the whole table
        row = "%d,," + ",".join(["%d"] * table.shape[1]) + "\n"
        cells = np.column_stack([np.arange(num), table]).ravel().tolist()
        body = (row * num) % tuple(cells)
    else:
        rows = zip(data.groups, table.tolist())
        body = "".join(f"{c},{g}," + ",".join(map(str, r)) + "\n" for c, (g, r) in enumerate(rows))
    path.write_text(header + "\n" + body)
    plot = run_dir / "partition_labels.png"
    artifacts = ((plot, "partition/label_distribution"), (path, "partition/class_counts"))
    draw = partial(draw_once, counts, plot, title, names)
    return PartitionStats(artifacts, draw, background)


def _header(num_classes: int, names: tuple[str, ...] | None) -> str:
    """The CSV's header: `class_<name>` per class where the classes have names, else
    `class_<id>`; cells quoted where a name holds a comma, a quote or a line break."""
    classes = [f"class_{c}" for c in (names if names is not None else range(num_classes))]
    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow(
        ["client", "group", "n_train", "n_test", "n_val", *classes]
    )
    return out.getvalue()


def _let_go_of_files(keep: int) -> None:
    """Point every file this fork inherited (but the standard streams and `keep`) at /dev/null:
    the run's files stay open in the run alone, so the run-dir lock ends with the run even while
    this process still draws. (Replaced, not closed: an inherited Python file object that
    closes its descriptor later closes /dev/null, never a file this process opened since.)"""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:  # no /proc: the files stay shared until the drawing ends
        return
    null = os.open(os.devnull, os.O_RDWR)
    for fd in sorted(int(name) for name in names):
        if fd > 2 and fd not in (keep, null):
            with contextlib.suppress(OSError):
                os.dup2(null, fd)
    os.close(null)
