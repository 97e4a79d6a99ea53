"""The tools of the facts room around its experiments: ``audit facts generate`` (a seeded database as CSV)
and ``audit facts plot`` (redraw a finished sweep's plot).

\b
  audit facts generate --keys 32 --queries 8 --values-per-query 4 -o db.csv
  audit facts plot DIR
"""

from __future__ import annotations

from typing import Any

import click

from auditor.lab.options import SEED, SIZE, threads_option


@click.command("generate")
@click.option("--kind", type=click.Choice(["random", "planted"]), default="random", show_default=True)
@click.option("--keys", default=32, type=SIZE, show_default=True, help="|K|.")
@click.option("--queries", default=8, type=SIZE, show_default=True, help="|Q| (relations).")
@click.option("--values-per-query", default=4, type=SIZE, show_default=True,
              help="Values each relation owns (or shared vocabulary size).")
@click.option("--shared-values", is_flag=True, help="One value vocabulary shared by every relation.")
@click.option("--density", default=1.0, show_default=True, help="Fraction of (key, query) pairs present.")
@click.option("--key-groups", default=4, type=SIZE, show_default=True, help="planted: key groups.")
@click.option("--query-groups", default=2, type=SIZE, show_default=True, help="planted: query groups.")
@click.option("--noise", default=0.0, show_default=True, help="planted: fraction of facts relabelled.")
@click.option("--seed", default=0, type=SEED, show_default=True)
@click.option(
    "-o", "--output", required=True, help="CSV file to write (columns key, query, value, provenance)."
)
@threads_option
def generate_command(output: str, **spec: Any) -> None:
    """Write a seeded random database as CSV."""
    from auditor.lab.facts.database import DatabaseSpec

    db = DatabaseSpec(**spec).build()
    db.save_csv(output, seed=spec["seed"])
    click.echo(f"{db.name}: {db.num_triples} triples, shape {db.shape} -> {output}")


@click.command("plot")
@click.argument("folder", type=click.Path(exists=True))
@click.option("--out", default=None, help="Folder for the PNGs (default: next to results.csv).")
@threads_option
def plot_command(folder: str, out: str | None) -> None:
    """Redraw the plot of a finished facts sweep."""
    from auditor.lab.facts.plots import plot_results

    paths = plot_results(folder, out)
    if not paths:
        click.echo("no plot for this experiment (its results are tables)")
    for path in paths:
        click.echo(f"plot: {path}")
