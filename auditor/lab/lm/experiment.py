"""``audit lm``: how many bits a small GPT stores per parameter, measured as Morris et al. (2025) do.

The data are n sequences of S tokens drawn independently and uniformly from V tokens, so their entropy
is known exactly: H = n S log2 V bits (the model predicts every token, the first one from a BOS token;
nothing in the data is predictable, so nothing is subtracted). A model trained on them is scored by its
total code length on the same data, its log-loss L = sum over every token of -log2 p(token | the tokens
before it), and stores **memorized bits = H - L, clipped at 0** (:mod:`auditor.lab.information`: a model
at the uniform distribution pays L = H and stores 0; a model that cannot hold the data stores what it
saves over sending them). Morris et al. clip each sequence's memorized bits at 0 before summing; the rows
carry that count too (``memorized_bits_per_sequence``, never smaller), while the lab's plateaus and
``audit bits`` use the total, the lower bound on what the model holds. A model's capacity is the
plateau of memorized bits as the dataset grows past what it can hold: the dataset sizes are set as
multiples (``--dataset-factors``) of the capacity the
paper predicts, 3.6 bits per parameter, and the sweep covers every model shape, seed and training
precision (``float32``; ``bfloat16``: the model's weights and arithmetic in bfloat16, updated from a
float32 master copy, so the stored model is its bfloat16 weights).

One unit is one (model, dataset size, seed, precision): AdamW (betas 0.9, 0.98, no weight decay), a 5%
linear warm-up then cosine decay to 0 from the model's peak rate ``lr`` over its ``steps`` minibatch steps
of ``batch_size`` sequences (``--steps`` and ``--lr``: one value for every model or one per model), the
data's log-loss measured ``evals`` times along the way (the row's ``history``; the last is the final
count). A unit is ``converged`` when it memorized something and its memorized bits grew by less than
``plateau`` (relative) over the last fifth of its steps, else step-limited (a model still at chance has
not begun): under-trained models store less, so their counts are lower bounds on the capacity.

The report (``summary.csv``, ``summary.md``): per model and precision, the plateau = the dataset size
where the seeds' mean memorized bits is largest, with bits per parameter and a Student-t 95% interval
over the seeds, whether the data there exceeded what the model stored (``capacity_limited``: the data's
entropy at that size is at least 1.1 times the memorized bits and every seed had stopped gaining, so
the model, not the data or the step budget, set the count), and per precision the slope of capacity
against parameters (least squares through 0 over the seeds' capacity-limited plateaus, 95% interval),
beside the paper's 3.6 (float32) and 3.5 (bfloat16); intervals are clipped at 0, as the counts are.
The figure (``memorized.png``) draws memorized bits against the dataset's entropy per model, as the
paper's, and the same per parameter beside 3.6 and 3.5.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import scipy.stats

from auditor.core.atomic import write_text_atomic
from auditor.core.errors import AuditError, did_you_mean
from auditor.lab.experiment import Experiment, option
from auditor.lab.information import logloss_stored_bits, uniform_entropy
from auditor.lab.stats import mean_ci

PAPER_BITS = {"float32": 3.6, "bfloat16": 3.5}  # Morris et al. 2025, bits per parameter at the plateau
DTYPES = tuple(PAPER_BITS)
# The reference: five models from 11k to 814k parameters, with steps and a peak learning rate per model.
# The rate falls as 1 / width (measured at 6000 steps, factor 1: 2x64 stores 2.0 bits/param at 3e-3, 1.7 at
# 1e-3 and 0.25 at 1e-2; 1x24 2.3 at 1e-2 and 2.1 at 3e-3). The steps spend two cores' hour where a plateau
# is within reach: the two largest models cannot memorize in it (at 2000 steps 3x96 stores < 0.03
# bits/param) and are run short, their counts lower bounds that say so.
REFERENCE_MODELS = ("1x24", "2x32", "2x64", "3x96", "4x128")
REFERENCE_STEPS = (12000, 8000, 5000, 1500, 600)
REFERENCE_LR = (1e-2, 7.5e-3, 4e-3, 2.5e-3, 2e-3)
SHAPE = re.compile(r"^(\d+)x(\d+)(?:x(\d+))?$")  # LAYERSxWIDTH[xHEADS]


def parse_model(name: str) -> tuple[int, int, int]:
    """``"2x64"`` -> (layers 2, width 64, heads 4); ``"2x64x8"`` names the heads (default: width / 16,
    at least 1, at most 8)."""
    match = SHAPE.match(name.strip())
    if not match:
        raise AuditError(f"a model is LAYERSxWIDTH or LAYERSxWIDTHxHEADS (e.g. 2x64), got {name!r}")
    layers, d = int(match[1]), int(match[2])
    heads = int(match[3]) if match[3] else max(1, min(8, d // 16))
    return layers, d, heads


@dataclass(frozen=True)
class LMConfig:
    """A capacity sweep of small GPTs on uniform random token sequences (see the module docstring)."""

    models: tuple[str, ...] = option(REFERENCE_MODELS,
                                     "Model shapes LAYERSxWIDTH[xHEADS], e.g. 1x24,2x64 (about 11k to 814k "
                                     "parameters at the reference vocabulary).")
    dataset_factors: tuple[float, ...] = option((0.5, 1.0, 2.0),
                                                "Dataset sizes as multiples of 3.6 bits x parameters "
                                                "(the entropy the paper's capacity would hold).")
    seeds: tuple[int, ...] = option((0, 1, 2), "Seeds (data and initialisation).")
    dtypes: tuple[str, ...] = option(DTYPES, "Training precisions: float32, bfloat16.")
    vocab: int = option(128, "Tokens V (uniform): log2 V bits per token.")
    seq_len: int = option(32, "Tokens per sequence S.")
    steps: tuple[int, ...] = option(REFERENCE_STEPS,
                                    "Minibatch steps per unit (5% warm-up, then cosine decay): one value for "
                                    "every model, or one per model in --models order.",
                                    parse="steps", per_item=True)
    batch_size: int = option(32, "Sequences per step (the whole dataset when it is smaller).")
    lr: tuple[float, ...] = option(REFERENCE_LR, "Peak AdamW learning rate: one value for every model, or "
                                   "one per model in --models order.", per_item=True)
    evals: int = option(5, "Log-loss measurements on the whole dataset per unit (the history).")
    plateau: float = option(0.01, "Converged: memorized bits grew by less than this share over the last "
                                  "fifth of the steps.", parse="floats")
    device: str = option("cpu", "cpu | cuda | cuda:<i>.")

    def __post_init__(self) -> None:
        if not self.models:
            raise AuditError("--models lists no model; give e.g. 1x24,2x64")
        for name in self.models:
            parse_model(name)
        for dtype in self.dtypes:
            if dtype not in DTYPES:
                raise did_you_mean("training precision", dtype, DTYPES)
        if not self.dtypes or not self.seeds or not self.dataset_factors:
            raise AuditError("--dtypes, --seeds and --dataset-factors each need at least one value")
        if self.vocab < 2 or self.seq_len < 1:
            raise AuditError(f"--vocab must be >= 2 and --seq-len >= 1, got {self.vocab} and {self.seq_len}")
        for name, reference in (("steps", REFERENCE_STEPS), ("lr", REFERENCE_LR)):
            values = getattr(self, name)
            if values == reference and len(self.models) != len(values) and set(self.models) <= set(
                    REFERENCE_MODELS):  # the reference's own models, a subset: each keeps its value
                values = tuple(reference[REFERENCE_MODELS.index(m)] for m in self.models)
                object.__setattr__(self, name, values)
            if len(values) not in (1, len(self.models)):
                hint = (" (the reference's, for its own models: give --steps and --lr for others, e.g. "
                        "--steps 3000 --lr 1e-2)" if values == reference else "")
                raise AuditError(f"--{name} takes one value for every model or one per model "
                                 f"({','.join(self.models)}); got {len(values)} values{hint}")
        if min(self.steps) < 5 or self.batch_size < 1 or self.evals < 1:
            raise AuditError(f"--steps must be >= 5, --batch-size and --evals >= 1; got "
                             f"{','.join(map(str, self.steps))}, {self.batch_size}, {self.evals}")
        if not 0 < self.plateau < 1:
            raise AuditError(f"--plateau must be in (0, 1), got {self.plateau}")
        if not (self.device == "cpu" or re.fullmatch(r"cuda(:\d+)?", self.device)):
            raise AuditError(f"--device is cpu, cuda or cuda:<i>, got {self.device!r}")

    def units(self) -> list[dict[str, Any]]:
        """One unit per (model, dataset size, seed, precision), smallest models first (a partial run has
        whole small-model curves)."""
        from auditor.lab.lm.model import GPTShape

        out = []
        for i, name in enumerate(self.models):
            layers, d, heads = parse_model(name)
            steps = self.steps[i if len(self.steps) > 1 else 0]
            lr = self.lr[i if len(self.lr) > 1 else 0]
            shape = GPTShape(layers, d, heads, self.vocab, self.seq_len)
            for factor in self.dataset_factors:
                bits = factor * PAPER_BITS["float32"] * shape.parameters
                sequences = max(1, round(bits / (self.seq_len * math.log2(self.vocab))))
                for dtype in self.dtypes:
                    for seed in self.seeds:
                        out.append({
                            "experiment": "lm", "model": name, "layers": layers, "d": d, "heads": heads,
                            "vocab": self.vocab, "seq_len": self.seq_len, "sequences": sequences,
                            "dataset_factor": factor, "seed": seed, "dtype": dtype, "steps": steps,
                            "batch_size": self.batch_size, "lr": lr, "evals": self.evals,
                            "plateau": self.plateau, "device": self.device})
        return sorted(out, key=lambda u: GPTShape(u["layers"], u["d"], u["heads"], u["vocab"],
                                                   u["seq_len"]).parameters)


@dataclass(frozen=True)
class LMUnit:
    """The entries of one unit and their defaults (left out of its resume key at these values)."""

    experiment: str = "lm"
    model: str = ""
    layers: int = 1
    d: int = 24
    heads: int = 1
    vocab: int = 128
    seq_len: int = 32
    sequences: int = 1
    dataset_factor: float = 1.0
    seed: int = 0
    dtype: str = "float32"
    steps: int = 3000
    batch_size: int = 32
    lr: float = 1e-2
    evals: int = 10
    plateau: float = 0.01
    device: str = "cpu"


def dataset(unit: dict[str, Any]) -> Any:
    """The unit's uniform random sequences: (sequences, seq_len) token ids, from its own seed."""
    import torch

    g = torch.Generator().manual_seed(int(unit["seed"]) * 1_000_003 + 0xDA7A)
    return torch.randint(int(unit["vocab"]), (int(unit["sequences"]), int(unit["seq_len"])), generator=g)


