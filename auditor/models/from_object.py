"""A model the user already holds (a transformers ``PreTrainedModel``) as a :class:`LoadedModel`.

``auditor.audit_model(model, processor, data)`` audits a ViT, BERT or GPT-2 family model built or loaded by
the caller, fed by its own image processor or tokenizer. The family comes from
``model.config.model_type`` and its registered adapter does the rest exactly as for a model loaded by
name (blocks, forward pass, context length, query row). A model with a task head
(``ViTForImageClassification``, ``BertForMaskedLM``, ``GPT2LMHeadModel``, ...) is audited through its
base model. The object is neither copied nor moved; :func:`evaluating` puts it in eval mode for the
audit and restores its mode afterwards. A model held in TransformerLens (``TransformerBridge``,
``HookedTransformer``) or nnsight is audited through :mod:`auditor.models.interp`.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from PIL import Image
from torch import nn

from auditor.core.errors import AuditError
from auditor.models.base import (
    HFAdapter,
    ImagePreprocessor,
    LoadedModel,
    ModelSpec,
    TextTokenizer,
    weights_dtype,
)
from auditor.models.registry import _ADAPTERS

IN_MEMORY = "in-memory"  # the weights column of a model object's rows


def _adapter(model: Any) -> HFAdapter:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    supported = sorted(t for t, a in _ADAPTERS.items() if isinstance(a, HFAdapter))
    if not isinstance(model, nn.Module) or not model_type:
        raise AuditError(f"expected a model name or a transformers model object (PreTrainedModel, or one "
                         f"held in TransformerLens or nnsight); got {type(model).__name__}")
    adapter = _ADAPTERS.get(model_type)
    if not isinstance(adapter, HFAdapter):
        raise AuditError(
            f"{type(model).__name__} is a {model_type!r} model; model objects of these types can be "
            f"audited: {', '.join(supported)}"
        )
    return adapter


def _size(processor: Any) -> tuple[int, int] | None:
    """(H, W) an image processor resizes to, or None when it does not say."""
    size = getattr(processor, "size", None)
    if size is None:
        return None
    get = size.get if isinstance(size, dict) else lambda key: getattr(size, key, None)
    height, width = get("height"), get("width")
    return (int(height), int(width)) if height and width else None


def image_preprocessor(processor: Any, image_size: int) -> ImagePreprocessor:
    """An :class:`ImagePreprocessor` doing what a transformers image processor does for ViT: resize
    (with its resampling filter) to the model's size, rescale to [0, 1], standardise."""
    size = _size(processor)
    if size is not None and size != (image_size, image_size):
        raise AuditError(f"the image processor resizes to {size[0]}x{size[1]} but the model takes "
                         f"{image_size}x{image_size} images; pass the processor that belongs to the model")
    if not getattr(processor, "do_resize", True) or not getattr(processor, "do_rescale", True):
        raise AuditError(
            "the image processor must resize and rescale (do_resize, do_rescale); the audit feeds "
            "the model decoded photos"
        )
    normalize = getattr(processor, "do_normalize", True)
    mean = tuple(float(m) for m in processor.image_mean) if normalize else (0.0, 0.0, 0.0)
    std = tuple(float(s) for s in processor.image_std) if normalize else (1.0, 1.0, 1.0)
    if len(mean) != 3 or len(std) != 3:
        raise AuditError(
            f"the image processor's image_mean/image_std must have 3 channels; got {mean}, {std}"
        )
    resample = Image.Resampling(getattr(processor, "resample", Image.Resampling.BILINEAR))

    def resize(image: Image.Image) -> Image.Image:
        return image.resize((image_size, image_size), resample=resample)

    return ImagePreprocessor(
        name=f"{type(processor).__name__}: PIL {resample.name.lower()} resize to {image_size}x{image_size}, "
             f"mean={list(mean)}, std={list(std)}",
        size=(image_size, image_size),
        mean=mean,  # type: ignore[arg-type]
        std=std,  # type: ignore[arg-type]
        resize=resize,
    )


