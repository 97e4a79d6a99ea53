"""Where an audit's tokens come from, and the checks made before any of them is produced.

A source yields :class:`TokenGroup` s, each the tokens of one weights source with the fingerprint of the
data they were made from (resume reuses a row only on equal fingerprints):

- a model named by string: per weights source, load the model, read the inputs, extract every
  representation, let the model go (:func:`model_groups`);
- a model object the caller holds (:func:`object_groups`);
- token files written by ``--save-tokens`` (:func:`read_token_files`), or tensors (``audit_tokens``).

A model's tokens are held in memory when every representation's fit in the memory budget (one forward
pass); otherwise they are streamed (:func:`token_groups`, :mod:`auditor.audit.stream`): one forward pass in
chunks, each chunk reduced to what the tests need and dropped.

The ``check_*`` functions validate a configuration against the model's architecture read from its
configuration alone: nothing there loads weights or touches the report folder, so a mistake costs
nothing and never disturbs an earlier run's files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import inspect
import logging
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

import probes
from auditor.audit.assumptions import ASSUMPTION_TESTS
from auditor.audit.config import DEFAULT_REPRESENTATIONS, MAX_DEFAULT_SAMPLES, AuditConfig
from auditor.audit.stream import ContextReducer, StreamedContexts, chunk_examples
from auditor.audit.tokens import Tokens
from auditor.core.errors import AuditError
from auditor.core.execution import check_executor
from auditor.core.slurm import SlurmOptions

__all__ = ["MAX_DEFAULT_SAMPLES", "Row", "TokenGroup", "TokenItem", "check_model_options", "check_object_options",
           "check_shapes", "extracted", "extracted_passes", "extraction_stage", "fingerprint", "model_groups",
           "object_groups", "plan", "read_token_files", "streamed", "token_groups"]
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")  # a representation name that is no path
EMBEDDING = "embedding"
GIB = 2**30
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Row:
    """A planned report row: a representation under one weights source."""

    representation: str
    weights: str


def plan(config: AuditConfig) -> list[Row]:
    """Representation x weights rows. ``block.0@pretrained`` pins one representation to one source.

    With ``layers`` every weights source starts with ``embedding`` (its blocks are added once the model's
    block count is known, see :meth:`AuditConfig.layer_representations`) and representations left at
    their default add nothing.
    """
    rows: list[Row] = [Row(EMBEDDING, w) for w in config.weights] if config.layers is not None else []
    given = () if config.layers is not None and config.representations == DEFAULT_REPRESENTATIONS else (
        config.representations)
    for item in given:
        name, _, pinned = item.partition("@")
        for w in [pinned] if pinned else config.weights:
            row = Row(name.strip(), w.strip())
            if row not in rows:
                rows.append(row)
    return rows


def by_weights(config: AuditConfig) -> dict[str, list[str]]:
    """The representations of the plan grouped by weights source (one model load each)."""
    groups: dict[str, list[str]] = {}
    for row in plan(config):
        groups.setdefault(row.weights, []).append(row.representation)
    return groups


# ---------------------------------------------------------------------------------------------------
# Checks before any work: nothing here loads a model or touches the report folder
# ---------------------------------------------------------------------------------------------------


def check_common(config: AuditConfig) -> None:
    """The device, the data path and the sweep's k against --samples (any model source)."""
    from auditor.data import HF_PREFIX
    from auditor.models import resolve_device

    resolve_device(config.device)
    if config.data is not None and not config.data.startswith(HF_PREFIX) and not Path(config.data).expanduser().exists():
        raise AuditError(f"data {config.data!r} does not exist; give an image folder, a .txt file or a folder "
                         "of them, or hf:<dataset>")
    if config.sweep and config.sweep_ks and config.samples is not None and max(config.sweep_ks) > config.samples:
        raise AuditError(f"sweep k = {max(config.sweep_ks)} exceeds the N = {config.samples} examples asked for; "
                         f"valid: 1 <= k <= {config.samples} (or load more with --samples)")


