"""Where an audit's tokens come from.

A source yields :class:`TokenGroup` s, each the tokens of one weights source with the fingerprint of the
data they were made from (resume reuses a row only on equal fingerprints):

- a model named by string: per weights source, load the model, read the inputs, extract every
  representation, let the model go (:func:`model_groups`);
- a model object the caller holds (:func:`object_groups`);
- token files written by ``--save-tokens`` (:func:`read_token_files`), or tensors (``audit_tokens``).

A model's tokens are held in memory when every representation's fit in the memory budget (one forward
pass); otherwise they are streamed (:func:`token_groups`, :mod:`auditor.audit.stream`): one forward pass in
chunks, each chunk reduced to what the tests need and dropped.

The three sources take the audit's plan (:class:`~auditor.audit.plan.AuditPlan`, checked before any work);
what they call receives only its parts: which examples (:class:`~auditor.audit.plan.Sampling`), how tokens
are made (:class:`~auditor.audit.plan.Extraction`) and, for streamed contexts, the tests they are reduced for.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm

from auditor.audit.assumptions import RunOptions
from auditor.audit.plan import AuditPlan, Extraction, Sampling, architecture
from auditor.audit.stream import ContextReducer, StreamedContexts, chunk_examples
from auditor.audit.tokens import Tokens
from auditor.core.errors import AuditError

if TYPE_CHECKING:
    from auditor.data import Inputs
    from auditor.models.base import LoadedModel, ModelSpec

__all__ = ["Read", "TokenGroup", "TokenItem", "extracted", "extracted_passes", "extraction_stage",
           "fingerprint", "load_inputs_for", "model_groups", "object_groups", "read_token_files", "streamed",
           "token_groups"]
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")  # a representation name that is no path
GIB = 2**30
log = logging.getLogger(__name__)


def read_token_files(plan: AuditPlan) -> list[TokenGroup]:
    """The token files of ``plan.tokens``, checked, one group each."""
    from auditor.models import resolve_device

    resolve_device(plan.loading.device)
    groups: list[TokenGroup] = []
    seen: dict[str, str] = {}
    for file in plan.tokens or ():
        tok = Tokens.load(file)
        made_by = tok.meta.get("model", "")
        if made_by and made_by != plan.model:
            raise AuditError(f"{file} holds tokens of {made_by!r}, not {plan.model!r}; run "
                             f"`audit {made_by} --tokens {file}`")
        rep = tok.meta.get("representation") or "tokens"
        if not _NAME.fullmatch(rep) or ".." in rep:
            raise AuditError(
                f"{file}: its metadata names representation {rep!r}, a path that could lead outside "
                "--out, not a representation name (valid: embedding, random-attention, block.L)"
            )
        weights = tok.meta.get("weights") or "unknown"
        label = f"{rep}@{weights}"
        if label in seen:
            raise AuditError(f"{seen[label]} and {file} both hold {label}; give each representation once")
        seen[label] = file
        meta = {
            **tok.meta,
            "data_source": f"{tok.meta.get('data_source', '')} (tokens read from {file})".strip(),
        }
        item = TokenItem(rep, tok.queries, tok.contexts, tok.n, meta)
        plan.check_shape(n=tok.n, d=tok.d, num=tok.N, n_set_by="tokens")
        groups.append(
            TokenGroup(weights, [item], fingerprint([("contexts", tok.contexts), ("queries", tok.queries)]))
        )
    return groups


# ---------------------------------------------------------------------------------------------------
# Token sources: one group per weights source (or token file), made only when it is tested
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class TokenItem:
    """One representation's tokens, ready for the tests."""

    representation: str
    queries: torch.Tensor  # (N, d)
    contexts: torch.Tensor | StreamedContexts | None  # (N, n, d); reduced when streamed; None: queries only
    n: int
    meta: Mapping[str, str]
    tokens: Tokens | None = None  # what --save-tokens writes
    saved: Path | None = None  # the token file a streamed extraction wrote (--save-tokens)


@dataclass(eq=False)
class TokenGroup:
    """The tokens of one weights source, with the fingerprint of the data they were made from."""

    weights: str
    items: list[TokenItem]
    fingerprint: str
    first: bool | None = None  # the first N examples (True) or a seeded random draw (False)
    skipped: str | None = None  # why nothing was made (weights unavailable)
    representations: list[str] = field(default_factory=list)  # of a skipped group
    stage: str | None = None  # the stage that made it while the run waited (extraction); None: made before


def extraction_stage(weights: str) -> str:
    """The name of the stage that loads the model and the inputs and extracts the tokens of ``weights``."""
    return f"extraction @ {weights}"


def fingerprint(tensors: list[tuple[str, torch.Tensor]]) -> str:
    """16 hex digits of SHA-256 over names, dtypes, shapes and bytes: equal only for equal data."""
    from auditor.data.inputs import Fingerprint

    return Fingerprint.of(tensors)


