"""Where an audit's tokens come from, and the checks made before any of them is produced.

A source yields :class:`TokenGroup` s, each the tokens of one weights source with the fingerprint of the
data they were made from (resume reuses a row only on equal fingerprints):

- a model named by string: per weights source, load the model, read the inputs, extract every
  representation, let the model go (:func:`model_groups`);
- a model object the caller holds (:func:`object_groups`);
- token files written by ``--save-tokens`` (:func:`read_token_files`), or tensors (``audit_tokens``).

The ``check_*`` functions validate a configuration against the model's architecture read from its
configuration alone: nothing there loads weights or touches the report folder, so a mistake costs
nothing and never disturbs an earlier run's files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import probes
from auditor.assumptions import ASSUMPTION_TESTS
from auditor.config import MAX_DEFAULT_SAMPLES, AuditConfig
from auditor.errors import AuditError
from auditor.execution import check_executor
from auditor.tokens import Tokens

__all__ = ["MAX_DEFAULT_SAMPLES", "Row", "TokenGroup", "TokenItem", "check_model_options", "check_object_options",
           "check_shapes", "extraction_stage", "fingerprint", "model_groups", "object_groups", "plan",
           "read_token_files"]
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")  # a representation name that is no path


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
            check_shapes(config, n=n, d=d, layers=layers, reps=reps)


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
        from auditor.extract import parse_representation

        for rep in reps:
            parse_representation(rep, layers)
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
    check_shapes(config, n=loaded.n, d=loaded.d, layers=loaded.num_layers, reps=planned[loaded.weights])


def read_token_files(config: AuditConfig) -> list[TokenGroup]:
    """The token files of ``config.tokens``, checked, one group each."""
    given = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    unused = [name for name in ("data", "samples", "first", "context_length", "save_tokens", "representations",
                                "weights", "trust_remote_code") if given[name] != defaults[name]]
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
    contexts: torch.Tensor | None  # (N, n, d); None when only queries are held
    n: int
    meta: Mapping[str, str]
    tokens: Tokens | None = None  # what --save-tokens writes


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
    """Inputs for ``loaded``, the tokens of ``reps`` extracted from them, and the inputs' fingerprint."""
    from auditor.extract import extract

    inputs, first = load_inputs_for(loaded, config, out, progress)
    if config.sweep and config.sweep_ks and max(config.sweep_ks) > inputs.N:
        raise AuditError(f"sweep k = {max(config.sweep_ks)} exceeds the N = {inputs.N} examples loaded; "
                         f"valid: 1 <= k <= {inputs.N} (or load more with --samples)")
    digest = fingerprint(sorted(inputs.tensors.items()))
    if config.workers > 1:  # shard extraction across processes / Ray workers; tokens are identical
        from auditor.shard import ModelRecipe, extract_sharded

        recipe = ModelRecipe.of(loaded, device=config.device, context_length=config.context_length,
                                trust_remote_code=config.trust_remote_code)
        tokens = extract_sharded(recipe, inputs, reps, workers=config.workers, executor=config.executor,
                                 address=config.address, batch_size=config.batch_size, seed=config.seed,
                                 loaded=loaded, progress=progress)
    else:
        tokens = extract(loaded, inputs, reps, batch_size=config.batch_size, seed=config.seed, progress=progress)
    items = [TokenItem(rep, tok.queries, tok.contexts, tok.n, tok.meta, tok) for rep, tok in tokens.items()]
    return TokenGroup(loaded.weights, items, digest, first, stage=extraction_stage(loaded.weights))


def model_groups(config: AuditConfig, spec: Any, out: Path | None, progress: bool) -> Iterator[TokenGroup]:
    """Per weights source: load the model, extract every representation, let the model go."""
    from auditor.models import WeightsUnavailable, load_model

    for weights, reps in by_weights(config).items():
        try:
            loaded = load_model(spec.name, weights, device=config.device, seed=config.seed,
                                context_length=config.context_length, trust_remote_code=config.trust_remote_code)
        except WeightsUnavailable as err:
            yield TokenGroup(weights, [], "", skipped=f"weights unavailable: {err}", representations=reps,
                             stage=extraction_stage(weights))
            continue
        check_shapes(config, n=loaded.n, d=loaded.d, layers=loaded.num_layers, reps=reps)  # e.g. timm
        group = extracted(loaded, reps, config, out, progress)
        del loaded
        yield group


def object_groups(config: AuditConfig, loaded: Any, out: Path | None, progress: bool) -> Iterator[TokenGroup]:
    """The one group of a model object, extracted in eval mode (the object's own mode restored after)."""
    from auditor.models.from_object import evaluating

    with evaluating(loaded.model):
        group = extracted(loaded, by_weights(config)[loaded.weights], config, out, progress)
    yield group


