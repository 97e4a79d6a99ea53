"""The audit: model -> inputs -> tokens -> probes -> rows -> report.

``audit("vit-base")`` (also ``auditor.audit``) loads the model once per weights source, extracts every
requested representation in one early-exit pass, runs the assumption tests of :mod:`probes` on the
tokens (on the GPU when there is one) and returns one typed row per representation x test as a
DataFrame (columns and types: :mod:`auditor.report.schema`); with ``out`` it also writes
``results.csv``, ``summary.md``, plots and (optionally) the tokens. The same pipeline takes a
transformers model object the caller holds (``audit(model, processor, data)``), saved token files
(``tokens=``, ``audit MODEL --tokens FILE``) or tensors (:func:`audit_tokens`).

Every option is checked before a model loads or the report folder is touched, so a mistake costs
nothing and never disturbs an interrupted run's ``results.partial.*``. Rows are named by representation
and weights: the default plan is ``embedding``, ``random-attention`` and ``block.0``, each with random
and with pretrained weights. A pretrained row whose weights cannot be loaded (offline) is kept as a
*skipped* row with the reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from tqdm.auto import tqdm

import probes
from auditor.errors import AuditError, did_you_mean
from auditor.provenance import provenance, timestamp
from auditor.report.folder import PARTIAL_CSV, ReportFolder, RowStore
from auditor.report.schema import COLUMNS, rows_frame
from auditor.sources import (
    Row,
    TokenGroup,
    TokenItem,
    check_model_options,
    check_object_options,
    check_shapes,
    fingerprint,
    model_groups,
    object_groups,
    plan,
    read_token_files,
)
from auditor.tokens import Tokens

__all__ = ["COLUMNS", "AuditConfig", "AuditResult", "audit", "audit_tokens", "plan", "run", "run_tests"]

TESTS = ("assumption2", "assumption1", "assumption3", "general_position")
QUERY_TESTS = ("assumption1", "general_position")  # the tests that need no context matrices
DEFAULT_REPRESENTATIONS = ("embedding", "random-attention", "block.0")
DEFAULT_WEIGHTS = ("random", "pretrained")
DEFAULT_SUBSETS = 5000
MAX_SUBSETS = 10_000_000  # per test; the sampled share is then known to about +-0.0003
MAX_SWEEP_REFINE = 64  # bisection steps; log2(d) of any real model is far below
MAX_THREADS = 1024
TENSORS = "tensors"  # the model column of audit_tokens rows
GIVEN = "given"  # ... and their weights column
log = logging.getLogger(__name__)
_NOT_RESULTS = ("workers", "executor", "address", "save_tokens", "threads", "tokens")  # cannot change a row


@dataclass(frozen=True)
class AuditConfig:
    """Everything that decides an audit's numbers (recorded in every report).

    The ``audit`` command line has one option per field, with the same defaults.
    """

    model: str = "vit-base"
    data: str | None = None
    samples: int | None = None  # None: all available, at most 2000 (the paper's N)
    first: bool = False  # take the first `samples` examples instead of a seeded random draw
    subsets: int = DEFAULT_SUBSETS
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
    tokens: tuple[str, ...] | None = None  # token files to test again instead of extracting
    trust_remote_code: bool = False
    threads: int | None = None  # torch threads for the run (None: torch's default)
    workers: int = 1  # > 1: shard extraction across workers (see auditor.shard)
    executor: str = "local"  # "local" (processes on this machine) | "ray"
    address: str | None = None  # Ray cluster address for executor="ray"

    def __post_init__(self) -> None:
        _bounded("subsets", self.subsets, 1, MAX_SUBSETS)
        _bounded("sweep_subsets", self.sweep_subsets, 1, MAX_SUBSETS)
        _bounded("sweep_refine", self.sweep_refine, 0, MAX_SWEEP_REFINE)
        _positive("batch_size", self.batch_size)
        _positive("workers", self.workers)
        if self.threads is not None:
            _bounded("threads", self.threads, 1, MAX_THREADS)
        if self.executor not in ("local", "ray"):
            raise did_you_mean("executor", self.executor, ("local", "ray"))
        if self.samples is not None:
            _positive("samples", self.samples)
        if self.context_length is not None:
            _positive("context_length", self.context_length)
        for name in ("first", "sweep", "save_tokens", "trust_remote_code"):
            if not isinstance(getattr(self, name), bool):
                raise AuditError(f"{name} must be True or False; got {getattr(self, name)!r}")
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, int | float) or not (
            0 < self.threshold <= 1
        ):
            raise AuditError(f"threshold must be a number in (0, 1]; got {self.threshold!r}")
        if self.rtol is not None and (isinstance(self.rtol, bool) or not isinstance(self.rtol, int | float)
                                      or not 0 <= self.rtol < 1 or math.isnan(self.rtol)):
            raise AuditError(f"tolerance (rtol) must be a number in [0, 1); got {self.rtol!r}")
        lo, hi = probes.rank.SEED_RANGE
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not lo <= self.seed <= hi:
            raise AuditError(f"seed must be an integer in [-2**63, 2**63 - 1] (64 bits); got {self.seed!r}")
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
        if self.tokens is not None and not self.tokens:
            raise AuditError("tokens lists no file; give at least one token file (written by --save-tokens)")


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise AuditError(f"{name} must be a positive integer; got {value!r}")


def _bounded(name: str, value: Any, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        word = "a positive integer" if lo == 1 else f"an integer >= {lo}"
        raise AuditError(f"{name} must be {word} (valid: {lo:,} .. {hi:,}); got {value!r}")


@dataclass
class AuditResult:
    """Rows of an audit, the Kruskal curves of ``--sweep``, and what was skipped."""

    rows: pd.DataFrame
    curves: pd.DataFrame
    config: AuditConfig
    context_ranks: dict[str, torch.Tensor] = field(default_factory=dict)  # "repr@weights" -> (N,) ranks
    margins: dict[str, torch.Tensor] = field(default_factory=dict)
    out: Path | None = None

    def __repr__(self) -> str:
        from auditor.report import summary_table

        status = self.rows["status"] if "status" in self.rows else pd.Series(dtype=str)
        where = f"; report in {self.out}" if self.out is not None else ""
        head = (f"AuditResult({self.config.model}: {len(self.rows)} rows, {int((status == 'ok').sum())} tested, "
                f"{int((status == 'skipped').sum())} skipped{where})")
        table = summary_table(self.rows)
        return head if table.empty else f"{head}\n{table.to_string()}"


def default_out(model: str) -> Path:
    """``reports/<model>-<timestamp>``, with the model name made filesystem-safe."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", model).strip("_") or "model"
    return Path("reports") / f"{slug}-{timestamp()}"


