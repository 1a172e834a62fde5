"""Label-distribution plot of a partition: clients x classes heatmap plus client sizes (PNG)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedexp.data.partition import class_counts


def plot_label_distribution(counts: np.ndarray, path: str | Path, title: str = "") -> Path:
    """Write a PNG of per-client class shares (rows sum to 1) and per-client training sizes.

    Shares rather than counts, so that clients of very different sizes (natural splits) are
    comparable; the bar panel on the right gives the sizes.
    """
    import matplotlib

    matplotlib.use("Agg")  # no display on servers; set before pyplot is imported
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    counts = np.asarray(counts, dtype=np.float64)
    num_clients, num_classes = counts.shape
    sizes = counts.sum(1)
    shares = counts / np.maximum(sizes, 1)[:, None]
    height = min(12.0, 3.0 + 0.18 * num_clients)
    width = min(16.0, 7.0 + 0.08 * num_classes)
    fig, (ax, bar) = plt.subplots(
        1,
        2,
        figsize=(width, height),
        gridspec_kw={"width_ratios": [4, 1]},
        sharey=True,
        layout="constrained",
    )
    image = ax.imshow(shares, aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="none")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    ax.set_title(title or f"{num_clients} clients x {num_classes} classes", fontsize=10)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(MaxNLocator(integer=True))
    bar.barh(np.arange(num_clients), sizes, height=0.8, color="gray")
    bar.set_xlabel("training samples")
    fig.colorbar(
        image,
        ax=[ax, bar],  # shrink both panels alike so client rows stay aligned
        orientation="horizontal",
        label="share of the client's training samples",
        fraction=0.05,
        pad=0.08,
    )
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


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
    run_dir = Path(run_dir)
    counts = class_counts(data.train_labels(), data.partition, data.num_classes)
    path = run_dir / "partition_stats.csv"
    header = "client,group,n_train,n_test,n_val," + ",".join(
        f"class_{c}" for c in range(counts.shape[1])
    )
    part = data.partition
    groups = data.groups or [""] * len(counts)
    n_val = [len(v) for v in part.val] if part.val is not None else [0] * len(counts)
    rows = [
        f"{c},{groups[c]},{len(part.train[c])},{len(part.test[c])},{n_val[c]},"
        + ",".join(map(str, counts[c]))
        for c in range(len(counts))
    ]
    path.write_text("\n".join([header, *rows]) + "\n")
    plot = plot_label_distribution(counts, run_dir / "partition_labels.png", title)
    return ((plot, "partition/label_distribution"), (path, "partition/class_counts"))
