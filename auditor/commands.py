"""Click commands of the audit itself: ``audit MODEL`` and ``audit models``."""

from __future__ import annotations

from pathlib import Path

import click

from auditor.errors import AuditError
from auditor.runner import DEFAULT_REPRESENTATIONS, DEFAULT_WEIGHTS, TESTS, AuditConfig, default_out


def _csv(value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    return tuple(s.strip() for s in value.split(",") if s.strip())


def _ints(value: str | None) -> tuple[int, ...] | None:
    items = _csv(value)
    if items is None:
        return None
    try:
        return tuple(int(s) for s in items)
    except ValueError:
        raise AuditError(f"--sweep-ks takes comma-separated integers like 50,197,400; got {value!r}") from None


@click.command("model", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.argument("model")
@click.option("--data", default=None, metavar="PATH|hf:NAME",
              help="Image folder (ImageNet layout or flat), .txt file/folder, or hf:<dataset>. "
                   "Default: a small real sample bundled with installed packages (labelled as such).")
@click.option("--samples", type=int, default=None, help="Examples N to use (default: all, at most 2000).")
@click.option("--subsets", type=int, default=5000, show_default=True, help="Random k-subsets per Kruskal test.")
@click.option("--representations", "-r", default=",".join(DEFAULT_REPRESENTATIONS), show_default=True,
              help="Comma list of embedding, random-attention, block.L; pin weights with @, e.g. block.0@pretrained.")
@click.option("--weights", "-w", default=",".join(DEFAULT_WEIGHTS), show_default=True,
              help="Comma list of random, pretrained, or a save_pretrained folder.")
@click.option("--tests", default=",".join(TESTS), show_default=True, help="Which assumption tests to run.")
@click.option("--threshold", type=float, default=0.99, show_default=True,
              help="Share of full-rank subsets needed for an assumption to hold.")
@click.option("--tolerance", "rtol", type=float, default=None,
              help="Relative rank tolerance (default: max(k, d) x eps of the token dtype).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for random weights and subsets.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--batch-size", type=int, default=32, show_default=True, help="Examples per forward pass.")
@click.option("--context-length", type=int, default=None, help="n for text models (default BERT 512, GPT-2 1024).")
@click.option("--sweep", is_flag=True, help="Also trace the Kruskal curve: full-rank share against k.")
@click.option("--sweep-ks", default=None, help="Comma list of k for --sweep (default: 16 steps up to min(N, d)).")
@click.option("--sweep-subsets", type=int, default=500, show_default=True, help="Subsets per k in --sweep.")
@click.option("--sweep-refine", type=int, default=6, show_default=True,
              help="Extra k placed by bisection where the curve leaves 1.0 (pins the Kruskal rank estimate).")
@click.option("--save-tokens", is_flag=True, help="Write contexts and queries as safetensors (for audit capacity).")
@click.option("--workers", type=int, default=1, show_default=True,
              help="Shard token extraction across this many workers (tokens are identical to one process).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="Where --workers run: local processes or Ray.")
@click.option("--address", default=None, help="Ray cluster address for --executor ray (e.g. auto).")
@click.option("--trust-remote-code", is_flag=True, help="Allow hub models to run their own code (off by default).")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Report folder (default: reports/<model>-<timestamp>).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bars.")
def audit_command(model: str, out: Path | None, quiet: bool, representations: str, weights: str, tests: str,
                  sweep_ks: str | None, **options) -> None:
    """Test the token assumptions of attention-memorization theory on MODEL.

    MODEL is a registered name (vit-base, vit-base-224, bert-base, bert-large, gpt2, gpt2-large, minilm;
    see `audit models`), a Hugging Face hub id, a local save_pretrained folder, or timm:<name>.

    \b
    Examples:
      audit vit-base                                          # offline smoke test on bundled photos
      audit vit-base --data ../shared/data/imagenet-sample    # 1000 ImageNet images
      audit gpt2 --data ../shared/data/wikitext-2/test.txt --context-length 256 --samples 500
      audit minilm --data ../shared/data/wikitext-2/test.txt --context-length 128 --sweep
    """
    from auditor.report import summary_table
    from auditor.runner import run

    config = AuditConfig(model=model, representations=_csv(representations), weights=_csv(weights),
                         tests=_csv(tests), sweep_ks=_ints(sweep_ks), **options)
    out = out or default_out(model)
    result = run(config, out=out, progress=not quiet)
    rows = result.rows
    click.echo("")
    click.echo(summary_table(rows).to_markdown())
    sources = sorted(set(rows["data_source"].dropna().astype(str)) - {""})
    tokenizers = sorted(set(rows["tokenizer"].dropna().astype(str)) - {""})
    if sources:
        click.echo(f"\ndata: {'; '.join(sources)}")
    if tokenizers:
        click.echo(f"tokens from: {'; '.join(tokenizers)}")
    for note in sorted(set(rows.loc[rows["status"] == "skipped", "note"].astype(str))):
        click.echo(f"skipped: {note}")
    click.echo(f"report: {out}/summary.md (rows in {out}/results.csv)")


@click.command("models")
def models_command() -> None:
    """List the registered model names (any hub id or timm:<name> works too)."""
    from auditor.models import known_models, resolve

    for name in known_models():
        spec = resolve(name)
        click.echo(f"{name:14s} {spec.family:5s} {spec.source:45s} {spec.description}")