@dataclass(frozen=True, eq=False)
class Read:
    """The inputs read for one model, whether they are the first N examples (else a seeded draw), and their
    fingerprint (:meth:`auditor.data.Inputs.fingerprint`)."""

    inputs: Inputs
    first: bool

    @functools.cached_property
    def fingerprint(self) -> str:
        """Asked for once the tokens are extracted: images made on demand are digested as the forward pass
        decodes them in order, so they are not decoded again for it."""
        return self.inputs.fingerprint()


PROBE_TEXT = "The quick brown fox jumps over the lazy dog."  # any tokenizer of text makes tokens of it


def check_tokenizer(loaded: LoadedModel) -> None:
    """Refuse a text model whose tokenizer makes no tokens of plain English (an empty or unusable
    vocabulary, e.g. tokenizer files saved without one), before the data is read: said as what it is, not
    as text too short."""
    tokenizer = loaded.tokenizer
    if loaded.modality != "text" or tokenizer is None or tokenizer.encode(PROBE_TEXT):
        return
    folder = f" into {loaded.weights}" if Path(loaded.weights).is_dir() else ""
    raise AuditError(
        f"the tokenizer of {loaded.name} @ {loaded.weights} ({tokenizer.name}) makes no tokens of text "
        f"({PROBE_TEXT!r} gives none): its vocabulary is empty or unusable; save the model's own tokenizer"
        f"{folder} (tokenizer.save_pretrained), or remove its tokenizer files so that text is read as bytes"
    )


def load_inputs_for(loaded: LoadedModel, sampling: Sampling, out: Path | None, progress: bool) -> Read:
    """The inputs for ``loaded`` as ``sampling`` asks (none read under ``out``), with their fingerprint; a
    tokenizer that makes no tokens is refused first (:func:`check_tokenizer`)."""
    from auditor.data import load_inputs

    check_tokenizer(loaded)
    inputs = load_inputs(loaded, sampling.data, sampling.count(loaded.n), seed=sampling.seed,
                         progress=progress, first=sampling.first, exclude=out)
    if sampling.samples is not None and sampling.samples > inputs.N:  # asked for; the data has fewer
        text = loaded.modality == "text"
        what = f"windows of n = {loaded.n} tokens" if text else "readable images"
        raise AuditError(f"--samples {sampling.samples} asks for more examples than the data gives: "
                         f"{inputs.N} ({what}) for {loaded.name} @ {loaded.weights}; valid: --samples <= "
                         f"{inputs.N}, or more data" + (", or a shorter --context-length" if text else ""))
    if sampling.sweep_k is not None and sampling.sweep_k > inputs.N:
        raise AuditError(f"sweep k = {sampling.sweep_k} exceeds the N = {inputs.N} examples loaded; "
                         f"valid: 1 <= k <= {inputs.N} (or load more with --samples)")
    return Read(inputs, sampling.first)


def extracted(loaded: LoadedModel, reps: list[str], sampling: Sampling, extraction: Extraction,
              out: Path | None, progress: bool) -> TokenGroup:
    """Inputs for ``loaded``, the tokens of ``reps`` extracted from them in one pass, and the inputs'
    fingerprint (no memory budget: every representation is held at once)."""
    read = load_inputs_for(loaded, sampling, out, progress)
    return _extract_group(loaded, read, reps, extraction, progress, out)


def extracted_passes(loaded: LoadedModel, reps: list[str], sampling: Sampling, extraction: Extraction,
                     out: Path | None, progress: bool) -> Iterator[TokenGroup]:
    """The tokens of ``reps`` as groups that each fit in ``extraction.memory_budget`` GiB (default: half the
    memory available), one forward pass each (see :func:`auditor.audit.extract.plan_passes`). The inputs are
    read once; the caller releases a group before asking for the next, so at most one is held."""
    read = load_inputs_for(loaded, sampling, out, progress)
    yield from _passes(loaded, read, reps, extraction, out, progress)


def _budget(memory_budget: float | None) -> int:
    """Bytes of tokens an audit may hold: ``memory_budget`` GiB, else half the memory available."""
    from auditor.audit.extract import available_memory

    return int(memory_budget * GIB) if memory_budget is not None else available_memory() // 2


