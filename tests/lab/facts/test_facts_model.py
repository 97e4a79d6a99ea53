"""Facts room, the layer: batched attention-only layers, training, the layer tensor L and its bound."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import forward_atol

from auditor.core.errors import AuditError
from auditor.lab.engine import TrainConfig
from auditor.lab.facts.database import DatabaseSpec, from_indices
from auditor.lab.facts.effective import (
    CPLogits,
    effective_rank,
    rank_one_signs,
    strict_argmax_hits,
)
from auditor.lab.facts.exact import exact_rank
from auditor.lab.facts.layer_tensor import (
    architecture_bound,
    bound_decomposition,
    flattening_lower_bound,
    layer_tensor,
    threshold_database,
)
from auditor.lab.facts.model import FactLayer, LayerConfig, argmax_accuracy, numpy_member, softmax_accuracy
from auditor.lab.facts.tensor import rank_bounds, reconstruct
from auditor.lab.facts.training import FactTask, train_layers

CONFIGS = [
    LayerConfig(d_model=2, heads=1, d_qk=1, d_vo=1, seed=0),
    LayerConfig(d_model=5, heads=2, d_qk=3, d_vo=2, seed=1),
    LayerConfig(d_model=8, heads=3, d_qk=8, d_vo=4, seed=2),
]


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread


# reductions one logit goes through in the padded layer: over d_model (projections, values, read-out),
# d_qk, the H d_vo heads and the two prompt tokens: the width for forward_atol of two evaluations
PADDED_CHAIN = (4 * max(c.d_model for c in CONFIGS) + max(c.d_qk for c in CONFIGS)
                + max(c.heads * c.d_vo for c in CONFIGS) + 2)


def reference_logits(w: dict[str, np.ndarray], K: int, d_qk: int, k: int, q: int) -> np.ndarray:
    """The layer written out for one prompt [k, q] with one member's unpadded weights."""
    x_k, x_q = w["embed"][k], w["embed"][K + q]
    out = x_q.copy()
    for h in range(w["w_q"].shape[0]):
        query = x_q @ w["w_q"][h]
        scores = np.array([query @ (x_k @ w["w_k"][h]), query @ (x_q @ w["w_k"][h])]) / np.sqrt(d_qk)
        attn = np.exp(scores - scores.max())
        attn /= attn.sum()
        mixed = attn[0] * x_k + attn[1] * x_q
        out = out + mixed @ w["w_v"][h] @ w["w_o"][h]
    return out @ w["unembed"]


def test_forward_matches_the_written_out_layer_for_every_member():
    K, Q, V = 4, 3, 5
    layer = FactLayer(CONFIGS, K, Q, V).double()
    logits = layer.all_logits().detach().numpy()  # (E, K, Q, V)
    for e, cfg in enumerate(CONFIGS):
        w = numpy_member(layer, e)
        assert w["w_q"].shape == (cfg.heads, cfg.d_model, cfg.d_qk)
        for k in range(K):
            for q in range(Q):
                want = reference_logits(w, K, cfg.d_qk, k, q)
                atol = forward_atol(torch.from_numpy(want), PADDED_CHAIN)  # float64, summed in other orders
                np.testing.assert_allclose(logits[e, k, q], want, rtol=0, atol=atol)


def test_member_in_ensemble_equals_member_alone_and_padding_stays_zero():
    db = DatabaseSpec(keys=6, queries=3, values_per_query=2, seed=0).build()
    cfg = TrainConfig(steps=30, lr=1e-2, eval_every=10, early_stop=False)
    together = train_layers(db, CONFIGS, cfg)
    alone = train_layers(db, [CONFIGS[0]], cfg)
    # reductions of the padded layer: over d_model (projections, values, read-out), d_qk, the H d_vo
    # heads, the two prompt tokens, the |V| values (softmax) and the |K||Q| prompts (mean loss); first
    # order, each training step adds at most one such rounding relative to the logits' scale
    model = together.model
    width = (4 * max(c.d_model for c in CONFIGS) + max(c.d_qk for c in CONFIGS)
             + max(c.heads * c.d_vo for c in CONFIGS) + 2
             + model.num_values + model.num_keys * model.num_queries)
    want = alone.model.all_logits(0)
    atol = (cfg.steps + 1) * forward_atol(want, width)
    torch.testing.assert_close(together.model.all_logits(0), want, atol=atol, rtol=0)
    # the smallest member's padded parameters received exactly zero updates
    m = together.model
    assert torch.count_nonzero(m.embed[0, :, 2:]) == 0
    assert torch.count_nonzero(m.w_q[0, 1:]) == 0 and torch.count_nonzero(m.w_q[0, :, :, 1:]) == 0
    assert torch.count_nonzero(m.unembed[0, 2:]) == 0
    assert together.rows[0]["parameters"] == CONFIGS[0].parameters(*db.shape)


