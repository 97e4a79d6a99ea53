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
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from PIL import Image
from torch import nn

from auditor.core.errors import AuditError
from auditor.models import interp
from auditor.models.base import (
    HFAdapter,
    ImagePreprocessor,
    LoadedModel,
    ModelSpec,
    TextTokenizer,
    weights_dtype,
)
from auditor.models.registry import adapters

IN_MEMORY = "in-memory"  # the weights column of a model object's rows


def _adapter(model: Any) -> HFAdapter:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    supported = sorted(t for t, a in adapters().items() if isinstance(a, HFAdapter))
    if not isinstance(model, nn.Module) or not model_type:
        raise AuditError(f"expected a model name or a transformers model object (PreTrainedModel, or one "
                         f"held in TransformerLens or nnsight); got {type(model).__name__}")
    adapter = adapters().get(model_type)
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
    kind = interp.interp_kind(model)
    if kind == interp.NNSIGHT:
        return _from_nnsight(model, processor, context_length)
    if kind is not None:
        return _from_transformer_lens(model, kind, processor, context_length)
    if interp.other_tl_model(model) is not None:
        raise interp.unsupported(model)
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


def _from_transformer_lens(model: Any, kind: str, processor: Any, context_length: int | None) -> LoadedModel:
    """A TransformerLens model audited as the family of its architecture, read at its own hook points
    (:class:`~auditor.models.interp.HookPointAdapter`)."""
    if kind == interp.TRANSFORMER_BRIDGE:
        original = model.original_model
        family = _adapter(original)
        config = getattr(original, "base_model", original).config
        if family.family not in interp.TL_FAMILIES:
            raise AuditError(
                f"TransformerBridge around a {config.model_type!r} model: TransformerLens models of the "
                f"{', '.join(interp.TL_FAMILIES)} family can be audited (hold the Hugging Face model itself, "
                "or its nnsight wrapper, for the others)"
            )
        architecture = type(original).__name__
    else:
        config = interp.hooked_hf_config(model, interp.tl_model_types())
        family = adapters()[config.model_type]
        architecture = str(model.cfg.original_architecture)
    d, depth = int(model.cfg.d_model), int(model.cfg.n_layers)
    if (d, depth) != (family.width(config), family.depth(config)):
        raise AuditError(f"{kind}: its cfg says d_model = {d}, n_layers = {depth} but its architecture "
                         f"{family.width(config)}, {family.depth(config)}")
    name = _label(str(getattr(model.cfg, "model_name", "") or getattr(config, "name_or_path", "") or kind))
    spec = ModelSpec(name=name, adapter=interp.HookPointAdapter(family, kind), source=IN_MEMORY,
                     description=f"TransformerLens {kind} ({architecture})")
    n = family.context_length(config, context_length)
    given = processor if processor is not None else getattr(model, "tokenizer", None)  # the one it carries
    if given is not None:
        tokenizer = text_tokenizer(given)
    else:
        tokenizer, _ = family.make_inputs(ModelSpec(name, family, IN_MEMORY), "random", None, config)
    if tokenizer.vocab_size > int(model.cfg.d_vocab):
        raise AuditError(f"the tokenizer has {tokenizer.vocab_size} ids but the model only "
                         f"{model.cfg.d_vocab} embeddings; pass the tokenizer that belongs to the model")
    parameter = next(model.parameters(), None)
    if parameter is None:
        raise AuditError(f"{kind} has no parameters")
    return LoadedModel(
        spec=spec, model=model, n=n, d=d, num_layers=depth, query_index=family.query_index(n),
        weights=IN_MEMORY, tokenizer_name=tokenizer.name, device=parameter.device, dtype=parameter.dtype,
        seed=0, tokenizer=tokenizer,
        details={"weights_source": f"TransformerLens {kind} object", "architecture": architecture,
                 "weights_dtype": weights_dtype(model.parameters()),
                 "hook_points": "blocks.0.hook_resid_pre (embedding), blocks.L.hook_resid_post (block.L)"},
    )


def _from_nnsight(model: Any, processor: Any, context_length: int | None) -> LoadedModel:
    """The Hugging Face model an nnsight wrapper holds, audited as that model held directly (with the
    wrapper's tokenizer when no processor is given)."""
    inner = interp.nnsight_module(model)
    loaded = from_object(inner, processor if processor is not None else getattr(model, "tokenizer", None),
                         context_length=context_length)
    wrapper = type(model).__name__
    spec = dataclasses.replace(loaded.spec, description=f"nnsight {wrapper} around {type(inner).__name__}")
    return dataclasses.replace(loaded, spec=spec, details={
        **loaded.details, "weights_source": f"nnsight {wrapper} object ({type(inner).__name__})"})


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