def _passes(loaded: LoadedModel, read: Read, reps: list[str], extraction: Extraction, out: Path | None,
            progress: bool) -> Iterator[TokenGroup]:
    """The groups of :func:`extracted_passes` from inputs already read."""
    from auditor.audit.extract import plan_passes, token_bytes

    budget = _budget(extraction.memory_budget)
    each = token_bytes(read.inputs.N, loaded.n, loaded.d, loaded.dtype)
    passes = plan_passes(reps, loaded.num_layers, each, budget)
    if len(passes) > 1:
        log.info("%s: %d representations of %.2f GiB each in %d forward passes (memory budget %.2f GiB)",
                 loaded.weights, sum(map(len, passes)), each / GIB, len(passes), budget / GIB)
    if each > budget:
        log.warning("one representation's tokens (%.2f GiB) exceed the memory budget (%.2f GiB); extracting "
                    "them one at a time", each / GIB, budget / GIB)
    for names in passes:
        yield _extract_group(loaded, read, names, extraction, progress, out)  # keeps no reference


def token_groups(loaded: LoadedModel, reps: list[str], sampling: Sampling, extraction: Extraction,
                 testing: RunOptions, out: Path | None, progress: bool,
                 read: Read | None = None) -> Iterator[TokenGroup]:
    """The tokens of ``reps`` for the tests: in memory (:func:`extracted_passes`) when every
    representation's fit in the memory budget at once, else streamed (:func:`streamed`, reduced for
    ``testing``) in one forward pass. Sharded extraction and float64 tokens are always held in memory.
    ``read``: the inputs, when they were read already (else read here)."""
    from auditor.audit.extract import parse_representation, token_bytes

    read = read if read is not None else load_inputs_for(loaded, sampling, out, progress)
    names = list(dict.fromkeys(parse_representation(r, loaded.num_layers).name for r in reps))
    each = token_bytes(read.inputs.N, loaded.n, loaded.d, loaded.dtype)
    if (extraction.sharding is not None or loaded.dtype == torch.float64
            or each * len(names) <= _budget(extraction.memory_budget)):
        yield from _passes(loaded, read, reps, extraction, out, progress)
        return
    yield streamed(loaded, read, names, extraction, testing, progress, out)


def streamed(loaded: LoadedModel, read: Read, reps: list[str], extraction: Extraction, testing: RunOptions,
             progress: bool, out: Path | None = None) -> TokenGroup:
    """One forward pass over ``read.inputs`` in chunks of whole batches that fit half the memory budget;
    each chunk's contexts are reduced to what the tests of ``testing`` need
    (:class:`auditor.audit.stream.ContextReducer`) and dropped. With ``save_tokens`` the contexts go to
    ``<out>/tokens`` chunk by chunk. The tokens are those of one in-memory pass: the same forward on the
    same batches."""
    from auditor.audit.extract import extract, token_bytes
    from auditor.audit.report.folder import TOKENS
    from auditor.models import resolve_device

    inputs = read.inputs
    num, n, d = inputs.N, loaded.n, loaded.d
    budget = _budget(extraction.memory_budget)
    per_example = len(reps) * token_bytes(1, n, d, loaded.dtype)
    chunk = chunk_examples(num, extraction.batch_size, per_example, budget)
    log.warning("%s: the tokens of %d representation(s) (%.2f GiB) exceed the memory budget (%.2f GiB); "
                "streaming the contexts in chunks of %d examples (same rows)", loaded.weights, len(reps),
                num * per_example / GIB, budget / GIB, chunk)
    device = resolve_device(extraction.device)
    reducers = {}
    for rep in reps:
        save = None
        if extraction.save_tokens and out is not None:
            save = Path(out) / TOKENS / f"{rep}@{loaded.weights}".replace("/", "_")
            save = save.with_name(save.name + ".safetensors")
        reducers[rep] = ContextReducer(num, n, d, loaded.dtype, device, tests=testing.tests,
                                       rtol=testing.rtol, robustness=testing.robustness, geometry=True,
                                       save=save, chunk=chunk)
    metas: dict[str, Mapping[str, str]] = {}
    bar = tqdm(total=num, disable=not progress, desc=f"extract {loaded.name} (streamed)", unit="ex")
    try:
        with bar:
            for start in range(0, num, chunk):
                part = inputs.part(start, start + chunk)
                tokens = extract(loaded, part, reps, batch_size=extraction.batch_size, seed=extraction.seed,
                                 progress=False)
                for rep, tok in tokens.items():
                    reducers[rep].add(tok.contexts, tok.queries, tok.meta)
                    metas[rep] = tok.meta
                bar.update(part.N)
                del tokens, part
        items = []
        for rep, reducer in reducers.items():
            queries, contexts = reducer.finish()
            items.append(TokenItem(rep, queries, contexts, n, metas[rep], saved=reducer.save))
    except BaseException:
        for reducer in reducers.values():
            reducer.abort()
        raise
    return TokenGroup(loaded.weights, items, read.fingerprint, read.first,
                      stage=extraction_stage(loaded.weights))


