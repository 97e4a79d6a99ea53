"""Token extraction: run a model over the inputs once and keep the representations asked for.

Representations (one name each, used identically in the CLI, CSV columns and plots):

- ``embedding``: what enters the first block, token/patch embeddings with positions (``hidden_states[0]``).
- ``random-attention``: ``embedding`` passed through ONE random single-head self-attention layer with a
  skip connection, the layer paper A (Section 5.1) uses to show that attention mixing makes Assumption 1
  hold: with X = LayerNorm(E) (no affine) and seeded Gaussian d x d matrices of variance 1/d,
  ``E + softmax(X W_Q (X W_K)^T / sqrt(d)) X W_V W_O``. The residual is added to the un-normalised E and
  the variance matches the Xavier initialisation of the authors' layer (their notebook, read for facts).
- ``block.L``: the output of transformer block L (``hidden_states[L + 1]``); ``block.-1`` is the last.

Forward hooks are attached inside a context manager and always removed; the deepest hook raises a
private exception, so the forward pass stops right after the last block needed (``embedding`` alone
runs no block at all).

Memory: one representation's tokens take N x (n + 1) x d values (contexts and queries). When every
requested representation fits in the memory budget they come from ONE forward pass; otherwise
:func:`plan_passes` splits them by depth into consecutive groups that each fit, and the caller extracts,
tests and releases one group before the next (each pass re-runs the blocks below its deepest one, and
stops there). A pass yields exactly the tokens a single pass would: the same forward on the same batches.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from auditor.audit.report.catalogue import block_index, block_name, representation_depth
from auditor.audit.tokens import Tokens
from auditor.core.errors import AuditError
from auditor.data import Inputs
from auditor.models.base import LoadedModel, dtype_name

EMBEDDING = "embedding"
RANDOM_ATTENTION = "random-attention"


@dataclass(frozen=True)
class Representation:
    """A validated representation name; ``block`` is the block index for ``block.L``."""

    name: str  # canonical: "embedding", "random-attention", "block.3"
    kind: str  # "embedding" | "random-attention" | "block"
    block: int | None = None

    @property
    def layer(self) -> str:
        """Where the tokens come from, in Hugging Face's hidden_states numbering."""
        if self.kind == "block":
            return f"hidden_states[{self.block + 1}]"
        if self.kind == RANDOM_ATTENTION:
            return "random attention on hidden_states[0]"
        return "hidden_states[0]"


def parse_representation(name: str, num_layers: int) -> Representation:
    """Validate a representation name for a model of ``num_layers`` blocks (negatives count from the end)."""
    valid = (f"valid: {EMBEDDING}, {RANDOM_ATTENTION}, block.0 .. block.{num_layers - 1}" if num_layers > 0
             else f"valid: {EMBEDDING}, {RANDOM_ATTENTION} (the model has no blocks)")
    text = str(name).strip()
    if text in (EMBEDDING, RANDOM_ATTENTION):
        return Representation(text, text)
    index = block_index(text)
    if index is None:
        close = difflib.get_close_matches(text, [EMBEDDING, RANDOM_ATTENTION, "block.0"], n=2, cutoff=0.6)
        hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
        raise AuditError(f"unknown representation {text!r}; {hint}{valid}")
    resolved = index + num_layers if index < 0 else index
    if not 0 <= resolved < num_layers:
        raise AuditError(
            f"representation {text!r} is out of range: the model has {num_layers} blocks; {valid}"
        )
    return Representation(block_name(resolved), "block", resolved)


# ---------------------------------------------------------------------------------------------------
# Memory: how many representations one forward pass may hold
# ---------------------------------------------------------------------------------------------------


def token_bytes(num: int, n: int, d: int, dtype: torch.dtype) -> int:
    """Bytes one representation's tokens take: contexts (N, n, d) and queries (N, d) in ``dtype``."""
    return num * (n + 1) * d * torch.empty((), dtype=dtype).element_size()


