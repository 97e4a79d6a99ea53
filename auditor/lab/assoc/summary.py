"""Fits and Markdown summaries of the capacity-lab-III results (what the report and the CLI print).

Points whose search never failed (the capacity reached the search's upper end, so it is only a lower
bound) are left out of every fit and counted as ``censored``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from auditor.lab.assoc.capacity import (
    FACTS_PER_PARAMETER_GUIDE,
    GUIDE_CONSTANT,
    LM_BITS_PER_PARAMETER,
    ConstantFit,
    PowerLawFit,
    fit_guide_constant,
    fit_power_law,
    n_log_n,
)


def _uncensored(rows: pd.DataFrame, value: str, fail: str) -> pd.DataFrame:
    """Rows whose search failed somewhere (``fail`` column set) and whose ``value`` is above 1."""
    return rows[rows[fail].notna() & (rows[value] > 1)]


def capacity_fits(rows: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Per memory kind: ``power`` (N = k P^b), ``law`` (P = c (N ln N)^b, b = 1 under the paper's law),
    ``constant`` (c of P = c N ln N) and the paper's ``guide`` c. Fits need >= 3 points (else None)."""
    out: dict[str, dict[str, Any]] = {}
    for kind in sorted(set(rows["kind"])):
        sub = _uncensored(rows[rows["kind"] == kind], "capacity", "first_fail")
        enough = len(sub) >= 3 and sub["parameters"].nunique() >= 2
        out[kind] = {
            "power": fit_power_law(sub["parameters"], sub["capacity"]) if enough else None,
            "law": fit_power_law(n_log_n(sub["capacity"]), sub["parameters"]) if enough else None,
            "constant": fit_guide_constant(sub["parameters"], n_log_n(sub["capacity"])) if len(sub) else None,
            "guide": GUIDE_CONSTANT[kind],
            "points": len(sub),
            "censored": int((rows["kind"] == kind).sum() - len(sub)),
        }
    return out


def facts_fits(rows: pd.DataFrame) -> dict[str, Any]:
    """``slope`` (facts = c P), ``power`` (facts = k P^b), bits per parameter, over every uncensored row."""
    sub = _uncensored(rows, "facts", "first_fail_facts")
    enough = len(sub) >= 3 and sub["parameters"].nunique() >= 2
    slope = fit_guide_constant(sub["facts"], sub["parameters"]) if len(sub) else None
    bits_per_fact = float(np.log2(rows["answers_per_relation"].iloc[0])) if len(rows) else float("nan")
    return {
        "slope": slope,
        "power": fit_power_law(sub["parameters"], sub["facts"]) if enough else None,
        "bits_per_parameter": slope.constant * bits_per_fact if slope else None,
        "bits_per_fact": bits_per_fact,
        "points": len(sub),
        "censored": len(rows) - len(sub),
    }


def _fmt_power(p: PowerLawFit | None) -> str:
    if p is None:
        return "n/a"
    lo, hi = p.ci95()
    return f"{p.exponent:.3f} ± {p.exponent_se:.3f} (95% {lo:.3f} to {hi:.3f}), R² {p.r2:.3f}"


def _fmt_const(c: ConstantFit | None) -> str:
    if c is None:
        return "n/a"
    lo, hi = c.ci95()
    return f"{c.constant:.3f} (95% {lo:.3f} to {hi:.3f}, n = {c.n})"


def capacity_markdown(rows: pd.DataFrame) -> str:
    """Capacity table (mean and range over seeds per size) and the fits against the paper's guides."""
    table = (
        rows.groupby(["kind", "d", "width", "parameters"])["capacity"]
        .agg(["mean", "min", "max", "count"])
        .reset_index()
        .rename(columns={"mean": "capacity mean", "min": "min", "max": "max", "count": "seeds"})
    )
    table["parameters / (N ln N)"] = table["parameters"] / n_log_n(table["capacity mean"].clip(lower=2))
    lines = [table.to_markdown(index=False, floatfmt=".3g"), ""]
    lines += ["| memory | paper's c in P = c N ln N | fitted c | exponent b in P ∝ (N ln N)^b | exponent in N ∝ P^b | censored |",
              "|---|---|---|---|---|---|"]
    for kind, fit in capacity_fits(rows).items():
        lines.append(f"| {kind} | {fit['guide']} | {_fmt_const(fit['constant'])} | {_fmt_power(fit['law'])} | "
                     f"{_fmt_power(fit['power'])} | {fit['censored']} |")
    return "\n".join(lines)


def facts_markdown(rows: pd.DataFrame) -> str:
    """Facts-per-parameter table and fit, compared with 0.15 facts and 2 bits per parameter."""
    table = (
        rows.groupby(["architecture", "d", "heads", "head_dim", "width", "parameters"])
        .agg(subjects=("subjects", "mean"), relations=("relations", "mean"), facts=("facts", "mean"),
             facts_min=("facts", "min"), facts_max=("facts", "max"),
             facts_per_parameter=("facts_per_parameter", "mean"), bits_per_parameter=("bits_per_parameter", "mean"))
        .reset_index()
    )
    fit = facts_fits(rows)
    slope = fit["slope"]
    lines = [table.to_markdown(index=False, floatfmt=".3g"), ""]
    lines.append(f"- fitted facts per parameter: {_fmt_const(slope)}; paper's guide {FACTS_PER_PARAMETER_GUIDE}")
    if fit["bits_per_parameter"] is not None:
        lines.append(f"- bits per parameter: {fit['bits_per_parameter']:.3f} (log2 D = {fit['bits_per_fact']:.0f} bits per fact); "
                     f"paper's guide {FACTS_PER_PARAMETER_GUIDE * fit['bits_per_fact']:.2f}; real language models "
                     f"~{LM_BITS_PER_PARAMETER:g}")
    lines.append(f"- exponent of facts ∝ P^b: {_fmt_power(fit['power'])} (1 = linear); censored points: {fit['censored']}")
    return "\n".join(lines)


def tradeoff_markdown(rows: pd.DataFrame) -> str:
    """The heat map as a table, and the smallest MLP width that stores the facts at each H."""
    grid = rows.pivot_table(index="heads", columns="width", values="accuracy", aggfunc="mean").sort_index()
    lines = ["accuracy over all facts (rows: H, columns: m)", "", grid.to_markdown(floatfmt=".3f"), ""]
    stored = rows.groupby(["heads", "width"])["stored"].all().reset_index()
    for heads, sub in stored.groupby("heads"):
        ok = sub[sub["stored"]]
        need = "none of the widths tried" if ok.empty else f"m = {int(ok['width'].min())}"
        lines.append(f"- H = {heads}: smallest width storing all facts at the threshold: {need}")
    return "\n".join(lines)


def dynamics_markdown(stages: pd.DataFrame) -> str:
    """Stage boundaries per seed as step numbers, with the plateau levels."""
    cols = ["seed", "uniform_end", "hallucination_start", "hallucination_end", "converged_at",
            "uniform_mean", "hallucination_mean", "relation_loss_mid", "hallucination_confirmed"]
    first = stages.iloc[0]
    head = (f"plateau levels: ln(R D) = {first['uniform_level']:.3f}, ln D = {first['hallucination_level']:.3f} "
            f"(= ln {round(math.exp(first['hallucination_level']))})")
    return head + "\n\n" + stages[cols].to_markdown(index=False, floatfmt=".4g")
