"""The ETTR-against-recall figure of ``foreshock goodput`` (matplotlib PNG)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

__all__ = ["plot_ettr_vs_recall"]


def plot_ettr_vs_recall(table: pd.DataFrame, path: str | Path, *, operating_recall: float | None = None,
                        title: str = "") -> Path:
    """Write ETTR of the ``foreshock`` strategy against recall, one line per cluster size.

    ``table`` is the output of :func:`foreshock.models.goodput.compare.sweep`. Each size also gets its
    ``young_daly`` (dashed) and ``oracle`` (dotted) ETTR as horizontal references, and a marker
    at ``operating_recall`` when given.
    """
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for k, (gpus, rows) in enumerate(table.groupby("gpus", sort=True)):
        color = f"C{k}"
        fs = rows[rows["strategy"] == "foreshock"].sort_values("recall")
        ax.plot(fs["recall"], fs["ettr"], "o-", color=color, ms=3, label=f"{gpus:,} GPUs: Foreshock")
        for strategy, style in (("young_daly", "--"), ("oracle", ":")):
            ref = rows.loc[rows["strategy"] == strategy, "ettr"]
            if len(ref):
                ax.axhline(float(ref.iloc[0]), color=color, ls=style, lw=1)
        if operating_recall is not None and len(fs):
            nearest = fs.iloc[(fs["recall"] - operating_recall).abs().argsort().iloc[0]]
            ax.plot([nearest["recall"]], [nearest["ettr"]], "*", color=color, ms=12)
    ax.set_xlabel("recall (share of failures predicted)")
    ax.set_ylabel("ETTR (productive time / wall time)")
    ax.set_title(title or "ETTR against recall (dashed: Young/Daly, dotted: oracle, star: operating point)",
                 fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