def check_model_options(config: AuditConfig, spec: Any) -> None:
    """Device, data, executor, weights and representations of a model named by string."""
    from auditor.models.base import folder_model_type, weights_kind

    check_common(config)
    if config.workers > 1:
        check_executor(config.executor)  # Ray importable when it is asked for
    for weights, reps in by_weights(config).items():
        kind = weights_kind(weights)
        if kind == "folder" and spec.adapter.model_types:
            found = folder_model_type(Path(weights).expanduser())
            if found not in spec.adapter.model_types:
                raise AuditError(f"{weights} holds a {found or 'unknown'} model, not a {spec.family} model")
        shape = architecture(spec, weights, kind, config.context_length)
        if shape is not None:
            n, d, layers = shape
            check_shapes(config, n=n, d=d, layers=layers, reps=config.layer_representations(reps, layers))


def architecture(spec: Any, weights: str, kind: str, context_length: int | None) -> tuple[int, int, int] | None:
    """(n, d, blocks) of the model ``load_model`` would build, read from its configuration alone (no
    weights); None when that needs the model itself (e.g. timm)."""
    from auditor.models.base import HFAdapter

    adapter = spec.adapter
    if not isinstance(adapter, HFAdapter):
        return None
    try:
        if kind == "folder":
            from transformers import AutoConfig

            hf_config = AutoConfig.from_pretrained(str(Path(weights).expanduser()), local_files_only=True)
        elif spec.config is not None:
            hf_config = spec.config()
        else:
            return None
    except (OSError, ValueError):  # unreadable here: the load itself will say why
        return None
    n = adapter.context_length(hf_config, context_length)  # a bad context length is an AuditError here
    return n, adapter.width(hf_config), adapter.depth(hf_config)


def check_shapes(config: AuditConfig, *, n: int, d: int, layers: int | None = None,
                 reps: list[str] | None = None, num: int | None = None) -> None:
    """Representations in range, n <= d, and subsets that fit in memory, for a model of this shape."""
    if reps:
        from auditor.audit.extract import parse_representation

        for rep in reps:
            parse_representation(rep, layers)
    from auditor.models.devices import check_precision

    check_precision(config.dtype, config.rtol, d)
    if n > d:
        raise AuditError(f"context length n = {n} exceeds the width d = {d} of {config.model}: "
                         f"Assumption 2 (rank n) is impossible; use --context-length <= {d}")
    limit = getattr(probes, "max_subsets_in_memory", None)
    if limit is None:
        return
    num = num if num is not None else config.samples or MAX_DEFAULT_SAMPLES
    checks = [(t, "subsets", config.subsets, ASSUMPTION_TESTS[t].k(num, n, d))
              for t in config.tests if ASSUMPTION_TESTS[t].kruskal]
    if config.sweep:
        checks.append(("sweep", "sweep_subsets", config.sweep_subsets, min(num, d)))
    for _, name, count, k in checks:
        if k <= num and count > limit(k) and math.comb(num, k) > limit(k):
            raise AuditError(f"{name} = {count:,} subsets of size k = {k} do not fit in memory; valid: "
                             f"1 <= {name} <= {limit(k):,} at k = {k}")


def check_object_options(config: AuditConfig, loaded: Any) -> None:
    """As :func:`check_model_options`, for a model object (its own weights only)."""
    check_common(config)
    if config.workers > 1:
        raise AuditError("workers > 1 rebuilds the model in each worker; a model object is audited in this process")
    planned = by_weights(config)
    if set(planned) != {loaded.weights}:
        other = sorted(set(planned) - {loaded.weights})
        raise AuditError(f"a model object has only its own weights; drop the @{other[0]} pin")
    reps = config.layer_representations(planned[loaded.weights], loaded.num_layers)
    check_shapes(config, n=loaded.n, d=loaded.d, layers=loaded.num_layers, reps=reps)


