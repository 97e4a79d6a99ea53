"""``audit capacity``: how many random labels an attention layer memorizes on a real representation.

The auditor extracts the tokens of a representation (``embedding``, ``random-attention``, ``block.L``)
or reads a ``--save-tokens`` file; random class labels are attached; attention layers with several H
train on them (non-shared contexts, one per example) to convergence, several seeds, the same settings for
every representation, and are certified; the rows put memorized (trained) and guaranteed (certified)
beside the lower bound H(min(n, d_h)-1)+1 and beside the assumption verdicts of the same reduced tokens
(and of the original ones). ``summary.csv`` aggregates the converged seeds per representation and H
(mean and 95% t interval).

Real tokens are wide (ViT-base: n = 197, d = 768) and a layer over them memorizes any few hundred
examples trivially (H(n-1)+1 >= 197 already at H = 1). To make the comparison informative on a CPU the
tokens are reduced, and every row says how: ``rows`` context rows are kept (the query row plus rows
drawn once, the same for every example) and the width is projected to ``dim`` by the top right
singular vectors of the pooled kept tokens (``svd``, no centring, so convex combinations stay convex
combinations) or by a seeded Gaussian matrix (``random``), then scaled to unit RMS. Tokens come from
the audit's own extraction (:func:`auditor.audit.sources.extracted`, the same inputs and forward passes as
``audit MODEL --save-tokens``) or from token files.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

import probes
from auditor.audit.tokens import Tokens
from auditor.core.errors import AuditError, did_you_mean
from auditor.lab.common.mha.certify import lower_bound
from auditor.lab.common.mha.data import MemorizeData, derived_seed, random_labels
from auditor.lab.common.mha.model import MHAConfig
from auditor.lab.common.mha.plots import converged_rows, mean_ci
from auditor.lab.common.mha.train import (
    CERTIFICATE_COLUMNS,
    CONVERGENCE_COLUMNS,
    TRAINING_COLUMNS,
    MemorizeSettings,
    fit_bucket,
)
from auditor.lab.experiment import Experiment, option, table
from auditor.lab.stats import intervals
from auditor.lab.sweep import file_fingerprint, unit_key, write_table

PROJECTIONS = ("svd", "random", "none")
EXTRACTED_SAMPLES = 256  # examples extracted when --samples is not given
VERDICTS = ("holds", "fraction", "critical_rtol")  # the audit's verdict columns of an assumption test


@dataclass(frozen=True)
class CapacitySettings:
    """How tokens are reduced, labelled, trained on and tested."""

    rows: int = option(16, "Context rows kept (n of the trained layer).")
    dim: int = option(64, "Projected token width (d of the layer); ignored by --projection none.")
    projection: str = option("svd", "How the width is reduced.", choices=PROJECTIONS)
    heads: tuple[int, ...] = option((1, 2, 4, 8), "H values.")
    seeds: tuple[int, ...] = option(
        (0, 1, 2), "Seeds of the labels and initialisation; means carry 95% t intervals."
    )
    classes: int = option(10, "Random label classes.")
    subsets: int = option(500, "Kruskal subsets per assumption test.")
    seed: int = option(0, "Model init, row selection, random projection, assumption sampling.")

    def __post_init__(self) -> None:
        if self.projection not in PROJECTIONS:
            raise did_you_mean("projection", self.projection, PROJECTIONS)
        if self.rows < 1 or self.dim < 1:
            raise AuditError("rows and dim must be >= 1")
        if not self.heads or min(self.heads) < 1:
            raise AuditError("heads must list positive numbers of heads")
        if not self.seeds:
            raise AuditError("give at least one seed")
        if self.classes < 2 or self.subsets < 1:
            raise AuditError("classes must be >= 2 and subsets >= 1")



# a unit's key leaves these defaults out
KEY_DEFAULTS = {"capacity": CapacitySettings, "train": MemorizeSettings, "samples": None}

def select_rows(n: int, rows: int, query_index: int | None, seed: int) -> torch.Tensor:
    """Indices of the kept context rows (sorted); the query row is always kept when there is one."""
    if rows > n:
        raise AuditError(f"cannot keep {rows} rows of contexts with n = {n}; use --rows <= {n}")
    g = torch.Generator().manual_seed(derived_seed(seed, "rows"))
    if query_index is None:
        return torch.randperm(n, generator=g)[:rows].sort().values
    q = query_index % n
    others = torch.tensor([i for i in range(n) if i != q])
    picked = others[torch.randperm(n - 1, generator=g)[: rows - 1]]
    return torch.cat([torch.tensor([q]), picked]).sort().values


def reduce_tokens(
    tokens: Tokens, settings: CapacitySettings
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """Kept and projected tokens: contexts (N, rows, dim'), queries (N, dim'), and a description."""
    keep = select_rows(tokens.n, settings.rows, tokens.query_index, settings.seed)
    contexts = tokens.contexts[:, keep].double()  # (N, rows, d)
    if tokens.query_index is not None:
        queries = tokens.contexts[:, tokens.query_index % tokens.n].double()  # (N, d)
    else:
        queries = tokens.queries.double()
    d = tokens.d
    if settings.projection == "none" or settings.dim >= d:
        P = torch.eye(d, dtype=torch.float64)
    elif settings.projection == "svd":
        pooled = torch.cat([contexts.reshape(-1, d), queries])  # (N rows + N, d)
        P = torch.linalg.svd(pooled, full_matrices=False).Vh[: settings.dim].T  # (d, dim)
    else:
        g = torch.Generator().manual_seed(derived_seed(settings.seed, "projection"))
        P = torch.randn(d, settings.dim, generator=g, dtype=torch.float64) / settings.dim**0.5  # (d, dim)
    contexts, queries = contexts @ P, queries @ P  # (N, rows, dim), (N, dim)
    scale = float(torch.cat([contexts.flatten(), queries.flatten()]).pow(2).mean().sqrt()) or 1.0
    info = {"n_original": tokens.n, "d_original": d, "rows_kept": " ".join(map(str, keep.tolist())),
            "projection": settings.projection if P.shape[1] < d else "none", "token_rms": scale}
    return (contexts / scale).float(), (queries / scale).float(), info


def assumption_columns(contexts: torch.Tensor, queries: torch.Tensor, n: int, subsets: int, seed: int,
                       prefix: str) -> dict[str, Any]:
    """Assumption 1 (Kruskal rank of the queries >= n) and 2 (every context has rank n) as the audit's
    verdict columns: ``holds``, ``fraction`` and ``critical_rtol`` (None where the probes do not give one)."""
    out: dict[str, Any] = {}
    results = {
        1: probes.assumption1(queries, n, subsets=subsets, seed=seed) if n <= queries.shape[0] else None,
        2: probes.assumption2(contexts, threshold=1.0),  # (every context, as the audit asks)
    }
    for a, result in results.items():
        row = {} if result is None else result.to_dict()
        row["holds"] = row.get("share_meets_threshold")  # (the share's verdict, by its committed column name)
        for verdict in VERDICTS:
            out[f"{prefix}assumption{a}_{verdict}"] = row.get(verdict)
    return out


def capacity_unit(unit: dict[str, Any], progress: bool = False) -> list[dict[str, Any]]:
    """One representation: reduce, label, test assumptions, train every (H, seed) together, certify."""
    tokens = Tokens.load(unit["tokens"])
    if unit.get("samples") is not None:  # --samples with --tokens: the first N examples of the file
        tokens = Tokens(tokens.contexts[: unit["samples"]], tokens.queries[: unit["samples"]], tokens.meta)
    settings = CapacitySettings(
        **{k: tuple(v) if isinstance(v, list) else v for k, v in unit["capacity"].items()}
    )
    train_settings = MemorizeSettings(**unit["train"])
    contexts, queries, info = reduce_tokens(tokens, settings)
    N, n, w = contexts.shape
    verdicts = {
        **assumption_columns(
            tokens.contexts, tokens.queries, tokens.n, settings.subsets, settings.seed, "original_"
        ),
        **assumption_columns(contexts, queries, n, settings.subsets, settings.seed, ""),
    }
    members = [(H, seed) for H in settings.heads for seed in settings.seeds]
    datasets = {
        seed: MemorizeData(
            contexts, queries, random_labels(N, settings.classes, seed), "classification", settings.classes
        )
        for seed in settings.seeds
    }
    configs = [
        MHAConfig(heads=H, d=w, d_h=w, d_v=w, outputs=settings.classes, seed=seed) for H, seed in members
    ]
    key = unit_key(unit, KEY_DEFAULTS)
    workdir = Path(unit["workdir"])
    measured = fit_bucket(configs, [datasets[seed] for _, seed in members], train_settings,
                          checkpoint=str(workdir / "checkpoints" / f"{key}.pt"),
                          history=workdir / "history" / f"{key}.csv",
                          saturation_path=workdir / "saturation" / f"{key}.csv", progress=progress, unit=key)
    meta = {k: tokens.meta.get(k, "") for k in ("model", "representation", "weights", "data_source")}
    meta["tokens_dtype"] = tokens.meta.get("dtype", str(tokens.contexts.dtype).removeprefix("torch."))
    return [
        {
            **meta,
            "N": N,
            "context": n,
            "d": w,
            "heads": H,
            "d_h": w,
            "seed": seed,
            "classes": settings.classes,
            "lower_bound": lower_bound(H, n, w, w)[0],
            "lower_bound_note": lower_bound(H, n, w, w)[1],
            **m,
            **info,
            **verdicts,
            "tokens_file": unit["tokens"],
            "history": f"history/{key}.csv",
            "saturation": f"saturation/{key}.csv",
            "member": i,
        }
        for i, ((H, seed), m) in enumerate(zip(members, measured))
    ]


_ASSUMPTIONS = tuple(f"{p}assumption{a}_{c}" for p in ("original_", "") for a in (1, 2) for c in VERDICTS)
COLUMNS = (
    "model",
    "representation",
    "weights",
    "data_source",
    "tokens_dtype",
    "N",
    "context",
    "d",
    "heads",
    "d_h",
    "seed",
    "classes",
    "lower_bound",
    "lower_bound_note",
    "memorized",
    "accuracy",
    *CONVERGENCE_COLUMNS,
    *CERTIFICATE_COLUMNS,
    *TRAINING_COLUMNS[:-2],
    "n_original",
    "d_original",
    "rows_kept",
    "projection",
    "token_rms",
    *_ASSUMPTIONS,
    "tokens_file",
    "history",
    "saturation",
    "member",
)


def _units(token_files: dict[str, str | Path], settings: CapacitySettings, train_settings: MemorizeSettings,
           out: str | Path, *, samples: int | None = None) -> list[dict[str, Any]]:
    """One unit per token file; ``samples``: train on the first N examples of each (None: all)."""
    if not token_files:
        raise AuditError("no token files to run on")
    return [{"kind": "capacity", "representation": name, "tokens": str(Path(path).resolve()),
             "fingerprint": file_fingerprint(path), "capacity": dataclasses.asdict(settings),
             "train": dataclasses.asdict(train_settings), "workdir": str(out), "samples": samples}
            for name, path in token_files.items()]


def extract_tokens(
    model: str,
    weights: str,
    data: str | None,
    samples: int,
    representations: list[str],
    out: str | Path,
    *,
    device: str = "auto",
    seed: int = 0,
    batch_size: int = 16,
    progress: bool = True,
    config_overrides: dict[str, Any] | None = None,
) -> dict[str, Path]:
    """Extract the representations once, as the audit does, and save each as
    ``out/tokens/<representation>.safetensors``. ``config_overrides`` change a random model's
    architecture (tests build tiny ViTs with it)."""
    from auditor.audit.config import AuditConfig
    from auditor.audit.plan import AuditPlan
    from auditor.audit.sources import extracted
    from auditor.models import load_model

    loaded = load_model(model, weights, device=device, seed=seed, config_overrides=config_overrides)
    plan = AuditPlan.of(
        AuditConfig(model=model, data=data, samples=samples, seed=seed, batch_size=batch_size)
    )
    paths = {}
    for item in extracted(
        loaded, list(representations), plan.sampling, plan.extraction, None, progress
    ).items:
        paths[item.representation] = Path(out) / "tokens" / f"{item.representation}.safetensors"
        item.tokens.save(paths[item.representation])
    return paths


@dataclass(frozen=True)
class CapacityConfig:
    """What ``audit capacity`` runs: the tokens, how they are reduced, and how the layers train."""

    model: str | None = option(None, "Model to extract from (see `audit models`).", argument=True)
    weights: str = option("random", "random | pretrained | a local folder.")
    data: str | None = option(
        None, "Image folder / text file / hf:<name>.", default_help="the bundled sample"
    )
    samples: int | None = option(
        None,
        "Examples N: extracted, or the first N of each --tokens file.",
        default_help=f"{EXTRACTED_SAMPLES} extracted; every example of a --tokens file",
    )
    representations: tuple[str, ...] = option(("embedding", "random-attention", "block.0"),
                                               "Comma-separated representations.")
    tokens: tuple[str, ...] = option((), "Use a --save-tokens file instead of extracting (repeatable).",
                                     multiple=True, default_help="none")
    settings: CapacitySettings = field(default=CapacitySettings(), metadata={"nested": True})
    training: MemorizeSettings = field(default=MemorizeSettings(), metadata={"nested": True})

    def __post_init__(self) -> None:
        if self.samples is not None and (isinstance(self.samples, bool) or not isinstance(self.samples, int)
                                         or self.samples < 1):
            raise AuditError(f"--samples must be a positive number of examples, got {self.samples!r}")
        missing = [p for p in self.tokens if not Path(p).is_file()]
        if missing:
            raise AuditError(
                f"--tokens file {missing[0]!r} does not exist; give a file written by --save-tokens"
            )
        if not self.tokens and not self.model:
            raise AuditError("give a MODEL to extract from (e.g. vit-base) or --tokens FILE")


def _experiment_units(config: CapacityConfig, out: Path) -> list[dict[str, Any]]:
    if config.tokens:
        files = {Path(p).stem: Path(p) for p in config.tokens}
        if config.samples is not None:  # the first N examples of each file: refused where a file has fewer
            for path in files.values():
                have = Tokens.load(path).N
                if have < config.samples:
                    raise AuditError(
                        f"--samples {config.samples} exceeds the {have} examples of token file "
                        f"{str(path)!r}; valid: 1 <= --samples <= {have} (or leave it out to use all)"
                    )
        return _units(files, config.settings, config.training, out, samples=config.samples)
    files = extract_tokens(
        config.model,
        config.weights,
        config.data,
        config.samples or EXTRACTED_SAMPLES,
        list(config.representations),
        out,
        device=config.training.device,
        seed=config.settings.seed,
    )
    return _units(files, config.settings, config.training, out)


def summarize(frame: pd.DataFrame) -> pd.DataFrame:
    """Per representation and H, over the converged seeds: memorized and guaranteed means with 95% t
    intervals, ``seeds`` (converged) of ``runs``, the lower bound, and the assumption verdicts of the
    reduced tokens (``assumption*``) and of the original ones (``original_assumption*``)."""
    rows = []
    for (name, H), part in frame.groupby(["representation", "heads"], sort=False):
        done = converged_rows(part)
        row = {
            "representation": name,
            "heads": H,
            "N": int(part["N"].iloc[0]),
            "context": int(part["context"].iloc[0]),
            "d": int(part["d"].iloc[0]),
            "seeds": len(done),
            "runs": len(part),
        }
        for quantity in ("memorized", "guaranteed"):
            row[f"{quantity}_mean"], row[f"{quantity}_low"], row[f"{quantity}_high"] = mean_ci(done[quantity])
        row["lower_bound"] = part["lower_bound"].iloc[0]
        row.update({c: part[c].iloc[0] for c in _ASSUMPTIONS if c in part})
        rows.append(row)
    return pd.DataFrame(rows)


def _report(frame: pd.DataFrame, out: Path, config: CapacityConfig) -> str:
    summary = summarize(frame)
    write_table(summary, out / "summary.csv", device=str(frame["device"].iloc[0]),
                seed=",".join(map(str, config.settings.seeds)))
    shown = summary.assign(**{q: intervals(summary, f"{q}_mean", f"{q}_low", f"{q}_high")
                              for q in ("memorized", "guaranteed")})
    columns = ["representation", "heads", "N", "memorized", "guaranteed", "lower_bound", "seeds", "runs",
               *[f"assumption{a}_{v}" for a in (1, 2) for v in VERDICTS],
               "original_assumption1_holds", "original_assumption2_holds"]
    stopped = frame[~frame["converged"].astype(bool)]
    return (
        "Examples memorized by gradient descent (memorized) and proven for arbitrary labels (guaranteed = "
        "min(rank Z, N)), mean [95% t interval] over the converged seeds, at the same training for every "
        "representation; seeds = converged of runs; verdicts of the reduced tokens the layer trains on:\n\n"
        + table(shown, columns)
        + (
            f"\n\n{len(stopped)} run(s) stopped at the step limit and are left out "
            "(raise --steps or --rounds)."
            if len(stopped)
            else "\n\nEvery run converged."
        )
        + f"\n\nresults: {out / 'results.csv'}; summary: {out / 'summary.csv'}"
    )


def _plots(frame: pd.DataFrame, out: Path, config: CapacityConfig) -> list[Path]:
    from auditor.lab.common.mha.plots import plot_sweep

    paths = []
    for name, part in frame.groupby("representation"):
        # the name may come from a token file's metadata: only a plain file name, never a path (../x)
        safe = re.sub(r"[^A-Za-z0-9_.@-]+", "_", str(name)).replace("..", "_").strip("._") or "tokens"
        paths.append(out / f"memorized_vs_heads_{safe}.png")
        plot_sweep(part, "heads", paths[-1], title=f"{name}: memorized against H")
    return paths


EXPERIMENT = Experiment(
    name="capacity",
    help="Memorization on real representations, trained to convergence over several seeds, "
    "beside the lower bound "
    "H(min(n, d_h)-1)+1 and the Assumption 1/2 verdicts of the same tokens.",
    examples="audit capacity vit-base --data /path/to/images --samples 256\n"
    "audit capacity --tokens run/tokens/block.0.safetensors",
    config=CapacityConfig,
    units=_experiment_units,
    run_unit=capacity_unit,
    columns=COLUMNS,
    plots=_plots,
    report=_report,
    presets={
        "quick": {
            "samples": 16,
            "representations": ("embedding", "block.0"),
            "settings": {"rows": 4, "dim": 8, "heads": (1, 2), "classes": 3, "subsets": 50, "seeds": (0,)},
            "training": {"steps": 100, "lr": 1e-2, "batch_size": 512, "eval_every": 20},
        },
        "reference": {"training": {"steps": 3000, "lr": 1e-2, "batch_size": 512, "eval_every": 50}},
    },
    key_defaults=KEY_DEFAULTS,
)