def text_tokenizer(tokenizer: Any) -> TextTokenizer:
    """A transformers tokenizer as a :class:`TextTokenizer` (a copy: the caller's object is not changed)."""
    from auditor.models.tokenizers import wrap_hf_tokenizer

    if not callable(tokenizer) or not hasattr(tokenizer, "convert_tokens_to_ids"):
        raise AuditError(
            f"expected a transformers tokenizer for a text model; got {type(tokenizer).__name__}"
        )
    with contextlib.suppress(Exception):  # a tokenizer that cannot be copied is used as it is
        tokenizer = copy.deepcopy(tokenizer)
    name = str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)
    return wrap_hf_tokenizer(tokenizer, f"{_label(name)} tokenizer (given)")


def _label(name: str) -> str:
    """A name for reports: a folder's own name rather than the machine's absolute path."""
    return Path(name).name if Path(name).is_absolute() else name


def from_object(model: Any, processor: Any = None, *, context_length: int | None = None) -> LoadedModel:
    """Describe a transformers model object as a :class:`LoadedModel` ready for extraction.

    Args:
        model: a ViT, BERT or GPT-2 family ``PreTrainedModel`` (with or without a task head), or such a model
            held in TransformerLens or nnsight (:mod:`auditor.models.interp`).
        processor: its image processor (ViT) or tokenizer (BERT, GPT-2); None uses the family's default
            inputs (ViT: bilinear resize, mean = std = 0.5; text: the offline tokenizers of the family).
        context_length: n for text models (default as for a model loaded by name).
    """
    from auditor.models.interp import from_interp, interp_kind, other_tl_model

    if interp_kind(model) is not None or other_tl_model(model) is not None:  # TransformerLens, nnsight
        return from_interp(model, processor, context_length=context_length)
    adapter = _adapter(model)
    base = getattr(model, "base_model", model)
    if not isinstance(base, adapter.model_class):
        raise AuditError(f"{type(model).__name__}: its base model is a {type(base).__name__}, not the "
                         f"{adapter.model_class.__name__} the {adapter.family} family audits")
    config = base.config
    name = _label(str(getattr(config, "name_or_path", "") or type(model).__name__))
    spec = ModelSpec(
        name=name, adapter=adapter, source=IN_MEMORY, description=f"{type(model).__name__} object"
    )
    n = adapter.context_length(config, context_length)
    if processor is None:
        tokenizer, preprocessor = adapter.make_inputs(spec, "random", None, config)
    elif adapter.modality == "image":
        tokenizer, preprocessor = None, image_preprocessor(processor, int(config.image_size))
    else:
        tokenizer, preprocessor = text_tokenizer(processor), None
    if tokenizer is not None and tokenizer.vocab_size > int(config.vocab_size):
        raise AuditError(
            f"the tokenizer has {tokenizer.vocab_size} ids but the model only {config.vocab_size} "
            "embeddings; pass the tokenizer that belongs to the model"
        )
    if (
        adapter.text_layout == "pairs"
        and tokenizer is not None
        and None in (tokenizer.cls_id, tokenizer.sep_id)
    ):
        raise AuditError("a BERT-style model needs a tokenizer with [CLS] and [SEP] tokens")
    parameter = next(base.parameters(), None)
    if parameter is None:
        raise AuditError(f"{type(model).__name__} has no parameters")
    return LoadedModel(
        spec=spec,
        model=base,
        n=n,
        d=adapter.width(config),
        num_layers=adapter.depth(config),
        query_index=adapter.query_index(n),
        weights=IN_MEMORY,
        tokenizer_name=(tokenizer or preprocessor).name,
        device=parameter.device,
        dtype=parameter.dtype,
        seed=0,
        tokenizer=tokenizer,
        image_preprocessor=preprocessor,
        details={"weights_source": f"{type(model).__name__} object", "architecture": type(base).__name__,
                 "weights_dtype": weights_dtype(base.parameters())},
    )


@contextlib.contextmanager
def evaluating(module: nn.Module) -> Iterator[None]:
    """``module`` in eval mode inside the block (no dropout), its own mode restored afterwards."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training
