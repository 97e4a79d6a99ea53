"""Model adapters: one file per backbone family, each registering itself in one line.

>>> from auditor.models import load_model
>>> loaded = load_model("vit-base", weights="random", seed=0)   # offline: the architecture is in code
>>> loaded.n, loaded.d, loaded.query_index
(197, 768, 0)
"""

from auditor.models.base import (
    Adapter,
    ImagePreprocessor,
    LoadedModel,
    ModelSpec,
    TextTokenizer,
    WeightsUnavailable,
    dtype_name,
    hub_reachable,
    resolve_device,
    resolve_dtype,
)
from auditor.models.registry import adapters, known_models, load_model, register, register_adapter, resolve

# The families register their adapters and named models on import (order = listing order).
from auditor.models import vit, bert, gpt2, minilm, timm_vit  # noqa: E402, F401, I001  isort: skip
from auditor.models import decoder, encoders, vision  # noqa: E402, F401, I001  isort: skip

__all__ = [
    "Adapter",
    "ImagePreprocessor",
    "LoadedModel",
    "ModelSpec",
    "TextTokenizer",
    "WeightsUnavailable",
    "adapters",
    "dtype_name",
    "hub_reachable",
    "known_models",
    "load_model",
    "register",
    "register_adapter",
    "resolve",
    "resolve_device",
    "resolve_dtype",
]
from auditor.models.from_object import from_object  # noqa: E402, F401  (a model object the caller holds)
