"""Certificate sweeps (``audit certify``): rank of Z against N, d_h and the tolerance.

For every configuration (H, n, d_h, seed) one dataset of the largest N is drawn and its prefixes of
size N_1 < N_2 < ... are certified, so the rank-against-N curve runs over nested datasets. Weights are
random (seeded, as initialised for training), loaded from a file, and optionally trained (all
configurations of a bucket together on the shared engine) and certified again. Each row also gives the
rank at float64's default tolerance (``rank_f64``) beside the float32 one, because softmax features can
look high-rank in exact arithmetic; the full rank-against-tolerance curves go to ``tolerance.csv``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

import probes
from auditor.errors import AuditError
from auditor.lab.engine import TrainConfig, train
from auditor.lab.memorize.certify import attention_features, certify, proposition2_bound, tolerance_curve
from auditor.lab.memorize.data import MemorizeData, make_data
from auditor.lab.memorize.model import MHAEnsemble
from auditor.lab.memorize.pipeline import file_fingerprint
from auditor.lab.memorize.plots import plot_rank_vs_examples, plot_tolerance
from auditor.lab.memorize.task import MemorizeTask
from auditor.lab.memorize.train import MemorizeRun, MemorizeSettings, buckets
from auditor.lab.sweep import run_sweep, unit_key
from auditor.provenance import provenance


@dataclass(frozen=True)
class CertifyRequest:
    """What to certify: the product of the swept values, at each N (nested prefixes)."""

    heads: tuple[int, ...] = (2,)
    context: tuple[int, ...] = (4,)
    d_h: tuple[int, ...] = (8,)
    N: tuple[int, ...] = (64,)
    d: int = 8
    seeds: tuple[int, ...] = (0,)
    classes: int = 10
    shared_context: bool = True
    train_steps: int = 0
    lr: float = 1e-2
    rtol: float | None = None
    weights: str = "random"  # "random" or a weights file

    def __post_init__(self) -> None:
        if self.train_steps < 0:
            raise AuditError(f"train_steps must be >= 0, got {self.train_steps}")
        if not (self.heads and self.context and self.d_h and self.N and self.seeds):
            raise AuditError("every swept option needs at least one value")
        if self.rtol is not None and not (math.isfinite(self.rtol) and 0 < self.rtol < 1):
            raise AuditError(f"rtol (the relative rank tolerance) must be in (0, 1), got {self.rtol}")

    def runs(self) -> list[MemorizeRun]:
        top = max(self.N)
        return list(dict.fromkeys(
            MemorizeRun(heads=H, context=n, d_h=dh, N=top, seed=s, d=self.d, classes=self.classes,
                        shared_context=self.shared_context)
            for H in self.heads for n in self.context for dh in self.d_h for s in self.seeds
        ))


def load_attention_weights(path: str | Path) -> tuple[torch.Tensor, torch.Tensor]:
    """W_Q, W_K of shape (H, d, d_h) from a .safetensors file or a tensor-only .pt file."""
    path = Path(path)
    if not path.exists():
        raise AuditError(f"weights file {str(path)!r} does not exist; give a .safetensors or .pt file or 'random'")
    if not path.is_file():
        raise AuditError(f"weights {str(path)!r} is not a file; give a .safetensors or .pt file or 'random'")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            tensors = load_file(str(path))
        else:
            tensors = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # corrupt or foreign files all get the same one-line answer
        raise AuditError(f"{path}: not a readable weights file ({type(err).__name__})") from None
    if not isinstance(tensors, dict) or not {"W_Q", "W_K"} <= set(tensors):
        raise AuditError(f"{path}: needs tensors 'W_Q' and 'W_K' of shape (H, d, d_h)")
    for name in ("W_Q", "W_K"):
        value = tensors[name]
        if not isinstance(value, torch.Tensor):
            raise AuditError(f"{path}: {name} is a {type(value).__name__}, not a tensor; save W_Q and W_K as "
                             "real tensors of shape (H, d, d_h)")
        if value.is_complex() or value.dtype == torch.bool:
            raise AuditError(f"{path}: {name} has dtype {str(value.dtype).removeprefix('torch.')}; "
                             "W_Q and W_K must be real numbers")
    W_Q, W_K = tensors["W_Q"].float(), tensors["W_K"].float()
    if W_Q.dim() != 3 or W_Q.shape != W_K.shape or W_Q.numel() == 0:
        raise AuditError(f"{path}: W_Q {tuple(W_Q.shape)} and W_K {tuple(W_K.shape)} must both be (H, d, d_h), "
                         "none of them 0")
    if not (torch.isfinite(W_Q).all() and torch.isfinite(W_K).all()):
        raise AuditError(f"{path}: W_Q and W_K must be finite (found NaN or infinity, also after casting to float32)")
    return W_Q, W_K


def _rows(model: MHAEnsemble, i: int, data: MemorizeData, run: MemorizeRun, sizes: list[int], label: str,
          rtol: float | None) -> list[dict[str, Any]]:
    Z_all = attention_features(model, data, i)  # (N_max, H w)
    out = []
    for N in sizes:
        start = time.perf_counter()
        Z, labels = Z_all[:N], data.labels[:N]
        cert = certify(Z, labels, task="classification", classes=run.classes, rtol=rtol)
        exact = probes.numerical_rank(Z, source_dtype=torch.float64)
        out.append({
            "weights": label, "heads": run.heads, "context": run.context, "d_h": run.d_h, "d": run.d, "N": N,
            "seed": run.seed, "shared_context": run.shared_context, "classes": run.classes,
            "rank": cert.rank, "guaranteed": cert.guaranteed, "certified": cert.certified,
            "rank_rtol": cert.rtol, "rank_margin": cert.margin, "rank_f64": int(exact.rank),
            "rank_f64_margin": float(exact.margin), "features": cert.features,
            "shared_bound": proposition2_bound(run.heads, run.context) if run.shared_context else None,
            "bound": run.bound, "readout_residual": cert.residual, "seconds": time.perf_counter() - start,
        })
    return out


def certify_unit(unit: dict[str, Any]) -> list[dict[str, Any]]:
    """Certify one bucket of configurations (random/loaded weights, then trained if asked)."""
    request = CertifyRequest(**{k: tuple(v) if isinstance(v, list) else v for k, v in unit["request"].items()})
    runs = [MemorizeRun(**r) for r in unit["runs"]]
    sizes = sorted(request.N)
    datasets = [make_data(r.data_config()) for r in runs]
    model = MHAEnsemble([r.model_config() for r in runs], max_context=max(r.context for r in runs))
    label = "random"
    if request.weights != "random":
        W_Q, W_K = load_attention_weights(request.weights)
        with torch.no_grad():
            model.W_Q.copy_(W_Q.expand_as(model.W_Q))
            model.W_K.copy_(W_K.expand_as(model.W_K))
        label = Path(request.weights).name
    rows, curves = [], []
    for i, (run, ds) in enumerate(zip(runs, datasets)):
        rows += _rows(model, i, ds, run, sizes, label, request.rtol)
        curves.append(tolerance_curve(attention_features(model, ds, i)).assign(weights=label, **_ids(run)))
    if request.train_steps:
        task = MemorizeTask(datasets, batch_size=512)
        config = TrainConfig(steps=request.train_steps, lr=request.lr, eval_every=50)
        result = train(model, task, config, progress=False)
        for i, (run, ds) in enumerate(zip(runs, datasets)):
            trained = _rows(model, i, ds, run, sizes, "trained", request.rtol)
            for row in trained:
                row.update(train_steps=int(result.steps[i]), train_accuracy=float(result.accuracy[i]))
            rows += trained
            curves.append(tolerance_curve(attention_features(model, ds, i)).assign(weights="trained", **_ids(run)))
    stamp = provenance()
    folder = Path(unit["workdir"]) / "tolerance"
    folder.mkdir(parents=True, exist_ok=True)
    key = unit_key(unit)
    pd.concat(curves).assign(d=request.d, shared_context=request.shared_context, dtype="float64 (Z)",
                             **stamp).to_csv(folder / f"{key}.csv", index=False)
    return [{**row, "dtype": "float32", "device": "cpu", **stamp} for row in rows]


def _ids(run: MemorizeRun) -> dict[str, Any]:
    return {"heads": run.heads, "context": run.context, "d_h": run.d_h, "N": run.N, "seed": run.seed}


def run_certify(request: CertifyRequest, out: str | Path, *, progress: bool = True) -> pd.DataFrame:
    """Run the certificate sweep into ``out``: results.csv, tolerance.csv, tolerance.png, rank_vs_N.png."""
    out = Path(out)
    settings = MemorizeSettings(steps=max(request.train_steps, 1), batch_size=512, bucket_size=16)
    fingerprint = file_fingerprint(request.weights) if request.weights != "random" else None
    units = [{"kind": "certify", "request": dataclasses.asdict(request), "fingerprint": fingerprint,
              "runs": [dataclasses.asdict(r) for r in bucket], "workdir": str(out)}
             for bucket in buckets(request.runs(), settings)]
    frame = run_sweep(certify_unit, units, out, progress=progress, desc="certify")
    keys = [unit_key(unit) for unit in units]
    curves = pd.concat([pd.read_csv(out / "tolerance" / f"{key}.csv") for key in keys], ignore_index=True)
    curves.to_csv(out / "tolerance.csv", index=False)
    _plots(frame, curves, out)
    return frame


def _label(frame: pd.DataFrame) -> pd.Series:
    return frame.apply(lambda r: f"{r.weights} H={r.heads} n={r.context} d_h={r.d_h}", axis=1)


def _plots(frame: pd.DataFrame, curves: pd.DataFrame, out: Path) -> None:
    shared = bool(frame["shared_context"].iloc[0])
    curves = curves[curves["seed"] == curves["seed"].min()]
    bound = curves["heads"] * (curves["context"] - 1) + 1 if shared else None
    plot_tolerance(curves.assign(label=_label(curves), default_rtol=frame["rank_rtol"].iloc[0], bound=bound),
                   out / "tolerance.png",
                   title=f"rank of Z against tolerance (N = {frame['N'].max()}, seed {curves['seed'].min()}"
                         f"{'; dotted: H(n-1)+1' if shared else ''})")
    first_seed = frame[frame["seed"] == frame["seed"].min()]
    plot_rank_vs_examples(first_seed.assign(label=_label(first_seed), bound=first_seed["shared_bound"]),
                          out / "rank_vs_N.png", title=f"rank of Z against N (seed {first_seed['seed'].min()}"
                          f"{'; dotted: H(n-1)+1' if shared else ''})")