def read_token_files(config: AuditConfig) -> list[TokenGroup]:
    """The token files of ``config.tokens``, checked, one group each."""
    given = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    unused = [name for name in ("data", "samples", "first", "context_length", "save_tokens", "representations",
                                "weights", "trust_remote_code", "layers") if given[name] != defaults[name]]
    if config.workers > 1:
        unused.append("workers")
    if unused:
        raise AuditError(f"option(s) {', '.join(unused)} do not apply when re-testing token files (the tokens are "
                         "extracted already; each file names its representation and weights)")
    from auditor.models import resolve_device

    resolve_device(config.device)
    groups: list[TokenGroup] = []
    seen: dict[str, str] = {}
    for file in config.tokens:
        tok = Tokens.load(file)
        made_by = tok.meta.get("model", "")
        if made_by and made_by != config.model:
            raise AuditError(f"{file} holds tokens of {made_by!r}, not {config.model!r}; run "
                             f"`audit {made_by} --tokens {file}`")
        rep = tok.meta.get("representation") or "tokens"
        if not _NAME.fullmatch(rep) or ".." in rep:
            raise AuditError(f"{file}: its metadata names representation {rep!r}, a path that could lead outside "
                             "--out, not a representation name (valid: embedding, random-attention, block.L)")
        weights = tok.meta.get("weights") or "unknown"
        label = f"{rep}@{weights}"
        if label in seen:
            raise AuditError(f"{seen[label]} and {file} both hold {label}; give each representation once")
        seen[label] = file
        meta = {**tok.meta, "data_source": f"{tok.meta.get('data_source', '')} (tokens read from {file})".strip()}
        item = TokenItem(rep, tok.queries, tok.contexts, tok.n, meta)
        check_shapes(config, n=tok.n, d=tok.d, num=tok.N)
        groups.append(TokenGroup(weights, [item], fingerprint([("contexts", tok.contexts), ("queries", tok.queries)])))
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
    digest = hashlib.sha256()
    for name, tensor in tensors:
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()[:16]


def load_inputs_for(loaded: Any, config: AuditConfig, out: Path | None, progress: bool) -> tuple[Any, bool]:
    """The inputs for ``loaded``, and whether they are the first N examples (else a seeded draw)."""
    from auditor.data import load_inputs

    accepted = inspect.signature(load_inputs).parameters
    extra: dict[str, Any] = {}
    if "first" in accepted:
        extra["first"] = config.first
    if "exclude" in accepted and out is not None:
        extra["exclude"] = out
    from auditor.data import default_samples

    num = config.samples or default_samples(loaded.n, config.data, MAX_DEFAULT_SAMPLES)
    inputs = load_inputs(loaded, config.data, num, seed=config.seed,
                         progress=progress, **extra)
    return inputs, config.first or "first" not in accepted  # without the option the data layer takes the first N


def extracted(loaded: Any, reps: list[str], config: AuditConfig, out: Path | None, progress: bool) -> TokenGroup:
    """Inputs for ``loaded``, the tokens of ``reps`` extracted from them in one pass, and the inputs'
    fingerprint (no memory budget: every representation is held at once)."""
    inputs, first, digest = _inputs(loaded, config, out, progress)
    return _extract_group(loaded, inputs, reps, config, digest, first, progress, out)


def extracted_passes(loaded: Any, reps: list[str], config: AuditConfig, out: Path | None,
                     progress: bool) -> Iterator[TokenGroup]:
    """The tokens of ``reps`` as groups that each fit in ``config.memory_budget`` GiB (default: half the
    memory available), one forward pass each (see :func:`auditor.audit.extract.plan_passes`). The inputs are
    read once; the caller releases a group before asking for the next, so at most one is held."""
    inputs, first, digest = _inputs(loaded, config, out, progress)
    yield from _passes(loaded, inputs, first, digest, reps, config, out, progress)


def _budget(config: AuditConfig) -> int:
    """Bytes of tokens an audit may hold: ``--memory-budget`` GiB, else half the memory available."""
    from auditor.audit.extract import available_memory

    return int(config.memory_budget * GIB) if config.memory_budget is not None else available_memory() // 2


