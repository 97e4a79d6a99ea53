"""``audit capacity``: how many random labels an attention layer memorizes on a real representation.

The auditor extracts the tokens of a representation (``embedding``, ``random-attention``, ``block.L``)
or reads a ``--save-tokens`` file; random class labels are attached; attention layers with several H
train on them (non-shared contexts, one per example) and are certified; the rows put memorized (trained
and certified) beside the bound H(n-1)+1 and beside the representation's assumption verdicts.

Real tokens are wide (ViT-base: n = 197, d = 768) and a layer over them memorizes any few hundred
examples trivially (H(n-1)+1 >= 197 already at H = 1). To make the comparison informative on a CPU the
tokens are reduced, and every row says how: ``rows`` context rows are kept (the query row plus rows
drawn once, the same for every example) and the width is projected to ``dim`` by the top right
singular vectors of the pooled kept tokens (``svd``, no centring, so convex combinations stay convex
combinations) or by a seeded Gaussian matrix (``random``), then scaled to unit RMS.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

import probes
from auditor.errors import AuditError, did_you_mean
from auditor.lab.memorize.certify import capacity_bound
from auditor.lab.memorize.data import MemorizeData, derived_seed, random_labels
from auditor.lab.memorize.model import MHAConfig
from auditor.lab.memorize.train import MemorizeSettings, fit_bucket
from auditor.lab.sweep import run_sweep, unit_key
from auditor.provenance import provenance
from auditor.tokens import Tokens

PROJECTIONS = ("svd", "random", "none")


@dataclass(frozen=True)
class CapacitySettings:
    """How tokens are reduced, labelled, trained on and tested."""

    rows: int = 16  # context rows kept (n of the layer)
    dim: int = 64  # projected width (d of the layer); ignored by projection "none"
    projection: str = "svd"  # "svd" | "random" | "none"
    heads: tuple[int, ...] = (1, 2, 4, 8)
    seeds: tuple[int, ...] = (0,)  # labels and initialisation
    classes: int = 10
    subsets: int = 500  # Kruskal subsets per assumption test
    seed: int = 0  # row selection, random projection, assumption sampling

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


def reduce_tokens(tokens: Tokens, settings: CapacitySettings) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
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
            "projection": settings.projection if P.shape[1] < d else "none", "scale": scale}
    return (contexts / scale).float(), (queries / scale).float(), info


def assumption_columns(contexts: torch.Tensor, queries: torch.Tensor, n: int, subsets: int, seed: int,
                       prefix: str) -> dict[str, Any]:
    """Assumption 1 (Kruskal rank of the queries >= n) and 2 (every context has rank n) as columns."""
    out: dict[str, Any] = {}
    if n <= queries.shape[0]:
        a1 = probes.assumption1(queries, n, subsets=subsets, seed=seed)
        out.update({f"{prefix}assumption1_holds": a1.holds, f"{prefix}assumption1_fraction": a1.fraction})
    else:
        out.update({f"{prefix}assumption1_holds": None, f"{prefix}assumption1_fraction": None})
    a2 = probes.assumption2(contexts)
    out.update({f"{prefix}assumption2_holds": a2.holds, f"{prefix}assumption2_fraction": a2.fraction})
    return out


def file_fingerprint(path: str | Path) -> str:
    """First 16 hex digits of the file's SHA-256 (changed tokens make a new sweep unit)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def capacity_unit(unit: dict[str, Any], progress: bool = False) -> list[dict[str, Any]]:
    """One representation: reduce, label, test assumptions, train every (H, seed) together, certify."""
    tokens = Tokens.load(unit["tokens"])
    settings = CapacitySettings(**{k: tuple(v) if isinstance(v, list) else v for k, v in unit["capacity"].items()})
    train_settings = MemorizeSettings(**unit["train"])
    contexts, queries, info = reduce_tokens(tokens, settings)
    N, n, w = contexts.shape
    verdicts = {
        **assumption_columns(tokens.contexts, tokens.queries, tokens.n, settings.subsets, settings.seed, "original_"),
        **assumption_columns(contexts, queries, n, settings.subsets, settings.seed, ""),
    }
    members = [(H, seed) for H in settings.heads for seed in settings.seeds]
    datasets = {seed: MemorizeData(contexts, queries, random_labels(N, settings.classes, seed), "classification",
                                   settings.classes) for seed in settings.seeds}
    configs = [MHAConfig(heads=H, d=w, d_h=w, d_v=w, outputs=settings.classes, seed=seed) for H, seed in members]
    key = unit_key(unit)
    workdir = Path(unit["workdir"])
    measured = fit_bucket(configs, [datasets[seed] for _, seed in members], train_settings,
                          checkpoint=str(workdir / "checkpoints" / f"{key}.pt"),
                          history=workdir / "history" / f"{key}.csv",
                          saturation_path=workdir / "saturation" / f"{key}.csv", progress=progress)
    meta = {k: tokens.meta.get(k, "") for k in ("model", "representation", "weights", "data_source")}
    meta["tokens_dtype"] = tokens.meta.get("dtype", str(tokens.contexts.dtype).removeprefix("torch."))
    stamp = provenance()
    return [
        {**meta, "N": N, "context": n, "d": w, "heads": H, "d_h": w, "seed": seed,
         "classes": settings.classes, "bound": capacity_bound(H, n, w), **m, **info, **verdicts,
         "tokens_file": unit["tokens"], "history": f"history/{key}.csv", "saturation": f"saturation/{key}.csv",
         "member": i, **stamp}
        for i, ((H, seed), m) in enumerate(zip(members, measured))
    ]


def run_capacity(
    token_files: dict[str, str | Path],
    settings: CapacitySettings,
    train_settings: MemorizeSettings,
    out: str | Path,
    *,
    executor: str = "local",
    progress: bool = True,
) -> pd.DataFrame:
    """Run (or resume) the capacity pipeline on saved token files (representation -> path)."""
    if not token_files:
        raise AuditError("no token files to run on")
    units = [
        {"kind": "capacity", "representation": name, "tokens": str(Path(path).resolve()),
         "fingerprint": file_fingerprint(path), "capacity": dataclasses.asdict(settings),
         "train": dataclasses.asdict(train_settings), "workdir": str(out)}
        for name, path in token_files.items()
    ]
    return run_sweep(capacity_unit, units, out, executor=executor, progress=progress, desc="capacity")


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
    """Extract the representations once and save each as ``out/tokens/<representation>.safetensors``.

    ``config_overrides`` change a random model's architecture (tests build tiny ViTs with it).
    """
    from auditor.data import load_inputs
    from auditor.extract import extract
    from auditor.models import load_model

    loaded = load_model(model, weights, device=device, seed=seed, config_overrides=config_overrides)
    inputs = load_inputs(loaded, data, samples, seed=seed, progress=progress)
    extracted = extract(loaded, inputs, representations, batch_size=batch_size, seed=seed, progress=progress)
    paths = {}
    for name, tokens in extracted.items():
        path = Path(out) / "tokens" / f"{name}.safetensors"
        tokens.save(path)
        paths[name] = path
    return paths
