"""Vision encoders after ViT: DINOv2 (with and without registers), CLIP's and SigLIP's vision towers.

Tokens: the patch tokens of one image plus the CLS token (DINOv2, CLIP; the query is CLS, row 0) and,
for DINOv2 with registers, its register tokens (rows 1 .. r): every block attends to them, so they belong
to the context E(t) and n = 1 + r + patches (261 for dinov2-reg-base). SigLIP has no CLS token: its
pooled output comes from an attention-pooling head whose probe is one learned vector, the same for every
image, so a Kruskal test on it would be trivially rank 1. Its query is chosen per image: ``mean`` (the
default) is the mean of the n patch tokens, the summary a mean-pooling probe reads; ``first`` is the
top-left patch, a fixed position like a CLS row (``--query``).

``embedding`` is what block 0 receives: patch + position embeddings with CLS/registers, and for CLIP
after its pre-LayerNorm. Inputs follow each model's image processor: DINOv2 resizes the short side to
256 and crops 224 (its position table is interpolated from 518), CLIP resizes the short side to 224
and crops 224, SigLIP resizes to 224 x 224; all bicubic, each with its own mean and std.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

import torch
import transformers
from PIL import Image
from torch import nn

from auditor.core.errors import did_you_mean
from auditor.data.feed import ImagePreprocessor
from auditor.models.base import ContextLimits, ModelSpec
from auditor.models.partial_adapter import PartialAdapter
from auditor.models.registry import register, register_adapter

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
CLIP_NORM = ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))
HALF = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
DINOV2_CROP = 224  # the DINOv2 image processor's crop (its config's 518 is the position table's size)
SIGLIP_QUERIES = ("mean", "first")
ConfigT = TypeVar("ConfigT", bound=transformers.PretrainedConfig)


def crop_preprocessor(
    name: str, short_side: int | None, crop: int, norm: tuple[tuple[float, ...], ...]
) -> ImagePreprocessor:
    """Bicubic resize of the short side to ``short_side`` then a centre crop of ``crop`` (``short_side``
    None: resize straight to ``crop`` x ``crop``), then standardise with ``norm`` = (mean, std)."""

    def resize(image: Image.Image) -> Image.Image:
        if short_side is None:
            return image.resize((crop, crop), resample=Image.Resampling.BICUBIC)
        width, height = image.size
        scale = short_side / min(width, height)
        size = (max(crop, round(width * scale)), max(crop, round(height * scale)))
        image = image.resize(size, resample=Image.Resampling.BICUBIC)
        left, top = (size[0] - crop) // 2, (size[1] - crop) // 2
        return image.crop((left, top, left + crop, top + crop))

    how = f"bicubic resize to {crop}x{crop}" if short_side is None else \
        f"bicubic resize of the short side to {short_side}, centre crop {crop}x{crop}"
    mean, std = (tuple(float(v) for v in part) for part in norm)
    return ImagePreprocessor(name=f"{name}: {how}, mean={list(mean)}, std={list(std)}", size=(crop, crop),
                             mean=mean, std=std, resize=resize)  # type: ignore[arg-type]


class VisionAdapter(PartialAdapter):
    """A ViT-like image encoder with a CLS token (DINOv2, CLIP); SigLIP overrides the query."""

    modality = "image"
    config_class = transformers.AutoConfig
    registers = False

    def image_size(self, config: Any) -> int:
        return int(config.image_size)

    def extra_tokens(self, config: Any) -> int:
        """Tokens besides the patches: the CLS token (and registers)."""
        return 1

    def context_limits(self, config: Any) -> ContextLimits:
        config = self.tower(config)
        return ContextLimits(self.family, fixed=self.extra_tokens(config)
                             + (self.image_size(config) // int(config.patch_size)) ** 2)

    def preprocessor(self, config: Any) -> ImagePreprocessor:
        raise NotImplementedError

    def make_loaded_inputs(self, spec: ModelSpec, kind: str, source: str | None, config: Any,
                           options: Mapping[str, Any]):
        state = dict(options)
        preprocessor = self.preprocessor(config)
        token_note = self.notes(config, self.context_length(config, None), state).get("tokens")
        if token_note:  # the rows' tokenizer column names how the image became these tokens
            preprocessor = dataclasses.replace(preprocessor, name=f"{preprocessor.name}; {token_note}")
        return None, preprocessor, state

    def forward(self, model: nn.Module, batch: Mapping[str, torch.Tensor]) -> None:
        model.net(pixel_values=batch["pixel_values"])


class Dinov2Adapter(VisionAdapter):
    family = "dinov2"
    model_types = ("dinov2", "dinov2_with_registers")
    block_path = "encoder.layer"
    after_blocks = ("layernorm.",)

    def image_size(self, config: Any) -> int:
        return min(DINOV2_CROP, int(config.image_size))

    def extra_tokens(self, config: Any) -> int:
        return 1 + int(getattr(config, "num_register_tokens", 0) or 0)

    def preprocessor(self, config: Any) -> ImagePreprocessor:
        crop = self.image_size(config)
        return crop_preprocessor("dinov2", round(crop * 256 / 224), crop, IMAGENET)

    def notes(self, config: Any, n: int, state: Mapping[str, Any]) -> dict[str, str]:
        regs = int(getattr(config, "num_register_tokens", 0) or 0)
        out = {"positions": "learned, interpolated from the config's image size to the crop",
               "query": "CLS (row 0)"}
        if regs:
            out["registers"] = (
                f"{regs} register tokens at rows 1..{regs}, part of the context (every block attends to them)"
            )
            out["tokens"] = f"CLS query; {regs} registers in the context"
        return out


class ClipVisionAdapter(VisionAdapter):
    family = "clip"
    model_types = ("clip", "clip_vision_model")
    block_path = "encoder.layers"
    after_blocks = ("post_layernorm.",)

    def tower(self, config: Any) -> Any:
        return getattr(config, "vision_config", config)

    def tower_dict(self, values: dict[str, Any]) -> dict[str, Any]:
        if "vision_config" in values:
            return {"model_type": f"{values['model_type']}_vision_model", **values["vision_config"]}
        return values

    def preprocessor(self, config: Any) -> ImagePreprocessor:
        return crop_preprocessor("clip", self.image_size(config), self.image_size(config), CLIP_NORM)

    def notes(self, config: Any, n: int, state: Mapping[str, Any]) -> dict[str, str]:
        return {"positions": "learned absolute positions; embedding read after CLIP's pre-LayerNorm",
                "query": "CLS (row 0)", "tower": "the vision tower (the text tower is never read)"}


class SiglipVisionAdapter(ClipVisionAdapter):
    family = "siglip"
    model_types = ("siglip", "siglip_vision_model")
    after_blocks = ("post_layernorm.", "head.")
    options = ("query",)

    def extra_tokens(self, config: Any) -> int:
        return 0

    def preprocessor(self, config: Any) -> ImagePreprocessor:
        return crop_preprocessor("siglip", None, self.image_size(config), HALF)

    def query_for(self, n: int, options: Mapping[str, Any]) -> tuple[str, int]:
        rule = options.get("query", "mean")
        if rule not in SIGLIP_QUERIES:
            raise did_you_mean("SigLIP query", str(rule), SIGLIP_QUERIES)
        return ("mean", 0) if rule == "mean" else ("index", 0)

    def notes(self, config: Any, n: int, state: Mapping[str, Any]) -> dict[str, str]:
        rule = state.get("query", "mean")
        query = ("mean of the n patch tokens (no CLS token)" if rule == "mean"
                 else "the top-left patch (row 0; no CLS token)")
        return {"positions": "learned absolute positions", "query": query, "tokens": f"query = {query}",
                "tower": "the vision tower (the text tower is never read)"}


DINOV2 = register_adapter(Dinov2Adapter())
CLIP = register_adapter(ClipVisionAdapter())
SIGLIP = register_adapter(SiglipVisionAdapter())


def _vit_b(cls: type[ConfigT], *, patch: int, image: int, **family: Any) -> ConfigT:
    """A ViT-B vision config of class ``cls`` (768 wide, 12 blocks of 12 heads) with patches of ``patch``
    pixels, a position table for ``image`` pixels, and the family's own fields."""
    return cls(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, patch_size=patch,
               image_size=image, **family)


