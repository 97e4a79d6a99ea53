"""The click command of the audit itself, ``audit MODEL`` (``audit models``: ``auditor.audit.model_list``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from auditor.audit.config import (
    LAYERS_FORMS,
    MAX_DEFAULT_SAMPLES,
    MAX_SUBSETS,
    MAX_SWEEP_REFINE,
    MAX_THREADS,
    AuditConfig,
)
from auditor.audit.plan import DEFAULT_COST
from auditor.audit.report.catalogue import RTOL_RULE
from auditor.core.errors import AuditError
from auditor.core.execution import EXECUTORS
from auditor.core.options import MAX_SIZE
from auditor.core.slurm import pop_options as pop_slurm_options
from auditor.core.slurm import with_click_options as slurm_options

_D = {f.name: f.default for f in dataclasses.fields(AuditConfig)}  # the CLI's defaults are the config's


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
        raise AuditError(
            f"--sweep-ks takes comma-separated integers like 50,197,400; got {value!r}"
        ) from None


@click.command("model", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.argument("model")
@click.option("--data", default=_D["data"], metavar="PATH|hf:NAME",
              help="Image folder (ImageNet layout or flat), .txt file/folder, or hf:<dataset>. "
                   "Default: a small real sample bundled with installed packages (labelled as such).")
@click.option(
    "--samples",
    type=int,
    default=_D["samples"],
    help=f"Examples N to use, at most {MAX_SIZE:,} (default: all, at most {MAX_DEFAULT_SAMPLES}); a seeded "
    "random draw unless --first.",
)
@click.option(
    "--first",
    is_flag=True,
    default=_D["first"],
    help="Take the first N examples instead of a seeded random draw.",
)
@click.option("--subsets", type=int, default=_D["subsets"], show_default=True,
              help=f"Random k-subsets per Kruskal test (at most {MAX_SUBSETS:,}).")
@click.option(
    "--representations",
    "-r",
    default=",".join(_D["representations"]),
    show_default=True,
    help="Comma list of embedding, random-attention, block.L; pin weights with @, e.g. block.0@pretrained.",
)
@click.option(
    "--layers",
    default=_D["layers"],
    metavar="BLOCKS",
    help=f"Audit the embedding and these blocks, one representation each: {LAYERS_FORMS}. Adds "
    "to -r when -r is given (e.g. -r random-attention), else replaces its default. Writes depth.csv.",
)
@click.option(
    "--memory-budget",
    type=float,
    default=_D["memory_budget"],
    metavar="GIB",
    help="Most memory the extracted tokens may take at once; tokens that do not fit are streamed: "
    "one forward pass in chunks, each tested as it is extracted and dropped, with the same rows "
    "(default: half the available memory).",
)
@click.option(
    "--robustness/--no-robustness",
    default=_D["robustness"],
    show_default=True,
    help="Say how much each share's comparison with its threshold depends on the rank tolerance: the "
    "tolerance at which it flips, "
    "the fraction from 0.1x to 10x rtol, and the exact smallest margin (costs about one to three "
    "more factorisation passes per test).",
)
@click.option(
    "--exact-brackets",
    is_flag=True,
    default=_D["exact_brackets"],
    help="Close every critical-tolerance bracket (to 3%, 10% beyond 10x either side of rtol, or to "
    "float64 resolution) by computing exact spectra wherever the default analysis stops at its work caps "
    "and reports the proven bracket (critical_rtol_exact False). Can cost many times the tests.",
)
@click.option("--weights", "-w", default=",".join(_D["weights"]), show_default=True,
              help="Comma list of random, pretrained, or a save_pretrained folder.")
@click.option(
    "--tests", default=",".join(_D["tests"]), show_default=True, help="Which assumption tests to run."
)
@click.option("--threshold", type=float, default=_D["threshold"], show_default=True,
              help="Share of full-rank k-subsets a Kruskal test's share is compared with "
                   "(share_meets_threshold; Assumption 2 compares with 1, every context). A share is no "
                   "proof: each row states first whether a witness refutes Kruskal rank >= k.")
@click.option("--rtol", type=float, default=_D["rtol"],
              help=f"Relative rank tolerance: a singular value counts when it exceeds rtol x sigma_max "
                   f"(default: {RTOL_RULE}).")
@click.option("--seed", type=int, default=_D["seed"], show_default=True,
              help="Seed for the example draw, random weights and subsets (64-bit integer).")
@click.option("--device", default=_D["device"], show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option(
    "--batch-size",
    type=int,
    default=_D["batch_size"],
    show_default=True,
    help=f"Examples per forward pass (at most {MAX_SIZE:,}).",
)
@click.option("--context-length", type=int, default=_D["context_length"],
              help=f"n for text models, at most {MAX_SIZE:,}. Default: the family's n (BERT 512, GPT-2 "
                   "1024, decoders 128; within the width d), halved while an audit with no options would "
                   f"cost more than {DEFAULT_COST.flops:.1e} estimated FLOPs (block 0's forward and the "
                   "tests' Gram matrices), so that it ends in minutes on two CPU cores; `audit models` "
                   "shows the result.")
@click.option(
    "--dtype",
    default=_D["dtype"],
    show_default=True,
    help="dtype the audited blocks compute tokens in (float32, float64, bfloat16, float16); weights "
    "stored in another dtype are cast as they are read. The rank tolerance follows it.",
)
@click.option(
    "--query",
    type=click.Choice(["mean", "first"]),
    default=_D["query"],
    help="SigLIP (no CLS token): the query is the mean of the patch tokens (default) or the first patch.",
)
@click.option(
    "--bos/--no-bos",
    default=_D["bos"],
    help="Decoder LLMs: put the BOS token at position 0 or not (default: as the model's tokenizer does).",
)
@click.option("--sweep", is_flag=True, default=_D["sweep"],
              help="Also trace the Kruskal curve: full-rank share against k.")
@click.option(
    "--sweep-ks",
    default=_D["sweep_ks"],
    help="Comma list of k for --sweep (default: 16 steps up to min(N, d)).",
)
@click.option("--sweep-subsets", type=int, default=_D["sweep_subsets"], show_default=True,
              help=f"Subsets per k in --sweep (at most {MAX_SUBSETS:,}).")
@click.option(
    "--sweep-refine",
    type=int,
    default=_D["sweep_refine"],
    show_default=True,
    help=f"Extra k placed by bisection where the curve leaves 1.0 (pins the Kruskal rank estimate; at "
    f"most {MAX_SWEEP_REFINE}).",
)
@click.option("--save-tokens", is_flag=True, default=_D["save_tokens"],
              help="Write contexts and queries as safetensors (for --tokens and audit capacity).")
@click.option("--tokens", "tokens", multiple=True, metavar="FILE",
              help="Test token files written by --save-tokens again, without loading MODEL or extracting "
                   "(repeatable, or a comma list).")
@click.option(
    "--threads",
    type=int,
    default=_D["threads"],
    help=f"torch threads (default: torch's own choice; at most {MAX_THREADS}).",
)
@click.option(
    "--workers",
    type=int,
    default=_D["workers"],
    show_default=True,
    help=f"Shard token extraction across this many workers (tokens are identical to one process; at "
    f"most {MAX_THREADS}).",
)
@click.option("--executor", type=click.Choice(EXECUTORS), default=_D["executor"], show_default=True,
              help="Where --workers run: this process, Ray tasks or one Slurm job array.")
@click.option("--address", default=_D["address"], help="Ray cluster address for --executor ray (e.g. auto).")
@slurm_options
@click.option("--trust-remote-code", is_flag=True, default=_D["trust_remote_code"],
              help="Allow hub models to run their own code (off by default).")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Report folder (default: reports/<model>-<timestamp>); rerunning into it reuses finished tests.",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bars.")
def audit_command(model: str, out: Path | None, quiet: bool, representations: str, weights: str, tests: str,
                  sweep_ks: str | None, tokens: tuple[str, ...], **options) -> None:
    """Test the token assumptions of attention-memorization theory on MODEL.

    MODEL is a registered name (vit-base, vit-base-224, bert-base, bert-large, gpt2, gpt2-large, minilm;
    see `audit models`), a Hugging Face hub id, a local save_pretrained folder, or timm:<name>.

    \b
    Examples:
      audit vit-base                                          # offline smoke test on bundled photos
      audit vit-base --data ../shared/data/imagenet-sample    # 1000 ImageNet images
      audit gpt2 --data ../shared/data/wikitext-2/test.txt --context-length 256 --samples 500
      audit minilm --data ../shared/data/wikitext-2/test.txt --context-length 128 --sweep
      audit vit-base --layers all --data ../shared/data/imagenet-sample --samples 300   # every depth
      audit vit-base --tokens reports/vit/tokens/block.0@random.safetensors --subsets 20000
    """
    from auditor.audit.report import stage_table, summary_table
    from auditor.audit.runner import default_out, run

    files = tuple(f for item in tokens for f in _csv(item) or ()) or None
    slurm = pop_slurm_options(options)
    config = AuditConfig(model=model, representations=_csv(representations), weights=_csv(weights),
                         tests=_csv(tests), sweep_ks=_ints(sweep_ks), tokens=files, slurm=slurm, **options)
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
    reused = int(rows["note"].astype(str).str.contains("reused from").sum())
    if reused:
        click.echo(
            f"reused: {reused} finished tests of an earlier run on the same data (see the note column)"
        )
    for note in sorted(set(rows.loc[rows["status"] == "skipped", "note"].astype(str))):
        click.echo(f"skipped: {note}")
    if not result.stages.empty:
        click.echo(f"\ntime per stage:\n{stage_table(result.stages).to_markdown(disable_numparse=True)}")
    depth = f", depth profile in {out}/depth.csv" if not result.depth.empty else ""
    click.echo(f"report: {out}/summary.md (rows in {out}/results.csv{depth})")
