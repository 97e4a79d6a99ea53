"""Text -> windows of exactly n tokens, without padding, drawn at random (seeded) or taken from the start.

GPT-2 (``stream`` layout): the text is tokenized as one stream and cut into consecutive, non-overlapping
windows of n tokens. BERT (``pairs`` layout): ``[CLS] s1 [SEP] s2 [SEP]`` with s1 a sentence (cut to at
most half of the n - 3 text tokens) and s2 the text that follows it, cut so the total is exactly n; the
next pair starts at the next unused sentence. Every position is a real token, so padding can never
reach a rank test. Text is read in chunks cut at line breaks where the GPT-2 pre-tokenizer also breaks,
so chunked and whole-text tokenization agree while a large corpus is only read as far as needed.

Selection: with ``first=True`` the first windows are taken and reading stops there. Otherwise every window
of the source is made (at most ``POOL_TOKENS`` tokens are read from a larger one, and the label says so)
and a seeded uniform random subset is kept, in source order. Files must be UTF-8: a file with NUL bytes
or more than 1 % undecodable bytes is refused; fewer undecodable bytes become U+FFFD and are counted
(``undecodable_bytes``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from auditor.core.errors import AuditError
from auditor.data.feed import Fed, TextTokenizer
from auditor.data.inputs import HF_PREFIX, Inputs
from auditor.data.selection import left_out_note, random_order, visible_files

CHUNK_CHARS = 1 << 16
POOL_TOKENS = 1 << 23  # a random draw reads at most this many tokens (8.4 million) of a larger source
MAX_UNDECODABLE = 0.01  # share of a file's bytes that may be invalid UTF-8 before it is refused
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")
_ESCAPED = re.compile("[\udc80-\udcff]")  # bytes that are not UTF-8, as decoded by surrogateescape


def safe_cut(text: str, start: int, size: int) -> int:
    """End of a chunk beginning at ``start``: just after a newline that is not followed by more space
    (GPT-2's pre-tokenizer splits there too), at or after ``start + size``; ``len(text)`` if none."""
    pos = start + size
    while pos < len(text):
        cut = text.find("\n", pos)
        if cut < 0:
            return len(text)
        nxt = text[cut + 1 : cut + 3]
        if nxt and not nxt[0].isspace() or (nxt[:1] == " " and len(nxt) > 1 and not nxt[1].isspace()):
            return cut + 1
        pos = cut + 1
    return len(text)


def chunks(text: str, size: int = CHUNK_CHARS) -> Iterator[str]:
    """Consecutive pieces of ``text`` of about ``size`` characters, cut at safe line breaks."""
    start = 0
    while start < len(text):
        end = safe_cut(text, start, size)
        yield text[start:end]
        start = end


def read_text_file(path: Path, counts: dict[str, int]) -> str:
    """A UTF-8 text file; invalid bytes become U+FFFD and are counted in ``counts["undecodable_bytes"]``.

    A file with NUL bytes (binary, or UTF-16) or with more than 1 % invalid bytes is refused.
    """
    raw = path.read_bytes()
    if b"\x00" in raw:
        raise AuditError(
            f"{path} is not UTF-8 text (it contains NUL bytes: binary or UTF-16); text must be UTF-8"
        )
    text = raw.decode("utf-8-sig", errors="surrogateescape")
    bad = len(_ESCAPED.findall(text))
    if bad > MAX_UNDECODABLE * len(raw):
        raise AuditError(
            f"{path}: {bad} of its {len(raw)} bytes are not valid UTF-8; text must be UTF-8 "
            "(convert it first, e.g. iconv -f latin1 -t utf-8)"
        )
    counts["undecodable_bytes"] = counts.get("undecodable_bytes", 0) + bad
    return _ESCAPED.sub("\ufffd", text) if bad else text


def read_documents(
    data: str, counts: dict[str, int] | None = None, exclude: str | Path | None = None
) -> tuple[Iterator[str], str]:
    """Texts of a ``.txt`` file, a folder of them (sorted; never ``exclude`` nor an audit report) or
    ``hf:...`` rows, and a label of the source. Files are read lazily, as the caller consumes them."""
    counts = {} if counts is None else counts
    if data.startswith(HF_PREFIX):
        from auditor.data.hf import load_hf_dataset

        dataset, label = load_hf_dataset(data, "text", (".txt",), exclude)
        return _hf_documents(dataset), label
    path = Path(data).expanduser()
    if not path.exists():
        raise AuditError(
            f"text source {data!r} does not exist; give a .txt file, a folder of them or hf:<name>"
        )
    if path.is_file():
        return (read_text_file(p, counts) for p in [path]), f"{path} (text file)"
    files = visible_files(path, (".txt",), exclude)
    if not files:
        raise AuditError(f"no .txt files under {str(path)!r}" + left_out_note(path, (".txt",), exclude))
    return (read_text_file(p, counts) for p in files), f"{path} (folder, {len(files)} .txt files, sorted)"


def _hf_documents(dataset: Any) -> Iterator[str]:
    """Rows of the first string column joined by newlines into documents of about CHUNK_CHARS."""
    features = dataset.features or {}
    column = "text" if "text" in features else next((k for k, f in features.items() if _is_string(f)), None)
    if column is None:
        raise AuditError(f"the dataset has no text column (columns: {', '.join(features) or 'unknown'})")
    lines: list[str] = []
    size = 0
    for row in dataset:
        lines.append(row[column] or "")
        size += len(lines[-1]) + 1
        if size >= CHUNK_CHARS:
            yield "\n".join(lines) + "\n"
            lines, size = [], 0
    if lines:
        yield "\n".join(lines) + "\n"


def _is_string(feature: Any) -> bool:
    return getattr(feature, "dtype", None) in ("string", "large_string")


def _pieces(documents: Iterable[str]) -> Iterator[str]:
    for doc in documents:
        yield from chunks(doc if doc.endswith("\n") else doc + "\n")


def stream_windows(
    tokenizer: TextTokenizer,
    documents: Iterable[str],
    n: int,
    samples: int,
    on_tokens: Callable[[int], None] | None = None,
) -> tuple[torch.Tensor, int]:
    """Up to ``samples`` consecutive windows of n tokens of the text stream: (N, n) int64, tokens read.

    A window equal to an earlier one is left out (repeated boilerplate would otherwise give identical
    examples, whose queries no Kruskal test can separate); the next window of the stream takes its place.
    """
    buffer = np.empty(0, dtype=np.int64)
    blocks: list[np.ndarray] = []  # (rows, n) int32 each
    kept: set[bytes] = set()
    count = seen = 0
    for piece in _pieces(documents):
        ids = np.asarray(tokenizer.encode(piece), dtype=np.int64)
        seen += len(ids)
        if on_tokens is not None:
            on_tokens(len(ids))
        buffer = np.concatenate([buffer, ids])
        full = len(buffer) // n
        rows = buffer[: full * n].reshape(full, n).astype(np.int32)  # (full, n)
        buffer = buffer[full * n :]
        fresh = []
        for row in rows:
            if count + len(fresh) == samples:
                break
            key = row.tobytes()
            if key not in kept:
                kept.add(key)
                fresh.append(row)
        blocks.append(np.stack(fresh) if fresh else np.empty((0, n), dtype=np.int32))
        count += len(fresh)
        if count == samples:
            break
    windows = np.concatenate(blocks) if blocks else np.empty((0, n), dtype=np.int32)
    return torch.from_numpy(windows).long().view(-1, n), seen  # (N, n)


def split_sentences(text: str) -> list[str]:
    """Non-empty lines, each split after sentence-ending punctuation."""
    out: list[str] = []
    for line in text.splitlines():
        out.extend(s for s in _SENTENCE_END.split(line.strip()) if s)
    return out


def _sentence_ids(
    tokenizer: TextTokenizer, documents: Iterable[str], on_tokens: Callable[[int], None] | None
) -> Iterator[list[int]]:
    for piece in _pieces(documents):
        sentences = split_sentences(piece)
        if sentences:
            encoded = [ids for ids in tokenizer.encode_batch(sentences) if ids]
            if on_tokens is not None:
                on_tokens(sum(map(len, encoded)))
            yield from encoded


def pair_windows(
    tokenizer: TextTokenizer,
    documents: Iterable[str],
    n: int,
    samples: int,
    on_tokens: Callable[[int], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Up to ``samples`` ``[CLS] s1 [SEP] s2 [SEP]`` rows of exactly n tokens.

    Returns input_ids (N, n), token_type_ids (N, n) (0 for [CLS] s1 [SEP], 1 for s2 [SEP]), tokens read.
    """
    if tokenizer.cls_id is None or tokenizer.sep_id is None:
        raise AuditError(f"tokenizer {tokenizer.name} has no [CLS]/[SEP] tokens for sentence pairs")
    budget = n - 3  # text tokens per row
    rows: list[np.ndarray] = []  # (n,) int32 each
    first_lengths: list[int] = []  # len(s1) + 2 per row: where token type 1 starts
    sentences = _sentence_ids(tokenizer, documents, on_tokens)
    seen = 0
    for first in sentences:
        seen += len(first)
        s1 = first[: max(1, budget // 2)]
        need = budget - len(s1)
        s2: list[int] = []
        for following in sentences:
            seen += len(following)
            s2.extend(following)
            if len(s2) >= need:
                break
        if len(s2) < need:
            break  # the text ran out inside this row
        rows.append(
            np.array([tokenizer.cls_id, *s1, tokenizer.sep_id, *s2[:need], tokenizer.sep_id], np.int32)
        )
        first_lengths.append(len(s1) + 2)
        if len(rows) == samples:
            break
    ids = torch.from_numpy(np.stack(rows) if rows else np.empty((0, n), np.int32)).long()  # (N, n)
    types = (
        torch.arange(n)[None, :] >= torch.tensor(first_lengths, dtype=torch.long)[:, None]
    ).long()  # (N, n)
    return ids.view(-1, n), types.view(-1, n), seen


def load_text_inputs(
    loaded: Fed,
    data: str | None,
    samples: int,
    *,
    seed: int = 0,
    first: bool = False,
    exclude: str | Path | None = None,
    progress: bool = True,
) -> Inputs:
    """Windows of exactly ``loaded.n`` tokens from ``data`` (None: the bundled Python text): the first
    ``samples`` (``first``) or a seeded random ``samples`` of all of them, in source order."""
    tokenizer = loaded.tokenizer
    if tokenizer is None:
        raise AuditError(f"{loaded.name} takes no text")
    counts = {"tokens_read": 0, "undecodable_bytes": 0}
    if data is None:
        from auditor.data.samples import bundled_text_documents

        documents, label = bundled_text_documents()
    else:
        documents, label = read_documents(data, counts, exclude)
    n, layout = loaded.n, loaded.text_layout
    pool = samples if first else max(samples, POOL_TOKENS // n)  # windows made at most
    with tqdm(disable=not progress, desc=f"tokenize ({tokenizer.name})", unit="tok", unit_scale=True) as bar:
        if layout == "stream":
            ids, seen = stream_windows(tokenizer, documents, n, pool + 1, bar.update)
            tensors = {"input_ids": ids}
            shape = f"contiguous windows of n={n} tokens"
        elif layout == "pairs":
            ids, token_types, seen = pair_windows(tokenizer, documents, n, pool + 1, bar.update)
            tensors = {"input_ids": ids, "token_type_ids": token_types}
            shape = f"[CLS] s1 [SEP] s2 [SEP] pairs of n={n} tokens"
        else:
            raise AuditError(f"{loaded.name} has no text layout")
    counts["tokens_read"] = seen
    made = int(ids.shape[0])
    if made == 0:
        need = n if layout == "stream" else n - 3
        raise AuditError(
            f"text too short: {label} gave {seen} tokens ({tokenizer.name}), "
            f"but one window of n = {n} needs {need} text tokens"
        )
    complete = made <= pool  # the source ended before the pool was full
    total = min(made, pool)
    if first:
        keep = torch.arange(min(total, samples))
        note = f"all {total} {shape}" if complete and total <= samples else f"first {len(keep)} {shape}"
    elif total <= samples:
        keep = torch.arange(total)
        note = f"all {total} {shape}"
    else:
        keep = torch.tensor(sorted(random_order(total, seed)[:samples]), dtype=torch.long)
        note = f"{samples} of {'' if complete else 'the first '}{total} {shape} drawn at random (seed {seed})"
        if not complete:
            note += f"; reading stopped after {seen} tokens"
    return Inputs(
        N=len(keep),
        n=n,
        data_source=f"{label}; {note}",
        tokenizer=tokenizer.name,
        counts=counts,
        tensors={name: t[keep] for name, t in tensors.items()},
    )