# ---------------------------------------------------------------------------------------------------
# The tests on one representation's tokens
# ---------------------------------------------------------------------------------------------------


def _skipped(config: AuditConfig, row: Row, reason: str) -> list[dict[str, Any]]:
    return [
        {"model": config.model, "representation": row.representation, "weights": row.weights, "test": test,
         "status": "skipped", "note": reason, "seed": config.seed}
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
    contexts: torch.Tensor | None, queries: torch.Tensor, config: AuditConfig, bar: tqdm | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    reuse: Callable[[str], dict[str, Any] | None] | None = None,
    *, n: int | None = None,
) -> tuple[list[dict[str, Any]], probes.ContextRanks | None]:
    """The assumption tests of ``config.tests`` on one representation's tokens.

    Args:
        contexts: (N, n, d) and queries: (N, d), on the device the tests should run on. ``contexts`` may
            be None when only queries are held (then only Assumption 1 and general position apply).
        on_row: called with each row as soon as its test finishes (the runner saves it to disk).
        reuse: returns the finished row of a Kruskal test from an earlier run of the same configuration
            on the same data, or None. Assumption 2 always runs (seconds; it feeds the rank histogram).
        n: the context length (default: ``contexts.shape[1]``).
    Returns:
        rows (one per test; typed values, see :mod:`auditor.report.schema`) and the per-context ranks.
    """
    num, d = queries.shape
    n = int(contexts.shape[1]) if n is None else n
    common = dict(subsets=config.subsets, seed=config.seed, rtol=config.rtol, threshold=config.threshold)
    rows: list[dict[str, Any]] = []
    ranks = None
    for test in config.tests:
        if contexts is None and test not in QUERY_TESTS:
            raise AuditError(f"{test} needs the context matrices; without contexts valid tests are "
                             f"{', '.join(QUERY_TESTS)}")
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


