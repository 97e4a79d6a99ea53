"""Token geometry against closed forms (probes.geometry)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import with_singular_values

from probes import geometry
from probes.geometry import (
    Geometry,
    anisotropy,
    collapse_residual,
    effective_rank,
    stable_rank,
    token_geometry,
)

EPS64 = float(np.finfo(np.float64).eps)




@pytest.mark.parametrize("d", [1, 5, 64])
def test_ranks_of_identity_and_rank_one(d):
    tol = 64 * d * EPS64
    assert float(effective_rank(torch.eye(d))) == pytest.approx(d, rel=tol)
    assert float(stable_rank(torch.eye(d))) == pytest.approx(d, rel=tol)
    rank_one = torch.outer(torch.arange(1.0, 8.0), torch.linspace(-1, 2, d))  # (7, d)
    # float32 rounding of the entries (eps32 / 2 relative) leaves noise singular values of total Frobenius
    # norm <= eps32 / 2 sigma_1: tail weights summing to s <= sqrt(d - 1) eps32 / 2, entropy <= s (1 +
    # ln((d - 1) / s)), and a stable rank above 1 by at most (eps32 / 2)^2 (+ the float64 tolerance)
    half_eps32 = torch.finfo(torch.float32).eps / 2
    s = math.sqrt(d - 1) * half_eps32
    entropy = s * (1 + math.log((d - 1) / s)) if d > 1 else 0.0
    assert float(effective_rank(rank_one)) == pytest.approx(1, rel=tol + entropy)
    assert float(stable_rank(rank_one)) == pytest.approx(1, rel=tol + half_eps32**2)


def test_ranks_known_singular_values_and_batches():
    x = with_singular_values([3.0, 1.0, 1.0], 6, 4)
    p = np.array([3, 1, 1]) / 5
    tol = 64 * 6 * EPS64  # backward-stable float64 SVD of a 6 x 4 matrix (sigma to k eps sigma_1, with room)
    assert float(effective_rank(x)) == pytest.approx(math.exp(-(p * np.log(p)).sum()), rel=tol)
    assert float(stable_rank(x)) == pytest.approx(11 / 9, rel=tol)
    batch = torch.stack([x, 2 * x, torch.zeros(6, 4), torch.eye(6, 4, dtype=torch.float64)]).reshape(
        2, 2, 6, 4
    )
    er, sr = effective_rank(batch), stable_rank(batch)
    assert er.shape == sr.shape == (2, 2) and er.dtype == torch.float64
    assert er.flatten().tolist() == pytest.approx([float(effective_rank(x))] * 2 + [0.0, 4.0], rel=tol)
    assert sr.flatten().tolist() == pytest.approx([11 / 9] * 2 + [0.0, 4.0], rel=tol)


def test_scale_invariance_and_input_kinds():
    x = torch.randn(30, 12, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    tol = 64 * 30 * EPS64  # x * scale rounds each entry by eps / 2; then a backward-stable float64 SVD
    for scale in (1e-170, 1e160):
        for f in (effective_rank, stable_rank, anisotropy):
            assert float(f(x * scale)) == pytest.approx(float(f(x)), rel=tol, abs=tol)
        assert torch.allclose(
            collapse_residual((x * scale).reshape(5, 6, 12)),
            collapse_residual(x.reshape(5, 6, 12)),
            rtol=tol,
        )
    assert float(effective_rank(x.numpy())) == float(effective_rank(x))
    # float32 input: the same numbers up to float32 rounding of the data
    assert float(stable_rank(x.float())) == pytest.approx(
        float(stable_rank(x)), rel=64 * float(np.finfo(np.float32).eps)
    )


def test_anisotropy_closed_forms():
    assert float(anisotropy(torch.eye(5))) == 0.0
    assert float(anisotropy(torch.tensor([[1.0, 0], [-1, 0]]))) == pytest.approx(-1.0, abs=4 * EPS64)
    assert float(anisotropy(3 * torch.ones(4, 7))) == pytest.approx(1.0, rel=16 * EPS64)
    angle = 0.3
    pair = torch.tensor([[2.0, 0.0], [math.cos(angle), math.sin(angle)]], dtype=torch.float64)
    assert float(anisotropy(pair)) == pytest.approx(math.cos(angle), rel=8 * EPS64)
    x = torch.randn(3, 40, 9, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    x[1, 5] = 0  # a zero vector: cosine 0 with everything
    unit = x / x.norm(dim=-1, keepdim=True).clamp(min=1e-300)
    cos = unit @ unit.transpose(-1, -2)  # (3, 40, 40)
    expected = (cos.sum((-2, -1)) - cos.diagonal(dim1=-2, dim2=-1).sum(-1)) / (40 * 39)
    assert torch.allclose(anisotropy(x), expected, rtol=0, atol=64 * 40 * EPS64)
    with pytest.raises(ValueError, match="anisotropy needs N >= 2"):
        anisotropy(torch.randn(1, 4))


def test_collapse_residual_closed_forms():
    row = torch.randn(1, 1, 8, generator=torch.Generator().manual_seed(2))
    assert collapse_residual(row.expand(3, 5, 8)).tolist() == [0.0, 0.0, 0.0]  # identical rows
    centred = torch.tensor([[1.0, 2.0], [-1.0, -2.0]])  # rows average to zero
    assert float(collapse_residual(centred)) == pytest.approx(1.0, rel=4 * EPS64)
    assert collapse_residual(centred).shape == ()
    assert float(collapse_residual(torch.zeros(4, 3))) == 0.0
    e = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # mean (0.5, 0.5): residual 1 / sqrt(2)
    assert float(collapse_residual(e)) == pytest.approx(0.5**0.5, rel=4 * EPS64)


def test_collapse_residual_blocks_do_not_change_the_result(monkeypatch):
    x = torch.randn(50, 7, 6, generator=torch.Generator().manual_seed(3))
    whole = collapse_residual(x)
    monkeypatch.setattr(geometry, "CHUNK_BYTES", 7 * 6 * 8 * 3)  # 3 contexts per block
    blocked = collapse_residual(x)
    x64 = x.double()
    direct = (x64 - x64.mean(1, keepdim=True)).flatten(1).norm(dim=1) / x64.flatten(1).norm(dim=1)
    assert blocked.shape == (50,)
    assert torch.allclose(blocked, whole, rtol=16 * EPS64, atol=0)
    assert torch.allclose(blocked, direct, rtol=64 * 42 * EPS64, atol=0)


def test_token_geometry_bundles_the_measures_raw_and_centred():
    g = torch.Generator().manual_seed(4)
    q, ctx = torch.randn(60, 16, generator=g), torch.randn(60, 9, 16, generator=g)
    geo = token_geometry(ctx, q)  # (contexts, queries), as audit_tokens and assumption3
    assert isinstance(geo, Geometry) and "\n" not in repr(geo) and "centred" in repr(geo)
    assert list(geo.to_dict()) == ["effective_rank", "stable_rank", "anisotropy", "collapse_residual",
                                   "effective_rank_centred", "stable_rank_centred", "anisotropy_centred"]
    q64 = q.double()
    centred = q64 - q64.mean(0)
    assert geo.to_dict() == pytest.approx(
        dict(
            effective_rank=float(effective_rank(q)),
            stable_rank=float(stable_rank(q)),
            anisotropy=float(anisotropy(q)),
            collapse_residual=float(collapse_residual(ctx).mean()),
            effective_rank_centred=float(effective_rank(centred)),
            stable_rank_centred=float(stable_rank(centred)),
            anisotropy_centred=float(anisotropy(centred)),
        ),
        rel=64 * 60 * EPS64,  # float64 statistics of the same 60 x 16 tokens summed in other orders
    )
    streamed = token_geometry((ctx[i:i + 7] for i in range(0, 60, 7)), q)  # chunks, as from an extractor
    assert streamed.collapse_residual == pytest.approx(geo.collapse_residual, rel=64 * 60 * EPS64)  # ditto
    assert token_geometry(None, q).collapse_residual is None


def test_centred_measures_see_past_a_dominant_mean_direction():
    """Tokens = a large shared vector + isotropic noise: raw stable rank ~1 and anisotropy ~1, the
    centred ones those of the noise (stable rank d / (1 + O(sqrt(d / N))), anisotropy ~0)."""
    g = torch.Generator().manual_seed(6)
    noise = torch.randn(400, 16, generator=g, dtype=torch.float64)
    x = noise + 100.0 * torch.ones(16, dtype=torch.float64)
    geo = token_geometry(None, x)
    assert geo.stable_rank < 1.01 and geo.anisotropy > 0.99
    alone = token_geometry(None, noise - noise.mean(0))
    # centring entries near 100 rounds each by <= 2 * 100 eps: ||E||_F <= 200 eps sqrt(N d) moves every
    # sigma (Weyl) by that, relative to sigma_min(noise) ~ sqrt(N) - sqrt(d); the ratios by a few times that
    rel = 4 * 200 * EPS64 * math.sqrt(400 * 16) / (math.sqrt(400) - math.sqrt(16))
    assert geo.stable_rank_centred == pytest.approx(alone.stable_rank, rel=rel)
    assert geo.effective_rank_centred == pytest.approx(alone.effective_rank, rel=rel)
    assert abs(geo.anisotropy_centred) < 0.01 and geo.stable_rank_centred > 8
    same = token_geometry(None, torch.ones(5, 3))  # identical tokens: nothing left once centred
    assert (same.stable_rank, same.stable_rank_centred, same.anisotropy_centred) == (1.0, 0.0, 0.0)


@pytest.mark.parametrize(("call", "match"), [
    (lambda: effective_rank(torch.randn(5)), r"x must be a non-empty matrix"),
    (lambda: stable_rank(torch.tensor([[1.0, math.nan]])), "NaN/Inf"),
    (lambda: collapse_residual(torch.zeros(0, 3, 4)), "contexts must be a non-empty"),
    (lambda: token_geometry(None, torch.randn(2, 3, 4)), r"queries must have shape \(N, d\)"),
    (lambda: token_geometry(torch.randn(5, 4), torch.randn(5, 4)), r"contexts must have shape \(N, n, d\)"),
    (lambda: token_geometry([], torch.randn(5, 4)), "contexts held no context"),
    (lambda: anisotropy([[1.0, 2.0]]), "must be a torch.Tensor or numpy.ndarray"),
])
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_geometry_on_cuda_matches_cpu():
    g = torch.Generator().manual_seed(5)
    q, ctx = torch.randn(80, 32, generator=g), torch.randn(80, 10, 32, generator=g)
    cpu, gpu = token_geometry(ctx, q).to_dict(), token_geometry(ctx.cuda(), q.cuda()).to_dict()
    assert gpu == pytest.approx(cpu, rel=1e-10, abs=1e-12)