def _passes(loaded: Any, inputs: Any, first: bool, digest: str, reps: list[str], config: AuditConfig,
            out: Path | None, progress: bool) -> Iterator[TokenGroup]:
    """The groups of :func:`extracted_passes` from inputs already read."""
    from auditor.audit.extract import plan_passes, token_bytes

    budget = _budget(config)
    each = token_bytes(inputs.N, loaded.n, loaded.d, loaded.dtype)
    passes = plan_passes(reps, loaded.num_layers, each, budget)
    if len(passes) > 1:
        log.info("%s: %d representations of %.2f GiB each in %d forward passes (memory budget %.2f GiB)",
                 loaded.weights, sum(map(len, passes)), each / GIB, len(passes), budget / GIB)
    if each > budget:
        log.warning("one representation's tokens (%.2f GiB) exceed the memory budget (%.2f GiB); extracting "
                    "them one at a time", each / GIB, budget / GIB)
    for names in passes:
        yield _extract_group(loaded, inputs, names, config, digest, first, progress, out)  # keeps no reference


def token_groups(loaded: Any, reps: list[str], config: AuditConfig, out: Path | None,
                 progress: bool) -> Iterator[TokenGroup]:
    """The tokens of ``reps`` for the tests: in memory (:func:`extracted_passes`) when every
    representation's fit in the memory budget at once, else streamed (:func:`streamed`) in one forward
    pass. Sharded extraction (``workers > 1``) and float64 tokens are always held in memory (passes)."""
    from auditor.audit.extract import parse_representation, token_bytes

    inputs, first, digest = _inputs(loaded, config, out, progress)
    names = list(dict.fromkeys(parse_representation(r, loaded.num_layers).name for r in reps))
    each = token_bytes(inputs.N, loaded.n, loaded.d, loaded.dtype)
    if config.workers > 1 or loaded.dtype == torch.float64 or each * len(names) <= _budget(config):
        yield from _passes(loaded, inputs, first, digest, reps, config, out, progress)
        return
    yield streamed(loaded, inputs, names, config, digest, first, progress, out)


def streamed(loaded: Any, inputs: Any, reps: list[str], config: AuditConfig, digest: str, first: bool,
             progress: bool, out: Path | None = None) -> TokenGroup:
    """One forward pass over ``inputs`` in chunks of whole batches that fit half the memory budget; each
    chunk's contexts are reduced to what the tests need (:class:`auditor.audit.stream.ContextReducer`) and
    dropped. With ``--save-tokens`` the contexts go to ``<out>/tokens`` chunk by chunk. The tokens are
    those of one in-memory pass: the same forward on the same batches."""
    from auditor.audit.extract import extract, token_bytes
    from auditor.audit.report.folder import TOKENS
    from auditor.models import resolve_device

    num, n, d = inputs.N, loaded.n, loaded.d
    budget = _budget(config)
    per_example = len(reps) * token_bytes(1, n, d, loaded.dtype)
    chunk = chunk_examples(num, config.batch_size, per_example, budget)
    log.warning("%s: the tokens of %d representation(s) (%.2f GiB) exceed the memory budget (%.2f GiB); "
                "streaming the contexts in chunks of %d examples (same rows)", loaded.weights, len(reps),
                num * per_example / GIB, budget / GIB, chunk)
    geometry = importlib.util.find_spec("probes.geometry") is not None
    device = resolve_device(config.device)
    reducers = {}
    for rep in reps:
        save = None
        if config.save_tokens and out is not None:
            save = Path(out) / TOKENS / f"{rep}@{loaded.weights}".replace("/", "_")
            save = save.with_name(save.name + ".safetensors")
        reducers[rep] = ContextReducer(num, n, d, loaded.dtype, device, tests=config.tests, rtol=config.rtol,
                                       robustness=config.robustness, geometry=geometry, save=save, chunk=chunk)
    metas: dict[str, Mapping[str, str]] = {}
    bar = tqdm(total=num, disable=not progress, desc=f"extract {loaded.name} (streamed)", unit="ex")
    try:
        with bar:
            for start in range(0, num, chunk):
                part = dataclasses.replace(inputs, N=min(chunk, num - start),
                                           tensors={k: v[start : start + chunk] for k, v in inputs.tensors.items()})
                tokens = extract(loaded, part, reps, batch_size=config.batch_size, seed=config.seed, progress=False)
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
    return TokenGroup(loaded.weights, items, digest, first, stage=extraction_stage(loaded.weights))