# ---------------------------------------------------------------------------------------------------
# The public entry points
# ---------------------------------------------------------------------------------------------------


def _options(options: dict[str, Any]) -> dict[str, Any]:
    """Comma strings or sequences as tuples; unknown names refused with the valid ones."""
    for key in ("representations", "weights", "tests", "sweep_ks", "tokens"):
        if isinstance(options.get(key), str | Path):
            options[key] = tuple(s.strip() for s in str(options[key]).split(",") if s.strip())
        elif options.get(key) is not None:
            options[key] = tuple(str(v) if key == "tokens" else v for v in options[key])
    valid = [f.name for f in dataclasses.fields(AuditConfig) if f.name != "model"]
    unknown = set(options) - set(valid)
    if unknown:
        raise AuditError(f"unknown audit option(s) {sorted(unknown)}; valid: {', '.join(valid)}")
    return options


def audit(model: Any = "vit-base", processor: Any = None, data: str | None = None, *,
          out: str | Path | None = None, progress: bool = True, **options: Any) -> pd.DataFrame:
    """Run the assumption audit of ``model``; return one typed row per representation x test.

    Args:
        model: a registered name (``vit-base``, ``gpt2``, ...; see ``audit models``), a hub id, a
            save_pretrained folder, ``timm:<name>``, or a transformers model object of the ViT, BERT or
            GPT-2 family that you hold (its weights are audited as ``weights = "in-memory"``).
        processor: for a model object, its image processor or tokenizer (None: the family's default).
        data: image folder, .txt file or folder, ``hf:<dataset>``, or None for the bundled sample.
        out: folder for the report (results.csv, summary.md, plots); None writes nothing.
        options: the fields of :class:`AuditConfig` (``samples``, ``first``, ``subsets``,
            ``representations``, ``weights``, ``tests``, ``threshold``, ``rtol``, ``seed``, ``device``,
            ``batch_size``, ``context_length``, ``sweep``, ``sweep_ks``, ``save_tokens``, ``tokens``,
            ``threads``, ...), with the defaults of the ``audit`` command line.
    Raises:
        AuditError (a ValueError) for a user mistake, before any work is done where it can be seen then.
    """
    options = _options(options)
    if data is not None:
        options["data"] = str(data)
    if isinstance(model, str):
        if processor is not None:
            raise AuditError("processor goes with a model object; a model named by string brings its own "
                             "tokenizer or image preprocessing")
        return run(AuditConfig(model=model, **options), out=out, progress=progress).rows
    from auditor.models.from_object import IN_MEMORY, from_object

    misplaced = sorted(set(options) & {"weights", "workers", "executor", "address", "tokens", "trust_remote_code"})
    if misplaced:
        raise AuditError(f"option(s) {', '.join(misplaced)} do not apply to a model object (its weights are "
                         "the ones audited, in this process)")
    loaded = from_object(model, processor, context_length=options.get("context_length"))
    config = AuditConfig(model=loaded.name, weights=(IN_MEMORY,), **options)
    return run(config, out=out, progress=progress, model_object=loaded).rows