def sequence_logloss_bits(model: Any, data: Any, batch: int = 256) -> np.ndarray:
    """The model's code length of every sequence of ``data`` in bits, sum over its tokens of -log2 p(token):
    (n,) float64 (logits of any precision, the softmax in float32, the sums in float64)."""
    import torch
    from torch.nn import functional as F

    out = []
    with torch.no_grad():
        for start in range(0, data.shape[0], batch):
            x = data[start:start + batch]
            logits = model(x).float()  # (b, S, V)
            nll = F.cross_entropy(logits.transpose(1, 2), x, reduction="none")  # (b, S) nats
            out.append(nll.double().sum(dim=1).cpu().numpy())
    return np.concatenate(out) / math.log(2.0)


def logloss_bits(model: Any, data: Any, batch: int = 256) -> float:
    """The model's total code length for ``data`` in bits: sum over every token of -log2 p(token)."""
    return float(sequence_logloss_bits(model, data, batch).sum())


def lm_unit(unit: dict[str, Any]) -> list[dict[str, Any]]:
    """Train one model on one dataset and count what it memorized: one row (see the module docstring)."""
    import torch
    from torch.nn import functional as F

    from auditor.lab.lm.model import GPTShape, TinyGPT

    started = time.perf_counter()
    device = torch.device(unit["device"])
    shape = GPTShape(unit["layers"], unit["d"], unit["heads"], unit["vocab"], unit["seq_len"])
    data = dataset(unit).to(device)  # (n, S)
    n, steps = data.shape[0], int(unit["steps"])
    g = torch.Generator().manual_seed(int(unit["seed"]) * 1_000_003 + 0x6E7)
    model = TinyGPT(shape, g)
    master = [p.detach().clone().to(device) for p in model.parameters()]  # float32, what AdamW updates
    dtype = getattr(torch, unit["dtype"])
    model = model.to(device=device, dtype=dtype)
    for m in master:
        m.requires_grad_(True)
    optimizer = torch.optim.AdamW(master, lr=float(unit["lr"]), betas=(0.9, 0.98), weight_decay=0.0)
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: min(1.0, (k + 1) / warmup) * 0.5 * (
        1 + math.cos(math.pi * min(max(k - warmup, 0), steps - warmup) / max(1, steps - warmup))))
    entropy = float(uniform_entropy(n * shape.seq_len, shape.vocab))
    marks = sorted({max(1, round(steps * (i + 1) / int(unit["evals"]))) for i in range(int(unit["evals"]))}
                   | {round(0.8 * steps)})
    history: list[dict[str, float]] = []
    order = torch.Generator().manual_seed(int(unit["seed"]) * 1_000_003 + 0xBA7C)
    batch = min(int(unit["batch_size"]), n)
    perm, cursor = torch.randperm(n, generator=order), 0
    for step in range(1, steps + 1):
        if cursor + batch > n:  # a new epoch: a new order
            perm, cursor = torch.randperm(n, generator=order), 0
        x = data[perm[cursor:cursor + batch].to(device)]
        cursor += batch
        with torch.no_grad():
            for p, m in zip(model.parameters(), master):
                p.copy_(m)  # the model's weights: the master copy rounded to the training precision
        logits = model(x).float()
        loss = F.cross_entropy(logits.reshape(-1, shape.vocab), x.reshape(-1))
        model.zero_grad(set_to_none=True)
        loss.backward()
        for p, m in zip(model.parameters(), master):
            m.grad = p.grad.float()
        optimizer.step()
        schedule.step()
        if step in marks:
            with torch.no_grad():
                for p, m in zip(model.parameters(), master):
                    p.copy_(m)
            per_sequence = sequence_logloss_bits(model, data)  # (n,): weights in the training precision
            stored = float(logloss_stored_bits(entropy, float(per_sequence.sum()))[0])
            history.append({"step": step, "memorized_bits": round(stored, 3)})
    code = float(per_sequence.sum())  # the final model's (the last mark is the last step)
    memorized = float(logloss_stored_bits(entropy, code)[0])
    sequence_entropy = shape.seq_len * math.log2(shape.vocab)
    by_sequence = float(np.clip(sequence_entropy - per_sequence, 0.0, None).sum())  # Morris et al.'s clip
    before = next(h["memorized_bits"] for h in history if h["step"] == round(0.8 * steps))
    gain = (memorized - before) / max(memorized, 1.0)
    converged = memorized > 0 and gain < float(unit["plateau"])  # at chance is no plateau: not begun
    return [{
        "model": unit["model"], "layers": shape.layers, "d": shape.d, "heads": shape.heads,
        "parameters": shape.parameters, "vocab": shape.vocab, "seq_len": shape.seq_len, "sequences": n,
        "tokens": n * shape.seq_len, "dataset_factor": unit["dataset_factor"], "seed": unit["seed"],
        "dtype": unit["dtype"], "entropy_bits": round(entropy, 3), "logloss_bits": round(code, 3),
        "memorized_bits": round(memorized, 3), "bits_per_parameter": memorized / shape.parameters,
        "memorized_bits_per_sequence": round(by_sequence, 3),
        "final_gain": round(gain, 5), "converged": converged,
        "stop_reason": "plateau" if converged else "step_limit", "steps_trained": steps, "steps": steps,
        "batch_size": batch, "lr": unit["lr"], "history": history, "device": str(device),
        "seconds": round(time.perf_counter() - started, 3),
    }]


