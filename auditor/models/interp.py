"""Models held in an interpretability library: TransformerLens (``TransformerBridge``, and
``HookedTransformer`` before TransformerLens 4) and nnsight (``NNsight``, ``LanguageModel``).

``auditor.audit_model(model)`` audits such an object as it is, in this process, exactly as the same
architecture loaded by name: the family of its architecture (GPT-2 for TransformerLens; for nnsight any family
:mod:`auditor.models.from_object` takes) chooses the context length n, the query row, the text layout and,
without a tokenizer, the default one, and every representation is read where the library itself names it:

- TransformerLens: ``embedding`` is the input of block 0 (``blocks.0.hook_resid_pre``, which is
  ``hook_embed`` + ``hook_pos_embed`` for learned positions) and ``block.L`` is ``blocks.L.hook_resid_post``.
  Hooks are torch hooks on those hook points (a ``HookPoint`` is an identity module), so the model's own
  TransformerLens hooks and weight processing stay as the user set them: a bridge in compatibility mode
  (folded layer norms, centred weights) is audited as it computes.
- nnsight: the wrapper's torch module (``model._module``) is the Hugging Face model; its blocks are hooked as
  for that model held directly (what ``model.<block>.output`` would save inside a trace).

Without ``processor`` the tokenizer the object carries (``model.tokenizer``) is used, else the family's
default. The libraries are optional (``pip install -e ".[interp]"``); nothing here imports them: an object is
recognised by the classes it is made of.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from auditor.core.errors import AuditError
from auditor.models.base import Adapter, HFAdapter, LoadedModel, ModelSpec, weights_dtype

TRANSFORMER_BRIDGE = "TransformerBridge"  # TransformerLens >= 3
HOOKED_TRANSFORMER = "HookedTransformer"  # TransformerLens < 4
NNSIGHT = "nnsight"
LIBRARIES = {TRANSFORMER_BRIDGE: "TransformerLens", HOOKED_TRANSFORMER: "TransformerLens", NNSIGHT: "nnsight"}
TL_FAMILIES = ("gpt2",)  # families a TransformerLens model is audited as (plain stream text, no BOS rule)


def interp_kind(model: Any) -> str | None:
    """Which library object ``model`` is (:data:`TRANSFORMER_BRIDGE`, :data:`HOOKED_TRANSFORMER`,
    :data:`NNSIGHT`), None for any other object; read from its classes, without importing the libraries."""
    for cls in type(model).__mro__:
        module = cls.__module__ or ""
        if module.startswith("transformer_lens") and cls.__name__ in (TRANSFORMER_BRIDGE, HOOKED_TRANSFORMER):
            return cls.__name__
        if module.startswith("nnsight") and cls.__name__ in ("Envoy", "NNsight"):
            return NNSIGHT
    return None


def other_tl_model(model: Any) -> str | None:
    """The class name of a TransformerLens model this module does not audit (``HookedEncoder``, ...)."""
    module = type(model).__module__ or ""
    return type(model).__name__ if module.startswith("transformer_lens") else None


# ---------------------------------------------------------------------------------------------------
# TransformerLens: blocks seen through their hook points
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class HookedBlock:
    """Block L as its hook points see it: what enters ``hook_resid_pre`` and what leaves ``hook_resid_post``.

    The extractor hooks a block's input (pre-hook) for the embedding and its output for ``block.L``; here the
    first goes to the ``hook_resid_pre`` point and the second to the ``hook_resid_post`` point.
    """

    pre: nn.Module
    post: nn.Module

    def register_forward_pre_hook(self, hook: Any, *, with_kwargs: bool = False) -> Any:
        return self.pre.register_forward_pre_hook(hook, with_kwargs=with_kwargs)

    def register_forward_hook(self, hook: Any, **kwargs: Any) -> Any:
        return self.post.register_forward_hook(hook, **kwargs)


class HookPointAdapter(Adapter):
    """A TransformerLens model audited as the family of its architecture (``base``): the family's inputs,
    context length and query row; the model's own forward pass and residual-stream hook points."""

    options: tuple[str, ...] = ()

    def __init__(self, base: HFAdapter, kind: str) -> None:
        self.base = base
        self.kind = kind
        self.family = base.family
        self.modality = base.modality
        self.text_layout = base.text_layout
        self.model_types = base.model_types

    def load(self, spec: ModelSpec, weights: str, **kwargs: Any) -> LoadedModel:
        raise AuditError(f"a {self.kind} is audited as the object you hold; pass it to audit_model")

    def blocks(self, model: nn.Module) -> Sequence[HookedBlock]:
        points = model.hook_dict
        return [HookedBlock(points[f"blocks.{i}.hook_resid_pre"], points[f"blocks.{i}.hook_resid_post"])
                for i in range(int(model.cfg.n_layers))]

    def forward(self, model: nn.Module, batch: Mapping[str, torch.Tensor]) -> None:
        model(batch["input_ids"], return_type=None)  # token ids as given: no BOS prepended

    def query_index(self, n: int) -> int:
        return self.base.query_index(n)


