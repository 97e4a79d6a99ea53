"""Vision Transformers from Hugging Face (``ViTModel``): the paper's ``vit-base`` and its relatives.

Tokens: n = 1 + (image_size / patch_size)^2 (197 for ViT-base at 224 px), the query is the CLS token
(row 0). Inputs: RGB images resized to the model's size with PIL bilinear resampling and standardised
with mean = std = 0.5 per channel, as the google/vit image processor does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from PIL import Image
from transformers import ViTConfig, ViTModel

from auditor.data.feed import ImagePreprocessor
from auditor.models.base import ContextLimits, HFAdapter, ModelSpec, hub_reachable
from auditor.models.registry import register, register_adapter

VIT_MEAN = (0.5, 0.5, 0.5)
VIT_STD = (0.5, 0.5, 0.5)


def vit_preprocessor(
    image_size: int, mean: tuple[float, ...] = VIT_MEAN, std: tuple[float, ...] = VIT_STD
) -> ImagePreprocessor:
    """Resize to (image_size, image_size) with PIL bilinear resampling, then standardise."""

    def resize(image: Image.Image) -> Image.Image:
        return image.resize((image_size, image_size), resample=Image.Resampling.BILINEAR)

    mean3 = tuple(float(m) for m in mean)
    std3 = tuple(float(s) for s in std)
    return ImagePreprocessor(
        name=f"vit: PIL bilinear resize to {image_size}x{image_size}, mean={list(mean3)}, std={list(std3)}",
        size=(image_size, image_size),
        mean=mean3,  # type: ignore[arg-type]
        std=std3,  # type: ignore[arg-type]
        resize=resize,
    )


def _saved_norm(source: Path | str | None) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """mean/std of the image processor saved with the weights (folder or hub id), if it can be read."""
    if source is None:
        return None
    path = Path(source) / "preprocessor_config.json"
    if not path.is_file():
        try:
            from huggingface_hub import hf_hub_download

            path = Path(
                hf_hub_download(str(source), "preprocessor_config.json", local_files_only=not hub_reachable())
            )
        except Exception:  # noqa: BLE001 - no saved processor (offline, absent): the family default applies
            return None
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return tuple(cfg.get("image_mean", VIT_MEAN)), tuple(cfg.get("image_std", VIT_STD))


class ViTAdapter(HFAdapter):
    family = "vit"
    modality = "image"
    model_types = ("vit",)
    config_class = ViTConfig
    model_class = ViTModel
    block_paths = ("layers", "encoder.layer")  # transformers 5, transformers 4
    model_kwargs = {"add_pooling_layer": False}

    def context_limits(self, config: Any) -> ContextLimits:
        return ContextLimits("ViT", fixed=1 + (int(config.image_size) // int(config.patch_size)) ** 2)

    def make_inputs(self, spec: ModelSpec, kind: str, folder: Path | None, config: Any, *,
                    trust_remote_code: bool = False):
        source = folder if kind == "folder" else (spec.source if kind == "pretrained" else None)
        norm = _saved_norm(source)
        return None, vit_preprocessor(int(config.image_size), *(norm or (VIT_MEAN, VIT_STD)))

    def forward(self, model, batch) -> None:
        model(pixel_values=batch["pixel_values"])


VIT = register_adapter(ViTAdapter())


def _vit_large() -> ViTConfig:
    return ViTConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)


# ViTConfig() defaults are ViT-base/16 at 224 px: 768 wide, 12 blocks, 12 heads, MLP 3072.
register(
    ModelSpec("vit-base", VIT, "google/vit-base-patch16-224-in21k", ViTConfig, "ViT-B/16, paper A; n = 197")
)
register(
    ModelSpec("vit-base-224", VIT, "google/vit-base-patch16-224", ViTConfig, "ViT-B/16, ImageNet-1k; n = 197")
)
register(
    ModelSpec("vit-large", VIT, "google/vit-large-patch16-224-in21k", _vit_large, "ViT-L/16 in21k; n = 197")
)
