"""``plot_timeline``: one lane each for read, transfer and compute, per chunk, over time.

Each chunk is a bar in every lane: when a reader thread read it, when it was
copied to the device (CUDA only), and when the consumer trained on it (from
receiving it to asking for the next). The consumer's waits are drawn red on the
compute lane: where they are long, training stalled on data; where the read
bars sit under earlier compute bars, reading overlapped training.
"""

from __future__ import annotations

import os
from pathlib import Path

from ._latency import LatencyStats

__all__ = ["plot_timeline"]

_COLORS = {"read": "#4C72B0", "transfer": "#DD8452", "compute": "#55A868", "wait": "#C44E52"}
# Back-to-back chunks would merge into one band: every other chunk gets the darker shade.
_ALTERNATE = {"read": "#27466F", "transfer": "#9C5220", "compute": "#2F6B3D"}


def plot_timeline(
    stats: LatencyStats, path: str | os.PathLike, *, title: str | None = None
) -> Path:
    """Draw ``stats``' chunk records to an image at ``path`` (PNG by suffix); returns the path.

    Needs matplotlib (``pip install chunkstream[plot]``); it is imported here. The
    plot is a ``matplotlib.figure.Figure`` saved by itself, without pyplot, so it
    works on a headless machine and leaves the user's backend as it was.
    """
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError("plot_timeline needs matplotlib: pip install chunkstream[plot]") from exc
    stats.resolve_pending()
    chunks = sorted(stats.chunks, key=lambda c: c.received)
    path = Path(path)
    figure = Figure(figsize=(11, 3.2), layout="constrained")
    ax = figure.add_subplot()
    lanes = ["compute", "transfer", "read"]
    if not any(c.transfer_begin is not None for c in chunks):
        lanes.remove("transfer")
    origin = min((c.read_begin for c in chunks), default=0.0)
    bars: dict[str, list[tuple[float, float]]] = {k: [] for k in (*lanes, "wait")}
    for c in chunks:
        bars["read"].append((c.read_begin - origin, c.read_end - c.read_begin))
        if "transfer" in lanes and c.transfer_begin is not None:
            duration = c.transfer_s if c.transfer_s is not None else 0.0
            bars["transfer"].append((c.transfer_begin - origin, duration))
        if c.compute_end is not None:
            bars["compute"].append((c.received - origin, c.compute_end - c.received))
        bars["wait"].append((c.received - c.wait_s - origin, c.wait_s))
    end = max((c.compute_end or c.received for c in chunks), default=origin) - origin
    # Reads can be far shorter than a pixel; give every bar a visible minimum width.
    least = max(end, 1e-9) * 0.002
    for row, lane in enumerate(lanes):
        spans = [(x, max(w, least)) for x, w in bars[lane]]
        colors = [(_COLORS, _ALTERNATE)[i % 2][lane] for i in range(len(spans))]
        ax.broken_barh(spans, (row - 0.35, 0.7), facecolors=colors, alpha=0.75, linewidth=0)
    compute_row = lanes.index("compute")
    ax.broken_barh(
        bars["wait"],
        (compute_row - 0.35, 0.7),
        facecolors=_COLORS["wait"],
        label="waiting for data",
    )
    ax.set_yticks(range(len(lanes)), lanes)
    ax.set_xlabel("seconds since the first read")
    summary = stats.summary()
    ax.set_title(
        title
        or f"{int(summary['num_chunks'])} chunks: stall {100 * summary['stall_fraction']:.1f}% "
        f"of epoch time, {summary['chunks_per_s']:.2f} chunks/s, {summary['gb_per_s']:.3f} GB/s"
    )
    ax.legend(loc="upper right", fontsize="small")
    ax.grid(axis="x", alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return path