def _hf_config_of_hooked(model: Any, supported: Sequence[str]) -> Any:
    """The Hugging Face config of a HookedTransformer's architecture (``cfg.original_architecture``), with the
    sizes of its ``cfg``: what the family's rules read (width, depth, heads, position table, vocabulary)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    cfg = model.cfg
    architecture = str(getattr(cfg, "original_architecture", None) or "")
    names = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    model_type = next((t for t, name in names.items() if name == architecture and t in supported), None)
    if model_type not in supported:
        raise AuditError(
            f"HookedTransformer of architecture {architecture or 'unknown'!r}: TransformerLens models of "
            f"these Hugging Face types can be audited: {', '.join(supported)}"
        )
    d, heads = int(cfg.d_model), int(cfg.n_heads)
    return AutoConfig.for_model(
        model_type, hidden_size=d, num_hidden_layers=int(cfg.n_layers), num_attention_heads=heads,
        max_position_embeddings=int(cfg.n_ctx), vocab_size=int(cfg.d_vocab), n_inner=cfg.d_mlp,
        intermediate_size=cfg.d_mlp, head_dim=int(cfg.d_head),
    )


def _from_transformer_lens(model: Any, kind: str, processor: Any, context_length: int | None) -> LoadedModel:
    from auditor.models.from_object import IN_MEMORY, _adapter, _label, text_tokenizer

    if kind == TRANSFORMER_BRIDGE:
        original = model.original_model
        family = _adapter(original)
        config = getattr(original, "base_model", original).config
        if family.family not in TL_FAMILIES:
            raise AuditError(
                f"TransformerBridge around a {config.model_type!r} model: TransformerLens models of the "
                f"{', '.join(TL_FAMILIES)} family can be audited (hold the Hugging Face model itself, or "
                "its nnsight wrapper, for the others)"
            )
        architecture = type(original).__name__
    else:
        from auditor.models.registry import _ADAPTERS

        supported = [t for t, a in _ADAPTERS.items() if getattr(a, "family", None) in TL_FAMILIES]
        config = _hf_config_of_hooked(model, supported)
        family = _ADAPTERS[config.model_type]
        architecture = str(model.cfg.original_architecture)
    d, depth = int(model.cfg.d_model), int(model.cfg.n_layers)
    if (d, depth) != (family.width(config), family.depth(config)):
        raise AuditError(f"{kind}: cfg says d_model = {d}, n_layers = {depth} but its architecture "
                         f"{family.width(config)}, {family.depth(config)}")
    name = _label(str(getattr(model.cfg, "model_name", "") or getattr(config, "name_or_path", "") or kind))
    adapter = HookPointAdapter(family, kind)
    spec = ModelSpec(name=name, adapter=adapter, source=IN_MEMORY,
                     description=f"TransformerLens {kind} ({architecture})")
    n = family.context_length(config, context_length)
    given = processor if processor is not None else getattr(model, "tokenizer", None)
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


# ---------------------------------------------------------------------------------------------------
# nnsight: the wrapped module
# ---------------------------------------------------------------------------------------------------


def _from_nnsight(model: Any, processor: Any, context_length: int | None) -> LoadedModel:
    from auditor.models.from_object import from_object

    inner = next((m for m in (getattr(model, "_module", None), getattr(model, "_model", None))
                  if isinstance(m, nn.Module)), None)
    if inner is None:
        raise AuditError(f"{type(model).__name__}: an nnsight object without a torch module inside")
    if processor is None:
        processor = getattr(model, "tokenizer", None)
    loaded = from_object(inner, processor, context_length=context_length)
    wrapper = type(model).__name__
    spec = dataclasses.replace(loaded.spec, description=f"nnsight {wrapper} around {type(inner).__name__}")
    return dataclasses.replace(loaded, spec=spec, details={
        **loaded.details, "weights_source": f"nnsight {wrapper} object ({type(inner).__name__})"})


def from_interp(model: Any, processor: Any = None, *, context_length: int | None = None) -> LoadedModel:
    """A TransformerLens or nnsight model as a :class:`LoadedModel` ready for extraction (see the module's
    docstring); an AuditError for an object of these libraries that cannot be audited."""
    kind = interp_kind(model)
    if kind == NNSIGHT:
        return _from_nnsight(model, processor, context_length)
    if kind in (TRANSFORMER_BRIDGE, HOOKED_TRANSFORMER):
        return _from_transformer_lens(model, kind, processor, context_length)
    other = other_tl_model(model)
    raise AuditError(f"TransformerLens {other}: audited are HookedTransformer and TransformerBridge models "
                     f"of the {', '.join(TL_FAMILIES)} family" if other else
                     f"{type(model).__name__} is neither a TransformerLens nor an nnsight model")