def test_small_database_is_memorized_completely():
    db = DatabaseSpec(keys=8, queries=4, values_per_query=2, seed=1).build()
    trained = train_layers(
        db,
        [LayerConfig(d_model=16, heads=1, d_qk=16, d_vo=16, seed=0)],
        TrainConfig(steps=600, lr=1e-2, eval_every=20),
    )
    row = trained.rows[0]
    assert row["accuracy"] == 1.0 and row["facts_stored"] == 32
    assert row["early_stopped"] and row["steps_trained"] < 600


def test_tau_accuracy_is_consistent_with_argmax():
    db = DatabaseSpec(keys=10, queries=4, values_per_query=3, seed=2).build()
    trained = train_layers(
        db, [LayerConfig(d_model=4, d_qk=4, d_vo=2)], TrainConfig(steps=150, lr=1e-2), taus=(0.3, 0.5, 0.9)
    )
    task = trained.task
    logits = task.logits(trained.model)[0]  # (N, V)
    targets = task.values[0]
    V = logits.shape[-1]
    arg = float(argmax_accuracy(logits, targets))
    taus = [1 / (V + 1), 0.2, 0.5, 0.6, 0.9, 0.99]
    accs = [float(softmax_accuracy(logits, targets, t)) for t in taus]
    assert all(b <= a for a, b in zip(accs, accs[1:]))  # never increases with tau
    assert accs[0] >= arg  # tau <= 1/|V|: every argmax clears it
    assert all(a <= arg for t, a in zip(taus, accs) if t >= 0.5)  # p >= tau > 1/2 is the unique argmax
    assert 0 < arg < 1  # the check is not vacuous
    assert trained.rows[0]["acc_tau0.5"] == pytest.approx(float(softmax_accuracy(logits, targets, 0.5)))
    # with two values, p >= 1/2 and argmax agree (up to exact ties)
    two = from_indices(np.array([[k, q, (k + q) % 2] for k in range(6) for q in range(3)]), (6, 3, 2))
    two_trained = train_layers(two, [LayerConfig(d_model=2, d_qk=1, d_vo=1)], TrainConfig(steps=40))
    lg, tg = two_trained.task.logits(two_trained.model)[0], two_trained.task.values[0]
    assert float(softmax_accuracy(lg, tg, 0.5)) == float(argmax_accuracy(lg, tg))


def test_task_pads_databases_of_different_sizes():
    full = DatabaseSpec(keys=6, queries=3, values_per_query=2, seed=0).build()
    sparse = DatabaseSpec(keys=6, queries=3, values_per_query=2, density=0.5, seed=1).build()
    layer = FactLayer([CONFIGS[1], CONFIGS[1]], *full.shape)
    both = FactTask([full, sparse], [0, 1])
    only = FactTask([sparse], [0, 0])
    torch.testing.assert_close(both.loss(layer, None)[1], only.loss(layer, None)[1])
    torch.testing.assert_close(both.accuracy(layer)[1], only.accuracy(layer)[1])
    with pytest.raises(AuditError, match="share one shape"):
        FactTask([full, DatabaseSpec(keys=5, queries=3, values_per_query=2).build()], [0, 1])


# ---------------------------------------------------------------- the layer tensor L


def test_layer_tensor_is_the_logits_and_the_bound_decomposition_is_exact():
    K, Q, V = 6, 4, 10
    configs = [*CONFIGS, LayerConfig(d_model=3, heads=1, d_qk=3, d_vo=3, seed=4)]
    layer = FactLayer(configs, K, Q, V).double()
    logits = layer.all_logits().detach().numpy()
    for e, cfg in enumerate(configs):
        lt = layer_tensor(layer, e)
        L = lt.full()
        np.testing.assert_allclose(L, logits[e], rtol=0, atol=forward_atol(torch.from_numpy(L), PADDED_CHAIN))
        bound, factors = bound_decomposition(lt)
        assert factors[0].shape[1] == bound.bound
        np.testing.assert_allclose(reconstruct(factors), L, atol=1e-9 * np.abs(L).max())
        assert flattening_lower_bound(L) <= bound.bound <= architecture_bound(cfg, (K, Q, V))
        assert bound.bound <= min(bound.joint, bound.key_side + bound.query_side, bound.slice_bound)


