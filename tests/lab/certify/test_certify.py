"""Capacity certificates: exact small cases, the Proposition 2 ceiling, tolerance, saturation."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from auditor.core.errors import AuditError
from auditor.lab.certify.experiment import CertifyRequest, default_rtols
from auditor.lab.common.mha.certify import (
    attention_features,
    capacity_bound,
    certify,
    circle_code,
    lower_bound,
    proposition2_bound,
    readout_realizable,
    tolerance_curve,
)
from auditor.lab.common.mha.data import DataConfig, MemorizeData, make_data
from auditor.lab.common.mha.model import MHAConfig, MHAEnsemble
from auditor.lab.common.mha.saturation import saturation
from auditor.lab.common.mha.task import MemorizeTask
from auditor.lab.engine import TrainConfig, train

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread


def layer(H: int, d: int, d_h: int, outputs: int = 5, seed: int = 0, **kw) -> MHAEnsemble:
    return MHAEnsemble([MHAConfig(heads=H, d=d, d_h=d_h, d_v=d_h, outputs=outputs, seed=seed, **kw)])


def test_bounds_known_values():
    assert proposition2_bound(heads=20, context=32) == 621
    assert capacity_bound(heads=30, context=32, d_h=10) == 30 * 9 + 1
    assert capacity_bound(heads=30, context=32, d_h=64) == proposition2_bound(30, 32)


def test_uniform_attention_certifies_exactly_one_example():
    """W_Q = 0 makes every head average the shared context: all rows of Z are equal, rank 1."""
    data = make_data(DataConfig(N=12, context=4, d=6, task="regression", seed=3))
    model = layer(2, 6, 3)
    with torch.no_grad():
        model.W_Q.zero_()
    Z = attention_features(model, data)
    expected_row = data.contexts[0].double().mean(0).repeat(2)  # (H w,): both heads average the 4 rows
    torch.testing.assert_close(Z, expected_row.expand(12, -1))
    cert = certify(Z, data.labels, task="regression", error_tolerance=1e-9)
    assert cert.rank == 1 and cert.guaranteed == 1
    assert cert.readout_hits == 1  # labels are distinct reals: only the fitted example is within 1e-9


def test_two_row_identity_context_known_rank():
    """n = 2 rows e_1, e_2 (d = 2), one head: row t of Z is s(t) itself, so rank = H(n-1)+1 = 2 exactly."""
    N = 7
    contexts = torch.eye(2)[None]  # (1, 2, 2)
    queries = torch.randn(N, 2, generator=torch.Generator().manual_seed(0))
    labels = torch.rand(N, 1, generator=torch.Generator().manual_seed(1))
    data = MemorizeData(contexts, queries, labels, "regression")
    model = layer(1, 2, 2, outputs=1)
    Z = attention_features(model, data)  # (N, 2)
    torch.testing.assert_close(Z.sum(1), torch.ones(N, dtype=torch.float64))  # rows are softmax vectors
    cert = certify(Z, labels, task="regression", error_tolerance=1e-9)
    assert cert.rank == 2 == proposition2_bound(1, 2)
    assert cert.readout_hits >= 2 and cert.residual < 1e-9


def test_full_rank_z_memorizes_every_label_exactly():
    """rank(Z) = N: the least-squares readout reproduces arbitrary real labels on all N examples."""
    data = make_data(
        DataConfig(N=20, context=6, d=8, task="regression", outputs=3, shared_context=False, seed=4)
    )
    Z = attention_features(layer(4, 8, 8, outputs=3), data)  # (20, 32)
    cert = certify(Z, data.labels, task="regression", error_tolerance=1e-8)
    assert cert.rank == 20 and cert.readout_hits == 20
    assert cert.margin > 1


@pytest.mark.parametrize(("H", "n", "d", "d_h"), [(1, 3, 4, 4), (2, 3, 4, 4), (3, 5, 8, 8), (4, 8, 16, 16)])
def test_proposition2_random_weights_reach_the_ceiling_exactly(H, n, d, d_h):
    """Shared context: rank(Z) = H(n-1)+1 for random weights once N >= H(n-1)+1, and never more."""
    bound = proposition2_bound(H, n)
    for N in (bound, 3 * bound):
        data = make_data(DataConfig(N=N, context=n, d=d, classes=5, seed=N))
        rank = certify(attention_features(layer(H, d, d_h, seed=N), data), data.labels, classes=5).rank
        assert rank == bound
    small = make_data(DataConfig(N=bound - 1, context=n, d=d, classes=5, seed=9))
    assert certify(attention_features(layer(H, d, d_h), small), small.labels, classes=5).rank == bound - 1


def test_proposition2_holds_for_trained_weights_and_fails_without_sharing():
    H, n, d = 3, 4, 8
    bound = proposition2_bound(H, n)
    data = make_data(DataConfig(N=60, context=n, d=d, classes=4, seed=1))
    model = layer(H, d, d, outputs=4, seed=2)
    task = MemorizeTask([data], batch_size=60)
    train(model, task, TrainConfig(steps=150, lr=3e-2, early_stop=False), progress=False)
    Z = attention_features(model, data)
    assert certify(Z, data.labels, classes=4).rank <= bound
    assert certify(Z, data.labels, classes=4, rtol=1e-12).rank <= bound  # even at a tiny tolerance
    # per-example contexts are not bound by the ceiling: rank reaches min(N, H d)
    free = make_data(DataConfig(N=60, context=n, d=d, classes=4, shared_context=False, seed=1))
    assert certify(attention_features(model, free), free.labels, classes=4).rank == H * d > bound


def test_tolerance_decides_the_rank_of_tiny_d_h():
    """d_h = 1: exact arithmetic sees (almost) the full ceiling, float32 tolerance sees far less."""
    H, n, d = 4, 8, 16
    data = make_data(DataConfig(N=200, context=n, d=d, classes=5, seed=0))
    Z = attention_features(layer(H, d, 1, seed=3), data)
    curve = tolerance_curve(Z)
    assert curve["rank"].is_monotonic_decreasing
    loose = certify(Z, data.labels, classes=5).rank
    strict = certify(Z, data.labels, classes=5, source_dtype=torch.float64).rank
    assert loose < strict <= proposition2_bound(H, n)
    assert int(curve.loc[curve["rtol"].idxmin(), "rank"]) >= strict


def test_circle_code_separates_every_class():
    code = circle_code(100)
    assert torch.equal((code @ code.T).argmax(1), torch.arange(100))
    torch.testing.assert_close(code.norm(dim=1), torch.ones(100, dtype=torch.float64))


def test_readout_realizability_follows_d_v():
    assert readout_realizable(d_v=2, width=16, target_width=2)  # circle code through 2 value dims
    assert not readout_realizable(d_v=1, width=16, target_width=2)  # the authors' d_v = 1 with classes
    assert readout_realizable(d_v=1, width=16, target_width=1)  # scalar regression
    assert not readout_realizable(d_v=4, width=1, target_width=2)


def test_certify_rejects_bad_input():
    with pytest.raises(AuditError, match="one label per row"):
        certify(torch.zeros(3, 2), torch.zeros(4, dtype=torch.long), classes=3)
    with pytest.raises(AuditError, match="classes"):
        certify(torch.zeros(3, 2), torch.zeros(3, dtype=torch.long))


@pytest.mark.parametrize("rtol", [0.0, 1.0, -1e-6, math.inf, math.nan])
def test_certify_request_refuses_a_rank_tolerance_outside_0_1(rtol):
    with pytest.raises(AuditError, match=r"rtol \(the relative rank tolerance\) must be in \(0, 1\)"):
        CertifyRequest(rtol=rtol)
    assert CertifyRequest(rtol=1e-6).rtol == 1e-6


def test_saturation_counts_known_patterns():
    s = torch.tensor([
        [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]],
        [[0.0, 0.995, 0.005], [0.0, 0.0, 1.0]],
        [[0.3, 0.3, 0.4], [0.2, 0.2, 0.6]],
    ])  # (N=3, H=2, n=3)
    sat = saturation(s)
    torch.testing.assert_close(sat.per_head, torch.tensor([2 / 3, 1 / 3], dtype=torch.float64))
    assert sat.per_example.tolist() == [1, 2, 0]
    assert math.isclose(sat.with_free_head, 2 / 3)
    assert sat.histogram()["examples"].tolist() == [1, 1, 1]
    with pytest.raises(AuditError):
        saturation(s, threshold=1.5)


# -- what the certificate outputs claim ------------------------------------------------------------
def test_lower_bound_applies_only_where_contexts_can_have_rank_n():
    assert lower_bound(heads=4, context=8, d_h=16, d=16) == (4 * 7 + 1, "")
    assert lower_bound(heads=4, context=8, d_h=2, d=16) == (4 * 1 + 1, "")  # d_h < n: H(d_h - 1) + 1
    value, note = lower_bound(heads=4, context=20, d_h=16, d=16)
    assert value is None and "n > d" in note and "Assumption 2" in note


def test_certify_run_prints_guaranteed_beside_the_bounds_and_names_argmax_hits(tmp_path, capsys):
    from auditor.cli import main

    out = tmp_path / "cert"
    assert main(["certify", "--heads", "2", "--context", "3", "--d-h", "1,3", "--N", "8,32", "--d", "4",
                 "--threads", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    header = next(line for line in printed.splitlines() if line.startswith("| weights"))
    for column in ("guaranteed", "lower_bound", "shared_bound", "readout_hits"):
        assert column in header
    assert "certified" not in header and "check: guaranteed <= shared_bound on 4 of 4" in printed
    frame = pd.read_csv(out / "results.csv")
    assert (frame["guaranteed"] == frame[["rank", "N"]].min(axis=1)).all()
    assert (frame["guaranteed"] <= frame["shared_bound"]).all()  # Proposition 2: an exact ceiling
    assert frame.set_index("d_h")["lower_bound"].to_dict() == {1: 1, 3: 5}
    # the tolerance curves are at the largest N: their default rtol is that N's, max(N, H w) eps(float32)
    curves = pd.read_csv(out / "tolerance.csv")
    rtols = default_rtols(curves, frame)
    assert rtols.notna().all()
    assert rtols.to_numpy() == pytest.approx([max(32, 2 * 4) * torch.finfo(torch.float32).eps] * len(curves))


def test_certify_of_n_beyond_d_leaves_the_bound_blank_with_its_reason(tmp_path, capsys):
    from auditor.cli import main

    out = tmp_path / "wide"
    assert (
        main(
            [
                "certify",
                "--heads",
                "1",
                "--context",
                "6",
                "--d-h",
                "4",
                "--N",
                "8",
                "--d",
                "4",
                "--no-plots",
                "--threads",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    frame = pd.read_csv(out / "results.csv")
    assert frame["lower_bound"].isna().all() and frame["lower_bound_note"].str.contains("n > d").all()
    assert "lower_bound blank: n > d" in capsys.readouterr().out