def available_memory() -> int:
    """Bytes of memory available to this process now (Linux ``MemAvailable``, else the free pages)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def plan_passes(
    representations: Sequence[str], num_layers: int, bytes_each: int, budget: int
) -> list[list[str]]:
    """The forward passes that extract ``representations`` holding at most ``budget`` bytes of tokens.

    Everything in one pass (in the order given) when it fits; otherwise the canonical names sorted by
    depth and cut into consecutive groups of at most ``budget // bytes_each`` (at least one each: a
    representation larger than the budget gets a pass of its own).
    """
    names = list(dict.fromkeys(parse_representation(r, num_layers).name for r in representations))
    per_pass = max(1, budget // max(1, bytes_each))
    if len(names) <= per_pass:
        return [names]
    names.sort(key=representation_depth)  # stable: random-attention stays beside the embedding
    return [names[i : i + per_pass] for i in range(0, len(names), per_pass)]


# ---------------------------------------------------------------------------------------------------
# The random attention layer
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RandomAttention:
    """A fixed random single-head self-attention layer with a skip connection (weights (d, d) each)."""

    w_q: torch.Tensor
    w_k: torch.Tensor
    w_v: torch.Tensor
    w_o: torch.Tensor
    eps: float = 1e-5  # torch.nn.LayerNorm's default, as in the authors' layer

    @classmethod
    def create(cls, d: int, seed: int, device: torch.device, dtype: torch.dtype) -> RandomAttention:
        """Gaussian weights of variance 1/d drawn on the CPU from ``seed`` (same on every device)."""
        gen = torch.Generator().manual_seed(seed)
        w_q, w_k, w_v, w_o = (torch.randn(d, d, generator=gen) / math.sqrt(d) for _ in range(4))
        return cls(*(w.to(device=device, dtype=dtype) for w in (w_q, w_k, w_v, w_o)))

    def __call__(self, embedding: torch.Tensor) -> torch.Tensor:
        """embedding: (B, n, d) -> (B, n, d)."""
        d = embedding.shape[-1]
        x = F.layer_norm(embedding, (d,), eps=self.eps)  # (B, n, d), no affine
        q, k, v = x @ self.w_q, x @ self.w_k, x @ self.w_v  # (B, n, d) each
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)  # (B, n, n)
        weights = scores.float().softmax(dim=-1).to(embedding.dtype)  # (B, n, n), rows in the simplex
        return embedding + (weights @ v) @ self.w_o  # (B, n, d)


# ---------------------------------------------------------------------------------------------------
# Hooks
# ---------------------------------------------------------------------------------------------------


class _StopForward(Exception):  # noqa: N818 - a control-flow signal, not an error
    """Raised by the deepest hook: everything needed has been captured."""


@contextlib.contextmanager
def capture(
    blocks: Sequence[nn.Module], embedding: bool, block_indices: Sequence[int]
) -> Iterator[dict[str, torch.Tensor]]:
    """Hooks that store ``embedding`` (input of block 0) and ``block.L`` outputs in the yielded dict.

    The forward pass is stopped (by :class:`_StopForward`, caught by :func:`run_until_captured`) after
    the deepest requested block, or before block 0 when only the embedding is wanted. The hooks are
    removed on exit, also when the body raises.
    """
    store: dict[str, torch.Tensor] = {}
    deepest = max(block_indices, default=-1)
    handles = []

    def embedding_hook(module, args, kwargs):
        store[EMBEDDING] = args[0] if args else kwargs["hidden_states"]
        if deepest < 0:
            raise _StopForward

    def block_hook(index: int):
        def hook(module, args, output):
            store[block_name(index)] = output[0] if isinstance(output, tuple | list) else output
            if index == deepest:
                raise _StopForward

        return hook

    try:
        if embedding or deepest < 0:
            handles.append(blocks[0].register_forward_pre_hook(embedding_hook, with_kwargs=True))
        for index in sorted(set(block_indices)):
            handles.append(blocks[index].register_forward_hook(block_hook(index)))
        yield store
    finally:
        for handle in handles:
            handle.remove()


def run_until_captured(loaded: LoadedModel, batch: dict[str, torch.Tensor]) -> None:
    """One forward pass of ``loaded`` on ``batch``, stopped by the deepest hook."""
    with contextlib.suppress(_StopForward):
        loaded.adapter.forward(loaded.model, batch)


# ---------------------------------------------------------------------------------------------------
# Extraction
# ---------------------------------------------------------------------------------------------------


def _to_device(batch: dict[str, torch.Tensor], loaded: LoadedModel) -> dict[str, torch.Tensor]:
    return {
        k: v.to(loaded.device, loaded.dtype) if v.is_floating_point() else v.to(loaded.device)
        for k, v in batch.items()
    }


def _weights_source(loaded: LoadedModel) -> str:
    """Where the weights were read from, as the user named it: an installed copy found by the tool is named
    after what it is a copy of, not by this machine's absolute path."""
    source = str(loaded.details.get("weights_source", ""))
    if loaded.weights == "pretrained" and Path(source).is_absolute():
        return f"installed copy of {loaded.spec.source}"
    return source