COLUMNS = ("model", "layers", "d", "heads", "parameters", "vocab", "seq_len", "sequences", "tokens",
           "dataset_factor", "seed", "dtype", "entropy_bits", "logloss_bits", "memorized_bits",
           "bits_per_parameter", "memorized_bits_per_sequence", "final_gain", "converged", "stop_reason",
           "steps_trained", "steps", "batch_size", "lr", "history", "device", "seconds")


def _done(column: pd.Series) -> pd.Series:
    """A ``converged`` column (bools, or their text in a CSV) as booleans."""
    return column.map(lambda v: str(v).strip().lower() == "true")


def settled(frame: pd.DataFrame) -> pd.Series:
    """Which rows converged: ``converged`` true and something memorized. A model still at the uniform
    distribution has not begun to memorize; its bits did not grow because it has not moved, which is no
    plateau (rows written before this rule may say ``converged`` there: the rule is applied on reading)."""
    return _done(frame["converged"]) & (pd.to_numeric(frame["memorized_bits"]) > 0)


def plateau_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per model and precision: the dataset size where the seeds' mean memorized bits is largest, its bits
    per parameter with a 95% t interval over the seeds, and whether the model (not the data, not the step
    budget) set it: ``capacity_limited`` when the data there hold at least 1.1 times what was memorized and
    every seed had stopped gaining."""
    rows = []
    for (parameters, model, dtype), part in frame.groupby(["parameters", "model", "dtype"], sort=True):
        means = part.groupby("sequences")["memorized_bits"].mean()
        best = part[part["sequences"] == means.idxmax()]
        done = settled(best)
        bpp = best["memorized_bits"] / parameters
        mean, low, high = mean_ci(bpp)
        low = low if pd.isna(low) else max(low, 0.0)  # memorized bits are clipped at 0: so is the interval
        entropy = float(best["entropy_bits"].iloc[0])
        rows.append({
            "model": model, "dtype": dtype, "parameters": int(parameters),
            "sequences": int(best["sequences"].iloc[0]),
            "entropy_bits": entropy, "memorized_bits": float(best["memorized_bits"].mean()),
            "bits_per_parameter": mean, "ci_low": low, "ci_high": high, "seeds": len(best),
            "capacity_limited": bool(entropy >= 1.1 * float(best["memorized_bits"].mean()) and done.all()),
            "converged": int(done.sum()),
            "paper_bits_per_parameter": PAPER_BITS[dtype],
        })
    return pd.DataFrame(rows)


def slope_fit(frame: pd.DataFrame, dtype: str) -> tuple[float, float, float, int]:
    """(slope, low, high, points): capacity = slope x parameters through 0, by least squares over every seed's
    plateau (each (model, seed)'s largest memorized bits over the dataset sizes), 95% t interval. Only
    plateaus that the model set count (capacity-limited: the data there hold at least 1.1 times what was
    memorized); a model that stored nearly all of every dataset it finished shows no capacity yet."""
    part = frame[frame["dtype"] == dtype]
    best = part.loc[part.groupby(["parameters", "seed"])["memorized_bits"].idxmax()]
    best = best[(best["entropy_bits"] >= 1.1 * best["memorized_bits"]) & settled(best)]
    x, y = best["parameters"].to_numpy(float), best["memorized_bits"].to_numpy(float)
    if len(x) == 0:
        return float("nan"), float("nan"), float("nan"), 0
    slope = float(x @ y / (x @ x))
    if len(x) < 2:
        return slope, float("nan"), float("nan"), 1
    resid = y - slope * x
    se = math.sqrt(float(resid @ resid) / (len(x) - 1) / float(x @ x))
    half = float(scipy.stats.t.ppf(0.975, len(x) - 1)) * se
    return slope, max(slope - half, 0.0), slope + half, len(x)  # capacities are >= 0: so is the interval


def _fmt(mean: float, low: float, high: float) -> str:
    if pd.isna(mean):
        return "-"
    return f"{mean:.2f}" if pd.isna(low) else f"{mean:.2f} [{low:.2f}, {high:.2f}]"


def _report(frame: pd.DataFrame, out: Path, config: LMConfig) -> str:
    from auditor.lab.sweep import write_table

    table = plateau_table(frame)
    write_table(table, out / "summary.csv", device=config.device, seed=json.dumps(list(config.seeds)))
    lines = ["| model | parameters | precision | plateau: sequences (entropy, bits) | memorized bits | "
             "bits/param [95% CI over seeds] | paper | capacity-limited | converged seeds |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in table.itertuples():
        stepped = r.converged < r.seeds  # a seed still gaining at the plateau: its count is a lower bound
        why = ("yes" if r.capacity_limited else "no: still gaining" if stepped
               else "no: the data were stored (less than 1.1 x memorized)")
        lines.append(f"| {r.model} | {r.parameters} | {r.dtype} | {r.sequences} ({r.entropy_bits:.0f}) | "
                     f"{r.memorized_bits:.0f} | {'>= ' if stepped else ''}"
                     f"{_fmt(r.bits_per_parameter, r.ci_low, r.ci_high)} | "
                     f"{r.paper_bits_per_parameter} | {why} | {r.converged} of {r.seeds} |")
    lines.append("")
    for dtype in sorted(set(frame["dtype"])):
        slope, low, high, points = slope_fit(frame, dtype)
        lines.append(f"{dtype}: capacity = {_fmt(slope, low, high)} bits x parameters (least squares through "
                     f"0 over {points} capacity-limited (model, seed) plateaus; the paper: "
                     f"{PAPER_BITS[dtype]})")
    steps = sorted(set(frame["steps"]))
    limited = int((~settled(frame)).sum())
    lines.append(f"\nsteps per unit: {', '.join(map(str, steps))}; {limited} of {len(frame)} units "
                 "step-limited (still gaining at the end, or not yet begun: their memorized bits are lower "
                 "bounds)")
    text = "\n".join(lines)
    write_text_atomic(out / "summary.md", text + "\n")
    return text + f"\n\nresults: {out / 'results.csv'}; summary: {out / 'summary.md'}"


def _plots(frame: pd.DataFrame, out: Path, config: LMConfig) -> list[Path]:
    """``memorized.png``: (a) memorized bits against the dataset's entropy per model and precision (the
    paper's figure; log axes, a unit storing nothing drawn on the floor), (b) the same per parameter, where
    every model meets the paper's 3.6 and 3.5 bits/param on one scale; hollow markers: step-limited units
    (still gaining when they stopped: lower bounds)."""
    from matplotlib.ticker import NullFormatter

    from auditor.lab.figures import plt, save

    fig, (ax, per) = plt.subplots(1, 2, figsize=(13, 7))
    models = frame.drop_duplicates("model").sort_values("parameters")
    colors = plt.cm.viridis(np.linspace(0, 0.9, max(1, len(models))))
    floor = max(1.0, 0.5 * float(frame.loc[frame["memorized_bits"] > 0, "memorized_bits"].min())
                if (frame["memorized_bits"] > 0).any() else 1.0)
    for color, model in zip(colors, models.itertuples()):
        for dtype, style in (("float32", "-"), ("bfloat16", "--")):
            part = frame[(frame["model"] == model.model) & (frame["dtype"] == dtype)]
            if part.empty:
                continue
            stats = part.assign(done=settled(part)).groupby("entropy_bits").agg(
                mean=("memorized_bits", "mean"), low=("memorized_bits", "min"),
                high=("memorized_bits", "max"), done=("done", "all"))
            stats = stats.reset_index()
            x, p = stats["entropy_bits"].to_numpy(float), float(model.parameters)
            name = f"{model.model} ({model.parameters:,} params), {dtype}"
            done = stats["done"].to_numpy(bool)
            for axis, scale, bottom in ((ax, 1.0, floor), (per, p, 0.0)):
                y = np.maximum(stats["mean"].to_numpy(float), bottom) / scale
                axis.plot(x / scale, y, style, color=color, lw=1.2, label=name if axis is ax else None)
                axis.plot(x[done] / scale, y[done], "o", ms=4, color=color)
                axis.plot(x[~done] / scale, y[~done], "o", ms=4, mfc="white", color=color)
                axis.fill_between(x / scale, np.maximum(stats["low"], bottom) / scale,
                                  np.maximum(stats["high"], bottom) / scale, color=color, alpha=0.12)
        ax.axhline(PAPER_BITS["float32"] * model.parameters, color=color, ls=":", lw=0.8)
    grid = np.geomspace(float(frame["entropy_bits"].min()), float(frame["entropy_bits"].max()), 50)
    ax.plot(grid, grid, color="gray", lw=0.8, label="memorized = dataset entropy (all of the data)")
    ax.plot([], [], ":", color="k", lw=0.8, label="3.6 bits x parameters, per model (Morris et al., float32)")
    ax.plot([], [], "o", mfc="white", color="k", label="hollow: step-limited (a lower bound)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(bottom=floor)
    ax.xaxis.set_minor_formatter(NullFormatter())  # decades only: the 2..9 x 10^k labels collide
    ax.set_xlabel("dataset entropy n S log2 V (bits)")
    ax.set_ylabel("memorized bits = entropy - log-loss (bits)")
    ax.set_title("(a) memorized bits (a unit storing 0 is drawn on the floor)", fontsize=9)
    ax.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3)  # below: off the curves
    ax.grid(alpha=0.3, which="both")
    ratio = (frame["entropy_bits"] / frame["parameters"]).to_numpy(float)
    line = np.linspace(0.0, float(ratio.max()), 50)
    per.plot(line, line, color="gray", lw=0.8)
    for dtype, style in (("float32", ":"), ("bfloat16", "-.")):
        per.axhline(PAPER_BITS[dtype], color="k", ls=style, lw=0.9,
                    label=f"Morris et al., {dtype}: {PAPER_BITS[dtype]} bits/param")
    per.set_xlim(0, 1.05 * float(ratio.max()))
    per.plot([], [], color="gray", lw=0.8, label="memorized = dataset entropy")
    per.set_xlabel("dataset entropy per parameter (bits/param)")
    per.set_ylabel("memorized bits per parameter")
    per.set_ylim(0, 1.1 * max(PAPER_BITS["float32"], float((frame["memorized_bits"]
                                                             / frame["parameters"]).max())))
    per.set_title("(b) per parameter: every model on one scale (linear: 0 is 0)", fontsize=9)
    per.legend(fontsize=7, loc="upper left")
    per.grid(alpha=0.3)
    return [save(fig, out / "memorized.png", title="memorized bits against dataset size, per model "
                 "(seeds: mean, band = min to max)")]


EXPERIMENT = Experiment(
    name="lm",
    help="Bits per parameter of small GPTs memorizing uniform random token sequences (Morris et al.): "
    "memorized bits = the data's entropy - the model's log-loss, swept over dataset size to the plateau.",
    examples="audit lm --scale quick                      # two tiny models, seconds\n"
    "audit lm --executor ray --out runs/lm        # reference: 5 models, 11k-814k parameters, 3 seeds, "
    "float32 and bfloat16: about an hour on 2 cores (a unit per core)\n"
    "audit lm --scale paper --device cuda         # V = 2048, S = 64, 10^5 steps: a GPU job",
    config=LMConfig,
    units=lambda config, out: config.units(),
    run_unit=lm_unit,
    columns=COLUMNS,
    plots=_plots,
    report=_report,
    presets={
        "quick": {"models": ("1x8", "1x16"), "dataset_factors": (0.5, 2.0), "seeds": (0,),
                  "dtypes": ("float32", "bfloat16"), "vocab": 16, "seq_len": 8, "steps": (40,), "lr": (1e-2,),
                  "batch_size": 16, "evals": 2},
        "paper": {"models": ("1x8", "1x32", "2x64", "4x128", "6x256"),
                  "dataset_factors": (0.25, 0.5, 1.0, 2.0, 4.0),
                  "vocab": 2048, "seq_len": 64, "steps": (100_000,), "batch_size": 128, "lr": (1e-3,),
                  "evals": 20},
    },
    key_defaults=LMUnit,
)