def audit_tokens(
    contexts: Any, queries: Any, n: int | None = None, *, tests: tuple[str, ...] | str | None = None,
    subsets: int = DEFAULT_SUBSETS, seed: int = 0, rtol: float | None = None,
    threshold: float = probes.DEFAULT_THRESHOLD, out: str | Path | None = None, progress: bool = True,
) -> pd.DataFrame:
    """The assumption tests on tokens you already hold; the same typed rows as :func:`audit`.

    Args:
        contexts: (N, n, d) context matrices E(t), or None when only the queries are held.
        queries: (N, d) query vectors e(t).
        n: the context length; default ``contexts.shape[1]`` (required without contexts).
        tests: which tests (default: all four; without contexts Assumption 1 and general position).
        subsets, seed, rtol, threshold: as for :func:`audit`.
        out: folder for a report (results.csv, summary.md, plots); None writes nothing.
    """
    queries = torch.as_tensor(queries)
    if queries.ndim != 2:
        raise AuditError(f"queries must be (N, d); got shape {tuple(queries.shape)}")
    if contexts is None:
        if n is None:
            raise AuditError("without contexts, give n (the context length the Kruskal tests use as k)")
        _positive("n", n)
        tokens = Tokens(queries[:, None, :], queries, {})  # (N, 1, d): checks shapes; not tested as contexts
        n_tokens = n
    else:
        tokens = Tokens(torch.as_tensor(contexts), queries, {})
        if n is not None and n != tokens.n:
            raise AuditError(f"n = {n} but the contexts hold n = {tokens.n} tokens per example")
        n_tokens = tokens.n
    if tests is None:
        tests = TESTS if contexts is not None else QUERY_TESTS
    config = AuditConfig(model=TENSORS, representations=(f"tokens@{GIVEN}",), weights=(GIVEN,),
                         **_options({"tests": tests, "subsets": subsets, "seed": seed, "rtol": rtol,
                                     "threshold": threshold}))
    meta = {"model": TENSORS, "representation": "tokens", "weights": GIVEN,
            "dtype": str(queries.dtype).removeprefix("torch."), "data_source": "tensors given to audit_tokens"}
    item = TokenItem("tokens", tokens.queries, None if contexts is None else tokens.contexts, n_tokens, meta)
    group = TokenGroup(GIVEN, [item], fingerprint([("queries", tokens.queries)] + (
        [] if contexts is None else [("contexts", tokens.contexts)])))
    check_shapes(config, n=n_tokens, d=tokens.d, num=tokens.N)
    return _run_groups(config, lambda out_path: iter([group]), out=out, progress=progress).rows


def run(config: AuditConfig, *, out: str | Path | None = None, progress: bool = True,
        model_object: Any = None) -> AuditResult:
    """:func:`audit` with a resolved config; returns rows, curves and the per-context ranks.

    ``model_object``: a :class:`~auditor.models.LoadedModel` built around a model the caller holds (see
    :func:`auditor.models.from_object`). Options are checked before anything is loaded or written; a run
    that fails leaves no folder it created behind, and an interrupted one keeps its finished rows in
    ``results.partial.csv`` (a later run of the same configuration on the same data reuses them).
    """
    if config.tokens is not None:
        files = read_token_files(config)
        labels = tuple(f"{item.representation}@{group.weights}" for group in files for item in group.items)
        config = dataclasses.replace(config, representations=labels,
                                     weights=tuple(dict.fromkeys(g.weights for g in files)))
        return _run_groups(config, lambda out_path: iter(files), out=out, progress=progress,
                           keep={Path(f) for f in config.tokens})
    if model_object is not None:
        check_object_options(config, model_object)
        return _run_groups(config, lambda out_path: object_groups(config, model_object, out_path, progress),
                           out=out, progress=progress)
    from auditor.models import resolve

    spec = resolve(config.model, trust_remote_code=config.trust_remote_code)
    check_model_options(config, spec)
    return _run_groups(config, lambda out_path: model_groups(config, spec, out_path, progress),
                       out=out, progress=progress)


# ---------------------------------------------------------------------------------------------------
# The run: groups -> tests -> rows -> report
# ---------------------------------------------------------------------------------------------------


def _config_record(config: AuditConfig) -> dict[str, Any]:
    """The configuration fields that decide a row, as JSON would store them."""
    fields = {k: v for k, v in dataclasses.asdict(config).items() if k not in _NOT_RESULTS}
    return json.loads(json.dumps(fields, default=str))


