"""The audit: model -> inputs -> tokens -> probes -> rows -> report.

``audit_model("vit-base")`` (also ``auditor.audit_model``) loads the model once per weights source, extracts
every requested representation in one early-exit pass, runs the assumption tests of :mod:`probes` on the
tokens (on the GPU when there is one) and returns one typed row per representation x test as a
DataFrame (columns and types: :mod:`auditor.audit.report.schema`); with ``out`` it also writes
``results.csv``, ``summary.md``, plots and (optionally) the tokens. The same pipeline takes a
transformers model object the caller holds (``audit_model(model, processor, data)``), saved token files
(``tokens=``, ``audit MODEL --tokens FILE``) or tensors (:func:`audit_tokens`).

Every option (:class:`~auditor.audit.config.AuditConfig`) is checked, and the plan it makes
(:class:`~auditor.audit.plan.AuditPlan`: the rows and one frozen part per stage) checked against the
model, before a model loads or the report folder is touched, so a mistake costs nothing and never
disturbs an interrupted run's ``results.partial.*``. Rows are named by representation and weights: the
default plan is ``embedding``, ``random-attention`` and ``block.0``, each with random and with pretrained
weights. A pretrained row whose weights cannot be loaded (offline) is kept as a *skipped* row with the
reason. The tests come from one table (:mod:`auditor.audit.assumptions`) and run on each representation
as :mod:`auditor.audit.verdicts` says; the wall time of each stage (extraction per weights source, each
test, the sweep) is recorded with ``time.perf_counter`` and reported as ``stage | seconds | share``.

``layers="all"`` (``--layers``) audits the embedding and every block; such an audit across depth (also:
two or more ``block.L``) names each layer's tests in the time per stage and returns its depth profile
(``AuditResult.depth``, ``depth.csv``; :mod:`auditor.audit.report.depth`). Tokens are extracted in one
forward pass and held when they fit in the memory budget; otherwise the contexts stream
(:mod:`auditor.audit.stream`): each chunk is reduced to what the tests need and dropped, with the same
rows; config.json says so (``contexts``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
from tqdm.auto import tqdm

import probes
from auditor.audit.assumptions import ASSUMPTION_TESTS, QUERY_TESTS, TESTS, RunOptions
from auditor.audit.config import (
    DEFAULT_REPRESENTATIONS,
    DEFAULT_SUBSETS,
    DEFAULT_WEIGHTS,
    MAX_SUBSETS,
    AuditConfig,
    positive,
)
from auditor.audit.plan import AuditPlan, Row
from auditor.audit.report import AuditResult, write_report
from auditor.audit.report.depth import depth_frame
from auditor.audit.report.folder import PARTIAL_CONFIG, PARTIAL_CSV, ReportFolder, RowStore
from auditor.audit.report.schema import COLUMNS, rows_frame
from auditor.audit.sources import (
    TokenGroup,
    TokenItem,
    fingerprint,
    model_groups,
    object_groups,
    read_token_files,
)
from auditor.audit.stream import StreamedContexts, streamed_note
from auditor.audit.tokens import Tokens
from auditor.audit.verdicts import (
    StageClock,
    check_contexts_given,
    curve_frame,
    run_tests,
    sweep_ks,
    token_geometry,
)
from auditor.core.errors import AuditError
from auditor.core.provenance import provenance, timestamp

if TYPE_CHECKING:
    from auditor.models.base import LoadedModel

__all__ = [
    "COLUMNS",
    "DEFAULT_REPRESENTATIONS",
    "DEFAULT_SUBSETS",
    "DEFAULT_WEIGHTS",
    "MAX_SUBSETS",
    "QUERY_TESTS",
    "TESTS",
    "AuditConfig",
    "AuditPlan",
    "AuditResult",
    "StageClock",
    "audit_model",
    "audit_tokens",
    "default_out",
    "run",
    "run_tests",
]

TENSORS = "tensors"  # the model column of audit_tokens rows
GIVEN = "given"  # ... and their weights column
SETUP = "setup"  # first imports and the option checks against the model, before any work
READING_TOKENS = "reading token files"  # the stage of --tokens
SAVING_TOKENS = "saving tokens"  # the stage of --save-tokens
SWEEP = "sweep"  # the stage of --sweep
log = logging.getLogger(__name__)
_NOT_RESULTS = ("workers", "executor", "address", "slurm", "save_tokens", "threads", "tokens",
                "memory_budget")  # cannot change a row


def default_out(model: str) -> Path:
    """``reports/<model>-<timestamp>``, with the model name made filesystem-safe."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", model).strip("_") or "model"
    return Path("reports") / f"{slug}-{timestamp()}"


