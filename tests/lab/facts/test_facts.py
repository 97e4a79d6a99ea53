"""Facts room, databases and tensors: partial functions, bounds, exact rank, CP-rank estimates."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import sympy

from auditor.core.errors import AuditError
from auditor.lab.facts.cp import CPConfig, batched_cp_als, eckart_young_floor, estimate_cp_rank
from auditor.lab.facts.database import DatabaseSpec, from_frame, from_indices, load_csv
from auditor.lab.facts.exact import exact_rank, pencil_rank
from auditor.lab.facts.tensor import (
    bound_decomposition,
    compress,
    dense_tensor,
    exact_matrix_rank,
    flattening,
    rank_bound,
    rank_bounds,
    rank_mod_p,
    reconstruct,
    values_per_key,
    values_per_query,
)

W_TENSOR = np.zeros((2, 2, 2), dtype=int)
W_TENSOR[0, 0, 1] = W_TENSOR[0, 1, 0] = W_TENSOR[1, 0, 0] = 1  # rank 3, border rank 2


def cp_tensor(rank: int, shape=(8, 7, 6), seed: int = 0, integer: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    draw = (
        (lambda n: rng.integers(-2, 3, (n, rank))) if integer else (lambda n: rng.standard_normal((n, rank)))
    )
    return np.einsum("ir,jr,kr->ijk", *(draw(n) for n in shape))


# ---------------------------------------------------------------- databases


def test_frame_round_trip_and_value_table(tmp_path):
    frame = pd.DataFrame(
        {
            "subject": ["paris", "paris", "rome", "rome"],
            "relation": ["country", "river", "country", "country"],
            "object": ["france", "seine", "italy", "italy"],
        }
    )
    db = from_frame(frame, key="subject", query="relation", value="object")
    assert db.shape == (2, 2, 3) and db.num_triples == 3  # the repeated (rome, country, italy) counts once
    table = db.value_table()
    assert db.values[table[db.keys.index("rome"), db.queries.index("country")]] == "italy"
    assert table[db.keys.index("rome"), db.queries.index("river")] == -1
    path = tmp_path / "db.csv"
    db.save_csv(path)
    again = load_csv(path)
    assert sorted(map(tuple, again.to_frame().to_numpy())) == sorted(map(tuple, db.to_frame().to_numpy()))


def test_partial_function_check_names_the_clash(tmp_path):
    frame = pd.DataFrame({"key": ["a", "a", "b"], "query": ["r", "r", "r"], "value": ["x", "y", "x"]})
    with pytest.raises(AuditError, match=r"not a partial function: \('a', 'r'\) has two values, 'x' and 'y'"):
        from_frame(frame)
    path = tmp_path / "clash.csv"
    frame.to_csv(path, index=False)
    with pytest.raises(AuditError, match="not a partial function"):
        load_csv(path)
    with pytest.raises(AuditError, match="two values"):
        from_indices(np.array([[0, 0, 0], [0, 0, 1]]), (1, 1, 2))


def test_bad_input_errors_say_what_is_valid(tmp_path):
    frame = pd.DataFrame({"key": ["a"], "querry": ["r"], "value": ["x"]})
    with pytest.raises(AuditError, match="unknown column 'query'; did you mean 'querry'"):
        from_frame(frame)
    with pytest.raises(AuditError, match="no such database file"):
        load_csv(tmp_path / "missing.csv")
    with pytest.raises(AuditError, match="empty"):
        from_frame(pd.DataFrame({"key": ["a", None], "query": ["r", "s"], "value": ["x", "y"]}))
    with pytest.raises(AuditError, match="unknown database generator 'plantd'; did you mean 'planted'"):
        DatabaseSpec(kind="plantd")
    with pytest.raises(AuditError, match="density"):
        DatabaseSpec(density=0)


def test_random_generator_shape_density_and_blocks():
    spec = DatabaseSpec(keys=20, queries=5, values_per_query=3, density=0.5, seed=3)
    db = spec.build()
    assert db.num_triples == 50 and db.shape == (20, 5, 15)
    k, q, v = db.triples.T
    assert np.all(v // 3 == q)  # every relation draws from its own block of values
    assert np.array_equal(spec.build().triples, db.triples)  # deterministic
    assert not np.array_equal(
        DatabaseSpec(keys=20, queries=5, values_per_query=3, density=0.5, seed=4).build().triples, db.triples
    )
    shared = DatabaseSpec(keys=20, queries=5, values_per_query=3, shared_values=True).build()
    assert shared.shape == (20, 5, 3) and shared.num_triples == 100


def test_planted_generator_is_constant_on_blocks_and_noise_relabels():
    spec = DatabaseSpec(kind="planted", keys=30, queries=6, key_groups=3, query_groups=2, seed=1)
    db = spec.build()
    table = db.value_table()
    # keys with identical rows form the groups: exactly key_groups distinct rows,
    # query_groups distinct columns
    assert len({tuple(r) for r in table}) == 3 and len({tuple(c) for c in table.T}) == 2
    assert len(np.unique(table)) == 6  # one distinct value per block
    noisy = DatabaseSpec(
        kind="planted", keys=30, queries=6, key_groups=3, query_groups=2, noise=0.2, seed=1
    ).build()
    changed = np.mean(noisy.value_table() != table)
    assert 0.1 < changed < 0.3


# ---------------------------------------------------------------- bounds and exact rank


def test_exact_matrix_rank_and_rank_mod_p_match_sympy():
    rng = np.random.default_rng(0)
    for _ in range(60):
        m, n, r = rng.integers(1, 8), rng.integers(1, 8), rng.integers(1, 5)
        a = rng.integers(-2, 3, (m, r)) @ rng.integers(-2, 3, (r, n))
        expected = sympy.Matrix(a.tolist()).rank()
        assert exact_matrix_rank(a) == expected
        assert rank_mod_p(a) == expected


def test_bound_decompositions_are_exact_and_have_the_bound_size():
    for seed in range(10):
        db = DatabaseSpec(
            keys=7, queries=4, values_per_query=3, shared_values=seed % 2 == 0, density=0.8, seed=seed
        ).build()
        D = dense_tensor(db)
        for side, count in (("key", values_per_key(db).sum()), ("query", values_per_query(db).sum())):
            factors = bound_decomposition(db, side)
            assert factors[0].shape[1] == count
            assert np.array_equal(reconstruct(factors), D)  # 0/1 factors: small integer sums, exact in float
        assert rank_bound(db) == min(values_per_key(db).sum(), values_per_query(db).sum())


def test_bound_holds_on_random_databases():
    """Certified lower bound <= rank estimate <= the paper's bound, on random databases of both kinds."""
    for seed in range(4):
        db = DatabaseSpec(
            keys=6, queries=3, values_per_query=3, shared_values=True, density=0.9, seed=seed
        ).build()
        b = rank_bounds(db)
        assert b.lower <= b.upper <= b.paper_bound
        est = estimate_cp_rank(db, CPConfig(tolerance=1e-4, restarts=3, max_iter=1000))
        assert b.lower <= est.rank <= b.paper_bound
        assert est.rank == b.upper or est.errors[est.rank] <= 1e-4


