"""Streamed contexts: the tests of an audit whose context matrices do not fit in memory.

The Kruskal tests need only the (N, d) queries and, for Assumption 3, the (N, d) context means;
Assumption 2 and the collapse residual need each context once. A :class:`ContextReducer` therefore
takes the contexts chunk by chunk as they are extracted and keeps, per representation, only

- the per-context ranks, margins and bounds of Assumption 2 (:func:`probes.context_ranks`),
- the float64 context means (Assumption 3 tests e(t) + mean E(t)),
- the per-context collapse residuals of the token geometry,

then drops the chunk: memory is bounded by the chunk and the (N, d) arrays, not by N x n x d.

The rows equal those of the in-memory path bit for bit: every per-context quantity comes from the same
probes call on the same blocks of contexts (each reduction is fed the blocks its in-memory call would
cut, see :class:`_Aligned`), and each test's streamed form (its declaration in
:mod:`auditor.audit.report.catalogue`) forms its verdict from them with probes' public API, as its
in-memory form would. Assumption 2's tolerance analysis (critical tolerance, tolerance grid, exact smallest
margin) revisits a few contexts chosen only once every context is decided, so the contexts are also
written to a token file as they stream (the ``--save-tokens`` file when asked, else a temporary file
removed after the tests) and those few are read back from it.
"""

from __future__ import annotations

import os
import tempfile
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import probes
from auditor.audit.assumptions import ASSUMPTION_TESTS, RunOptions
from auditor.audit.tokens import ContextFile, TokenWriter
from auditor.core.errors import AuditError
from probes import robust
from probes.geometry import collapse_residual, residual_block

__all__ = ["ContextReducer", "StreamedContexts", "chunk_examples"]


