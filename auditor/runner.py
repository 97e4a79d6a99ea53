"""The audit: model -> inputs -> tokens -> probes -> rows -> report.

``audit("vit-base")`` (also ``auditor.audit``) loads the model once per weights source, extracts every requested representation
in one early-exit pass, runs the assumption tests of :mod:`probes` on the tokens (on the GPU when there
is one) and returns one row per representation x test as a DataFrame; with ``out`` it also writes
``results.csv``, ``summary.md``, plots and (optionally) the tokens.

Rows are named by representation and weights: the default plan is ``embedding``, ``random-attention``
and ``block.0``, each with random and with pretrained weights. A pretrained row whose weights cannot be
loaded (offline) is kept as a *skipped* row with the reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from tqdm.auto import tqdm

import probes
from auditor.errors import AuditError, did_you_mean
from auditor.provenance import provenance, timestamp

TESTS = ("assumption2", "assumption1", "assumption3", "general_position")
DEFAULT_REPRESENTATIONS = ("embedding", "random-attention", "block.0")
DEFAULT_WEIGHTS = ("random", "pretrained")
MAX_DEFAULT_SAMPLES = 2000  # the paper's N
log = logging.getLogger(__name__)
PARTIAL_CSV = "results.partial.csv"  # rows of a run in progress (or interrupted); removed at the end
PARTIAL_CONFIG = "results.partial.json"  # the configuration those rows belong to (resume only if equal)
_NOT_RESULTS = ("workers", "executor", "address", "save_tokens")  # config fields that cannot change a row

COLUMNS = [
    "model", "representation", "layer", "weights", "test", "status", "k", "N", "n", "d", "fraction", "holds",
    "threshold", "min_margin", "subsets", "exhaustive", "rank_counts", "witness", "tolerance", "dtype",
    "device", "data_source", "data_counts", "tokenizer", "seed", "seconds", "note", "git_commit", "versions",
]


@dataclass(frozen=True)
class AuditConfig:
    """Everything that decides an audit's numbers (recorded in every report)."""

    model: str = "vit-base"
    data: str | None = None
    samples: int | None = None  # None: all available, at most MAX_DEFAULT_SAMPLES
    subsets: int = 5000
    representations: tuple[str, ...] = DEFAULT_REPRESENTATIONS
    weights: tuple[str, ...] = DEFAULT_WEIGHTS
    tests: tuple[str, ...] = TESTS
    threshold: float = probes.DEFAULT_THRESHOLD
    rtol: float | None = None
    seed: int = 0
    device: str = "auto"
    batch_size: int = 32
    context_length: int | None = None
    sweep: bool = False
    sweep_ks: tuple[int, ...] | None = None
    sweep_subsets: int = 500
    sweep_refine: int = 6  # extra k placed by bisection where the curve leaves 1.0
    save_tokens: bool = False
    trust_remote_code: bool = False
    workers: int = 1  # > 1: shard extraction across workers (see auditor.shard)
    executor: str = "local"  # "local" (processes on this machine) | "ray"
    address: str | None = None  # Ray cluster address for executor="ray"

    def __post_init__(self) -> None:
        _positive("subsets", self.subsets)
        _positive("batch_size", self.batch_size)
        _positive("sweep_subsets", self.sweep_subsets)
        if isinstance(self.sweep_refine, bool) or not isinstance(self.sweep_refine, int) or self.sweep_refine < 0:
            raise AuditError(f"sweep_refine must be an integer >= 0; got {self.sweep_refine!r}")
        _positive("workers", self.workers)
        if self.executor not in ("local", "ray"):
            raise did_you_mean("executor", self.executor, ("local", "ray"))
        if self.samples is not None:
            _positive("samples", self.samples)
        if self.context_length is not None:
            _positive("context_length", self.context_length)
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, int | float) or not (
            0 < self.threshold <= 1
        ):
            raise AuditError(f"threshold must be a number in (0, 1]; got {self.threshold!r}")
        if self.rtol is not None and (not isinstance(self.rtol, int | float) or not 0 <= self.rtol < 1
                                      or math.isnan(self.rtol)):
            raise AuditError(f"tolerance (rtol) must be a number in [0, 1); got {self.rtol!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise AuditError(f"seed must be an integer; got {self.seed!r}")
        for test in self.tests:
            if test not in TESTS:
                raise did_you_mean("test", test, TESTS)
        if not self.tests or not self.representations or not self.weights:
            raise AuditError("tests, representations and weights must each name at least one item")
        for w in self.weights:
            if not w:
                raise AuditError("empty weights name; valid: random, pretrained, or a save_pretrained folder")
        if self.sweep_ks is not None:
            for k in self.sweep_ks:
                _positive("sweep k", k)


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise AuditError(f"{name} must be a positive integer; got {value!r}")


@dataclass(frozen=True)
class Row:
    """A planned report row: a representation under one weights source."""

    representation: str
    weights: str


def plan(config: AuditConfig) -> list[Row]:
    """Representation x weights rows. ``block.0@pretrained`` pins one representation to one source."""
    rows: list[Row] = []
    for item in config.representations:
        name, _, pinned = item.partition("@")
        for w in [pinned] if pinned else config.weights:
            row = Row(name.strip(), w.strip())
            if row not in rows:
                rows.append(row)
    return rows


@dataclass
class AuditResult:
    """Rows of an audit, the Kruskal curves of ``--sweep``, and what was skipped."""

    rows: pd.DataFrame
    curves: pd.DataFrame
    config: AuditConfig
    context_ranks: dict[str, torch.Tensor] = field(default_factory=dict)  # "repr@weights" -> (N,) ranks
    margins: dict[str, torch.Tensor] = field(default_factory=dict)
    out: Path | None = None


def default_out(model: str) -> Path:
    """``reports/<model>-<timestamp>``, with the model name made filesystem-safe."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", model).strip("_") or "model"
    return Path("reports") / f"{slug}-{timestamp()}"


def prepare_out(out: str | Path) -> Path:
    """Create the output folder up front, so an unwritable path fails before any work is done."""
    path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise AuditError(f"cannot write to output folder {str(path)!r} ({err.strerror}); choose another --out") from None
    return path


def _skipped(config: AuditConfig, row: Row, reason: str, extra: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"model": config.model, "representation": row.representation, "weights": row.weights, "test": test,
         "status": "skipped", "note": reason, "seed": config.seed, **extra}
        for test in config.tests
    ]


def _test_row(result: probes.AssumptionResult) -> dict[str, Any]:
    d = result.to_dict()
    return {
        "test": d["test"], "status": "ok", "k": d["k"], "N": d["N"], "n": d["n"], "d": d["d"],
        "fraction": d["fraction"], "holds": d["holds"], "threshold": d["threshold"],
        "min_margin": d["min_margin"], "subsets": d["subsets"], "exhaustive": d["exhaustive"],
        "rank_counts": d["rank_counts"], "witness": d["witness"], "tolerance": d["rtol"],
        "dtype": d["dtype"], "device": d["device"], "seconds": round(d["seconds"], 3), "note": d["note"],
    }


def run_tests(
    contexts: torch.Tensor, queries: torch.Tensor, config: AuditConfig, bar: tqdm | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    reuse: Callable[[str], dict[str, Any] | None] | None = None,
) -> tuple[list[dict[str, Any]], probes.ContextRanks | None]:
    """The assumption tests of ``config.tests`` on one representation's tokens.

    Args:
        contexts: (N, n, d) and queries: (N, d), on the device the tests should run on.
        on_row: called with each row as soon as its test finishes (the runner saves it to disk).
        reuse: returns the finished row of a Kruskal test from an interrupted run of the same
            configuration, or None. Assumption 2 always runs (seconds; it feeds the rank histogram).
    Returns:
        rows (one per test) and the per-context ranks (for the histogram plot).
    """
    num, n, d = contexts.shape
    common = dict(subsets=config.subsets, seed=config.seed, rtol=config.rtol, threshold=config.threshold)
    rows: list[dict[str, Any]] = []
    ranks = None
    for test in config.tests:
        k = n if test in ("assumption1", "assumption3") else min(num, d)
        cached = reuse(test) if reuse is not None and test != "assumption2" else None
        if cached is not None:
            rows.append(cached)
        elif test != "assumption2" and k > num:
            rows.append({"test": test, "status": "skipped", "k": k, "N": num, "n": n, "d": d,
                         "note": f"N = {num} examples < k = {k}: too few for one {k}-subset; "
                                 f"give at least {k} samples"})
        elif test == "assumption2":
            ranks = probes.context_ranks(contexts, rtol=config.rtol)
            rows.append(_test_row(probes.assumption2(contexts, rtol=config.rtol, ranks=ranks)))
        elif test == "assumption1":
            rows.append(_test_row(probes.assumption1(queries, n, **common)))
        elif test == "assumption3":
            rows.append(_test_row(probes.assumption3(contexts, queries, n, **common)))
        else:
            rows.append(_test_row(probes.general_position(queries, n=n, **common)))
        if on_row is not None:
            on_row(rows[-1])
        if bar is not None:
            bar.update()
    return rows, ranks


def _sweep_ks(config: AuditConfig, num: int, n: int, d: int) -> list[int]:
    if config.sweep_ks:
        return sorted(k for k in set(config.sweep_ks) if k <= num)
    top = min(num, d)
    ks = sorted({*range(max(1, top // 16), top + 1, max(1, top // 16)), min(n, top), top})
    return [k for k in ks if k <= num]


def audit(model: str = "vit-base", *, out: str | Path | None = None, progress: bool = True,
          **options: Any) -> pd.DataFrame:
    """Run the assumption audit of ``model``; return one row per representation x test.

    Options are the fields of :class:`AuditConfig` (``data``, ``samples``, ``subsets``,
    ``representations``, ``weights``, ``tests``, ``threshold``, ``rtol``, ``seed``, ``device``,
    ``batch_size``, ``context_length``, ``sweep``, ``sweep_ks``, ``save_tokens``, ...). With ``out`` the
    report (results.csv, summary.md, plots) is written there. Raises AuditError for user mistakes.
    """
    for key in ("representations", "weights", "tests", "sweep_ks"):
        if isinstance(options.get(key), str):
            options[key] = tuple(s.strip() for s in options[key].split(",") if s.strip())
        elif options.get(key) is not None:
            options[key] = tuple(options[key])
    unknown = set(options) - {f.name for f in dataclasses.fields(AuditConfig)}
    if unknown:
        raise AuditError(f"unknown audit option(s) {sorted(unknown)}; valid: "
                         f"{', '.join(f.name for f in dataclasses.fields(AuditConfig) if f.name != 'model')}")
    config = AuditConfig(model=model, **options)
    return run(config, out=out, progress=progress).rows


def run(config: AuditConfig, *, out: str | Path | None = None, progress: bool = True) -> AuditResult:
    """:func:`audit` with a resolved config; returns rows, curves and the per-context ranks.

    A run that fails (bad data, an impossible n, ...) leaves no empty report folder behind; an
    interrupted one keeps its finished rows in ``results.partial.csv``.
    """
    created = [] if out is None else [p for p in (Path(out), *Path(out).parents) if not p.exists()]
    try:
        return _run(config, out=out, progress=progress)
    except BaseException as err:
        if out is not None and isinstance(err, AuditError | ValueError):
            # a user error invalidates the run: no partial rows (an interrupt or a crash keeps them)
            for name in (PARTIAL_CSV, PARTIAL_CONFIG):
                with contextlib.suppress(OSError):
                    (Path(out) / name).unlink(missing_ok=True)
        for folder in created:  # deepest first; rmdir never removes a folder that holds a file
            try:
                folder.rmdir()
            except OSError:
                break
        raise


def _config_record(config: AuditConfig) -> dict[str, Any]:
    """The configuration fields that decide a row, as JSON would store them."""
    fields = {k: v for k, v in dataclasses.asdict(config).items() if k not in _NOT_RESULTS}
    return json.loads(json.dumps(fields, default=str))


def _stamped(records: list[dict[str, Any]], stamp: dict[str, Any]) -> pd.DataFrame:
    """Rows as a frame; provenance columns filled where a row has none of its own (reused rows keep the
    commit and versions that computed them)."""
    frame = pd.DataFrame(records)
    for key, value in stamp.items():
        frame[key] = frame[key].fillna(value) if key in frame.columns else value
    return frame


@dataclass
class _Rows:
    """Rows and curves as they finish; rows reach ``out/results.partial.csv`` at once, so an
    interrupted run keeps them (only once a test has run: skip rows alone are not worth a file).
    ``previous``: finished Kruskal rows of an interrupted run with the same configuration."""

    out: Path | None
    stamp: dict[str, Any]
    config: dict[str, Any]
    records: list[dict[str, Any]] = field(default_factory=list)
    curves: list[pd.DataFrame] = field(default_factory=list)
    previous: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)

    def load_previous(self) -> int:
        """Read the finished rows an interrupted run of this configuration left in ``out``."""
        if self.out is None or not (self.out / PARTIAL_CSV).is_file():
            return 0
        try:
            same = json.loads((self.out / PARTIAL_CONFIG).read_text()) == self.config
            frame = pd.read_csv(self.out / PARTIAL_CSV) if same else None
        except (OSError, ValueError):  # unreadable or from another version: start afresh
            return 0
        if frame is None or not {"representation", "weights", "test", "status"} <= set(frame.columns):
            return 0
        for row in frame[frame["status"] == "ok"].to_dict("records"):
            row = {k: v for k, v in row.items() if not (isinstance(v, float) and math.isnan(v))}
            note = "reused from the interrupted run's results.partial.csv"
            row["note"] = f"{row['note']}; {note}" if row.get("note") else note
            self.previous[(row["representation"], row["weights"], row["test"])] = row
        return len(self.previous)

    def add(self, *rows: dict[str, Any]) -> None:
        self.records += rows
        self.save()

    def save(self) -> None:
        if self.out is not None and any(r.get("status") == "ok" for r in self.records):
            from auditor.atomic import write_csv_atomic, write_text_atomic

            write_text_atomic(self.out / PARTIAL_CONFIG, json.dumps(self.config, indent=1))
            write_csv_atomic(_stamped(self.records, self.stamp), self.out / PARTIAL_CSV)

    def discard(self) -> None:
        for name in (PARTIAL_CSV, PARTIAL_CONFIG):
            with contextlib.suppress(OSError):
                (self.out / name).unlink(missing_ok=True)


def _run(config: AuditConfig, *, out: str | Path | None, progress: bool) -> AuditResult:
    from auditor.models import resolve

    spec = resolve(config.model, trust_remote_code=config.trust_remote_code)
    out_path = prepare_out(out) if out is not None else None
    stamp = provenance()
    done = _Rows(out_path, stamp, _config_record(config))
    if done.load_previous():
        log.warning("resuming: %d finished tests of an interrupted run in %s are reused (Assumption 2 and "
                    "the sweep run again)", len(done.previous), out_path)
    result = AuditResult(rows=pd.DataFrame(), curves=pd.DataFrame(), config=config, out=out_path)
    try:
        _audit_loop(config, spec, result, done, progress)
    except KeyboardInterrupt as err:
        done.save()
        kept = out_path is not None and (out_path / PARTIAL_CSV).exists()
        where = (f"; {len(done.records)} finished rows are in {out_path / PARTIAL_CSV}; rerun the same command "
                 f"to resume" if kept else "")
        raise KeyboardInterrupt(f"audit interrupted{where}") from err
    records = done.records
    tested = sum(r.get("status") == "ok" for r in records)
    if tested == 0 and all(r.get("status") == "skipped" for r in records):
        reasons = sorted({r["note"] for r in records})
        raise AuditError(f"nothing could be tested: {reasons[0]}")
    frame = _stamped(records, stamp)
    result.rows = frame.reindex(columns=COLUMNS + [c for c in frame.columns if c not in COLUMNS])
    result.curves = pd.concat(done.curves, ignore_index=True) if done.curves else pd.DataFrame()
    if out_path is not None:
        from auditor.report import write_report

        write_report(result, out_path)
        done.discard()
    return result


def _audit_loop(config: AuditConfig, spec: Any, result: AuditResult, done: _Rows, progress: bool) -> None:
    """Per weights source: load, extract every representation, test it; rows and curves go to ``done``,
    per-context ranks and margins to ``result``."""
    from auditor.data import load_inputs
    from auditor.extract import extract, parse_representation
    from auditor.models import WeightsUnavailable, load_model, resolve_device

    by_weights: dict[str, list[str]] = {}
    for row in plan(config):
        by_weights.setdefault(row.weights, []).append(row.representation)
    test_device = resolve_device(config.device)
    for weights, reps in by_weights.items():
        try:
            loaded = load_model(spec.name, weights, device=config.device, seed=config.seed,
                                context_length=config.context_length,
                                trust_remote_code=config.trust_remote_code)
        except WeightsUnavailable as err:
            for rep in reps:
                done.add(*_skipped(config, Row(rep, weights), f"weights unavailable: {err}", {}))
            continue
        for rep in reps:  # validate names before any data is read
            parse_representation(rep, loaded.num_layers)
        if loaded.n > loaded.d:
            raise AuditError(f"context length n = {loaded.n} exceeds the width d = {loaded.d} of {config.model}: "
                             f"Assumption 2 (rank n) is impossible; use --context-length <= {loaded.d}")
        samples = config.samples or MAX_DEFAULT_SAMPLES
        inputs = load_inputs(loaded, config.data, samples, seed=config.seed, progress=progress)
        if config.sweep and config.sweep_ks and max(config.sweep_ks) > inputs.N:
            raise AuditError(f"sweep k = {max(config.sweep_ks)} exceeds the N = {inputs.N} examples loaded; "
                             f"valid: 1 <= k <= {inputs.N} (or load more with --samples)")
        if config.workers > 1:  # shard extraction across processes / Ray workers; tokens are identical
            from auditor.shard import ModelRecipe, extract_sharded

            recipe = ModelRecipe.of(loaded, device=config.device, context_length=config.context_length,
                                    trust_remote_code=config.trust_remote_code)
            tokens = extract_sharded(recipe, inputs, reps, workers=config.workers, executor=config.executor,
                                     address=config.address, batch_size=config.batch_size, seed=config.seed,
                                     loaded=loaded, progress=progress)
        else:
            tokens = extract(loaded, inputs, reps, batch_size=config.batch_size, seed=config.seed,
                             progress=progress)
        del loaded
        bar = tqdm(total=len(tokens) * len(config.tests), desc=f"tests ({weights})", unit="test",
                   disable=not progress)
        for rep, tok in tokens.items():
            label = f"{rep}@{weights}"
            if config.save_tokens and result.out is not None:
                tok.save(result.out / "tokens" / f"{label.replace('/', '_')}.safetensors")
            contexts, queries = tok.contexts.to(test_device), tok.queries.to(test_device)
            base = {"model": config.model, "representation": rep, "layer": tok.meta.get("layer", ""),
                    "weights": weights, "data_source": tok.meta.get("data_source", ""),
                    "tokenizer": tok.meta.get("tokenizer", ""), "seed": config.seed, "dtype": tok.meta.get("dtype"),
                    "data_counts": tok.meta.get("data_counts", "")}
            _, ranks = run_tests(contexts, queries, config, bar,
                                 on_row=lambda row, base=base: done.add({**base, **row}),
                                 reuse=lambda test, key=(rep, weights): done.previous.get((*key, test)))
            if ranks is not None:
                result.context_ranks[label] = ranks.rank.cpu()
                result.margins[label] = ranks.margin.cpu()
            if config.sweep:
                ks = _sweep_ks(config, tok.N, tok.n, tok.d)
                sweep = probes.kruskal_sweep(queries, ks, subsets=config.sweep_subsets, seed=config.seed,
                                             refine=config.sweep_refine,
                                             rtol=config.rtol, progress=progress)
                frame = sweep.frame().assign(model=config.model, representation=rep, weights=weights, n=tok.n,
                                             lower_estimate=sweep.lower_estimate,
                                             upper_bound=sweep.upper_bound)
                done.curves.append(frame)
            del contexts, queries
        bar.close()
