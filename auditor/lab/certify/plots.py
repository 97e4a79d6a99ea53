"""Figures of the certify room: the numerical rank of Z against the tolerance, and against N."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from auditor.lab.figures import plt, save


def plot_tolerance(curves: pd.DataFrame, path: str | Path, title: str = "") -> None:
    """Numerical rank of Z against rtol (log axis), one line per ``label``.

    Optional columns: ``bound`` (drawn dotted per label, e.g. H(n-1)+1) and ``default_rtol`` (the default
    tolerance of that label's own Z, which grows with its N and width: a dashed line in the label's colour).
    """
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for label, part in curves.groupby("label", sort=False):
        line = ax.plot(part["rtol"], part["rank"], marker=".", label=str(label))[0]
        if "bound" in part and part["bound"].notna().any():
            ax.axhline(float(part["bound"].iloc[0]), color=line.get_color(), ls=":", lw=1)
        if "default_rtol" in part and part["default_rtol"].notna().any():
            ax.axvline(float(part["default_rtol"].dropna().iloc[0]), color=line.get_color(), ls="--", lw=0.8)
    if "default_rtol" in curves and curves["default_rtol"].notna().any():
        ax.plot([], [], color="gray", ls="--", lw=0.8, label="default (float32) rtol of each Z")
    ax.set_xscale("log")
    ax.set_xlabel("relative tolerance rtol (singular values > rtol * sigma_max count)")
    ax.set_ylabel("numerical rank of Z")
    ax.set_title(title or "rank of Z against tolerance (dotted: H(n-1)+1)")
    save(fig, path, ax=ax)


def plot_rank_vs_examples(frame: pd.DataFrame, path: str | Path, title: str = "") -> None:
    """rank(Z) against N for each ``label`` (columns N, rank, label, bound), with y = N and the bounds."""
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for label, part in frame.groupby("label", sort=False):
        part = part.sort_values("N")
        line = ax.plot(part["N"], part["rank"], marker="o", ms=3, label=str(label))[0]
        if part["bound"].notna().any():
            ax.axhline(float(part["bound"].iloc[0]), color=line.get_color(), ls=":", lw=1)
    top = frame["N"].max()
    ax.plot([0, top], [0, top], color="gray", lw=0.8, label="rank = N")
    ax.set_xlabel("examples N")
    ax.set_ylabel("numerical rank of Z (default tolerance)")
    ax.set_title(title or "rank of Z against N (dotted: H(n-1)+1)")
    save(fig, path, ax=ax)