def _extract_group(loaded: LoadedModel, read: Read, reps: list[str], extraction: Extraction, progress: bool,
                   out: Path | None = None) -> TokenGroup:
    """One forward pass over ``read.inputs`` (sharded across workers when asked) for ``reps``, as a group."""
    from auditor.audit.extract import extract

    sharding = extraction.sharding
    if sharding is not None:  # shard extraction across processes / Ray workers; tokens are identical
        from auditor.audit.shard import ModelRecipe, extract_sharded

        n = loaded.n if loaded.modality == "text" else sharding.loading.context_length  # the n chosen here
        recipe = ModelRecipe.of(loaded, device=sharding.loading.device, context_length=n,
                                trust_remote_code=sharding.loading.trust_remote_code)
        slurm = sharding.slurm  # Slurm jobs' logs in <out>/.slurm (hidden: not report files)
        slurm = slurm.at(Path(out).absolute() / ".slurm") if out is not None else slurm
        tokens = extract_sharded(recipe, read.inputs, reps, workers=sharding.workers,
                                 executor=sharding.executor, address=sharding.address,
                                 batch_size=extraction.batch_size, seed=extraction.seed, loaded=loaded,
                                 progress=progress, slurm=slurm)
    else:
        tokens = extract(loaded, read.inputs, reps, batch_size=extraction.batch_size, seed=extraction.seed,
                         progress=progress)
    items = [TokenItem(rep, tok.queries, tok.contexts, tok.n, tok.meta, tok) for rep, tok in tokens.items()]
    return TokenGroup(loaded.weights, items, read.fingerprint, read.first,
                      stage=extraction_stage(loaded.weights))


def model_groups(plan: AuditPlan, spec: ModelSpec, out: Path | None, progress: bool) -> Iterator[TokenGroup]:
    """Per weights source: load the model, extract every representation (in passes that fit the memory
    budget), let the model go.

    Before the first extraction every weights source's model is loaded and its inputs read (the tokenizer
    run over the data, the examples counted for N and n) and checked against its shape, last source first,
    so a tokenizer that makes no tokens or data too short for one source fails before any test of another
    has run; each of these models is let go at once except the first source's, which is extracted next.
    The inputs read are the ones tested (random weights are built again from the same seed)."""
    from auditor.models import WeightsUnavailable, load_model
    from auditor.models.base import weights_kind

    loading = plan.loading
    sources = list(plan.by_weights().items())

    def load(weights: str) -> LoadedModel | str:
        n = plan.context_length(spec, weights)
        try:
            return load_model(spec.name, weights, device=loading.device, seed=loading.seed,
                              context_length=n, trust_remote_code=loading.trust_remote_code,
                              dtype=loading.dtype, query=loading.query, bos=loading.bos)
        except WeightsUnavailable as err:
            return f"weights unavailable: {err}"

    ready: dict[str, tuple[LoadedModel | None, Read | str]] = {}  # weights -> (model kept, inputs or why not)
    for index in reversed(range(len(sources))) if len(sources) > 1 else ():
        weights, reps = sources[index]
        loaded = load(weights)
        if isinstance(loaded, str):
            ready[weights] = (None, loaded)
            continue
        plan.check_shape(n=loaded.n, d=loaded.d, layers=loaded.num_layers,
                         reps=plan.representations(reps, loaded.num_layers), n_set_by=loaded.modality)
        read = load_inputs_for(loaded, plan.sampling, out, progress)
        ready[weights] = (loaded if index == 0 else None, read)
        del loaded
    for weights, reps in sources:
        kept, read = ready.pop(weights, (None, None))
        if isinstance(read, str):
            loaded = read
        else:
            loaded = kept if kept is not None else load(weights)
        if isinstance(loaded, str):
            n = plan.context_length(spec, weights)
            shape = architecture(spec, weights, weights_kind(weights), n)
            planned = plan.representations(reps, shape[2]) if shape is not None else reps
            yield TokenGroup(weights, [], "", skipped=loaded, representations=planned,
                             stage=extraction_stage(weights))
            continue
        del kept
        reps = plan.representations(reps, loaded.num_layers)  # the block count of e.g. timm: known now
        plan.check_shape(n=loaded.n, d=loaded.d, layers=loaded.num_layers, reps=reps,
                         n_set_by=loaded.modality)
        yield from token_groups(loaded, reps, plan.sampling, plan.extraction, plan.testing, out, progress,
                                read=read)
        del loaded


def object_groups(plan: AuditPlan, loaded: LoadedModel, out: Path | None,
                  progress: bool) -> Iterator[TokenGroup]:
    """The one group of a model object, extracted in eval mode (the object's own mode restored after)."""
    from auditor.models.from_object import evaluating

    reps = plan.representations(plan.by_weights()[loaded.weights], loaded.num_layers)
    with evaluating(loaded.model):
        yield from token_groups(loaded, reps, plan.sampling, plan.extraction, plan.testing, out, progress)
