"""Shared test helpers: seeding, tiny model builders, and the shared real data. Tests run offline.

- ``shared_data("imagenet-sample")``: the path under /work/shared/data (or ../shared/data next to the
  repository). Missing data fails the test when the ``CI`` environment variable is set, skips otherwise.
- ``tiny_vit(**overrides)``, ``tiny_bert(...)``, ``tiny_gpt2(...)``, ``tiny_timm(...)``: architecture
  overrides for ``load_model(..., config_overrides=...)`` that keep a real family small and fast.
- ``tiny_model(name, **overrides)``: a random-weight tiny model of a registered family, on the CPU.
- ``save_tiny_vit(folder, **overrides)``: a seeded random tiny ViT saved as a model folder.
- ``tiny_memorize(**overrides)``: the config of a seconds-long ``audit memorize`` sweep.
- ``tiny_audit_argv(model, images, out, *extra)``: the arguments of a seconds-long ``audit MODEL`` run.
- fixture ``vit_base_random``: the real ViT-base architecture, random weights, shared by the session.
- fixture ``offline``: the hub switched off (``HF_HUB_OFFLINE=1``) for one test, whatever the network.
- ``forward_atol(x, width)`` and ``margin_atol(margin, rtol, rel)``: the float tolerances that follow
  from the dtype when the same computation runs with other kernels (another batch size, another torch
  build). Bit-identity is asserted only for the same process and the same shapes.
- ``float32_rel(k, d)`` and ``assert_rows_agree(a, b, rel)``: two audit rows of tokens made by other
  kernels, whose singular values moved by at most ``rel * sigma_max`` (``NOISY`` columns; the others are
  decisions and counts, compared exactly).
"""

from __future__ import annotations  # noqa: I001 -- probes is imported before torch, on purpose

import itertools
import math
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
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


def float32_rel(k: int, d: int) -> float:
    """How far, relative to sigma_max, the singular values of a k x d block of float32 tokens move when
    the tokens come from other kernels: each token moves by at most d eps |X|max (``forward_atol``), the
    block by at most sqrt(k d) times that in spectral norm, and sigma_max >= |X|max."""
    return d * torch.finfo(torch.float32).eps * math.sqrt(k * d)


# audit row columns that are floats of the tokens' singular values or of their geometry: equal across
# kernels only within float noise (assert_rows_agree); every other column is a decision or a count
GEOMETRY = ["effective_rank", "stable_rank", "anisotropy", "effective_rank_centred", "stable_rank_centred",
            "anisotropy_centred", "collapse_residual"]
NOISY = ["min_margin", "critical_rtol", "critical_rtol_low", "critical_rtol_high", "verdict_margin",
         "margin_bound", *GEOMETRY]


def assert_rows_agree(a: Any, b: Any, rel: float) -> bool:
    """Two audit rows (pandas Series) of one test whose singular values sigma_k / sigma_1 moved by at most
    ``rel`` between the runs: each run's critical-tolerance bracket is proven for its own tokens, so the
    brackets widened by 2 rel meet; the geometry (float64 statistics) agrees to 1e-3; the margins within
    ``2 margin_atol``. Returns whether that margin bound was informative (finite)."""
    where = (a["representation"], a["test"])

    def missing(column: str) -> bool:  # a number the test does not give (NaN) in both rows
        return bool(pd.isna(a[column]) and pd.isna(b[column]))

    if not missing("critical_rtol_low"):
        assert a["critical_rtol_low"] - 2 * rel <= b["critical_rtol_high"], where
        assert b["critical_rtol_low"] - 2 * rel <= a["critical_rtol_high"], where
    for column in GEOMETRY:
        if column in a and not missing(column):
            assert a[column] == pytest.approx(b[column], rel=1e-3, abs=1e-6), (column, *where)
    if missing("min_margin"):
        return False
    tol = margin_atol(min(a["min_margin"], b["min_margin"]), float(a["rtol"]), rel)
    assert a["min_margin"] == b["min_margin"] or abs(a["min_margin"] - b["min_margin"]) <= 2 * tol, where
    return math.isfinite(tol)


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