def test_compress_keeps_the_rank_and_removes_repeats():
    base = cp_tensor(3, (4, 3, 3), seed=1, integer=True)
    padded = np.concatenate([base, base[:2], np.zeros((2, 3, 3), int)], axis=0)  # repeated and zero slices
    padded = np.concatenate([padded, padded[:, :1]], axis=1)
    core = compress(padded)
    assert core.shape == compress(base).shape
    assert exact_rank(padded).lower == exact_rank(base).lower == 3


def test_exact_rank_known_answers():
    assert exact_rank(W_TENSOR) == exact_rank(W_TENSOR)  # deterministic
    w = exact_rank(W_TENSOR)
    assert (w.rank, w.method) == (3, "pencil")  # every flattening has rank 2
    rotation = np.stack([np.eye(2, dtype=int), np.array([[0, -1], [1, 0]])], axis=2)
    assert exact_rank(rotation).rank == 3  # rank 2 over C, 3 over R
    swap = np.stack([np.eye(2, dtype=int), np.array([[0, 1], [1, 0]])], axis=2)
    assert exact_rank(swap).rank == 2
    assert pencil_rank(np.eye(3, dtype=int), np.diag([1, 1, 2])) == 3
    assert (
        pencil_rank(np.eye(3, dtype=int), np.array([[1, 1, 0], [0, 1, 0], [0, 0, 2]])) == 4
    )  # one Jordan block
    assert pencil_rank(np.eye(2, dtype=int), np.zeros((2, 2), int)) == 2
    # rectangles with distinct values: rank = number of rectangles (the value flattening certifies it)
    db = from_indices(
        np.array([[0, 0, 0], [0, 1, 0], [1, 0, 0], [1, 1, 0], [2, 2, 1], [3, 2, 2], [3, 3, 2]]), (4, 4, 3)
    )
    assert exact_rank(db).rank == 3 == rank_bounds(db).exact
    planted = DatabaseSpec(kind="planted", keys=12, queries=6, key_groups=3, query_groups=2, seed=2).build()
    assert exact_rank(planted).rank == 6 == rank_bounds(planted).exact