def extract(
    loaded: LoadedModel,
    inputs: Inputs,
    representations: Sequence[str],
    *,
    batch_size: int = 32,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Tokens]:
    """Tokens of every requested representation, in one pass over ``inputs``.

    Returns ``{name: Tokens}`` with contexts (N, n, d) on the CPU in the model's dtype and queries
    (N, d) = contexts[:, query_index]. ``seed`` draws the random attention layer's weights.
    """
    reps = _requested(loaded, inputs, representations, batch_size)
    num, n, d = inputs.N, loaded.n, loaded.d
    need_embedding = any(r.kind in (EMBEDDING, RANDOM_ATTENTION) for r in reps)
    block_indices = sorted({r.block for r in reps if r.kind == "block"})
    mixer = (
        RandomAttention.create(d, seed, loaded.device, loaded.dtype)
        if any(r.kind == RANDOM_ATTENTION for r in reps)
        else None
    )
    out = {r.name: torch.empty((num, n, d), dtype=loaded.dtype) for r in reps}  # (N, n, d) each, CPU
    loaded.adapter.prepare(loaded.model, max(block_indices, default=-1))  # families built block by block
    blocks = loaded.adapter.blocks(loaded.model)
    row = 0
    bar = tqdm(total=num, disable=not progress, desc=f"extract {loaded.name}", unit="ex")
    with torch.inference_mode(), capture(blocks, need_embedding, block_indices) as store, bar:
        for batch in inputs.batches(batch_size):
            batch = _to_device(batch, loaded)
            size = next(iter(batch.values())).shape[0]
            store.clear()
            run_until_captured(loaded, batch)
            for rep in reps:
                if rep.kind == RANDOM_ATTENTION:
                    tokens = mixer(store[EMBEDDING])
                else:
                    tokens = store[rep.name]
                if tuple(tokens.shape) != (size, n, d):
                    raise RuntimeError(
                        f"{rep.name}: got tokens {tuple(tokens.shape)}, expected {(size, n, d)}"
                    )
                out[rep.name][row : row + size].copy_(tokens)
            row += size
            bar.update(size)
    if row != num:
        raise RuntimeError(f"the inputs yielded {row} examples but announced N = {num}")
    meta = _meta(loaded, inputs, seed)
    return {rep.name: Tokens(contexts=out[rep.name], queries=_queries(loaded, out[rep.name]),
                             meta={**meta, "representation": rep.name, "layer": rep.layer}) for rep in reps}


def _requested(loaded: LoadedModel, inputs: Inputs, representations: Sequence[str],
               batch_size: int) -> list[Representation]:
    """The representations asked of :func:`extract`, parsed and without repeats; its arguments checked."""
    reps = list(
        {r.name: r for r in (parse_representation(x, loaded.num_layers) for x in representations)}.values()
    )
    if not reps:
        raise AuditError(f"no representation requested; valid: {EMBEDDING}, {RANDOM_ATTENTION}, block.<L>")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise AuditError(f"batch_size must be a positive integer; got {batch_size!r}")
    if inputs.n != loaded.n:
        raise AuditError(
            f"the inputs hold {inputs.n} tokens per example but {loaded.name} uses n = {loaded.n}"
        )
    return reps


def _queries(loaded: LoadedModel, contexts: torch.Tensor) -> torch.Tensor:
    """The query of every context (N, n, d) -> (N, d): the row ``query_index``, or the mean of the rows."""
    return contexts.mean(dim=1) if loaded.query == "mean" else contexts[:, loaded.query_index].clone()


def _meta(loaded: LoadedModel, inputs: Inputs, seed: int) -> dict[str, str]:
    """The metadata every token file of one extraction carries (representation and layer added per file)."""
    return {
        "model": loaded.name,
        "family": loaded.family,
        "modality": loaded.modality,
        "weights": loaded.weights,
        "weights_source": _weights_source(loaded),
        "dtype": dtype_name(loaded.dtype),
        "device": str(loaded.device),
        "data_source": inputs.data_source,
        "data_counts": json.dumps(dict(inputs.counts), sort_keys=True),
        "tokenizer": inputs.tokenizer,
        "query_index": "mean" if loaded.query == "mean" else str(loaded.query_index),
        "n": str(loaded.n),
        "d": str(loaded.d),
        "seed": str(seed),
        "model_seed": str(loaded.seed),
        **{key: str(loaded.details[key]) for key in ("weights_dtype",) if key in loaded.details},
    }
