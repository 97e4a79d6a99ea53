"""The model registry: names -> :class:`ModelSpec`, and :func:`load_model`.

Registered names (``vit-base``, ``bert-large``, ``gpt2``, ``minilm``, ...) carry their architecture in
code, so ``weights="random"`` works offline. Other names are accepted when they are unambiguous:
``timm:<name>`` (a ViT from timm), a Hugging Face hub id ``owner/name`` or a local ``save_pretrained``
folder whose config ``model_type`` has an adapter (ViT, BERT, GPT-2, the decoder LLMs, RoBERTa, DeBERTa-v2,
ModernBERT, DINOv2, CLIP, SigLIP). Each family module registers its adapter and its named
models in one line each; a duplicate name is an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from auditor.core.errors import AuditError, did_you_mean
from auditor.models.base import (
    Adapter,
    LoadedModel,
    ModelSpec,
    check_width,
    first_line,
    hub_reachable,
    looks_like_path,
    quiet_transformers,
    resolve_device,
    resolve_dtype,
)
from auditor.models.limits import check_config, config_error

_MODELS: dict[str, ModelSpec] = {}
_ADAPTERS: dict[str, Adapter] = {}  # Hugging Face model_type -> adapter
TIMM_PREFIX = "timm:"


def register(spec: ModelSpec) -> ModelSpec:
    """Add a named model; names are unique."""
    if spec.name in _MODELS:
        raise ValueError(f"model {spec.name!r} is registered twice")
    _MODELS[spec.name] = spec
    return spec


def register_adapter(adapter: Adapter) -> Adapter:
    """Add a family adapter under the Hugging Face model types it serves."""
    for model_type in adapter.model_types:
        if model_type in _ADAPTERS:
            raise ValueError(f"model type {model_type!r} has two adapters")
        _ADAPTERS[model_type] = adapter
    return adapter


def adapters() -> dict[str, Adapter]:
    """Every registered family adapter, by the Hugging Face ``model_type`` it serves (a copy)."""
    return dict(_ADAPTERS)


def known_models() -> list[str]:
    """The registered short names, sorted."""
    return sorted(_MODELS)


def registered(name: str) -> ModelSpec:
    """The spec of a registered short name (no hub or timm look-up)."""
    if name not in _MODELS:
        raise did_you_mean("model", name, _MODELS)
    return _MODELS[name]


def _offline_hint() -> str:
    return f"names that work offline: {', '.join(known_models())}, timm:<name>, or a local folder"


def _spec_from_hub(name: str, trust_remote_code: bool = False) -> ModelSpec:
    """A spec for a hub id or local folder, from its config (``model_type`` picks the family)."""
    from transformers import AutoConfig

    folder = Path(name).expanduser()
    local = folder.is_dir()
    if not local and not hub_reachable():
        try:  # a config cached by an earlier online run still works
            config = AutoConfig.from_pretrained(
                name, local_files_only=True, trust_remote_code=trust_remote_code
            )
        except (OSError, ValueError):
            raise AuditError(
                f"could not reach the Hugging Face hub to read the config of {name!r}; {_offline_hint()}"
            ) from None
    else:
        declared = _declared_type(folder) if local else None
        if declared is not None and declared not in _ADAPTERS:
            raise _unsupported(name, declared, trust_remote_code)
        try:
            with quiet_transformers():
                config = AutoConfig.from_pretrained(
                    str(folder) if local else name, local_files_only=local,
                    trust_remote_code=bool(trust_remote_code),
                )
        except AuditError:
            raise
        except Exception as err:  # noqa: BLE001 - OSError, ValueError, transformers' StrictDataclassError
            if "trust_remote_code" in str(err) or "does not recognize this architecture" in str(err):
                raise _unsupported(name, declared or "unknown", trust_remote_code) from None
            where = str(folder / "config.json") if local else f"the config of {name!r}"
            if type(err).__name__.startswith("StrictDataclass"):
                raise config_error(err, where) from None
            raise AuditError(f"cannot read {where}: {first_line(err)}") from None
    adapter = _ADAPTERS.get(config.model_type)
    if adapter is None:
        raise _unsupported(name, config.model_type, trust_remote_code)
    check_config(adapter.tower(config), str(folder / "config.json") if local else f"the config of {name!r}")
    return ModelSpec(
        name=name,
        adapter=adapter,
        source=str(folder) if local else name,
        config=lambda: type(config).from_dict(config.to_dict()),  # a fresh copy per load
        description=f"{config.model_type} from {'folder' if local else 'the hub'}",
    )


def _declared_type(folder: Path) -> str | None:
    """``model_type`` of a folder's config.json as written (None when unreadable: the load says why)."""
    import json

    try:
        values = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return str(values.get("model_type") or "unknown") if isinstance(values, dict) else None


