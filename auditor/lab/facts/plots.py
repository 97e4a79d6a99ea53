"""Heat maps and curves of the facts experiments, drawn from their ``results.csv`` (PNG, Agg backend).

One function per experiment; each takes the results frame and an output folder and returns the paths
it wrote. Accuracies are averaged over the rows that share a cell (database seeds, init seeds).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from auditor.core.atomic import real_folder
from auditor.core.errors import AuditError
from auditor.lab.figures import heatmap, plt, save


def _title(frame: pd.DataFrame) -> str:
    first = frame.iloc[0]
    seeds = frame["db"].nunique() if "db" in frame else 1
    return (
        f"{first['keys']} keys x {first['queries']} queries, {first['triples']} triples ({seeds} database(s))"
    )


def plot_width(frame: pd.DataFrame, out: Path) -> list[Path]:
    """Accuracy over (d_model, d_vo) and against d_model + d_vo (d_qk = d_model, H = 1)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    table = frame.pivot_table(index="d_vo", columns="d_model", values="accuracy", aggfunc="mean")
    heatmap(left, table, label="argmax accuracy")
    left.set_xlabel("d_model")
    left.set_ylabel("d_head,vo")
    left.set_title("accuracy (mean over seeds)")
    frame = frame.assign(width=frame["d_model"] + frame["d_vo"])
    for d_vo, part in frame.groupby("d_vo"):
        mean = part.groupby("width")["accuracy"].mean()
        right.plot(mean.index, mean.to_numpy(), marker="o", label=f"d_vo = {d_vo}")
    right.set_xlabel("d_model + d_head,vo")
    right.set_ylabel("argmax accuracy")
    right.set_ylim(0, 1.02)
    right.legend(fontsize=8)
    right.grid(alpha=0.3)
    return [save(fig, out / "width.png", title=f"facts/width: {_title(frame)}")]


def plot_budget(frame: pd.DataFrame, out: Path) -> list[Path]:
    """Accuracy over the (d_qk, d_vo) grid, with the fixed-budget anti-diagonal, and along that line."""
    d_model = int(frame["d_model"].iloc[0])
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    table = frame.pivot_table(index="d_vo", columns="d_qk", values="accuracy", aggfunc="mean")
    heatmap(left, table, label="argmax accuracy")
    cols, rows = list(table.columns), list(table.index)
    line = [(cols.index(qk), rows.index(d_model + 1 - qk)) for qk in cols if d_model + 1 - qk in rows]
    left.plot([x for x, _ in line], [y for _, y in line], "r--", lw=1.5)
    left.set_xlabel("d_head,qk")
    left.set_ylabel("d_head,vo")
    left.set_title(f"accuracy, d_model = {d_model} (red: d_qk + d_vo = d_model + 1)")
    budget = frame[frame["on_budget"].astype(bool)]
    for tau_col, label in (("accuracy", "argmax"), ("acc_tau0.95", "softmax >= 0.95")):
        if tau_col in budget:
            mean = budget.groupby("d_vo")[tau_col].mean()
            right.plot(mean.index, mean.to_numpy(), marker="o", label=label)
    right.set_xticks(sorted(budget["d_vo"].unique()))
    right.set_xlabel("d_head,vo  (d_head,qk = d_model - d_head,vo + 1)")
    right.set_ylabel("accuracy")
    right.set_ylim(0, 1.02)
    right.grid(alpha=0.3)
    right.legend(fontsize=8)
    right.set_title("fixed parameter budget 2 d_model (d_model + 1) per head")
    return [save(fig, out / "budget.png", title=f"facts/budget: {_title(frame)}")]


