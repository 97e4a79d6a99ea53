"""Certificate sweeps (``audit certify``): rank of Z against N, d_h and the tolerance.

For every configuration (H, n, d_h, seed) one dataset of the largest N is drawn and its prefixes of
size N_1 < N_2 < ... are certified, so the rank-against-N curve runs over nested datasets. Weights are
random (seeded, as initialised for training), loaded from a file, and optionally trained (all
configurations of a bucket together on the shared engine) and certified again. Each row also gives the
rank at float64's default tolerance (``rank_f64``) beside the float32 one, because softmax features can
look high-rank in exact arithmetic; the full rank-against-rtol curves go to ``tolerance.csv``. Each row
puts ``guaranteed`` (min(rank, N): arbitrary labels fitted exactly) beside the theory's ``lower_bound``
(what the best weights reach; blank with ``lower_bound_note`` where the theorem does not apply) and the
shared-context ceiling ``shared_bound``; ``readout_hits`` counts argmax hits of the readout, which may
exceed both. This is ``audit certify``.
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
from auditor.core.errors import AuditError
from auditor.lab.certify.plots import plot_rank_vs_examples, plot_tolerance
from auditor.lab.common.mha.certify import (
    attention_features,
    certify,
    lower_bound,
    proposition2_bound,
    tolerance_curve,
)
from auditor.lab.common.mha.data import MemorizeData, make_data
from auditor.lab.common.mha.model import MHAEnsemble
from auditor.lab.common.mha.task import MemorizeTask
from auditor.lab.common.mha.train import MemorizeRun, MemorizeSettings, buckets
from auditor.lab.engine import TrainConfig, train
from auditor.lab.experiment import Experiment, option, table
from auditor.lab.sweep import file_fingerprint, unit_key, write_csv, write_table


@dataclass(frozen=True)
class CertifyRequest:
    """What to certify: the product of the swept values, at each N (nested prefixes). Loaded weights
    set H, d and d_h from their shape (H, d, d_h)."""

    heads: tuple[int, ...] = option((2,), "H values.")
    context: tuple[int, ...] = option((4,), "n values.")
    d_h: tuple[int, ...] = option((8,), "d_h values.")
    N: tuple[int, ...] = option((64,), "Dataset sizes N (nested prefixes of one dataset).", flag="--N")
    d: int = option(8, "Token width d.")
    seeds: tuple[int, ...] = option((0,), "Seeds (data and initialisation).")
    classes: int = option(10, "Random label classes.")
    shared_context: bool = option(
        True, "One context for all examples or one each.", flag="--shared/--non-shared"
    )
    steps: int = option(0, "Also certify after training this many steps (0: certify the given weights only).")
    lr: float = 1e-2
    rtol: float | None = option(
        None, "Relative rank tolerance in (0, 1).", default_help="max(N, H d) * eps(float32)"
    )
    weights: str = option(
        "random", "'random' (seeded) or a .safetensors/.pt file with W_Q and W_K of shape (H, d, d_h)."
    )

    def __post_init__(self) -> None:
        if self.weights != "random":
            W_Q, _ = load_attention_weights(self.weights)
            H, d, d_h = W_Q.shape
            object.__setattr__(self, "heads", (H,))
            object.__setattr__(self, "d_h", (d_h,))
            object.__setattr__(self, "d", d)
        if self.steps < 0:
            raise AuditError(f"steps must be >= 0, got {self.steps}")
        if not (self.heads and self.context and self.d_h and self.N and self.seeds):
            raise AuditError("every swept option needs at least one value")
        if self.rtol is not None and not (math.isfinite(self.rtol) and 0 < self.rtol < 1):
            raise AuditError(f"rtol (the relative rank tolerance) must be in (0, 1), got {self.rtol}")
        self.runs()  # validates every configuration (H, n, d_h against d)

    @classmethod
    def from_unit(cls, request: dict[str, Any]) -> CertifyRequest:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in request.items()})

    def runs(self) -> list[MemorizeRun]:
        top = max(self.N)
        return list(dict.fromkeys(
            MemorizeRun(heads=H, context=n, d_h=dh, N=top, seed=s, d=self.d, classes=self.classes,
                        shared_context=self.shared_context)
            for H in self.heads for n in self.context for dh in self.d_h for s in self.seeds
        ))


KEY_DEFAULTS = {"request": CertifyRequest, "runs": [MemorizeRun]}  # a unit's key leaves these defaults out


def load_attention_weights(path: str | Path) -> tuple[torch.Tensor, torch.Tensor]:
    """W_Q, W_K of shape (H, d, d_h) from a .safetensors file or a tensor-only .pt file."""
    path = Path(path)
    if not path.exists():
        raise AuditError(
            f"weights file {str(path)!r} does not exist; give a .safetensors or .pt file or 'random'"
        )
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
        raise AuditError(
            f"{path}: W_Q {tuple(W_Q.shape)} and W_K {tuple(W_K.shape)} must both be (H, d, d_h), "
            "none of them 0"
        )
    if not (torch.isfinite(W_Q).all() and torch.isfinite(W_K).all()):
        raise AuditError(
            f"{path}: W_Q and W_K must be finite (found NaN or infinity, also after casting to float32)"
        )
    return W_Q, W_K


def _rows(model: MHAEnsemble, i: int, data: MemorizeData, run: MemorizeRun, sizes: list[int], label: str,
          rtol: float | None) -> list[dict[str, Any]]:
    Z_all = attention_features(model, data, i)  # (N_max, H w)
    out = []
    bound, note = lower_bound(run.heads, run.context, run.d_h, run.d)
    for N in sizes:
        start = time.perf_counter()
        Z, labels = Z_all[:N], data.labels[:N]
        cert = certify(Z, labels, task="classification", classes=run.classes, rtol=rtol)
        exact = probes.numerical_rank(Z, source_dtype=torch.float64)
        out.append(
            {
                "weights": label,
                "heads": run.heads,
                "context": run.context,
                "d_h": run.d_h,
                "d": run.d,
                "N": N,
                "seed": run.seed,
                "shared_context": run.shared_context,
                "classes": run.classes,
                "rank": cert.rank,
                "guaranteed": cert.guaranteed,
                "readout_hits": cert.readout_hits,
                "rtol": cert.rtol,
                "rank_margin": cert.margin,
                "rank_f64": int(exact.rank),
                "rank_f64_margin": float(exact.margin),
                "features": cert.features,
                "shared_bound": proposition2_bound(run.heads, run.context) if run.shared_context else None,
                "lower_bound": bound,
                "lower_bound_note": note,
                "readout_residual": cert.residual,
                "seconds": time.perf_counter() - start,
            }
        )
    return out


def certify_unit(unit: dict[str, Any]) -> list[dict[str, Any]]:
    """Certify one bucket of configurations (random/loaded weights, then trained if asked)."""
    request = CertifyRequest.from_unit(unit["request"])
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
    if request.steps:
        task = MemorizeTask(datasets, batch_size=512)
        config = TrainConfig(steps=request.steps, lr=request.lr, eval_every=50)
        result = train(model, task, config, progress=False)
        for i, (run, ds) in enumerate(zip(runs, datasets)):
            trained = _rows(model, i, ds, run, sizes, "trained", request.rtol)
            for row in trained:
                row.update(
                    steps_trained=int(result.steps_trained[i]), train_accuracy=float(result.accuracy[i])
                )
            rows += trained
            curves.append(
                tolerance_curve(attention_features(model, ds, i)).assign(weights="trained", **_ids(run))
            )
    key = unit_key(unit, KEY_DEFAULTS)
    write_table(
        pd.concat(curves).assign(d=request.d, shared_context=request.shared_context, dtype="float64 (Z)"),
        Path(unit["workdir"]) / "tolerance" / f"{key}.csv",
        unit=key,
    )
    return [{**row, "dtype": "float32"} for row in rows]


def _ids(run: MemorizeRun) -> dict[str, Any]:
    return {"heads": run.heads, "context": run.context, "d_h": run.d_h, "N": run.N, "seed": run.seed}


def _units(request: CertifyRequest, out: Path) -> list[dict[str, Any]]:
    settings = MemorizeSettings(steps=max(request.steps, 1), batch_size=512, bucket_size=16)
    fingerprint = file_fingerprint(request.weights) if request.weights != "random" else None
    return [{"kind": "certify", "request": dataclasses.asdict(request), "fingerprint": fingerprint,
             "runs": [dataclasses.asdict(r) for r in bucket], "workdir": str(out)}
            for bucket in buckets(request.runs(), settings)]


def _report(frame: pd.DataFrame, out: Path, request: CertifyRequest) -> str:
    """tolerance.csv: the rank-against-rtol curves of every unit, in unit order."""
    keys = frame["unit"].drop_duplicates()
    curves = pd.concat([pd.read_csv(out / "tolerance" / f"{key}.csv") for key in keys], ignore_index=True)
    write_csv(curves, out / "tolerance.csv")
    shown = [
        "weights",
        "heads",
        "context",
        "d_h",
        "N",
        "seed",
        "rank",
        "guaranteed",
        "lower_bound",
        "shared_bound",
        "readout_hits",
        "rank_margin",
        "rank_f64",
    ]
    return (table(frame, shown) + "\n\n" + explain(frame)
            + f"\n\nresults: {out / 'results.csv'}; rank-against-rtol curves: {out / 'tolerance.csv'}")


def explain(frame: pd.DataFrame) -> str:
    """What the count columns claim, and the one check the theory makes exact (guaranteed <= ceiling)."""
    lines = [
        "guaranteed = min(rank, N): labels interpolable, the examples whose arbitrary real labels these "
        "weights fit exactly (a linear readout of Z); degrees of freedom, not bits: `audit bits` counts them "
        "at log2(classes) per label only to draw them beside trained models.",
        "lower_bound = H(min(n, d_h)-1)+1: the rank SOME key/query weights reach "
        "when every context has rank n "
        "and the queries have Kruskal rank >= n; a floor for the best weights, not a ceiling for these.",
        "readout_hits: examples the least-squares readout classifies right by argmax; "
        "beyond guaranteed they are "
        "lucky hits (a class needs only the right argmax), so they may exceed every bound.",
    ]
    shared = frame[frame["shared_bound"].notna()] if "shared_bound" in frame else frame.iloc[:0]
    if len(shared):
        lines.append(
            "shared_bound = H(n-1)+1: no weights give rank(Z) above it when all examples share one context."
        )
        over = shared[shared["guaranteed"] > shared["shared_bound"]]
        lines.append(
            f"check: guaranteed <= shared_bound on {len(shared) - len(over)} of {len(shared)} shared-context "
            "rows" + ("" if over.empty else " (VIOLATED: see rows with guaranteed > shared_bound)")
        )
    notes = frame["lower_bound_note"].dropna() if "lower_bound_note" in frame else pd.Series(dtype=str)
    notes = notes[notes != ""].unique()
    lines += [f"lower_bound blank: {note}" for note in notes]
    return "\n".join(lines)


def _label(frame: pd.DataFrame) -> pd.Series:
    return frame.apply(lambda r: f"{r.weights} H={r.heads} n={r.context} d_h={r.d_h}", axis=1)


def default_rtols(curves: pd.DataFrame, frame: pd.DataFrame) -> pd.Series:
    """The default rtol of every curve's own Z (its weights, configuration, seed and N; the curves are
    computed at the largest N), read from the result rows: it grows with max(N, H w)."""
    keys = ["weights", "heads", "context", "d_h", "seed", "N"]
    rtols = frame.drop_duplicates(keys).set_index(keys)["rtol"]
    return pd.Series([rtols.get(tuple(row), float("nan")) for row in curves[keys].itertuples(index=False)],
                     index=curves.index, dtype=float)


def _plots(frame: pd.DataFrame, out: Path, request: CertifyRequest) -> list[Path]:
    curves = pd.read_csv(out / "tolerance.csv")
    shared = bool(frame["shared_context"].iloc[0])
    curves = curves[curves["seed"] == curves["seed"].min()]
    bound = curves["heads"] * (curves["context"] - 1) + 1 if shared else None
    plot_tolerance(
        curves.assign(label=_label(curves), default_rtol=default_rtols(curves, frame), bound=bound),
        out / "tolerance.png",
        title=f"rank of Z against rtol (N = {curves['N'].max()}, seed {curves['seed'].min()}"
        f"{'; dotted: H(n-1)+1' if shared else ''}; dashed: default rtol at that N)",
    )
    first_seed = frame[frame["seed"] == frame["seed"].min()]
    plot_rank_vs_examples(first_seed.assign(label=_label(first_seed), bound=first_seed["shared_bound"]),
                          out / "rank_vs_N.png", title=f"rank of Z against N (seed {first_seed['seed'].min()}"
                          f"{'; dotted: H(n-1)+1' if shared else ''})")
    return [out / "tolerance.png", out / "rank_vs_N.png"]


EXPERIMENT = Experiment(
    name="certify",
    help="Capacity certificate without gradient descent: the numerical rank of Z, the matrix whose row for "
    "example t stacks every head's attention-weighted context rows, and the examples a least-squares "
    "readout on Z provably memorizes.",
    examples="audit certify --heads 4 --context 8 --d-h 1,2,16 --N 50:300:50 --d 16\n"
    "audit certify --weights layer.safetensors --context 8 --N 200",
    config=CertifyRequest,
    units=_units,
    run_unit=certify_unit,
    columns=(
        "weights",
        "heads",
        "context",
        "d_h",
        "d",
        "N",
        "seed",
        "shared_context",
        "classes",
        "rank",
        "guaranteed",
        "readout_hits",
        "rtol",
        "rank_margin",
        "rank_f64",
        "rank_f64_margin",
        "features",
        "shared_bound",
        "lower_bound",
        "lower_bound_note",
        "readout_residual",
        "seconds",
        "steps_trained",
        "train_accuracy",
        "dtype",
    ),
    plots=_plots,
    report=_report,
    presets={"quick": {"heads": (2,), "context": (3,), "d_h": (3,), "N": (4, 8), "d": 4, "steps": 20}},
    key_defaults=KEY_DEFAULTS,
)
