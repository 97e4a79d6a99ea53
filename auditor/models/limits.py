"""A model's config is checked as data before anything is built from it.

A ``config.json`` comes with the weights and is as untrusted as they are: a size given as a string, heads
that do not divide the width, zero blocks or an absurd size (``intermediate_size`` 1e12) must be refused in
one line naming the field, before a tensor is allocated. :func:`check_config` does that for every family;
:func:`config_error` turns transformers' own validation errors (``StrictDataclassError``, not a
ValueError) into the same one line.
"""

from __future__ import annotations

import os
from typing import Any

from auditor.core.errors import AuditError

# The size fields of the families' configs (Llama-style, BERT-style, GPT-2's n_* and the vision towers').
SIZE_FIELDS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings", "n_embd", "n_layer", "n_head", "n_inner",
    "n_positions", "image_size", "patch_size", "num_channels", "type_vocab_size",
)
MAX_FIELD = 2**48  # a size beyond this is no model (memory bounds the rest: check_config)
FIX_HINT = "the config is corrupt or hand-edited: fix config.json or re-save the model with save_pretrained"


def machine_memory() -> int:
    """Bytes of physical memory of this machine (what any resident tensor must fit in)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not Linux or macOS
        return 2**40


def config_error(err: BaseException, where: str) -> AuditError:
    """One line for an error transformers raised while validating a config (the field and the reason)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    head = lines[0] if lines else type(err).__name__
    reason = lines[1] if len(lines) > 1 else head
    for prefix in ("TypeError: ", "ValueError: "):
        reason = reason.removeprefix(prefix)
    reason = reason.rstrip(".")
    field = head.split("'")[1] if head.count("'") >= 2 else None
    what = f"field {field!r}: " if field and "for field" in head else ""
    return AuditError(f"{where}: {what}{reason}; {FIX_HINT}")


def _size(config: Any, name: str, where: str) -> int | None:
    value = getattr(config, name, None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise AuditError(f"{where}: field {name!r} expected int, got {type(value).__name__} (value: "
                         f"{value!r}); {FIX_HINT}")
    low = 0 if name == "type_vocab_size" else 1
    if not low <= value <= MAX_FIELD:
        what = "the model has no blocks to audit" if name in ("num_hidden_layers", "n_layer") else (
            f"valid: {low}..{MAX_FIELD:,}")
        raise AuditError(f"{where}: {name} = {value}; {what}; {FIX_HINT}")
    return value


def block_bytes(config: Any, itemsize: int) -> int:
    """Bytes of the embedding tables and one block's weights in a dtype of ``itemsize`` bytes: what an audit
    of block 0 holds at most at once (from the config alone)."""
    d = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None) or 1
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None) or 1
    head = getattr(config, "head_dim", None) or max(1, d // heads)
    kv = getattr(config, "num_key_value_heads", None) or heads
    ff = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * d
    vocab = getattr(config, "vocab_size", None) or 0
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or 0
    block = 2 * d * heads * head + 2 * d * kv * head + 3 * d * ff
    return itemsize * (vocab * d + positions * d + block)


def check_config(config: Any, where: str, *, itemsize: int = 4, limit: int | None = None) -> None:
    """Refuse a config whose sizes are not positive integers, whose heads do not divide the width, that has
    no blocks, or whose embedding and one block in a dtype of ``itemsize`` bytes would not fit in ``limit``
    bytes (default: this machine's memory); one line naming the field (``where``: the config's path)."""
    sizes = {name: _size(config, name, where) for name in SIZE_FIELDS}
    d = sizes["hidden_size"] or sizes["n_embd"]
    heads = sizes["num_attention_heads"] or sizes["n_head"]
    if d and heads and sizes["head_dim"] is None and d % heads:
        raise AuditError(f"{where}: hidden_size {d} is not a multiple of num_attention_heads {heads}; "
                         f"{FIX_HINT}")
    kv = sizes["num_key_value_heads"]
    if heads and kv and heads % kv:
        raise AuditError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads "
                         f"{kv}; {FIX_HINT}")
    limit = machine_memory() if limit is None else limit
    need = block_bytes(config, itemsize)
    if need > limit:
        biggest = max((name for name in SIZE_FIELDS if sizes[name]), key=lambda n: sizes[n])
        raise AuditError(
            f"{where}: the embedding and one block take {need / 2**30:,.1f} GiB at {itemsize} bytes per "
            f"weight ({biggest} = {sizes[biggest]:,}), more than this machine's {limit / 2**30:,.1f} GiB of "
            f"memory; {FIX_HINT}, or audit it on a larger machine"
        )


def check_resident(config: Any, blocks: int, itemsize: int, where: str, limit: int | None = None) -> None:
    """Refuse holding the embedding and ``blocks`` blocks resident (random weights, or weights placed once)
    when they would not fit in ``limit`` bytes (default: this machine's memory); one line with the size and
    the limit, before anything is allocated."""
    limit = machine_memory() if limit is None else limit
    embedding = _embedding_bytes(config, itemsize)
    need = embedding + blocks * (block_bytes(config, itemsize) - embedding)
    if need > limit:
        raise AuditError(
            f"{where}: the embedding and {blocks} audited blocks take {need / 2**30:,.1f} GiB at {itemsize} "
            f"bytes per weight, more than this machine's {limit / 2**30:,.1f} GiB of memory; audit fewer or "
            "shallower blocks (--layers, -r block.L), or a checkpoint (read as its layers run on the CPU)"
        )


def _embedding_bytes(config: Any, itemsize: int) -> int:
    d = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None) or 1
    vocab = getattr(config, "vocab_size", None) or 0
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or 0
    return itemsize * (vocab * d + positions * d)