def plot_tau(frame: pd.DataFrame, out: Path) -> list[Path]:
    """rank(softmax>=tau(L)) and softmax>=tau accuracy against tau, per trained layer width."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for d_model, part in frame.groupby("d_model"):
        mean = part.groupby("tau")[["s_cp_rank", "acc_tau", "layer_bound"]].mean()
        (line,) = left.plot(mean.index, mean["s_cp_rank"], marker="o", label=f"d_model = {d_model}")
        left.axhline(mean["layer_bound"].iloc[0], color=line.get_color(), ls=":", lw=1)
        right.plot(mean.index, mean["acc_tau"], marker="o", label=f"d_model = {d_model}")
    lo, hi = frame["bounds_lower"].iloc[0], frame["bounds_upper"].iloc[0]
    left.axhspan(lo, hi, color="k", alpha=0.08, label=f"rank(D) in [{lo}, {hi}] (certified)")
    left.axhline(
        frame["cp_rank"].iloc[0], color="k", ls="--", label=f"rank(D) estimate {frame['cp_rank'].iloc[0]}"
    )
    left.set_xlabel("tau")
    left.set_ylabel(f"CP rank of softmax>=tau(L) (cp_tolerance {frame['cp_tolerance'].iloc[0]:g})")
    left.set_title("dotted: bound on rank(L) of that layer")
    left.legend(fontsize=7)
    left.grid(alpha=0.3)
    right.set_xlabel("tau")
    right.set_ylabel("softmax>=tau accuracy")
    right.set_ylim(0, 1.02)
    right.grid(alpha=0.3)
    right.legend(fontsize=8)
    return [save(fig, out / "tau.png", title=f"facts/tau: {_title(frame)}")]


def plot_bound(frame: pd.DataFrame, out: Path) -> list[Path]:
    """CP-rank estimate and flattening lower bound of L against the bound, random vs trained layers."""
    fig, ax = plt.subplots(figsize=(6, 5))
    top = float(frame["layer_bound"].max()) + 2
    ax.plot([0, top], [0, top], "k--", lw=1, label="= bound")
    for state, marker in (("random", "o"), ("trained", "s")):
        part = frame[frame["state"] == state]
        if len(part):
            ax.scatter(
                part["layer_bound"], part["layer_cp_rank"], marker=marker, label=f"{state}: CP estimate"
            )
            ax.scatter(
                part["layer_bound"],
                part["layer_flattening_lower"],
                marker=marker,
                facecolors="none",
                edgecolors="gray",
                label=f"{state}: flattening lower bound",
            )
    ax.set_xlabel("bound on rank(L) (explicit construction)")
    ax.set_ylabel("rank of L")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_title("facts/bound: rank(L) against its bound")
    return [save(fig, out / "bound.png")]


PLOTS = {"width": plot_width, "budget": plot_budget, "tau": plot_tau, "bound": plot_bound}


def plot_argmax(table: pd.DataFrame, out: Path) -> list[Path]:
    """Best and mean argmax accuracy against the bound on rank(L), one marker per learning rate, with
    rank(D) marked: the test of "low-rank layers fit high-rank databases under argmax"."""
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    for (lr, part), marker in zip(table.groupby("lr"), "osD^v"):
        jitter = part["layer_bound"] + 0.15 * (part["d_model"].rank(method="dense") - 1)
        ax.scatter(jitter, part["accuracy_best"], marker=marker, label=f"lr {lr:g}: best of seeds")
        ax.scatter(jitter, part["accuracy_mean"], marker=marker, facecolors="none", edgecolors="gray",
                   label=f"lr {lr:g}: mean")
    rank = int(table["rank_D"].iloc[0])
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xlabel(f"bound on rank(L) (every layer here is far below rank(D) = {rank})")
    ax.set_ylabel("argmax accuracy")
    ax.set_title("rank-bounded layers on a high-rank database (x jittered by d_model)", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return [save(fig, out / "argmax.png")]


def plot_tau_tracking(table: pd.DataFrame, out: Path) -> list[Path]:
    """Per tau: the mean rank gap (how far rank(softmax>=tau(L)) is from what the layer can hold), the
    share of inflated layers and the softmax>=tau accuracy."""
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    ax.plot(table["tau"], table["gap"], "o-", label="|rank(softmax>=tau(L)) - min(bound, rank D)| / rank D")
    ax.plot(table["tau"], table["inflated"], "s--", label="share of layers with rank above their bound")
    ax.plot(table["tau"], table["accuracy"], "^:", label="softmax>=tau accuracy")
    best = table.loc[table["gap"].idxmin(), "tau"]
    ax.axvline(best, color="tab:red", lw=0.8, label=f"smallest gap: tau = {best:g}")
    ax.axvline(0.95, color="gray", lw=0.8, ls=":", label="paper: tau = 0.95")
    ax.set_xlabel("tau")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return [save(fig, out / "tau_tracking.png")]


def plot_results(results: str | Path, out: str | Path | None = None) -> list[Path]:
    """Draw the plot of the experiment recorded in ``results`` (a results.csv or its folder)."""
    path = Path(results)
    path = path / "results.csv" if path.is_dir() else path
    if not path.is_file():
        raise AuditError(f"no results file at {str(path)!r}; give a sweep folder or its results.csv")
    frame = pd.read_csv(path)
    if frame.empty or "experiment" not in frame:
        raise AuditError(f"{str(path)!r} has no facts experiment rows")
    name = str(frame["experiment"].iloc[0])
    if name not in PLOTS:
        return []
    target = Path(out) if out is not None else path.parent
    real_folder(target)
    return PLOTS[name](frame, target)
