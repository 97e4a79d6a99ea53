"""Text -> windows of exactly n tokens, without padding.

GPT-2 (``stream`` layout): the text is tokenized as one stream and cut into consecutive, non-overlapping
windows of n tokens. BERT (``pairs`` layout): ``[CLS] s1 [SEP] s2 [SEP]`` with s1 a sentence (cut to at
most half of the n - 3 text tokens) and s2 the text that follows it, cut so the total is exactly n; the
next pair starts at the next unused sentence. Every position is a real token, so padding can never
reach a rank test. Text is read in chunks cut at line breaks where the GPT-2 pre-tokenizer also breaks,
so chunked and whole-text tokenization agree while a large corpus is only read as far as needed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from auditor.data import HF_PREFIX, Inputs
from auditor.errors import AuditError
from auditor.models.base import LoadedModel, TextTokenizer

CHUNK_CHARS = 1 << 16
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")


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


def read_documents(data: str) -> tuple[Iterator[str], str]:
    """Texts of a ``.txt`` file, a folder of them (sorted) or ``hf:...`` rows, and a label of the source."""
    if data.startswith(HF_PREFIX):
        from auditor.data.images import load_hf_dataset

        dataset, label = load_hf_dataset(data, "text")
        return _hf_documents(dataset), label
    path = Path(data).expanduser()
    if not path.exists():
        raise AuditError(
            f"text source {data!r} does not exist; give a .txt file, a folder of them or hf:<name>"
        )
    if path.is_file():
        return iter([path.read_text(encoding="utf-8", errors="replace")]), f"{path} (text file)"
    files = sorted(p for p in path.rglob("*.txt") if p.is_file())
    if not files:
        raise AuditError(f"no .txt files under {str(path)!r}")
    docs = (p.read_text(encoding="utf-8", errors="replace") for p in files)
    return docs, f"{path} (folder, {len(files)} .txt files, sorted)"


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
    tokenizer: TextTokenizer, documents: Iterable[str], n: int, samples: int
) -> tuple[torch.Tensor, int]:
    """Up to ``samples`` consecutive windows of n tokens of the text stream: (N, n) int64, tokens read."""
    buffer: list[int] = []
    windows: list[list[int]] = []
    seen = 0
    for piece in _pieces(documents):
        ids = tokenizer.encode(piece)
        seen += len(ids)
        buffer.extend(ids)
        full = min(len(buffer) // n, samples - len(windows))
        windows.extend(buffer[i * n : (i + 1) * n] for i in range(full))
        del buffer[: full * n]
        if len(windows) == samples:
            break
    return torch.tensor(windows, dtype=torch.long).view(-1, n), seen  # (N, n)


def split_sentences(text: str) -> list[str]:
    """Non-empty lines, each split after sentence-ending punctuation."""
    out: list[str] = []
    for line in text.splitlines():
        out.extend(s for s in _SENTENCE_END.split(line.strip()) if s)
    return out


def _sentence_ids(tokenizer: TextTokenizer, documents: Iterable[str]) -> Iterator[list[int]]:
    for piece in _pieces(documents):
        sentences = split_sentences(piece)
        if sentences:
            yield from (ids for ids in tokenizer.encode_batch(sentences) if ids)


def pair_windows(
    tokenizer: TextTokenizer, documents: Iterable[str], n: int, samples: int
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Up to ``samples`` ``[CLS] s1 [SEP] s2 [SEP]`` rows of exactly n tokens.

    Returns input_ids (N, n), token_type_ids (N, n) (0 for [CLS] s1 [SEP], 1 for s2 [SEP]), tokens read.
    """
    if tokenizer.cls_id is None or tokenizer.sep_id is None:
        raise AuditError(f"tokenizer {tokenizer.name} has no [CLS]/[SEP] tokens for sentence pairs")
    budget = n - 3  # text tokens per row
    rows: list[list[int]] = []
    types: list[list[int]] = []
    sentences = _sentence_ids(tokenizer, documents)
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
        rows.append([tokenizer.cls_id, *s1, tokenizer.sep_id, *s2[:need], tokenizer.sep_id])
        types.append([0] * (len(s1) + 2) + [1] * (need + 1))
        if len(rows) == samples:
            break
    ids = torch.tensor(rows, dtype=torch.long).view(-1, n)  # (N, n)
    return ids, torch.tensor(types, dtype=torch.long).view(-1, n), seen


def load_text_inputs(loaded: LoadedModel, data: str | None, samples: int, *, progress: bool = True) -> Inputs:
    """Windows of exactly ``loaded.n`` tokens from ``data`` (None: the bundled Python reference text)."""
    tokenizer = loaded.tokenizer
    if tokenizer is None:
        raise AuditError(f"{loaded.name} takes no text")
    if data is None:
        from auditor.data.samples import bundled_text

        text, label = bundled_text()
        documents: Iterable[str] = [text]
    else:
        documents, label = read_documents(data)
    n, layout = loaded.n, loaded.adapter.text_layout
    with tqdm(total=1, disable=not progress, desc=f"tokenize ({tokenizer.name})", unit="source") as bar:
        if layout == "stream":
            ids, seen = stream_windows(tokenizer, documents, n, samples)
            tensors = {"input_ids": ids}
            shape = f"contiguous windows of n={n} tokens"
        elif layout == "pairs":
            ids, token_types, seen = pair_windows(tokenizer, documents, n, samples)
            tensors = {"input_ids": ids, "token_type_ids": token_types}
            shape = f"[CLS] s1 [SEP] s2 [SEP] pairs of n={n} tokens"
        else:
            raise AuditError(f"{loaded.name} has no text layout")
        bar.update(1)
    if ids.shape[0] == 0:
        need = n if layout == "stream" else n - 3
        raise AuditError(
            f"text too short: {label} gave {seen} tokens ({tokenizer.name}), "
            f"but one window of n = {n} needs {need} text tokens"
        )
    return Inputs(
        N=int(ids.shape[0]),
        n=n,
        data_source=f"{label}; first {ids.shape[0]} {shape}",
        tokenizer=tokenizer.name,
        counts={"tokens_read": seen},
        tensors=tensors,
    )
