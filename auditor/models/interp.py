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
recognised by the classes it is made of. :func:`auditor.models.from_object.from_object` builds the
:class:`LoadedModel` from what this module knows of the libraries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from auditor.core.errors import AuditError
from auditor.models.base import Adapter, HFAdapter, LoadedModel, ModelSpec

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


def hooked_hf_config(model: Any, supported: Sequence[str]) -> Any:
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


def tl_model_types() -> list[str]:
    """The Hugging Face model types whose TransformerLens models can be audited (:data:`TL_FAMILIES`)."""
    from auditor.models.registry import adapters

    return [t for t, a in adapters().items() if getattr(a, "family", None) in TL_FAMILIES]


def nnsight_module(model: Any) -> nn.Module:
    """The torch module an nnsight wrapper holds (``_module``; ``_model`` in nnsight before 0.4)."""
    inner = next((m for m in (getattr(model, "_module", None), getattr(model, "_model", None))
                  if isinstance(m, nn.Module)), None)
    if inner is None:
        raise AuditError(f"{type(model).__name__}: an nnsight object without a torch module inside")
    return inner


def unsupported(model: Any) -> AuditError:
    """The one-line error for a TransformerLens object this module does not audit."""
    return AuditError(f"TransformerLens {type(model).__name__}: audited are HookedTransformer and "
                      f"TransformerBridge models of the {', '.join(TL_FAMILIES)} family")
