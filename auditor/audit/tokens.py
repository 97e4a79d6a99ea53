"""Extracted tokens of one representation, and their file format (``--save-tokens``).

A :class:`Tokens` holds, for N examples, the context matrices E(t) (``contexts: (N, n, d)``) and the
query vectors e(t) (``queries: (N, d)``; for self-attention models the query row of the context), plus
``meta``: how they were made (model, representation, weights, dtype, device, data, tokenizer, seed...).

File format: one safetensors file with the tensors ``contexts`` and ``queries`` and ``meta`` as its
string metadata (plus ``format``). safetensors never executes code when read, so a token file from
anyone is safe to open; :meth:`Tokens.load` checks everything a rank test relies on.

A streamed audit never holds all contexts: :class:`TokenWriter` writes the same file chunk by chunk
(the header first, with the final shapes, then each chunk of contexts as it is extracted, the queries
last), and :class:`ContextFile` reads back the contexts of chosen examples without loading the rest.
A file written either way is read by :meth:`Tokens.load` and by any safetensors reader.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import torch

from auditor.core.errors import AuditError

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

        from auditor.core.atomic import temporary_path

        path = Path(path)
        tensors = {"contexts": self.contexts.contiguous().cpu(), "queries": self.queries.contiguous().cpu()}
        tmp = temporary_path(path)
        try:
            save_file(tensors, str(tmp), metadata={**self.meta, "format": FORMAT})
            os.replace(tmp, path)
        except BaseException as err:
            tmp.unlink(missing_ok=True)  # no half-written file, under its name or a temporary one
            if isinstance(err, Exception) and not isinstance(err, AuditError):  # safetensors' own error
                reason = _io_reason(err)
                raise AuditError(f"cannot write the token file {path} ({reason}); free space on its disk "
                                 "or choose another --out (nothing was left behind)") from None
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


def _io_reason(err: BaseException) -> str:
    """The reason of a failed write in words: the OS's message for an OSError or for the error code that
    safetensors quotes (``Os { code: 28, ... }``), else the error's first line."""
    import re

    if isinstance(err, OSError) and err.errno is not None:
        return err.strerror or os.strerror(err.errno)
    code = re.search(r"code: (\d+)", str(err))
    if code:
        return os.strerror(int(code.group(1)))
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


# ---------------------------------------------------------------------------------------------------
# Chunked files: written as the contexts are extracted, read back by example
# ---------------------------------------------------------------------------------------------------

_SAFETENSORS_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
}


class TokenWriter:
    """Writes a token file chunk by chunk: ``write(contexts)`` for consecutive chunks (b, n, d) of the N
    examples, then ``finish(queries)`` with the (N, d) queries. The file appears (atomically renamed into
    place) only when complete; :meth:`abort` (or an exception in between) leaves nothing behind.
    Byte layout: the safetensors header (the final shapes and ``meta``), contexts (N, n, d), queries (N, d).
    """

    def __init__(self, path: str | os.PathLike[str], num: int, n: int, d: int, dtype: torch.dtype,
                 meta: dict[str, str]) -> None:
        from auditor.core.atomic import temporary_path

        if dtype not in _SAFETENSORS_DTYPES:
            raise AuditError(
                f"tokens of dtype {dtype} cannot be saved; valid: {', '.join(map(str, _SAFETENSORS_DTYPES))}"
            )
        self.path, self.shape, self.dtype = Path(path), (num, n, d), dtype
        size = torch.empty((), dtype=dtype).element_size()
        self.context_bytes, self.row_bytes = num * n * d * size, n * d * size
        code = _SAFETENSORS_DTYPES[dtype]
        header = {"__metadata__": {**meta, "format": FORMAT},
                  "contexts": {"dtype": code, "shape": [num, n, d], "data_offsets": [0, self.context_bytes]},
                  "queries": {"dtype": code, "shape": [num, d],
                              "data_offsets": [self.context_bytes, self.context_bytes + num * d * size]}}
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
        self.data_start = 8 + len(text)
        self.rows = 0
        self.tmp = temporary_path(self.path)
        self._fh = open(self.tmp, "wb")  # noqa: SIM115 - closed by finish or abort
        try:
            self._fh.write(struct.pack("<Q", len(text)) + text)
        except BaseException:
            self.abort()  # a full disk at the header: no temporary file left behind
            raise

    def write(self, contexts: torch.Tensor) -> None:
        """Append the contexts (b, n, d) of the next b examples."""
        b, n, d = contexts.shape
        if (n, d) != self.shape[1:] or self.rows + b > self.shape[0] or contexts.dtype != self.dtype:
            raise ValueError(f"chunk {tuple(contexts.shape)} {contexts.dtype} does not continue tokens "
                             f"{self.shape} {self.dtype} at example {self.rows}")
        self._fh.write(contexts.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        self.rows += b

    def finish(self, queries: torch.Tensor) -> Path:
        """Write the queries (N, d), sync and rename the file into place; returns its path."""
        if self.rows != self.shape[0] or tuple(queries.shape) != (self.shape[0], self.shape[2]):
            self.abort()
            raise ValueError(
                f"token file {self.path}: {self.rows} of {self.shape[0]} contexts written, queries "
                f"{tuple(queries.shape)}"
            )
        try:
            self._fh.write(queries.detach().cpu().to(self.dtype).contiguous().reshape(-1).view(torch.uint8)
                           .numpy().tobytes())
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
            os.replace(self.tmp, self.path)
        except BaseException:
            self.abort()
            raise
        return self.path

    def abort(self) -> None:
        """Close and remove the unfinished file (closing flushes: on a full disk that fails too)."""
        try:
            if not self._fh.closed:
                self._fh.close()
        except OSError:
            pass  # the file is closed even so, and removed below
        finally:
            self.tmp.unlink(missing_ok=True)

    def contexts_file(self) -> ContextFile:
        """The finished file's contexts, read back by example."""
        if not self._fh.closed or self.tmp.exists():
            raise ValueError(f"token file {self.path} is not finished")
        return ContextFile(self.path, self.shape, self.dtype, self.data_start)


@dataclass(frozen=True)
class ContextFile:
    """Contexts (N, n, d) stored at byte ``offset`` of ``path`` (a token file's contexts), read by example."""

    path: Path
    shape: tuple[int, int, int]
    dtype: torch.dtype
    offset: int

    def read(self, positions: torch.Tensor) -> torch.Tensor:
        """The contexts of the examples at ``positions`` (c,), in that order: (c, n, d) on the CPU."""
        _, n, d = self.shape
        out = torch.empty((positions.numel(), n, d), dtype=self.dtype)  # (c, n, d)
        flat = out.view(positions.numel(), n * d).view(
            torch.uint8
        )  # (c, n d size): the bytes of each context
        size = flat.shape[1]
        with open(self.path, "rb", buffering=0) as fh:
            for row, index in enumerate(positions.tolist()):
                fh.seek(self.offset + index * size)
                if fh.readinto(memoryview(flat[row].numpy())) != size:
                    raise OSError(f"{self.path}: short read of context {index}")
        return out