def test_exact_rank_is_honest_when_open():
    db = DatabaseSpec(keys=6, queries=3, values_per_query=3, shared_values=True, seed=1).build()
    result = exact_rank(db)
    assert result.rank is None and result.method == "open" and result.lower < result.upper
    with pytest.raises(AuditError, match="integer"):
        exact_rank(np.full((2, 2, 2), 0.5))


# ---------------------------------------------------------------- CP-rank estimates


@pytest.mark.parametrize("rank", [2, 4, 6])
@pytest.mark.parametrize("backend", ["tensorly", "als"])
def test_cp_estimate_recovers_constructed_rank(rank, backend):
    tensor = cp_tensor(rank, seed=rank)
    est = estimate_cp_rank(tensor, CPConfig(backend=backend, tolerance=1e-5, restarts=3, max_iter=2000))
    assert est.rank == rank and est.reached_by == "fit"
    assert est.floor == rank  # the flattenings have rank exactly `rank`


def test_cp_estimate_tolerance_and_border_rank():
    """W has rank 3 but border rank 2: a loose tolerance accepts rank 2, a tight one does not."""
    loose = estimate_cp_rank(W_TENSOR, CPConfig(tolerance=2e-2, restarts=2))
    tight = estimate_cp_rank(W_TENSOR, CPConfig(tolerance=1e-6, restarts=2, max_iter=2000))
    assert loose.rank == 2 and tight.rank == 3


def test_cp_estimate_on_databases_uses_certified_bounds():
    planted = DatabaseSpec(kind="planted", keys=40, queries=8, key_groups=4, query_groups=2, seed=0).build()
    est = estimate_cp_rank(planted)
    assert est.rank == 8 and est.ceiling_certified and est.shape == (4, 2, 8)  # fitted on the compressed core
    full = estimate_cp_rank(planted, CPConfig(compress=False, backend="als", verify_ceiling=True))
    assert full.rank == 8 and full.reached_by == "fit" and full.shape == (40, 8, 8)


def test_eckart_young_floor_is_a_valid_lower_limit():
    tensor = cp_tensor(5, seed=9)
    assert eckart_young_floor(tensor, 1e-8) == 5
    assert eckart_young_floor(tensor, 0.5) < 5  # a loose tolerance lets lower ranks through
    for mode in range(3):
        assert np.linalg.matrix_rank(flattening(tensor, mode)) == 5


def test_batched_als_members_do_not_interact():
    tensor = cp_tensor(3, (5, 4, 4), seed=2)
    coords = np.argwhere(tensor != 0)
    values = tensor[tuple(coords.T)]
    config = CPConfig(tolerance=1e-12, max_iter=40)
    together = batched_cp_als(coords, values, tensor.shape, [(2, 0), (3, 1), (4, 0)], config)
    alone = batched_cp_als(coords, values, tensor.shape, [(3, 1)], config)
    # float64 ALS in other batch shapes: each of the max_iter sweeps sums over the nnz entries and the
    # rank (nnz + R terms, eps each relative to |values|max); to first order the sweeps' differences add up
    atol = config.max_iter * (len(values) + 3) * np.finfo(np.float64).eps * np.abs(values).max()
    assert together[1] == pytest.approx(alone[0], rel=0, abs=atol)
