"""ETTR against cluster size, from a goodput sweep (:func:`foreshock.models.goodput.sweep`).

The ETTR-against-recall figure is :func:`foreshock.models.goodput.plot.plot_ettr_vs_recall`; this module
adds the view across cluster sizes, where the case for prediction is made: a job's failure rate
grows with its GPU count, so the ETTR lost to failures (and the share prediction wins back)
grows with it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

__all__ = ["size_table", "plot_ettr_vs_size"]

_STYLE = {"fixed": ("#7f8c8d", "s--"), "young_daly": ("#2c7fb8", "o--"), "oracle": ("#27ae60", "^:")}


def size_table(table: pd.DataFrame, recall: float) -> pd.DataFrame:
    """ETTR per cluster size (rows) and strategy (columns), Foreshock at the sweep recall nearest
    ``recall``; the column ``foreshock`` is labelled with that recall in :attr:`DataFrame.attrs`."""
    fs = table[table["strategy"] == "foreshock"]
    recalls = np.unique(fs["recall"].to_numpy(dtype=float))
    if recalls.size == 0:
        raise ValueError("the sweep has no foreshock rows")
    nearest = float(recalls[np.argmin(np.abs(recalls - recall))])
    rows = pd.concat([table[table["strategy"] != "foreshock"], fs[np.isclose(fs["recall"], nearest)]])
    out = rows.pivot_table(index="gpus", columns="strategy", values="ettr").sort_index()
    out.attrs["recall"] = nearest
    return out


def plot_ettr_vs_size(table: pd.DataFrame, recall: float, title: str = "ETTR against cluster size") -> Figure:
    """ETTR of each strategy against the job's GPU count (log axis), Foreshock at ``recall``."""
    wide = size_table(table, recall)
    fig = Figure(figsize=(7.5, 4.6))
    ax = fig.subplots()
    for strategy in wide.columns:
        color, style = _STYLE.get(strategy, ("#c0392b", "o-"))
        label = f"foreshock (recall {wide.attrs['recall']:.2f})" if strategy == "foreshock" else strategy
        width = 2 if strategy == "foreshock" else 1
        ax.plot(wide.index, wide[strategy], style, color=color, label=label, lw=width)
    ax.set_xscale("log", base=2)
    ax.set_xticks(wide.index, [f"{g:,}" for g in wide.index])
    ax.set_xlabel("GPUs in the job")
    ax.set_ylabel("ETTR (productive time / wall time)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    return fig