def test_architecture_bound_follows_d_vo_not_d_qk():
    shape = (16, 8, 32)
    base = architecture_bound(LayerConfig(d_model=8, d_qk=1, d_vo=1), shape)
    assert architecture_bound(LayerConfig(d_model=8, d_qk=8, d_vo=1), shape) == base
    assert architecture_bound(LayerConfig(d_model=8, d_qk=1, d_vo=2), shape) > base
    assert architecture_bound(LayerConfig(d_model=8, heads=2, d_qk=1, d_vo=1), shape) > base
    # joint construction: d_model + H d_vo min(|K|, |Q|) while that is the smallest count
    assert base == 8 + 1 * 1 * 8


def test_random_layer_attains_the_architecture_bound():
    """Random weights are generic: the data-dependent construction needs the worst-case count."""
    layer = FactLayer([LayerConfig(d_model=2, heads=1, d_qk=2, d_vo=1, seed=0)], 5, 2, 6).double()
    lt = layer_tensor(layer, 0)
    bound, _ = bound_decomposition(lt)
    assert flattening_lower_bound(lt.full()) <= bound.bound
    assert bound.bound == architecture_bound(lt.config, (5, 2, 6))


def test_threshold_database_matches_tau_accuracy():
    db = DatabaseSpec(keys=8, queries=3, values_per_query=2, seed=0).build()
    trained = train_layers(
        db, [LayerConfig(d_model=6, d_qk=6, d_vo=6)], TrainConfig(steps=200, lr=1e-2), taus=(0.8,)
    )
    L = layer_tensor(trained.model, 0).full()
    s_db = threshold_database(L, 0.8)
    present = {tuple(t) for t in s_db.triples}
    hits = np.mean([tuple(t) in present for t in db.triples])
    assert hits == pytest.approx(trained.rows[0]["acc_tau0.8"], abs=1e-6)
    assert rank_bounds(s_db).upper <= s_db.num_triples
    with pytest.raises(AuditError, match="tau"):
        threshold_database(L, 0.3)


# ---------------------------------------------------------------- effective rank


def test_effective_rank_one_is_decided_exactly():
    xor = from_indices(np.array([[0, 0, 0], [0, 1, 1], [1, 0, 1], [1, 1, 0]]), (2, 2, 2))
    a, b, c = rank_one_signs(xor)
    logits = torch.tensor(np.einsum("k,q,v->kqv", a, b, c))
    t = torch.tensor(xor.triples)
    assert strict_argmax_hits(logits[t[:, 0], t[:, 1]], t[:, 2]).all()
    result = effective_rank(xor)
    assert (result.rank, result.exact) == (1, True)
    assert exact_rank(xor).rank == 2  # rank 2 (the pencil of I and the swap), effective rank 1
    three = from_indices(np.array([[0, 0, 0], [0, 1, 1], [1, 0, 2]]), (2, 2, 3))
    assert rank_one_signs(three) is None  # three values: no rank-1 tensor
    odd = from_indices(np.array([[0, 0, 0], [0, 1, 0], [1, 0, 0], [1, 1, 1]]), (2, 2, 2))
    assert rank_one_signs(odd) is None  # parity cycle with an odd number of flips


def test_effective_rank_search_finds_a_verified_witness():
    db = DatabaseSpec(keys=8, queries=3, values_per_query=4, shared_values=True, seed=0).build()
    result = effective_rank(db, restarts=2, batch_ranks=3)
    assert result.rank is not None and 2 <= result.rank <= rank_bounds(db).upper
    assert result.accuracy[result.rank] == 1.0
    assert all(acc < 1.0 for r, acc in result.accuracy.items() if r < result.rank)


def test_cp_logits_mask_keeps_members_at_their_rank():
    model = CPLogits([1, 3], (4, 3, 5), seeds=[0, 1])
    assert torch.count_nonzero(model.A[0, :, 1:]) == 0
    keys = torch.arange(4).repeat(2, 1)
    queries = torch.zeros(2, 4, dtype=torch.long)
    out = model(keys, queries)  # (2, 4, 5)
    rank_one = torch.einsum("k,v->kv", model.A[0, :, 0] * model.B[0, 0, 0], model.C[0, :, 0])
    torch.testing.assert_close(out[0], rank_one)