# ---------------------------------------------------------------------------------------------------
# The public entry points
# ---------------------------------------------------------------------------------------------------


def _options(given: Mapping[str, Any]) -> dict[str, Any]:
    """The options with comma strings or sequences as tuples; unknown names refused with the valid ones."""
    options = dict(given)
    for key in ("representations", "weights", "tests", "sweep_ks", "tokens"):
        if isinstance(options.get(key), str | Path):
            options[key] = tuple(s.strip() for s in str(options[key]).split(",") if s.strip())
        elif options.get(key) is not None:
            options[key] = tuple(str(v) if key == "tokens" else v for v in options[key])
    layers = options.get("layers")
    if isinstance(layers, int) and not isinstance(layers, bool):
        options["layers"] = str(layers)
    elif isinstance(layers, list | tuple | range):  # block indices, e.g. range(6) or [0, 3, -1]
        options["layers"] = ",".join(str(v) for v in layers)
    valid = [f.name for f in dataclasses.fields(AuditConfig) if f.name != "model"]
    unknown = set(options) - set(valid)
    if unknown:
        raise AuditError(f"unknown audit option(s) {sorted(unknown)}; valid: {', '.join(valid)}")
    return options


def audit_model(model: str | torch.nn.Module = "vit-base", processor: object = None,
                data: str | Path | None = None, *, out: str | Path | None = None, progress: bool = True,
                **options: Any) -> pd.DataFrame:
    """Run the assumption audit of ``model``; return one typed row per representation x test.

    Args:
        model: a registered name of any family: ViT, BERT, GPT-2, decoder LLMs (Llama, Qwen, Mistral,
            Gemma, Phi), DINOv2, CLIP, SigLIP (``vit-base``, ``gpt2``, ``llama-3.2-1b``, ...; ``audit models``
            lists them), a hub id or save_pretrained folder of these types, ``timm:<name>``, or a
            transformers model object of the ViT, BERT or GPT-2 family that you hold, or one held in
            TransformerLens (``TransformerBridge``, ``HookedTransformer``: GPT-2 family) or nnsight (extra
            ``interp``; its weights are audited as ``weights = "in-memory"``).
        processor: for a model object, its image processor or tokenizer (None: the tokenizer the object
            carries, else the family's default).
        data: image folder, .txt file or folder, ``hf:<dataset>``, or None for the bundled sample.
        out: folder for the report (results.csv, summary.md, plots, report.html); None writes nothing.
        options: the fields of :class:`AuditConfig` (``samples``, ``first``, ``subsets``,
            ``representations``, ``weights``, ``tests``, ``threshold``, ``rtol``, ``seed``, ``device``,
            ``batch_size``, ``context_length``, ``sweep``, ``sweep_ks``, ``save_tokens``, ``tokens``,
            ``threads``, ``layers`` (``"all"``, ``"0:6"``, ``"-3:"``, ``"0,3,7"``, or block indices such as
            ``range(6)``), ``memory_budget`` (GiB), ...), with the defaults of the ``audit`` command line.
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

    misplaced = sorted(
        set(options) & {"weights", "workers", "executor", "address", "tokens", "trust_remote_code"}
    )
    if misplaced:
        raise AuditError(f"option(s) {', '.join(misplaced)} do not apply to a model object (its weights are "
                         "the ones audited, in this process)")
    loaded = from_object(model, processor, context_length=options.get("context_length"))
    config = AuditConfig(model=loaded.name, weights=(IN_MEMORY,), **options)
    return run(config, out=out, progress=progress, model_object=loaded).rows


def audit_tokens(
    contexts: object, queries: object, n: int | None = None, *, tests: tuple[str, ...] | str | None = None,
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
    clock = StageClock()
    queries = _given_tensor(queries, "queries")
    contexts = None if contexts is None else _given_tensor(contexts, "contexts")
    if queries.ndim != 2:
        raise AuditError(f"queries must be (N, d); got shape {tuple(queries.shape)}")
    if contexts is None:
        if n is None:
            raise AuditError("without contexts, give n (the context length the Kruskal tests use as k)")
        positive("n", n)
        tokens = Tokens(queries[:, None, :], queries, {})  # (N, 1, d): checks shapes; not tested as contexts
        n_tokens = n
    else:
        tokens = Tokens(contexts, queries, {})
        if n is not None and n != tokens.n:
            raise AuditError(f"n = {n} but the contexts hold n = {tokens.n} tokens per example")
        n_tokens = tokens.n
    if tests is None:
        tests = TESTS if contexts is not None else QUERY_TESTS
    config = AuditConfig(model=TENSORS, representations=(f"tokens@{GIVEN}",), weights=(GIVEN,),
                         **_options({"tests": tests, "subsets": subsets, "seed": seed, "rtol": rtol,
                                     "threshold": threshold}))
    plan = AuditPlan.of(config)
    check_contexts_given(plan.testing.tests, contexts is not None)
    meta = {
        "model": TENSORS,
        "representation": "tokens",
        "weights": GIVEN,
        "dtype": str(queries.dtype).removeprefix("torch."),
        "data_source": "tensors given to audit_tokens",
    }
    item = TokenItem("tokens", tokens.queries, None if contexts is None else tokens.contexts, n_tokens, meta)
    group = TokenGroup(GIVEN, [item], fingerprint([("queries", tokens.queries)] + (
        [] if contexts is None else [("contexts", tokens.contexts)])))
    plan.check_shape(n=n_tokens, d=tokens.d, num=tokens.N, n_set_by="tensors")
    return _run_groups(config, plan, lambda out_path: iter([group]), out=out, progress=progress,
                       clock=clock).rows


def _given_tensor(value: object, name: str) -> torch.Tensor:
    """A tensor argument of :func:`audit_tokens` as a tensor of numbers (detached: the tests read values
    only); a path, a string or anything that holds no numbers is a TypeError that says what to pass."""
    if isinstance(value, str | bytes | Path):
        raise TypeError(
            f"audit_tokens takes tensors, not files: {name} is {str(value)!r}; load a token file with "
            "auditor.audit.tokens.Tokens.load(path), or audit it with auditor.audit_model(tokens=path)"
        )
    if isinstance(value, torch.Tensor):
        tensor = value
    else:
        try:
            tensor = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError):
            kind = getattr(value, "dtype", None)
            raise TypeError(
                f"{name} must be a torch.Tensor or NumPy array of numbers; got {type(value).__name__}"
                + (f" of dtype {kind}" if kind is not None else "")
            ) from None
    if tensor.is_complex():
        raise TypeError(f"{name} must hold real numbers; got dtype {tensor.dtype}")
    return tensor.detach()


def run(config: AuditConfig, *, out: str | Path | None = None, progress: bool = True,
        model_object: LoadedModel | None = None) -> AuditResult:
    """:func:`audit` with a resolved config; returns rows, curves and the per-context ranks.

    ``model_object``: a :class:`~auditor.models.LoadedModel` built around a model the caller holds (see
    :func:`auditor.models.from_object`). Options are checked before anything is loaded or written; a run
    that fails leaves no folder it created behind, and an interrupted one keeps its finished rows in
    ``results.partial.csv`` (a later run of the same configuration on the same data reuses them).
    """
    clock = StageClock()
    plan = AuditPlan.of(config)
    if plan.tokens is not None:
        with clock.stage(READING_TOKENS):
            files = read_token_files(plan)
        labels = tuple(f"{item.representation}@{group.weights}" for group in files for item in group.items)
        config = dataclasses.replace(config, representations=labels,
                                     weights=tuple(dict.fromkeys(g.weights for g in files)))
        plan = dataclasses.replace(plan, rows=tuple(Row(item.representation, group.weights)
                                                    for group in files for item in group.items))
        return _run_groups(config, plan, lambda out_path: iter(files), out=out, progress=progress,
                           clock=clock, keep={Path(f) for f in plan.tokens})
    if model_object is not None:
        with clock.stage(SETUP):
            plan.check_object(model_object)
        return _run_groups(config, plan,
                           lambda out_path: object_groups(plan, model_object, out_path, progress),
                           out=out, progress=progress, clock=clock)
    with clock.stage(SETUP):
        from auditor.models import resolve

        spec = resolve(config.model, trust_remote_code=config.trust_remote_code)
        plan.check_model(spec)
    return _run_groups(config, plan, lambda out_path: model_groups(plan, spec, out_path, progress),
                       out=out, progress=progress, clock=clock)


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


def _stream_stage(work: str, rep: str, saved: bool, per_layer: bool) -> str | None:
    """The stage of work done on streamed contexts as they were extracted (``ranks``, ``means``,
    ``geometry``, ``file``); None: it stays in the extraction's stage (a temporary contexts file, or the
    collapse residuals outside an audit across depth)."""
    if work == "file":
        return SAVING_TOKENS if saved else None
    if work == "geometry":
        return f"geometry ({rep})" if per_layer else None
    test = next(name for name, spec in ASSUMPTION_TESTS.items() if work in spec.reduces)  # the test it serves
    return f"{test} ({rep})" if per_layer else test


def _timed(groups: Iterator[TokenGroup], clock: StageClock, per_layer: bool = False) -> Iterator[TokenGroup]:
    """The groups, each one's making (model, inputs, extraction) added to its stage while the run waits.

    No reference to a group is kept once the next is asked for: a group's tokens are released before the
    next group's are extracted (the memory bound of :func:`auditor.audit.sources.extracted_passes`). The work
    done on streamed contexts while they were extracted goes to the stage it serves (:func:`_stream_stage`).
    """
    while True:
        begin = time.perf_counter()
        group = next(groups, None)
        if group is None:
            return
        elapsed, streamed = time.perf_counter() - begin, []
        for item in group.items:
            if not isinstance(item.contexts, StreamedContexts):
                continue
            for work, seconds in item.contexts.seconds.items():
                stage = _stream_stage(work, item.representation, item.saved is not None, per_layer)
                if stage is not None:
                    streamed.append((stage, seconds))
        if group.stage is not None:
            clock.add(group.stage, elapsed - sum(seconds for _, seconds in streamed))
        for stage, seconds in streamed:
            clock.add(stage, seconds)
        yield group
        group = None


def _run_groups(config: AuditConfig, plan: AuditPlan, groups: Callable[[Path | None], Iterator[TokenGroup]],
                *, out: str | Path | None, progress: bool, clock: StageClock,
                keep: set[Path] = frozenset()) -> AuditResult:
    """Take the report folder (if any), test every group of ``plan``, write the report (``config`` is what it
    records), tidy the folder."""
    with clock.stage(SETUP):
        from auditor.models import resolve_device

        test_device = resolve_device(plan.loading.device)
    folder_or_none = ReportFolder(out) if out is not None else contextlib.nullcontext()
    with _torch_threads(plan.threads), folder_or_none as folder:
        out_path = folder.path if folder is not None else None
        stamp = provenance()
        done = RowStore(out_path, stamp, _config_record(config))
        if done.load_previous():
            log.warning(
                "resuming: %d finished Kruskal tests of an earlier run in %s are reused where the data "
                "is the same (Assumption 2 and the sweep run again)",
                len(done.previous),
                out_path,
            )
        per_layer = plan.across_depth
        saving = folder is not None and plan.extraction.save_tokens
        tester = _Tester(plan, test_device, done, clock, progress=progress, per_layer=per_layer,
                         tokens_dir=folder.tokens_dir if saving else None)
        tested = Tested()
        chunks: list[int] = []  # examples per chunk of each streamed representation
        try:
            for group in _timed(groups(out_path), clock, per_layer):
                chunks += [item.contexts.chunk for item in group.items
                           if isinstance(item.contexts, StreamedContexts)]
                tested = tested.merge(tester.group(group))
                if folder is not None:
                    folder.produced.update(tested.produced)
                del group  # released before the next group is extracted
        except KeyboardInterrupt as err:
            done.save()
            kept = out_path is not None and (out_path / PARTIAL_CSV).exists()
            where = (f"; {len(done.records)} finished rows are in {out_path / PARTIAL_CSV}; rerun the same "
                     f"command to resume" if kept else "")
            raise KeyboardInterrupt(f"audit interrupted{where}") from err
        except Exception as err:  # after some rows: report them (summary.md, results.csv), then fail
            finished = sum(r.get("status") == "ok" for r in done.records)
            if folder is None or not finished:
                raise
            message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            try:
                _report(config, plan, done, tested, stamp, clock, folder, keep, chunks,
                        incomplete=message)
            except Exception:  # noqa: BLE001 - the run's own error is the one to report
                log.warning("the %d finished rows could not be reported; they stay in %s", finished,
                            out_path / PARTIAL_CSV)
                raise err from None
            note = (f"; the {finished} rows finished before it are reported in {out_path / 'summary.md'} "
                    f"and results.csv (audit compare reads them; rerun the same command to resume)")
            if isinstance(err, AuditError):
                raise AuditError(message + note) from err
            log.error("audit stopped by an error%s", note)
            raise
        return _report(config, plan, done, tested, stamp, clock, folder, keep, chunks)


def _report(config: AuditConfig, plan: AuditPlan, done: RowStore, tested: Tested, stamp: dict[str, Any],
            clock: StageClock, folder: ReportFolder | None, keep: set[Path], chunks: list[int],
            incomplete: str | None = None) -> AuditResult:
    """The result of the rows in ``done`` and, with a folder, its report; ``incomplete``: the error that
    stopped the run after these rows (the report says so, and the rows of the partial file are kept for a
    resume)."""
    per_layer = plan.across_depth
    records = done.records
    if not any(r.get("status") == "ok" for r in records) and all(
        r.get("status") == "skipped" for r in records
    ):
        reasons = sorted({r["note"] for r in records})
        raise AuditError(f"nothing could be tested: {reasons[0]}")
    curves = pd.concat(tested.curves, ignore_index=True) if tested.curves else pd.DataFrame()
    if not curves.empty:  # sweep.csv carries the same provenance columns as results.csv
        curves = curves.assign(**{key: curves.get(key, value) for key, value in stamp.items()},
                               seed=plan.testing.seed)
    rows = rows_frame(records, stamp)
    result = AuditResult(rows=rows, curves=curves, config=config, context_ranks=dict(tested.ranks),
                         margins=dict(tested.margins), out=folder.path if folder is not None else None,
                         depth=depth_frame(rows, curves) if per_layer else pd.DataFrame(),
                         incomplete=incomplete)
    result.stages = clock.frame()
    if folder is not None:
        extra = {
            "torch_threads": torch.get_num_threads(),
            **({"contexts": streamed_note(chunks)} if chunks else {}),
            **({"incomplete": incomplete} if incomplete else {}),
        }
        try:
            written = write_report(result, folder.path, extra)
        except OSError as err:
            raise AuditError(
                f"cannot write the report into {str(folder.path)!r} ({err.strerror or err}); "
                f"the finished rows stay in {PARTIAL_CSV}: free some space or fix the folder and "
                "rerun to resume"
            ) from None
        folder.produced.update(written)
        partial = {folder.path / PARTIAL_CSV, folder.path / PARTIAL_CONFIG} if incomplete else set()
        folder.tidy(keep | partial)  # an incomplete run keeps its partial rows for the resume
    return result


@dataclass(frozen=True)
class Tested:
    """What testing groups made besides their rows (which go to the row store as each test finishes)."""

    ranks: Mapping[str, torch.Tensor] = field(default_factory=dict)  # "repr@weights" -> (N,) context ranks
    margins: Mapping[str, torch.Tensor] = field(default_factory=dict)  # ... and their margins
    curves: tuple[pd.DataFrame, ...] = ()  # the sweep's rows, per representation
    produced: tuple[Path, ...] = ()  # token files written into the report folder

    def merge(self, other: Tested) -> Tested:
        return Tested({**self.ranks, **other.ranks}, {**self.margins, **other.margins},
                      self.curves + other.curves, self.produced + other.produced)


def _skipped(model: str, testing: RunOptions, row: Row, reason: str) -> list[dict[str, Any]]:
    return [
        {"model": model, "representation": row.representation, "weights": row.weights, "test": test,
         "status": "skipped", "note": reason, "seed": testing.seed}
        for test in testing.tests
    ]


@dataclass(frozen=True, eq=False)
class _Tester:
    """Runs the tests (and the sweep) of ``plan`` on each representation of a group. Rows go to the row store
    ``done`` as each test finishes (saved at once, so an interrupted run keeps them), each with the token
    geometry of its representation, and the seconds of each stage to ``clock``; the rest is returned.
    ``tokens_dir``: where ``--save-tokens`` writes (made when first asked); ``per_layer``: stages named by
    test and representation."""

    plan: AuditPlan
    device: torch.device
    done: RowStore
    clock: StageClock
    tokens_dir: Callable[[], Path] | None
    progress: bool
    per_layer: bool

    def group(self, group: TokenGroup) -> Tested:
        """Every representation of ``group`` (or its skipped rows)."""
        if group.skipped is not None:
            for rep in group.representations:
                row = Row(rep, group.weights)
                self.done.add(*_skipped(self.plan.model, self.plan.testing, row, group.skipped))
            return Tested()
        tested = Tested()
        bar = tqdm(total=len(group.items) * len(self.plan.testing.tests), desc=f"tests ({group.weights})",
                   unit="test", disable=not self.progress)
        for item in group.items:
            tested = tested.merge(self.item(item, group, bar))
        bar.close()
        return tested

    def item(self, item: TokenItem, group: TokenGroup, bar: tqdm) -> Tested:
        """The tests and the sweep of one representation of ``group``."""
        plan, clock, rep, weights = self.plan, self.clock, item.representation, group.weights
        label = f"{rep}@{weights}"
        produced = [item.saved] if item.saved is not None else []  # written chunk by chunk while streaming
        if self.tokens_dir is not None and item.tokens is not None:
            path = self.tokens_dir() / f"{label.replace('/', '_')}.safetensors"
            try:
                with clock.stage(SAVING_TOKENS):
                    item.tokens.save(path)
            except OSError as err:
                raise AuditError(
                    f"cannot save tokens in {str(path.parent)!r} ({err.strerror or err}); free some "
                    "space or choose another --out"
                ) from None
            produced.insert(0, path)
        streamed = isinstance(item.contexts, StreamedContexts)
        contexts = item.contexts if streamed or item.contexts is None else item.contexts.to(self.device)
        queries = item.queries.to(self.device)
        meta = item.meta
        base = {"model": plan.model, "representation": rep, "layer": meta.get("layer", ""),
                "weights": weights, "data_source": meta.get("data_source", ""),
                "data_counts": meta.get("data_counts", ""),
                "first": group.first, "data_fingerprint": group.fingerprint,
                "tokenizer": meta.get("tokenizer", ""), "seed": plan.testing.seed,
                "dtype": meta.get("dtype") or str(queries.dtype).removeprefix("torch."),
                "weights_dtype": meta.get("weights_dtype", "")}
        with clock.stage(f"geometry ({rep})") if self.per_layer else contextlib.nullcontext():
            base.update(token_geometry(contexts, queries))
        _, ranks = run_tests(contexts, queries, plan.testing, bar, n=item.n, clock=clock,
                             layer=rep if self.per_layer else None,
                             on_row=lambda row: self.done.add({**base, **row}),
                             reuse=lambda test: self.done.reuse(rep, weights, test, group.fingerprint))
        self.done.settle(rep, weights)
        curves: tuple[pd.DataFrame, ...] = ()
        if plan.sweep is not None:
            ks = sweep_ks(plan.sweep, queries.shape[0], item.n, queries.shape[1])
            with clock.stage(SWEEP):
                found = probes.kruskal_sweep(queries, ks, subsets=plan.sweep.subsets, seed=plan.sweep.seed,
                                             refine=plan.sweep.refine, rtol=plan.sweep.rtol,
                                             progress=self.progress)
            curves = (curve_frame(found, plan.model, rep, weights, item.n),)
        if streamed:
            item.contexts.release()  # its temporary contexts file, once every test is done
        del contexts, queries
        if ranks is None:
            return Tested(curves=curves, produced=tuple(produced))
        return Tested({label: ranks.rank.cpu()}, {label: ranks.margin.cpu()}, curves, tuple(produced))