@contextlib.contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """``torch.set_num_threads(threads)`` for the block (None: leave torch's setting)."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _run_groups(config: AuditConfig, groups: Callable[[Path | None], Iterator[TokenGroup]], *,
                out: str | Path | None, progress: bool, keep: set[Path] = frozenset()) -> AuditResult:
    """Take the report folder (if any), test every group, write the report, tidy the folder."""
    with _torch_threads(config.threads), (ReportFolder(out) if out is not None else contextlib.nullcontext()) as folder:
        out_path = folder.path if folder is not None else None
        stamp = provenance()
        done = RowStore(out_path, stamp, _config_record(config))
        if done.load_previous():
            log.warning("resuming: %d finished Kruskal tests of an earlier run in %s are reused where the data "
                        "is the same (Assumption 2 and the sweep run again)", len(done.previous), out_path)
        result = AuditResult(rows=pd.DataFrame(), curves=pd.DataFrame(), config=config, out=out_path)
        try:
            for group in groups(out_path):
                _test_group(group, config, result, done, folder, progress)
        except KeyboardInterrupt as err:
            done.save()
            kept = out_path is not None and (out_path / PARTIAL_CSV).exists()
            where = (f"; {len(done.records)} finished rows are in {out_path / PARTIAL_CSV}; rerun the same "
                     f"command to resume" if kept else "")
            raise KeyboardInterrupt(f"audit interrupted{where}") from err
        records = done.records
        if not any(r.get("status") == "ok" for r in records) and all(r.get("status") == "skipped" for r in records):
            reasons = sorted({r["note"] for r in records})
            raise AuditError(f"nothing could be tested: {reasons[0]}")
        result.rows = rows_frame(records, stamp)
        result.curves = pd.concat(done.curves, ignore_index=True) if done.curves else pd.DataFrame()
        if folder is not None:
            from auditor.report import write_report

            try:
                written = write_report(result, folder.path, {"torch_threads": torch.get_num_threads()})
            except OSError as err:
                raise AuditError(f"cannot write the report into {str(folder.path)!r} ({err.strerror or err}); "
                                 f"the finished rows stay in {PARTIAL_CSV}: free some space or fix the folder and "
                                 "rerun to resume") from None
            folder.produced.update(written)
            folder.tidy(keep)
        return result


def _test_group(group: TokenGroup, config: AuditConfig, result: AuditResult, done: RowStore,
                folder: ReportFolder | None, progress: bool) -> None:
    """The tests (and the sweep) on every representation of one group; rows go to ``done``."""
    from auditor.models import resolve_device

    if group.skipped is not None:
        for rep in group.representations:
            done.add(*_skipped(config, Row(rep, group.weights), group.skipped))
        return
    test_device = resolve_device(config.device)
    bar = tqdm(total=len(group.items) * len(config.tests), desc=f"tests ({group.weights})", unit="test",
               disable=not progress)
    for item in group.items:
        rep, weights = item.representation, group.weights
        label = f"{rep}@{weights}"
        if config.save_tokens and folder is not None and item.tokens is not None:
            path = folder.tokens_dir() / f"{label.replace('/', '_')}.safetensors"
            try:
                item.tokens.save(path)
            except OSError as err:
                raise AuditError(f"cannot save tokens in {str(path.parent)!r} ({err.strerror or err}); free some "
                                 "space or choose another --out") from None
            folder.produced.add(path)
        contexts = item.contexts.to(test_device) if item.contexts is not None else None
        queries = item.queries.to(test_device)
        meta = item.meta
        base = {"model": config.model, "representation": rep, "layer": meta.get("layer", ""), "weights": weights,
                "data_source": meta.get("data_source", ""), "data_counts": meta.get("data_counts", ""),
                "first": group.first, "data_fingerprint": group.fingerprint,
                "tokenizer": meta.get("tokenizer", ""), "seed": config.seed,
                "dtype": meta.get("dtype") or str(queries.dtype).removeprefix("torch.")}
        _, ranks = run_tests(contexts, queries, config, bar, n=item.n,
                             on_row=lambda row, base=base: done.add({**base, **row}),
                             reuse=lambda test, key=(rep, weights): done.reuse(*key, test, group.fingerprint))
        done.settle(rep, weights)
        if ranks is not None:
            result.context_ranks[label] = ranks.rank.cpu()
            result.margins[label] = ranks.margin.cpu()
        if config.sweep:
            ks = _sweep_ks(config, queries.shape[0], item.n, queries.shape[1])
            sweep = probes.kruskal_sweep(queries, ks, subsets=config.sweep_subsets, seed=config.seed,
                                         refine=config.sweep_refine, rtol=config.rtol, progress=progress)
            frame = sweep.frame().assign(model=config.model, representation=rep, weights=weights, n=item.n,
                                         lower_estimate=sweep.lower_estimate, upper_bound=sweep.upper_bound)
            done.curves.append(frame)
        del contexts, queries
    bar.close()
