"""Shared test helpers: seeding, tiny model builders, and the shared real data. Tests run offline.

- ``shared_data("imagenet-sample")``: the path under /work/shared/data (or ../shared/data next to the
  repository). Missing data fails the test when the ``CI`` environment variable is set, skips otherwise.
- ``tiny_vit(**overrides)``, ``tiny_bert(...)``, ``tiny_gpt2(...)``, ``tiny_timm(...)``: architecture
  overrides for ``load_model(..., config_overrides=...)`` that keep a real family small and fast.
- ``tiny_model(name, **overrides)``: a random-weight tiny model of a registered family, on the CPU.
- fixture ``vit_base_random``: the real ViT-base architecture, random weights, shared by the session.
- ``forward_atol(x, width)`` and ``margin_atol(margin, rtol, rel)``: the float tolerances that follow
  from the dtype when the same computation runs with other kernels (another batch size, another torch
  build). Bit-identity is asserted only for the same process and the same shapes.
"""

from __future__ import annotations  # noqa: I001 -- probes is imported before torch, on purpose

import itertools
import math
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import probes  # noqa: F401 -- before torch: the OpenMP wait policy (the suite runs beside other jobs)
import torch

# The default test run never touches the network: without this, an online machine would download
# GPT-2's tokenizer (and any weights a test asks for) and the offline code paths would go untested.
# Run with HF_HUB_OFFLINE=0 to let tests use the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA_ROOTS = (Path("/work/shared/data"), REPO.parent / "shared" / "data")


def shared_data(relative: str) -> Path:
    """Path of a shared real dataset; fails under CI when missing, skips otherwise."""
    for root in SHARED_DATA_ROOTS:
        path = root / relative
        if path.exists():
            return path
    where = " or ".join(str(r / relative) for r in SHARED_DATA_ROOTS)
    if os.environ.get("CI"):
        pytest.fail(f"shared data missing under CI: {where}")
    pytest.skip(f"shared data not available: {where}")


def with_singular_values(sv: list[float], m: int, n: int, seed: int = 0) -> torch.Tensor:
    """An (m, n) float64 matrix with the given singular values (random singular vectors, up to rounding)."""
    g = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(m, m, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    s = torch.zeros(m, n, dtype=torch.float64)
    s[range(len(sv)), range(len(sv))] = torch.tensor(sv, dtype=torch.float64)
    return u @ s @ v.T


def forward_atol(x: torch.Tensor, width: int) -> float:
    """Worst-case absolute difference of two float evaluations of one forward pass whose kernels differ
    only in how they sum (batch size, blocking, library build): a length-``width`` dot product in the
    dtype of ``x`` carries at most ``width * eps`` relative error (the classical gamma_n bound), scaled
    by the largest magnitude of the result."""
    return width * torch.finfo(x.dtype).eps * x.abs().max().item()


def margin_atol(margin: float, rtol: float, rel: float) -> float:
    """How far a rank margin (decades between a singular value and ``rtol * sigma_max``) can move when
    the matrix moves by ``rel * sigma_max`` in spectral norm (Weyl: every singular value moves by at
    most that): the deciding value sigma = rtol * sigma_max * 10**margin moves by a relative
    ``x = rel / (rtol * 10**margin)`` and sigma_max by ``rel``. Infinite once x >= 1, i.e. when the
    margin is inside the float noise of the data and no float tolerance can be promised."""
    if not math.isfinite(margin):
        return 0.0
    x = rel / (rtol * 10.0**margin)
    if x >= 1 or rel >= 1:
        return math.inf
    return math.log10((1 + x) / (1 - x)) + 2 * math.log10((1 + rel) / (1 - rel))


def tiny_vit(**overrides: Any) -> dict[str, Any]:
    """ViTConfig fields of a 3-block, 32-wide ViT on 32 x 32 images (n = 1 + 4 x 4 = 17)."""
    return {
        "hidden_size": 32,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "image_size": 32,
        "patch_size": 8,
        **overrides,
    }


def tiny_bert(**overrides: Any) -> dict[str, Any]:
    """BertConfig fields of a 3-block, 32-wide BERT (full uncased vocabulary, 128 positions)."""
    return {
        "hidden_size": 32,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "max_position_embeddings": 128,
        **overrides,
    }


def tiny_gpt2(**overrides: Any) -> dict[str, Any]:
    """GPT2Config fields of a 3-block, 32-wide GPT-2 with 128 positions."""
    return {"n_embd": 32, "n_layer": 3, "n_head": 4, "n_positions": 128, **overrides}


def tiny_timm(**overrides: Any) -> dict[str, Any]:
    """timm ``create_model`` arguments of a 3-block, 32-wide ViT on 32 x 32 images (n = 17)."""
    return {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 3, "num_heads": 4, **overrides}


TINY = {
    "vit-base": tiny_vit,
    "bert-base": tiny_bert,
    "minilm": tiny_bert,
    "gpt2": tiny_gpt2,
    "timm:vit_tiny_patch16_224": tiny_timm,
}


def tiny_model(name: str, *, seed: int = 0, context_length: int | None = None, **overrides: Any):
    """A random-weight tiny model of ``name``'s family on the CPU (timm names need timm installed)."""
    from auditor.models import load_model

    if name.startswith("timm:"):
        pytest.importorskip("timm")
    return load_model(
        name,
        "random",
        device="cpu",
        seed=seed,
        context_length=context_length,
        config_overrides=TINY[name](**overrides),
    )


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module of tiny models: several times faster than two on a shared
    2-core machine (OpenMP contention). Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def vit_base_random():
    """The paper's ViT-base architecture with random weights (seed 0) on the CPU, built once per session."""
    from auditor.models import load_model

    return load_model("vit-base", "random", device="cpu", seed=0)


@pytest.fixture(autouse=True)
def _seed_everything() -> None:
    """Every test starts from the same random state."""
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


def brute_kruskal_rank(x: torch.Tensor, rtol: float | None = None) -> int:
    """Numerical Kruskal rank from a plain float64 SVD of every subset (the rule of numerical_rank)."""
    n_vec, d = x.shape
    for k in range(1, min(n_vec, d) + 1):
        idx = torch.tensor(list(itertools.combinations(range(n_vec), k)))  # (C(N, k), k)
        ranks = probes.rank.numerical_rank(
            x[idx], probes.rank.resolve_rtol(rtol, k, d, x.dtype)
        ).rank  # (C(N, k),)
        if bool((ranks < k).any()):
            return k - 1
    return min(n_vec, d)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``pytest -m fast`` is the developer's tier: the fast modules' tests that are not also ``slow``.

    (``-m fast`` replaces the default ``-m 'not slow'`` of pyproject.toml, so the slow tests of a fast
    module are left out here.)"""
    if config.option.markexpr != "fast":
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]
