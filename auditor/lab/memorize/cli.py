"""``audit memorize``, ``audit certify`` and ``audit capacity``: the memorization room from the shell.

Lists of values are comma separated (``--heads 1,2,4``) or inclusive ranges ``start:stop[:step]``
(``--heads 1:8``). Every command writes a folder (``--out``, default ``runs/<command>-<time>``) with
``results.csv`` and PNG plots, resumes when rerun with the same ``--out`` and prints a summary table.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click
import pandas as pd

from auditor.errors import AuditError
from auditor.lab.cli import SEED, SIZE, default_out, output_folder, threads_option
from auditor.lab.sweep import check_executor
from auditor.options import parse_seeds, parse_sizes
from auditor.provenance import provenance


def _flag(name: str) -> str:
    """The command-line spelling of a swept field (``d_h`` -> ``--d-h``)."""
    return "--" + name.replace("_", "-")


def _table(frame: pd.DataFrame, columns: list[str]) -> str:
    present = [c for c in columns if c in frame]
    return frame[present].to_markdown(index=False, floatfmt=".4g")


def training_options(f):
    """Options shared by the commands that train."""
    options = [
        click.option("--steps", default=None, type=int, help="Max optimisation steps (default: per preset / 3000)."),
        click.option("--lr", default=None, type=float, help="Peak Adam learning rate (default: 1e-2 CPU presets)."),
        click.option("--batch-size", default=None, type=SIZE, help="Minibatch size; N <= batch trains full-batch."),
        click.option("--eval-every", default=None, type=int, help="Full-set accuracy (early stop) every k steps."),
        click.option("--bucket-size", default=16, type=SIZE, show_default=True,
                     help="Max configurations trained together."),
        click.option("--no-certify", is_flag=True, help="Skip the rank certificates (faster)."),
        click.option("--device", default="cpu", show_default=True, help="cpu | cuda | cuda:<i>."),
        threads_option,
        click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True),
        click.option("--out", default=None, help="Output folder (rerun with the same folder to resume)."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _settings(base, steps, lr, batch_size, eval_every, bucket_size, no_certify, device, tolerance=None):
    from auditor.lab.memorize.train import MemorizeSettings

    given = {"steps": steps, "lr": lr, "batch_size": batch_size, "eval_every": eval_every, "tolerance": tolerance}
    fields = {**dataclasses.asdict(base), **{k: v for k, v in given.items() if v is not None}}
    fields.update(bucket_size=bucket_size, certify=not no_certify, device=device)
    return MemorizeSettings(**fields)


@click.command("memorize")
@click.option("--figure", type=click.Choice(["a", "b", "c"]), default=None,
              help="Preset of Paper A's Figure 2 panel: a (vs H), b (vs n), c (vs d_h).")
@click.option("--scale", type=click.Choice(["cpu", "paper"]), default="cpu", show_default=True,
              help="Preset scale: minutes on a CPU, or the paper's (a GPU job).")
@click.option("--heads", default=None, help="H values, e.g. 1,2,4 or 1:8.")
@click.option("--context", default=None, help="n values (context rows).")
@click.option("--d-h", "d_h", default=None, help="Key/query widths d_h.")
@click.option("--N", "N", default=None, help="Dataset sizes N.")
@click.option("--seeds", default="0", show_default=True, help="Seeds (data and initialisation).")
@click.option("--d", default=16, type=SIZE, show_default=True, help="Token width d (without --figure).")
@click.option("--d-v", "d_v", default=None, type=SIZE, help="Value width (default d_h; 1 for --variant authors).")
@click.option("--task", type=click.Choice(["classification", "regression"]), default="classification", show_default=True)
@click.option("--classes", default=100, type=SIZE, show_default=True, help="Classes (classification).")
@click.option("--outputs", default=1, type=SIZE, show_default=True, help="Label width (regression).")
@click.option("--tolerance", default=0.05, show_default=True,
              help="Regression: |error| <= tolerance is memorized; in (0, 0.5) (labels lie in [0, 1)).")
@click.option("--shared/--non-shared", default=True, show_default=True, help="One context for all examples or one each.")
@click.option("--variant", type=click.Choice(["spec", "authors"]), default="spec", show_default=True)
@click.option("--d-model", "d_model", default=None, type=SIZE, help="Embedding width of --variant authors (default d).")
@training_options
def memorize_command(figure, scale, heads, context, d_h, N, seeds, d, d_v, task, classes, outputs, tolerance, shared,
                     variant, d_model, steps, lr, batch_size, eval_every, bucket_size, no_certify, device, executor,
                     out):
    """Train attention layers to memorize random labels; sweep H, n, d_h, N and seeds.

    \b
    audit memorize --figure a                 # Figure 2(a) at CPU scale (minutes)
    audit memorize --heads 1:8 --context 8 --d-h 16 --N 512 --seeds 0,1
    """
    from auditor.lab.memorize.figures import figure_plan
    from auditor.lab.memorize.plots import UNSATURATED, plot_sweep
    from auditor.lab.memorize.train import MemorizeSettings, grid, run_memorize

    check_executor(executor)
    seed_list = tuple(parse_seeds(seeds, "--seeds"))
    if figure is not None:
        plan = figure_plan(figure, scale, seeds=seed_list)
        runs, base, x, note = plan.runs, plan.settings, plan.x, plan.note
        swept = {"heads": heads, "context": context, "d_h": d_h, "N": N}
        if any(v is not None for v in swept.values()):
            keep = {k: set(parse_sizes(v, _flag(k))) for k, v in swept.items() if v is not None}
            runs = [r for r in runs if all(getattr(r, k) in vals for k, vals in keep.items())]
    else:
        missing = [name for name, v in (("--heads", heads), ("--context", context), ("--d-h", d_h), ("--N", N)) if v is None]
        if missing:
            raise AuditError(f"give {', '.join(missing)} (or a preset with --figure a|b|c)")
        lists = {k: parse_sizes(v, _flag(k)) for k, v in (("heads", heads), ("context", context), ("d_h", d_h), ("N", N))}
        runs = grid(lists["heads"], lists["context"], lists["d_h"], lists["N"], seed_list, d=d, d_v=d_v, task=task,
                    classes=classes, outputs=outputs, shared_context=shared, variant=variant, d_model=d_model)
        base = MemorizeSettings(steps=3000, lr=1e-2, batch_size=512, eval_every=50, tolerance=tolerance)
        x = max(("heads", "context", "d_h"), key=lambda k: len(lists[k]))
        note = ""
    settings = _settings(base, steps, lr, batch_size, eval_every, bucket_size, no_certify, device, tolerance)
    if not runs:
        raise AuditError("the values given select none of the preset's runs; leave them out or pick listed ones")
    folder = default_out(out, "memorize")
    click.echo(f"memorize: {len(runs)} runs -> {folder}" + (f"\n{note}" if note else ""), err=True)
    with output_folder(folder):
        frame = run_memorize(runs, settings, folder, executor=executor)
        fits = plot_sweep(frame, x, folder / f"memorized_vs_{x}.png")
        if not fits.empty:
            fits.assign(x=x, unsaturated_below=UNSATURATED, **provenance()).to_csv(folder / "fits.csv", index=False)
        _saturation_plot(frame, folder)
    click.echo(_table(frame, ["heads", "context", "d_h", "N", "seed", "memorized", "accuracy", "bound",
                              "certified", "rank", "steps", "seconds"]))
    click.echo(f"\nresults: {folder / 'results.csv'}; plot: {folder / f'memorized_vs_{x}.png'}")


def _saturation_plot(frame: pd.DataFrame, folder: Path) -> None:
    """Saturation of the run with the most heads among those that memorized the most (Paper A, Fig. 3)."""
    from auditor.lab.memorize.plots import plot_saturation

    best = frame.sort_values(["heads", "memorized"], ascending=False).iloc[0]
    records = pd.read_csv(folder / best["saturation"])
    plot_saturation(records[records["member"] == best["member"]], folder / "saturation.png",
                    title=f"saturation: H={best['heads']}, n={best['context']}, d_h={best['d_h']}, N={best['N']}, "
                          f"memorized {best['memorized']}")


@click.command("certify")
@click.option("--heads", default="2", show_default=True, help="H values.")
@click.option("--context", default="4", show_default=True, help="n values.")
@click.option("--d-h", "d_h", default="8", show_default=True, help="d_h values.")
@click.option("--N", "N", default="64", show_default=True, help="Dataset sizes N.")
@click.option("--d", default=8, type=SIZE, show_default=True, help="Token width d.")
@click.option("--seeds", default="0", show_default=True)
@click.option("--classes", default=10, type=SIZE, show_default=True)
@click.option("--shared/--non-shared", default=True, show_default=True)
@click.option("--weights", default="random", show_default=True,
              help="'random' (seeded) or a .safetensors/.pt file with W_Q and W_K of shape (H, d, d_h).")
@click.option("--train-steps", default=0, show_default=True, help="Also certify after training this many steps.")
@click.option("--rtol", default=None, type=float,
              help="Relative rank tolerance in (0, 1) (default max(N, H d) * eps(float32)).")
@threads_option
@click.option("--out", default=None, help="Output folder.")
def certify_command(heads, context, d_h, N, d, seeds, classes, shared, weights, train_steps, rtol, out):
    """Capacity certificate without gradient descent: the numerical rank of Z, the matrix whose row for
    example t stacks every head's attention-weighted context rows, and the examples a least-squares
    readout on Z provably memorizes.

    \b
    audit certify --heads 4 --context 8 --d-h 1,2,16 --N 50:300:50 --d 16
    audit certify --weights layer.safetensors --context 8 --N 200
    """
    from auditor.lab.memorize.certify_runs import CertifyRequest, load_attention_weights, run_certify

    loaded = None if weights == "random" else load_attention_weights(weights)
    request = CertifyRequest(
        heads=tuple(parse_sizes(heads, "--heads")) if loaded is None else (loaded[0].shape[0],),
        context=tuple(parse_sizes(context, "--context")),
        d_h=tuple(parse_sizes(d_h, "--d-h")) if loaded is None else (loaded[0].shape[2],),
        N=tuple(parse_sizes(N, "--N")), d=d if loaded is None else loaded[0].shape[1],
        seeds=tuple(parse_seeds(seeds, "--seeds")), classes=classes, shared_context=shared, train_steps=train_steps,
        rtol=rtol, weights=weights,
    )
    request.runs()  # validates every configuration (H, n, d_h against d) before the folder exists
    folder = default_out(out, "certify")
    with output_folder(folder):
        frame = run_certify(request, folder)
    click.echo(_table(frame, ["weights", "heads", "context", "d_h", "N", "seed", "rank", "shared_bound", "certified",
                              "rank_margin", "rank_f64"]))
    click.echo(f"\nresults: {folder / 'results.csv'}; tolerance curves: {folder / 'tolerance.csv'} (+ PNGs)")


@click.command("capacity")
@click.argument("model", required=False)
@click.option("--weights", default="random", show_default=True, help="random | pretrained | a local folder.")
@click.option("--data", default=None, help="Image folder / text file / hf:<name> (default: bundled sample).")
@click.option("--samples", default=256, type=SIZE, show_default=True, help="Examples N.")
@click.option("--representation", "representations", default="embedding,random-attention,block.0",
              show_default=True, help="Comma-separated representations.")
@click.option("--tokens", "token_files", multiple=True, help="Use a --save-tokens file instead of extracting (repeatable).")
@click.option("--rows", default=16, type=SIZE, show_default=True, help="Context rows kept (n of the trained layer).")
@click.option("--dim", default=64, type=SIZE, show_default=True, help="Projected token width.")
@click.option("--projection", type=click.Choice(["svd", "random", "none"]), default="svd", show_default=True)
@click.option("--heads", default="1,2,4,8", show_default=True)
@click.option("--seeds", default="0", show_default=True)
@click.option("--classes", default=10, type=SIZE, show_default=True, help="Random label classes.")
@click.option("--subsets", default=500, type=SIZE, show_default=True, help="Kruskal subsets per assumption test.")
@click.option("--seed", default=0, type=SEED, show_default=True, help="Model init, row selection, projection.")
@training_options
def capacity_command(model, weights, data, samples, representations, token_files, rows, dim, projection, heads, seeds,
                     classes, subsets, seed, steps, lr, batch_size, eval_every, bucket_size, no_certify, device,
                     executor, out):
    """Memorization on a real representation against H(n-1)+1 and the assumption verdicts.

    \b
    audit capacity vit-base --data /path/to/images --samples 256
    audit capacity --tokens run/tokens/block.0.safetensors
    """
    from auditor.lab.memorize.pipeline import CapacitySettings, extract_tokens, run_capacity
    from auditor.lab.memorize.plots import plot_sweep
    from auditor.lab.memorize.train import MemorizeSettings

    check_executor(executor)
    settings = CapacitySettings(rows=rows, dim=dim, projection=projection, heads=tuple(parse_sizes(heads, "--heads")),
                                seeds=tuple(parse_seeds(seeds, "--seeds")), classes=classes, subsets=subsets, seed=seed)
    base = MemorizeSettings(steps=3000, lr=1e-2, batch_size=512, eval_every=50)
    train_settings = _settings(base, steps, lr, batch_size, eval_every, bucket_size, no_certify, device)
    names = [r.strip() for r in representations.split(",") if r.strip()]
    if token_files:
        missing = [p for p in token_files if not Path(p).is_file()]
        if missing:
            raise AuditError(f"--tokens file {missing[0]!r} does not exist; give a file written by --save-tokens")
    elif not model:
        raise AuditError("give a MODEL to extract from (e.g. vit-base) or --tokens FILE")
    elif not names:
        raise AuditError("--representation lists no representations; give e.g. embedding,block.0")
    folder = default_out(out, "capacity")
    with output_folder(folder):
        if token_files:
            files = {Path(p).stem: Path(p) for p in token_files}
        else:
            files = extract_tokens(model, weights, data, samples, names, folder, device=device, seed=seed)
        frame = run_capacity(files, settings, train_settings, folder, executor=executor)
        for name, part in frame.groupby("representation"):
            plot_sweep(part, "heads", folder / f"memorized_vs_heads_{name}.png", title=f"{name}: memorized against H")
    click.echo(_table(frame, ["representation", "heads", "N", "context", "d", "memorized", "bound", "certified",
                              "certified_init", "assumption1_holds", "assumption2_holds",
                              "original_assumption1_holds", "original_assumption2_holds"]))
    click.echo(f"\nresults: {folder / 'results.csv'}")
