"""What every figure of the lab shares: matplotlib on the Agg backend, one heat map, one way to save."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from auditor.core.atomic import save_figure  # noqa: E402

__all__ = ["heatmap", "plt", "save"]


def heatmap(
    ax: Any,
    table: pd.DataFrame,
    *,
    label: str,
    vmin: float = 0.0,
    vmax: float = 1.0,
    fmt: str = "{:.2f}",
    cmap: str = "viridis",
    fontsize: float = 7,
) -> Any:
    """``table`` (rows drawn bottom-up) with every finite cell written in it (``fmt``), and a colour bar
    (returned); the text is white on the darker 60% of the colour scale."""
    values = table.to_numpy(dtype=float)
    image = ax.imshow(values, origin="lower", cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    ax.set_xticks(range(table.shape[1]), [str(c) for c in table.columns])
    ax.set_yticks(range(table.shape[0]), [str(i) for i in table.index])
    dark = vmin + 0.6 * (vmax - vmin)
    for (i, j), value in np.ndenumerate(values):
        if np.isfinite(value):
            ax.text(j, i, fmt.format(value), ha="center", va="center", fontsize=fontsize,
                    color="w" if value < dark else "k")
    return plt.colorbar(image, ax=ax, label=label)


def save(fig: Any, path: str | Path, *, title: str | None = None, ax: Any = None) -> Path:
    """Grid and legend on ``ax`` (if given), the title, layout, the file at 130 dpi (written atomically, in
    the format of the suffix); the figure is released."""
    if ax is not None:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    try:
        fig.tight_layout()
        return save_figure(
            fig, path, dpi=130
        )  # atomic; a link at ``path`` is replaced, never written through
    finally:
        plt.close(fig)