def _inputs(loaded: Any, config: AuditConfig, out: Path | None, progress: bool) -> tuple[Any, bool, str]:
    """The inputs for ``loaded``, whether they are the first N, and their fingerprint."""
    inputs, first = load_inputs_for(loaded, config, out, progress)
    if config.sweep and config.sweep_ks and max(config.sweep_ks) > inputs.N:
        raise AuditError(f"sweep k = {max(config.sweep_ks)} exceeds the N = {inputs.N} examples loaded; "
                         f"valid: 1 <= k <= {inputs.N} (or load more with --samples)")
    return inputs, first, fingerprint(sorted(inputs.tensors.items()))


def _extract_group(loaded: Any, inputs: Any, reps: list[str], config: AuditConfig, digest: str, first: bool,
                   progress: bool, out: Path | None = None) -> TokenGroup:
    """One forward pass over ``inputs`` (sharded across workers when asked) for ``reps``, as a group."""
    from auditor.audit.extract import extract

    if config.workers > 1:  # shard extraction across processes / Ray workers; tokens are identical
        from auditor.audit.shard import ModelRecipe, extract_sharded

        recipe = ModelRecipe.of(loaded, device=config.device, context_length=config.context_length,
                                trust_remote_code=config.trust_remote_code)
        slurm = config.slurm or SlurmOptions()  # Slurm jobs' logs in <out>/.slurm (hidden: not report files)
        slurm = slurm.at(Path(out).absolute() / ".slurm") if out is not None else slurm
        tokens = extract_sharded(recipe, inputs, reps, workers=config.workers, executor=config.executor,
                                 address=config.address, batch_size=config.batch_size, seed=config.seed,
                                 loaded=loaded, progress=progress, slurm=slurm)
    else:
        tokens = extract(loaded, inputs, reps, batch_size=config.batch_size, seed=config.seed, progress=progress)
    items = [TokenItem(rep, tok.queries, tok.contexts, tok.n, tok.meta, tok) for rep, tok in tokens.items()]
    return TokenGroup(loaded.weights, items, digest, first, stage=extraction_stage(loaded.weights))


def model_groups(config: AuditConfig, spec: Any, out: Path | None, progress: bool) -> Iterator[TokenGroup]:
    """Per weights source: load the model, extract every representation (in passes that fit the memory
    budget), let the model go."""
    from auditor.models import WeightsUnavailable, load_model
    from auditor.models.base import weights_kind

    for weights, reps in by_weights(config).items():
        try:
            loaded = load_model(spec.name, weights, device=config.device, seed=config.seed,
                                context_length=config.context_length, trust_remote_code=config.trust_remote_code,
                                dtype=config.dtype, query=config.query, bos=config.bos)
        except WeightsUnavailable as err:
            shape = architecture(spec, weights, weights_kind(weights), config.context_length)
            planned = config.layer_representations(reps, shape[2]) if shape is not None else reps
            yield TokenGroup(weights, [], "", skipped=f"weights unavailable: {err}", representations=planned,
                             stage=extraction_stage(weights))
            continue
        reps = config.layer_representations(reps, loaded.num_layers)  # the block count of e.g. timm: known now
        check_shapes(config, n=loaded.n, d=loaded.d, layers=loaded.num_layers, reps=reps)
        yield from token_groups(loaded, reps, config, out, progress)
        del loaded


def object_groups(config: AuditConfig, loaded: Any, out: Path | None, progress: bool) -> Iterator[TokenGroup]:
    """The one group of a model object, extracted in eval mode (the object's own mode restored after)."""
    from auditor.models.from_object import evaluating

    reps = config.layer_representations(by_weights(config)[loaded.weights], loaded.num_layers)
    with evaluating(loaded.model):
        yield from token_groups(loaded, reps, config, out, progress)


