"""Vision Transformers from timm: ``timm:<name>`` (e.g. ``timm:vit_base_patch16_224.augreg_in21k``).

timm is optional (``pip install 'attention-auditor[timm]'``). The model must be a timm
``VisionTransformer`` with a class token (the query, row 0); n = prefix tokens (CLS, registers) +
patches. ``embedding`` is what enters the first block (patch embedding + CLS + positions, after
``norm_pre``), ``block.L`` the output of ``model.blocks[L]``. Images are prepared with the model's
own timm data config (interpolation, crop, mean/std), split into the PIL stage (resize, crop) and the
float stage (scale to [0, 1], standardise) like the other image models.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from auditor.core.errors import AuditError
from auditor.data.feed import ImagePreprocessor
from auditor.models.base import (
    Adapter,
    ContextLimits,
    LoadRequest,
    ModelSpec,
    WeightsUnavailable,
    first_line,
    hub_reachable,
    weights_dtype,
)
from auditor.models.hub import SAFETENSORS

TIMM_MISSING = "timm is not installed: pip install 'attention-auditor[timm]'"
_TO_TENSOR = ("ToTensor", "MaybeToTensor")


def import_timm() -> Any:
    """The timm module, or an AuditError saying how to install it."""
    try:
        import timm
    except ImportError:
        raise AuditError(TIMM_MISSING) from None
    return timm


def timm_spec(name: str) -> ModelSpec:
    """Spec of ``timm:<name>``; the architecture name (before any ``.tag``) must exist in timm."""
    timm = import_timm()
    arch = name.split(".", 1)[0]
    if not name or not timm.is_model(arch):
        close = difflib.get_close_matches(arch, timm.list_models("vit*"), n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
        raise AuditError(f"unknown timm model {name!r}; {hint}list them with timm.list_models('vit*')")
    return ModelSpec(name=f"timm:{name}", adapter=TIMM_VIT, source=name, config=None, description="timm ViT")


def timm_preprocessor(model: nn.Module) -> ImagePreprocessor:
    """The model's timm eval transform, split at ToTensor into a PIL stage and mean/std."""
    timm = import_timm()
    from torchvision import transforms as T

    size = tuple(
        int(s) for s in model.patch_embed.img_size
    )  # the pretrained cfg may predate an img_size override
    cfg = timm.data.resolve_data_config({"input_size": (3, *size)}, model=model)
    steps = list(timm.data.create_transform(**cfg, is_training=False).transforms)
    cut = next((i for i, s in enumerate(steps) if type(s).__name__ in _TO_TENSOR), None)
    tail = steps[cut + 1 :] if cut is not None else []
    if cut is None or len(tail) != 1 or not isinstance(tail[0], T.Normalize):
        raise AuditError(f"unsupported timm eval transform for this model: {steps}")
    pil_stage = T.Compose(steps[:cut])
    _, height, width = cfg["input_size"]
    mean = tuple(float(m) for m in tail[0].mean)
    std = tuple(float(s) for s in tail[0].std)
    return ImagePreprocessor(
        name=(
            f"timm: {cfg['interpolation']} resize, crop_pct={cfg['crop_pct']}, {height}x{width}, "
            f"mean={[round(m, 4) for m in mean]}, std={[round(s, 4) for s in std]}"
        ),
        size=(int(height), int(width)),
        mean=mean,  # type: ignore[arg-type]
        std=std,  # type: ignore[arg-type]
        resize=pil_stage,
    )


def _load_folder(model: nn.Module, folder: Path) -> str:
    """Load the folder's checked weights (safetensors, or a weights-only ``pytorch_model.bin``), strictly;
    return the dtype they are stored in."""
    from auditor.models.checkpoint import load_state_file

    state = load_state_file(folder)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise AuditError(f"{folder}: weights do not fit this timm model: {first_line(err)}") from None
    return weights_dtype(state.values())


def _pretrained(timm: Any, name: str) -> nn.Module:
    """timm pretrained weights from the hub, or from the hub cache when offline."""
    try:
        if hub_reachable():
            return timm.create_model(name, pretrained=True)
        from huggingface_hub import try_to_load_from_cache

        hub_id = (
            timm.models.get_pretrained_cfg(name).hf_hub_id if timm.models.get_pretrained_cfg(name) else None
        )
        cached = try_to_load_from_cache(hub_id, SAFETENSORS) if hub_id else None
        if not isinstance(cached, str):
            raise WeightsUnavailable(
                f"pretrained weights for timm:{name} unavailable: the Hugging Face hub is unreachable and "
                "they are not in the local cache"
            )
        return timm.create_model(name, pretrained=True, pretrained_cfg_overlay={"file": cached})
    except WeightsUnavailable:
        raise
    except (RuntimeError, OSError, ValueError) as err:
        raise WeightsUnavailable(
            f"pretrained weights for timm:{name} unavailable: {first_line(err)}"
        ) from None


class TimmViTAdapter(Adapter):
    family = "vit"
    modality = "image"
    overrides_apply_to = ("random", "folder")  # create_model keyword arguments

    def build(self, request: LoadRequest, config: Any) -> tuple[nn.Module, Any]:
        """The timm model (its own weights, the folder's or random ones), checked to be a ViT with a CLS
        token; the model is its own configuration."""
        timm, spec, seed = import_timm(), request.spec, request.seed
        kwargs = dict(request.overrides or {})
        if request.kind == "pretrained":
            from auditor.models.checkpoint import check_finite_parameters

            model, read_from = _pretrained(timm, spec.source), f"timm pretrained {spec.source}"
            check_finite_parameters(model, f"timm:{spec.source}")
            stored = weights_dtype(model.parameters())  # as timm holds them once loaded
        else:
            folder = Path(request.source) if request.kind == "folder" else None
            if folder is not None and (folder / "config.json").is_file():  # timm's save_for_hf layout
                kwargs = {**json.loads((folder / "config.json").read_text()).get("model_args", {}), **kwargs}
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                try:
                    model = timm.create_model(spec.source, pretrained=False, **kwargs)
                except TypeError as err:
                    raise AuditError(f"timm:{spec.source}: bad model arguments: {first_line(err)}") from None
            read_from = f"random init (torch.manual_seed({seed}))"
            stored = weights_dtype(model.parameters())
            if folder is not None:
                stored = _load_folder(model, folder)
                read_from = str(folder)
        if not isinstance(model, timm.models.vision_transformer.VisionTransformer):
            raise AuditError(f"timm:{spec.source} is a {type(model).__name__}, not a VisionTransformer")
        if getattr(model, "cls_token", None) is None:
            raise AuditError(f"timm:{spec.source} has no class token, so there is no CLS query to audit")
        model = model.to(device=request.device, dtype=request.dtype).eval()
        request.details.update(weights_source=read_from, architecture=f"timm {type(model).__name__}",
                               weights_dtype=stored)
        return model, model

    def context_limits(self, config: Any) -> ContextLimits:
        return ContextLimits("ViT", fixed=int(config.num_prefix_tokens) + int(config.patch_embed.num_patches))

    def width(self, config: Any) -> int:
        return int(config.embed_dim)

    def depth(self, config: Any) -> int:
        return len(config.blocks)

    def make_loaded_inputs(self, spec, kind, source, config, options):
        return None, timm_preprocessor(config), {}

    def blocks(self, model: nn.Module):
        return model.blocks

    def forward(self, model: nn.Module, batch: Mapping[str, torch.Tensor]) -> None:
        model.forward_features(batch["pixel_values"])


TIMM_VIT = TimmViTAdapter()
