"""Extracted tokens of one representation, and their file format (``--save-tokens``).

A :class:`Tokens` holds, for N examples, the context matrices E(t) (``contexts: (N, n, d)``) and the
query vectors e(t) (``queries: (N, d)``; for self-attention models the query row of the context), plus
``meta``: how they were made (model, representation, weights, dtype, device, data, tokenizer, seed...).

File format: one safetensors file with the tensors ``contexts`` and ``queries`` and ``meta`` as its
string metadata (plus ``format``). safetensors never executes code when read, so a token file from
anyone is safe to open; :meth:`Tokens.load` checks everything a rank test relies on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from auditor.errors import AuditError

FORMAT = "attention-auditor-tokens/1"
META_KEYS = (
    "model",
    "representation",
    "layer",
    "weights",
    "dtype",
    "device",
    "data_source",
    "tokenizer",
    "query_index",
    "n",
    "d",
    "seed",
)


def _check(contexts: torch.Tensor, queries: torch.Tensor, where: str) -> None:
    """Shapes (N, n, d) / (N, d), same N and d, floating, finite; else AuditError naming ``where``."""
    if contexts.ndim != 3:
        raise AuditError(f"{where}: contexts must be (N, n, d); got shape {tuple(contexts.shape)}")
    if queries.ndim != 2:
        raise AuditError(f"{where}: queries must be (N, d); got shape {tuple(queries.shape)}")
    (num, _, d), (num_q, d_q) = contexts.shape, queries.shape
    if (num, d) != (num_q, d_q):
        raise AuditError(
            f"{where}: contexts {tuple(contexts.shape)} and queries {tuple(queries.shape)} disagree on N or d"
        )
    if not (contexts.dtype.is_floating_point and queries.dtype.is_floating_point):
        raise AuditError(f"{where}: tokens must be floating point; got {contexts.dtype}, {queries.dtype}")


@dataclass(frozen=True)
class Tokens:
    """Context matrices and query vectors of N examples for one representation."""

    contexts: torch.Tensor  # (N, n, d), on CPU, dtype as produced
    queries: torch.Tensor  # (N, d); contexts[:, query_index] for self-attention models
    meta: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check(self.contexts, self.queries, "Tokens")
        bad = [k for k, v in self.meta.items() if not (isinstance(k, str) and isinstance(v, str))]
        if bad:
            raise AuditError(f"Tokens.meta must map str to str; bad keys: {bad}")

    @property
    def N(self) -> int:  # noqa: N802 - the paper's name for the number of examples
        return int(self.contexts.shape[0])

    @property
    def n(self) -> int:
        return int(self.contexts.shape[1])

    @property
    def d(self) -> int:
        return int(self.contexts.shape[2])

    @property
    def query_index(self) -> int | None:
        """Row of the context that is the query (None for cross-attention tokens)."""
        value = self.meta.get("query_index", "")
        return int(value) if value.lstrip("-").isdigit() else None

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write a safetensors file (atomically: a reader never sees a partial file)."""
        from safetensors.torch import save_file

        from auditor.atomic import temporary_path

        path = Path(path)
        tensors = {"contexts": self.contexts.contiguous().cpu(), "queries": self.queries.contiguous().cpu()}
        tmp = temporary_path(path)
        try:
            save_file(tensors, str(tmp), metadata={**self.meta, "format": FORMAT})
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Tokens:
        """Read a token file; an unreadable, incomplete, inconsistent or non-finite file is an AuditError."""
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise AuditError(f"token file {str(path)!r} does not exist")
        try:
            with safe_open(str(path), framework="pt", device="cpu") as fh:
                keys = set(fh.keys())
                missing = {"contexts", "queries"} - keys
                if missing:
                    raise AuditError(f"{path}: not a token file: missing tensor(s) {sorted(missing)}")
                meta = dict(fh.metadata() or {})
                contexts, queries = fh.get_tensor("contexts"), fh.get_tensor("queries")
        except AuditError:
            raise
        except Exception as err:  # noqa: BLE001 - safetensors raises its own error types for corrupt files
            raise AuditError(
                f"{path}: not a readable safetensors token file ({type(err).__name__})"
            ) from None
        _check(contexts, queries, str(path))
        if meta.get("format", FORMAT) != FORMAT:
            raise AuditError(f"{path}: unsupported token file format {meta['format']!r}; expected {FORMAT}")
        for name, tensor in (("contexts", contexts), ("queries", queries)):
            if not bool(torch.isfinite(tensor).all()):
                raise AuditError(f"{path}: {name} contain NaN or infinite values")
        meta.pop("format", None)
        for key, size in (("n", contexts.shape[1]), ("d", contexts.shape[2])):
            if key in meta and meta[key] != str(size):
                raise AuditError(f"{path}: metadata says {key}={meta[key]} but the tensors have {key}={size}")
        return cls(contexts=contexts, queries=queries, meta=meta)