def dinov2_base() -> transformers.Dinov2Config:
    return _vit_b(transformers.Dinov2Config, patch=14, image=518, intermediate_size=3072,
                  layerscale_value=1.0)


def dinov2_reg_base() -> transformers.Dinov2WithRegistersConfig:
    return _vit_b(transformers.Dinov2WithRegistersConfig, patch=14, image=518, num_register_tokens=4)


def clip_vit_b16() -> transformers.CLIPVisionConfig:
    return _vit_b(transformers.CLIPVisionConfig, patch=16, image=224, intermediate_size=3072,
                  hidden_act="quick_gelu", projection_dim=512)


def siglip_base() -> transformers.SiglipVisionConfig:
    return _vit_b(transformers.SiglipVisionConfig, patch=16, image=224, intermediate_size=3072)


register(
    ModelSpec(
        "dinov2-base", DINOV2, "facebook/dinov2-base", dinov2_base, "DINOv2 ViT-B/14 at 224 px; n = 257"
    )
)
register(ModelSpec("dinov2-reg-base", DINOV2, "facebook/dinov2-with-registers-base", dinov2_reg_base,
                   "DINOv2 ViT-B/14 with 4 registers (in the context); n = 261"))
register(ModelSpec("clip-vit-b16", CLIP, "openai/clip-vit-base-patch16", clip_vit_b16,
                   "CLIP ViT-B/16 vision tower; n = 197"))
register(ModelSpec("siglip-base", SIGLIP, "google/siglip-base-patch16-224", siglip_base,
                   "SigLIP B/16 vision tower, query = patch mean (--query); n = 196"))