def _unsupported(name: str, model_type: str, trust_remote_code: bool) -> AuditError:
    """A model type no family serves: the families that do, and what --trust-remote-code can and cannot do."""
    remote = ("--trust-remote-code would let transformers run the model's own code, but only these families' "
              "layouts can be audited" if not trust_remote_code else
              "--trust-remote-code does not add a family: only these layouts can be audited")
    return AuditError(f"{name!r} is a {model_type!r} model, which the auditor has no family for (supported: "
                      f"{', '.join(sorted(_ADAPTERS))}); {remote}")


def resolve(name: str, *, trust_remote_code: bool = False) -> ModelSpec:
    """The spec of a model name: registered name, ``timm:<name>``, hub id ``owner/name`` or local folder.

    An unknown short name raises an :class:`AuditError` with close matches and the known names.
    """
    if not isinstance(name, str) or not name.strip():
        raise AuditError(f"model name must be a non-empty string; known: {', '.join(known_models())}")
    name = name.strip()
    if name in _MODELS:
        return _MODELS[name]
    if name.startswith(TIMM_PREFIX):
        from auditor.models.timm_vit import timm_spec

        return timm_spec(name[len(TIMM_PREFIX) :])
    path = Path(name).expanduser()
    if path.is_dir():
        return _spec_from_hub(name, trust_remote_code)
    if path.exists():
        raise AuditError(
            f"{name!r} is a file; a model is a registered name, a hub id, timm:<name> or a folder"
        )
    if looks_like_path(name):
        raise AuditError(f"model folder {name!r} does not exist; {_offline_hint()}")
    if "/" in name:
        return _spec_from_hub(name, trust_remote_code)
    err = did_you_mean("model", name, _MODELS)
    raise AuditError(f"{err}; or a hub id 'owner/name', a local folder, or timm:<name>")


def load_model(
    name: str,
    weights: str = "random",
    *,
    device: str = "auto",
    dtype: torch.dtype | str = torch.float32,
    seed: int = 0,
    context_length: int | None = None,
    trust_remote_code: bool = False,
    config_overrides: Mapping[str, Any] | None = None,
    require_n_le_d: bool = False,
    query: str | None = None,
    bos: bool | None = None,
) -> LoadedModel:
    """Build or load a model, in eval mode on ``device``, ready for :func:`auditor.audit.extract.extract`.

    weights: ``"random"`` (the architecture from code, initialised after ``torch.manual_seed(seed)``),
    ``"pretrained"`` (the hub or an installed copy; :class:`WeightsUnavailable` when it cannot be read),
    or a folder written by ``save_pretrained``. ``context_length`` sets n for text models (default: the
    model's own n, BERT 512, GPT-2 1024, the decoders 128, or the largest power of two <= d / 2 for a model
    narrower than that: gpt2 256, minilm 128; an audit chooses its default n by its plan's cost rule).
    ``require_n_le_d`` refuses a context length above the width d (no context could have rank n), before
    any weights are read when the architecture is known. ``config_overrides`` change
    architecture fields of a random model (tests use it for tiny models: ``{"num_hidden_layers": 2}``; for
    timm they are ``create_model`` keyword arguments). ``trust_remote_code`` is passed to ``AutoConfig`` when
    a hub id is resolved; the model classes used (ViTModel, BertModel, GPT2Model, timm, and the transformers
    classes of ``decoder``, ``encoders`` and ``vision``) never run code from a checkpoint. ``query``
    (``mean`` | ``first``) picks the query of a model without a CLS token (SigLIP); ``bos`` puts (True) or
    leaves out (False) the BOS token of a decoder LLM at position 0 (None: as the model's tokenizer does).
    Either is an error for a family it does not apply to.
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise AuditError(f"seed must be an integer; got {seed!r}")
    spec = resolve(name, trust_remote_code=trust_remote_code)
    device, dtype = resolve_device(device), resolve_dtype(dtype)
    fixed = spec.modality == "image"  # a ViT's n is set by its image and patch size
    if require_n_le_d:
        shape = spec.adapter.planned_shape(
            spec, str(weights), context_length=context_length, overrides=config_overrides
        )
        if shape is not None:
            check_width(spec.name, *shape, fixed=fixed)
    options = {key: value for key, value in (("query", query), ("bos", bos)) if value is not None}
    for key in options:
        if key not in spec.adapter.options:
            takers = sorted({a.family for a in _ADAPTERS.values() if key in a.options})
            raise AuditError(f"--{key} applies to {', '.join(takers)} models only; {spec.name} is a "
                             f"{spec.family} model")
    loaded = spec.adapter.load(
        spec,
        str(weights),
        device=device,
        dtype=dtype,
        seed=seed,
        context_length=context_length,
        trust_remote_code=trust_remote_code,
        overrides=config_overrides,
        **options,
    )
    if require_n_le_d:
        check_width(spec.name, loaded.n, loaded.d, fixed=fixed)
    return loaded