def chunk_examples(num: int, batch_size: int, bytes_per_example: int, budget: int) -> int:
    """Examples per chunk: whole batches whose tokens (``bytes_per_example`` each, every representation
    of the pass) fill at most half of ``budget`` bytes (the rest is left to the reductions and the (N, d)
    arrays), at least one batch, at most all ``num``."""
    batches = max(1, (budget // 2) // max(1, batch_size * bytes_per_example))
    return min(num, batches * batch_size)


class _Aligned:
    """Feeds ``reduce`` the consecutive blocks of ``block`` contexts that one call on all N contexts would
    cut (the probes functions work block by block), whatever the chunks that arrive: rows that do not
    fill a block wait for the next chunk (at most ``block - 1`` are held)."""

    def __init__(self, block: int, reduce: Callable[[torch.Tensor], None]) -> None:
        self.block, self.reduce = block, reduce
        self.pending: torch.Tensor | None = None  # (r, n, d), r < block

    @property
    def held(self) -> int:
        return 0 if self.pending is None else int(self.pending.shape[0])

    def feed(self, contexts: torch.Tensor) -> None:
        """contexts: (b, n, d), the next b examples."""
        rows = contexts if self.pending is None else torch.cat([self.pending, contexts])  # (r + b, n, d)
        whole = rows.shape[0] // self.block * self.block
        if whole:
            self.reduce(rows[:whole])
        self.pending = rows[whole:].clone() if whole < rows.shape[0] else None

    def finish(self) -> None:
        if self.pending is not None:
            self.reduce(self.pending)
            self.pending = None


@dataclass(eq=False)
class StreamedContexts:
    """What the tests need of the N contexts (N, n, d) of one representation, reduced as they streamed.

    Attributes:
        shape: (N, n, d); dtype, device: of the contexts as the tests saw them.
        ranks: Assumption 2's per-context ranks (None when it is not among the tests).
        means: (N, d) float64 context means (None without Assumption 3).
        residuals: (N,) float64 per-context collapse residuals (None when not asked).
        file: the contexts on disk, for Assumption 2's tolerance analysis (None when not needed).
        chunk: examples per extracted chunk; largest: the most contexts held at once (a chunk and the
            rows waiting for a block).
        seconds: time spent on each reduction while streaming (``ranks``, ``means``, ``geometry``, ``file``).
    """

    shape: tuple[int, int, int]
    dtype: torch.dtype
    device: torch.device
    ranks: probes.ContextRanks | None
    means: torch.Tensor | None
    residuals: torch.Tensor | None
    file: ContextFile | None
    chunk: int
    largest: int
    seconds: dict[str, float] = field(default_factory=dict)
    _cleanup: Any = None  # removes a temporary file once the tests are done (or this is collected)

    def release(self) -> None:
        """Remove the temporary contexts file (a saved token file stays)."""
        if self._cleanup is not None:
            self._cleanup()

    def mixed(self, queries: torch.Tensor) -> torch.Tensor:
        """The vectors Assumption 3 tests: e(t) + mean of the rows of E(t), float64 (N, d)."""
        return queries.to(torch.float64) + self.means

    def collapse_residual(self) -> float | None:
        """The mean collapse residual over the contexts, as :func:`probes.geometry.token_geometry` sums it."""
        if self.residuals is None:
            return None
        total = 0.0
        total += float(self.residuals.sum())
        return total / self.residuals.numel()

    def run(self, name: str, queries: torch.Tensor, n: int, options: RunOptions) -> tuple[Any, Any]:
        """Test ``name`` by its streamed form (a test of the queries alone by its one form): the verdict its
        in-memory form gives on the full contexts."""
        test = ASSUMPTION_TESTS[name]
        if test.needs_contexts:
            return test.streamed(self, queries, n, options)
        return test.run(None, queries, n, options)

    def matrices(self) -> robust.Matrices:
        """The contexts as :func:`probes.robust.context_matrices` gives them, read from the file on demand."""
        num, k, d = self.shape
        return robust.context_reader(num, k, d, self.file.read, self.device)


class ContextReducer:
    """Reduces one representation's contexts chunk by chunk to a :class:`StreamedContexts`.

    Args:
        num, n, d: the shape (N, n, d) of all the contexts to come; dtype: theirs (not float64, whose
            rescaling for Assumption 3 needs every context at once).
        device: where the tests run (each chunk is moved there, as the in-memory path moves all).
        tests: the audit's tests (which reductions to make); rtol, robustness: the audit's.
        geometry: compute the collapse residuals (the token geometry of every row).
        save: write the contexts to this token file (``--save-tokens``); None: a temporary file, and
            only when Assumption 2's tolerance analysis needs one.
        chunk: examples per chunk (for the record).
    """

    def __init__(self, num: int, n: int, d: int, dtype: torch.dtype, device: torch.device, *,
                 tests: tuple[str, ...], rtol: float | None, robustness: bool | str, geometry: bool,
                 save: Path | None, chunk: int) -> None:
        if dtype == torch.float64:
            raise ValueError("float64 contexts are tested in memory (Assumption 3 rescales them all at once)")
        self.shape, self.dtype, self.device, self.rtol, self.chunk = (
            (num, n, d),
            dtype,
            torch.device(device),
            rtol,
            chunk,
        )
        self.rows = self.largest = 0
        self.seconds: dict[str, float] = {}
        self.save = save
        reductions = {kept for test in tests for kept in ASSUMPTION_TESTS[test].reduces}
        self.spill = save is not None or ("ranks" in reductions and robustness and n <= d)
        self.writer: TokenWriter | None = None
        # the (N, d) arrays are allocated whole once, and each chunk's rows written in place: a list of
        # per-chunk blocks scattered among the extraction's temporaries kept the heap from shrinking
        # (the resident set grew by about 0.1 GB per 1,000 examples at ViT-base)
        self.queries: torch.Tensor | None = torch.empty((num, d), dtype=dtype)  # (N, d), as the contexts
        self.means: torch.Tensor | None = (
            torch.empty((num, d), dtype=torch.float64, device=self.device) if "means" in reductions else None
        )
        self.ranks: list[probes.ContextRanks] | None = None
        self.residuals: list[torch.Tensor] | None = None
        self.aligned: list[_Aligned] = []
        if "ranks" in reductions:
            self.ranks = []
            self.aligned.append(_Aligned(probes.context_block(n, d), self._ranks))
        if geometry:
            self.residuals = []
            self.aligned.append(_Aligned(residual_block(n, d), self._residuals))

    def _timed(self, what: str, begin: float) -> None:
        self.seconds[what] = self.seconds.get(what, 0.0) + time.perf_counter() - begin

    def _ranks(self, block: torch.Tensor) -> None:
        begin = time.perf_counter()
        self.ranks.append(probes.context_ranks(block, rtol=self.rtol))
        self._timed("ranks", begin)

    def _residuals(self, block: torch.Tensor) -> None:
        begin = time.perf_counter()
        self.residuals.append(collapse_residual(block))  # (b,)
        self._timed("geometry", begin)

    def add(self, contexts: torch.Tensor, queries: torch.Tensor, meta: Mapping[str, str]) -> None:
        """The next chunk: contexts (b, n, d) and queries (b, d) on the CPU, with the tokens' metadata."""
        size = int(contexts.shape[0])
        if self.rows + size > self.shape[0]:
            self.abort()
            raise RuntimeError(f"more than the N = {self.shape[0]} contexts announced were streamed")
        if self.spill:
            begin = time.perf_counter()
            try:
                if self.writer is None:
                    self.writer = self._open(dict(meta))
                self.writer.write(contexts)
            except OSError as err:
                self.abort()  # the unfinished file and its temporary name are removed
                raise self._write_error(err) from None
            self._timed("file", begin)
        self.queries[self.rows : self.rows + size] = queries
        on_device = contexts.to(self.device)  # (b, n, d)
        self.largest = max(self.largest, size + sum(a.held for a in self.aligned))
        if self.means is not None:
            begin = time.perf_counter()
            self.means[self.rows : self.rows + size] = probes.context_means(on_device)
            self._timed("means", begin)
        for aligned in self.aligned:
            aligned.feed(on_device)
        self.rows += size

    def _open(self, meta: dict[str, str]) -> TokenWriter:
        num, n, d = self.shape
        if self.save is not None:
            return TokenWriter(self.save, num, n, d, self.dtype, meta)
        folder = Path(tempfile.gettempdir())
        fd, name = tempfile.mkstemp(dir=folder, prefix="auditor-contexts-", suffix=".safetensors")
        os.close(fd)
        try:
            return TokenWriter(name, num, n, d, self.dtype, meta)
        except BaseException:
            Path(name).unlink(missing_ok=True)
            raise

    def _write_error(self, err: OSError) -> AuditError:
        """One line for a failed write of the contexts' file: which file, why, and what to do."""
        num, n, d = self.shape
        size = num * n * d * self.dtype.itemsize / 2**30
        reason = err.strerror or str(err)
        if self.save is not None:
            return AuditError(f"cannot write the token file {self.save} ({reason}; it takes {size:.2f} GiB); "
                              "free space there or choose another --out (nothing was left behind)")
        return AuditError(
            f"cannot write the contexts' temporary file in {tempfile.gettempdir()} ({reason}; it takes "
            f"{size:.2f} GiB, for Assumption 2's tolerance analysis); free space there, set TMPDIR to a "
            "folder with room, or use --no-robustness (nothing was left behind)"
        )

    def abort(self) -> None:
        """Drop everything, an unfinished file included."""
        if self.writer is not None:
            self.writer.abort()
            if self.save is None:
                self.writer.path.unlink(missing_ok=True)

    def finish(self) -> tuple[torch.Tensor, StreamedContexts]:
        """(queries (N, d) on the CPU, what the tests need of the contexts); saves the token file."""
        num, n, d = self.shape
        if self.rows != num:
            self.abort()
            raise RuntimeError(f"{self.rows} contexts streamed but N = {num} announced")
        for aligned in self.aligned:
            aligned.finish()
        queries, self.queries = self.queries, None  # (N, d)
        file, cleanup = None, None
        if self.writer is not None:
            begin = time.perf_counter()
            try:
                self.writer.finish(queries)
            except OSError as err:
                self.abort()
                raise self._write_error(err) from None
            self._timed("file", begin)
            file = self.writer.contexts_file()
            if self.save is None:
                cleanup = weakref.finalize(file, Path(file.path).unlink, missing_ok=True)
        ranks = None if self.ranks is None else probes.ContextRanks.concat(self.ranks)
        streamed = StreamedContexts(
            shape=(num, n, d), dtype=self.dtype, device=self.device, ranks=ranks,
            means=self.means,
            residuals=None if self.residuals is None else torch.cat(self.residuals),
            file=file, chunk=self.chunk, largest=self.largest, seconds=dict(self.seconds), _cleanup=cleanup)
        return queries, streamed


def streamed_note(chunks: list[int]) -> str:
    """One line for the report's config.json: how the contexts were streamed."""
    return (f"streamed in chunks of at most {max(chunks)} examples (the tokens exceed the memory budget); "
            "the rows are those of the in-memory audit")