def save_tiny_vit(folder: Path, **overrides: Any) -> str:
    """A random tiny ViT (``tiny_vit(**overrides)``, no pooler) drawn after ``torch.manual_seed(0)`` and
    saved with ``save_pretrained`` into ``folder``; the folder as a string (a model name for the CLI and the
    API). The global torch generator is left where the draw ends, as after the same lines inline."""
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(0)
    ViTModel(ViTConfig(**tiny_vit(**overrides)), add_pooling_layer=False).save_pretrained(folder)
    return str(folder)


def tiny_memorize(**overrides: Any):
    """A seconds-long ``audit memorize`` grid: H in {1, 2}, n = 4, d_h = 4, N = 16, d = 8, 10 classes, seed
    0, 30 steps of batch 16 at lr 1e-2 with accuracy every 10 steps; ``overrides`` replace any field."""
    from auditor.lab.memorize.experiment import MemorizeConfig

    tiny = dict(heads=(1, 2), context=(4,), d_h=(4,), N=(16,), seeds=(0,), d=8, classes=10, steps=30, lr=1e-2,
                batch_size=16, eval_every=10)
    return MemorizeConfig(**{**tiny, **overrides})


def tiny_audit_argv(model: str, images: str | Path, out: Path, *extra: str) -> list[str]:
    """``audit MODEL`` arguments for a seconds-long run of a tiny model on the CPU: the first 20 images of
    ``images``, random weights, ``embedding`` and ``block.0``, both assumptions on 40 subsets, quiet, into
    ``out``; ``extra`` arguments go last."""
    return [model, "--data", str(images), "--samples", "20", "--first", "-w", "random",
            "-r", "embedding,block.0", "--tests", "assumption2,assumption1", "--subsets", "40",
            "--device", "cpu", "-q", "--out", str(out), *extra]


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


@pytest.fixture
def offline(monkeypatch):
    """Force the offline code paths (no hub) for one test, whatever the machine's network: the switch set
    and the cached answer of ``hub_reachable`` cleared before and after."""
    from auditor.models import hub_reachable

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub_reachable.cache_clear()
    yield
    hub_reachable.cache_clear()


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


TIER_FILE = Path(__file__).parent / "tier.txt"
TIER_MISSING = pytest.StashKey[list]()  # tier names a full default run did not collect


def _tier() -> frozenset[str]:
    """The node ids of the developer's tier (``tests/tier.txt``, chosen by ``scripts/pick_tier.py`` from
    the measured durations of a full run)."""
    lines = TIER_FILE.read_text().splitlines() if TIER_FILE.is_file() else []
    return frozenset(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def _fast_only(config: pytest.Config) -> bool:
    return config.option.markexpr == "fast"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With ``-m fast``, test modules without a tier test are not even imported (collection is most of a
    small run's time)."""
    name = collection_path.name
    if not _fast_only(config) or not name.startswith("test_") or collection_path.suffix != ".py":
        return None
    relative = collection_path.resolve().relative_to(Path(config.rootpath).resolve()).as_posix()
    return None if any(node.startswith(relative + "::") for node in _tier()) else True


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``pytest -m fast`` is the developer's tier: the tests named in ``tests/tier.txt`` get the ``fast``
    marker, so pytest's own ``-m`` selects them. A full default run also records tier names that no
    longer name a test (``test_tier_names_collected_tests`` fails on them)."""
    tier = _tier()
    for item in items:
        if item.nodeid in tier:
            item.add_marker(pytest.mark.fast)
    if _fast_only(config):  # (the tier alone, whatever a module marks)
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in tier])
        items[:] = [item for item in items if item.nodeid in tier]
    whole = not config.args or [Path(a).resolve() for a in config.args] == [Path(__file__).parent.resolve()]
    if whole and config.option.markexpr == "not slow" and not config.option.keyword:
        config.stash[TIER_MISSING] = sorted(tier - {item.nodeid for item in items})

