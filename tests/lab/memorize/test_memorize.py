"""The memorization room: data, the layer (both variants), batching with padding, training, sweeps, CLI."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import forward_atol, tiny_memorize

from auditor.cli import main
from auditor.core.errors import AuditError
from auditor.lab.common.mha.data import DataConfig, MemorizeData, make_data
from auditor.lab.common.mha.model import MHAConfig, MHAEnsemble, sinusoidal_positions
from auditor.lab.common.mha.plots import linear_fit, mean_ci, sweep_fits, sweep_summary
from auditor.lab.common.mha.task import MemorizeTask
from auditor.lab.common.mha.train import (
    MemorizeRun,
    MemorizeSettings,
    buckets,
    grid,
    train_rounds,
)
from auditor.lab.engine import TrainConfig, train
from auditor.lab.experiment import run_experiment
from auditor.lab.room import get

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest.one_thread


# -- data -------------------------------------------------------------------------------------------
def test_data_is_seeded_uniform_and_shaped():
    cfg = DataConfig(N=50, context=6, d=8, classes=7, seed=3)
    a, b = make_data(cfg), make_data(cfg)
    assert torch.equal(a.contexts, b.contexts) and torch.equal(a.labels, b.labels)
    assert a.contexts.shape == (1, 6, 8) and a.shared and a.queries.shape == (50, 8)
    assert float(a.queries.min()) >= 0 and float(a.queries.max()) < 1 and a.labels.max() < 7
    other = make_data(DataConfig(N=50, context=6, d=8, classes=7, seed=4))
    assert not torch.equal(a.queries, other.queries)
    free = make_data(DataConfig(N=50, context=6, d=8, shared_context=False, task="regression", outputs=2))
    assert free.contexts.shape == (50, 6, 8) and not free.shared and free.labels.shape == (50, 2)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"N": 0, "context": 4}, "N"),
        ({"N": 5, "context": 0}, "context"),
        ({"N": 5, "context": 4, "task": "regresion"}, "did you mean 'regression'"),
        ({"N": 5, "context": 4, "classes": 1}, "classes"),
    ],
)
def test_invalid_data_configs(kwargs, match):
    with pytest.raises(AuditError, match=match):
        DataConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"heads": 0}, "heads must be >= 1"),
        ({"d_h": 9}, "d_h=9 exceeds d=8"),
        ({"variant": "author"}, "did you mean 'authors'"),
        ({"variant": "authors", "d_model": 4, "d_h": 6}, "exceeds d_model=4"),
    ],
)
def test_invalid_layer_configs(kwargs, match):
    base = {"heads": 2, "d": 8, "d_h": 4, "d_v": 4, "outputs": 3}
    with pytest.raises(AuditError, match=match):
        MHAConfig(**{**base, **kwargs})


# -- the layer --------------------------------------------------------------------------------------
def reference_spec(model: MHAEnsemble, i: int, query: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
    """SPEC 1.1 written out head by head for one example of member i (no batching, no padding)."""
    cfg = model.configs[i]
    H, dh, dv = cfg.heads, cfg.d_h, cfg.d_v
    zs = []
    for h in range(H):
        W_Q, W_K, W_V = model.W_Q[i, h, :, :dh], model.W_K[i, h, :, :dh], model.W_V[i, h, :, :dv]
        s = torch.softmax(context @ W_K @ W_Q.T @ query, dim=0)  # (n,)
        zs.append(W_V.T @ context.T @ s)  # (d_v,)
    W_O = model.W_O[i, :H, :dv].reshape(H * dv, -1)  # (H d_v, d)
    return model.W_D[i].T @ (W_O.T @ torch.cat(zs))  # (d_o,)


def reference_authors(model: MHAEnsemble, i: int, query: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
    """The authors' layer: embed the (n+1)-row input, add positions, row 0 attends to rows 1..n only."""
    cfg = model.configs[i]
    X = torch.cat([query[None], context])  # (n+1, d)
    n1 = X.shape[0]
    emb = X @ model.W_in[i] + model.b_in[i] + sinusoidal_positions(n1, cfg.width)  # (n+1, w)
    mask = torch.zeros(n1, dtype=torch.bool)
    mask[0] = True  # nobody attends to the query row
    outs = []
    for h in range(cfg.heads):
        q, k, v = emb @ model.W_Q[i, h], emb @ model.W_K[i, h], emb @ model.W_V[i, h, :, : cfg.d_v]
        logits = (q @ k.T / math.sqrt(cfg.width)).masked_fill(mask[None], float("-inf"))  # (n+1, n+1)
        outs.append(torch.softmax(logits, -1)[0] @ v)  # row 0's output, (d_v,)
    o = torch.cat(outs) @ model.W_O[i, : cfg.heads, : cfg.d_v].reshape(-1, cfg.width)  # (w,)
    return o @ model.W_D[i] + model.b_D[i]


def _chain(cfg: MHAConfig, n: int) -> int:
    """Summed lengths of the reductions one output goes through (embedding over d, projections over the
    width, scores over d_h, softmax and pooling over the n + 1 rows, the H d_v output and the width-long
    read-out): the width for ``forward_atol`` of two evaluations that sum in different orders."""
    return cfg.d + 3 * cfg.width + cfg.d_h + 2 * (n + 1) + cfg.heads * cfg.d_v


@pytest.mark.parametrize("variant", ["spec", "authors"])
def test_batched_padded_layer_matches_the_formula(variant):
    """Members of different H, d_h, d_v and n in one padded ensemble reproduce the per-head formula."""
    d = 6
    configs = [
        MHAConfig(heads=1, d=d, d_h=2, d_v=3 if variant == "spec" else 1, outputs=4, variant=variant, seed=1),
        MHAConfig(heads=3, d=d, d_h=6, d_v=1, outputs=4, variant=variant, seed=2),
        MHAConfig(heads=2, d=d, d_h=4, d_v=2 if variant == "spec" else 1, outputs=4, variant=variant, seed=3),
    ]
    model = MHAEnsemble(configs, max_context=5)
    datasets = [
        make_data(DataConfig(N=9, context=n, d=d, classes=4, shared_context=False, seed=n)) for n in (5, 3, 4)
    ]
    task = MemorizeTask(datasets, batch_size=9)
    queries, contexts, _ = task.inputs(torch.arange(9).expand(3, -1))
    with torch.no_grad():
        out = model(queries, contexts, task.masks())  # (3, 9, 4)
        ref = reference_spec if variant == "spec" else reference_authors
        for i, ds in enumerate(datasets):
            for t in range(ds.N):
                expected = ref(model, i, ds.queries[t], ds.contexts[t])
                atol = forward_atol(expected, _chain(configs[i], ds.contexts.shape[-2]))
                torch.testing.assert_close(out[i, t], expected, rtol=0, atol=atol)


def test_shared_and_per_example_contexts_agree():
    data = make_data(DataConfig(N=8, context=4, d=6, classes=3, seed=0))
    model = MHAEnsemble([MHAConfig(heads=2, d=6, d_h=3, d_v=3, outputs=3)])
    shared = model(data.queries[None], data.contexts)  # (1, 8, 3), context (1, n, d)
    expanded = model(data.queries[None], data.context_rows()[None])  # (1, 8, 3), contexts (1, N, n, d)
    atol = forward_atol(shared, _chain(model.configs[0], data.contexts.shape[-2]))
    torch.testing.assert_close(shared, expanded, rtol=0, atol=atol)


def test_padding_stays_zero_and_member_extraction_roundtrips():
    configs = [
        MHAConfig(heads=1, d=4, d_h=2, d_v=2, outputs=3, seed=0),
        MHAConfig(heads=3, d=4, d_h=4, d_v=4, outputs=3),
    ]
    model = MHAEnsemble(configs)
    data = [make_data(DataConfig(N=12, context=3, d=4, classes=3, seed=s)) for s in (0, 1)]
    train(model, MemorizeTask(data, 12), TrainConfig(steps=20, lr=0.05, early_stop=False), progress=False)
    assert model.W_Q[0, 1:].abs().sum() == 0 and model.W_Q[0, :, :, 2:].abs().sum() == 0
    assert model.W_O[0, 1:].abs().sum() == 0
    single = model.member(0)
    assert single.W_Q.shape == (1, 1, 4, 2)
    q, ctx = data[0].queries[None], data[0].contexts
    torch.testing.assert_close(single(q, ctx), model(q.expand(2, -1, -1), ctx.expand(2, -1, -1))[:1])


# -- batches and training ---------------------------------------------------------------------------
def test_batches_are_the_same_alone_and_together():
    small = make_data(DataConfig(N=5, context=3, d=4, seed=0))
    big = make_data(DataConfig(N=40, context=3, d=4, seed=1))
    together = MemorizeTask([small, big], batch_size=8)
    b_small, b_big = MemorizeTask([small], batch_size=8), MemorizeTask([big], batch_size=8)
    g1, g2, g3 = (torch.Generator().manual_seed(0) for _ in range(3))
    for step in range(3):
        both, alone_s, alone_b = together.batch(step, g1), b_small.batch(step, g2), b_big.batch(step, g3)
        assert both.index[0, both.valid[0]].tolist() == list(range(5))  # N <= B: the whole set
        assert torch.equal(both.index[1], alone_b.index[0])
        assert torch.equal(alone_s.index[0], torch.arange(5))


def test_trainer_reaches_full_accuracy_on_an_easy_case():
    """N = 12 <= H(n-1)+1 = 13 with a shared context: within the guarantee, every seed gets 100%."""
    data = make_data(DataConfig(N=12, context=4, d=8, classes=3, seed=0))
    model = MHAEnsemble([MHAConfig(heads=4, d=8, d_h=8, d_v=8, outputs=3, seed=s) for s in range(4)])
    res = train(
        model, MemorizeTask([data] * 4, 32), TrainConfig(steps=400, lr=2e-2, eval_every=10), progress=False
    )
    assert res.accuracy.tolist() == [1.0] * 4 and bool((res.steps_trained < 400).all())


def test_regression_memorized_within_tolerance():
    data = make_data(DataConfig(N=6, context=4, d=8, task="regression", seed=0))
    model = MHAEnsemble([MHAConfig(heads=3, d=8, d_h=8, d_v=8, outputs=1, seed=0)])
    task = MemorizeTask([data], 8, error_tolerance=0.05)
    res = train(model, task, TrainConfig(steps=800, lr=2e-2, eval_every=20), progress=False)
    assert res.accuracy.item() == 1.0
    pred = model(data.queries[None], data.contexts)[0].detach()
    assert float((pred - data.labels).abs().max()) <= 0.05
    assert float(MemorizeTask([data], 8, error_tolerance=1e-6).accuracy(model)) < 1.0  # tolerance matters


def test_members_of_a_padded_bucket_match_the_same_configuration_alone():
    """H, n, d_h and N all differ inside the bucket; each member equals its solo run."""
    runs = [
        MemorizeRun(heads=1, context=3, d_h=2, N=10, d=6, classes=4, seed=0),
        MemorizeRun(heads=3, context=5, d_h=6, N=40, d=6, classes=4, seed=1),
        MemorizeRun(heads=2, context=4, d_h=4, N=25, d=6, classes=4, seed=2),
    ]
    data = [make_data(r.data_config()) for r in runs]
    cfg = TrainConfig(steps=120, lr=2e-2, eval_every=10, seed=4)
    together = MHAEnsemble([r.model_config() for r in runs], max_context=5)
    res = train(together, MemorizeTask(data, 16), cfg, progress=False)
    for i, run in enumerate(runs):
        alone = MHAEnsemble([run.model_config()], max_context=5)
        solo = train(alone, MemorizeTask([data[i]], 16), cfg, progress=False)
        assert solo.steps_trained.item() == res.steps_trained[i].item()
        ref = together.member(i)
        # first order: each step adds at most one forward/backward rounding (width eps relative to the
        # parameters' scale) to the difference, and the differences add up across the steps
        width = _chain(run.model_config(), 5)  # padded to the bucket's longest context
        for name in ("W_Q", "W_K", "W_V", "W_O", "W_D"):
            want = getattr(ref, name)
            atol = cfg.steps * forward_atol(want, width)
            torch.testing.assert_close(getattr(alone, name), want, rtol=0, atol=atol)


class StopAt(MemorizeTask):
    def __init__(self, *args, at: int, **kw):
        super().__init__(*args, **kw)
        self.at = at

    def batch(self, step, generator):
        if step == self.at:
            raise KeyboardInterrupt
        return super().batch(step, generator)


def test_memorize_training_resumes_to_the_same_result(tmp_path):
    data = [make_data(DataConfig(N=30, context=4, d=6, classes=5, seed=s)) for s in (0, 1)]
    configs = [MHAConfig(heads=h, d=6, d_h=6, d_v=6, outputs=5, seed=h) for h in (1, 2)]
    cfg = TrainConfig(
        steps=90, lr=2e-2, eval_every=10, checkpoint=str(tmp_path / "c.pt"), checkpoint_every=20
    )
    reference = MHAEnsemble(configs)
    ref = train(
        reference, MemorizeTask(data, 8), TrainConfig(**{**cfg.__dict__, "checkpoint": None}), progress=False
    )
    with pytest.raises(KeyboardInterrupt):
        train(MHAEnsemble(configs), StopAt(data, 8, at=47), cfg, progress=False)
    resumed = MHAEnsemble(configs)
    res = train(resumed, MemorizeTask(data, 8), cfg, progress=False)
    assert res.resumed_from == 40
    assert torch.equal(res.accuracy, ref.accuracy) and torch.equal(res.steps_trained, ref.steps_trained)
    for a, b in zip(resumed.parameters(), reference.parameters()):
        assert torch.equal(a, b)


# -- sweeps -----------------------------------------------------------------------------------------
def test_buckets_cover_every_run_once_and_respect_compatibility():
    runs = grid([1, 2, 8], [4], [4], [16, 64], [0, 1], d=8, classes=5)
    runs += grid([2], [4], [4], [16], [0], d=8, task="regression")
    settings = MemorizeSettings(steps=10, bucket_size=4)
    groups = buckets(runs, settings)
    flat = [r for b in groups for r in b]
    assert sorted(map(repr, flat)) == sorted(map(repr, runs))
    assert all(len(b) <= 4 and len({r.bucket_key() for r in b}) == 1 for b in groups)


def test_sweep_rows_resume_and_plots(tmp_path):
    config = tiny_memorize(heads=(1, 3), context=(3,), N=(12,), d=4, classes=3, steps=200, lr=3e-2,
                           eval_every=20)
    frame, _ = run_experiment(get("memorize"), config, tmp_path, plots=False, progress=False)
    needed = {
        "heads",
        "context",
        "d_h",
        "N",
        "seed",
        "memorized",
        "accuracy",
        "lower_bound",
        "readout_hits",
        "steps_trained",
        "seconds",
        "git_commit",
        "versions",
        "dtype",
        "device",
        "rank",
        "readout_hits_init",
        "guaranteed",
        "converged",
        "stop_reason",
        "rounds_trained",
    }
    assert needed <= set(frame.columns) and len(frame) == 2
    assert frame["lower_bound"].tolist() == [1 * 2 + 1, 3 * 2 + 1]
    assert (frame["guaranteed"] == frame[["rank", "N"]].min(axis=1)).all()
    assert set(frame["stop_reason"]) <= {"all_memorized", "plateau", "step_limit"}
    assert (frame["memorized"] == (frame["accuracy"] * frame["N"]).round()).all()
    assert (frame["rank"] <= frame["rank_ceiling"]).all()
    again, _ = run_experiment(
        get("memorize"), config, tmp_path, plots=False, progress=False
    )  # read back, not retrained
    pd.testing.assert_frame_equal(frame, again)
    from auditor.lab.common.mha.plots import plot_sweep

    fits = plot_sweep(frame, "heads", tmp_path / "h.png")
    assert (tmp_path / "h.png").stat().st_size > 0 and "r2" in fits


def test_linear_fit_known_answers():
    fit = linear_fit([1, 2, 3, 4], [3, 5, 7, 9])
    assert (fit.slope, fit.intercept) == pytest.approx((2.0, 1.0)) and fit.r2 == pytest.approx(1.0)
    noisy = linear_fit([0, 1, 2, 3], [0, 1, 0, 1])
    assert noisy.r2 == pytest.approx(0.2)


# -- command line -----------------------------------------------------------------------------------
def test_cli_memorize_and_certify(tmp_path, capsys):
    out = tmp_path / "mem"
    code = main(["memorize", "--heads", "1,2", "--context", "3", "--d-h", "4", "--N", "10", "--d", "4",
                 "--classes", "3", "--steps", "60", "--threads", "1", "--out", str(out)])
    assert code == 0
    assert (out / "results.csv").exists() and (out / "memorized_vs_heads.png").exists()
    printed = capsys.readouterr().out
    assert "| heads |" in printed.replace("   ", " ").replace("  ", " ") or "heads" in printed
    assert "memorized" in printed and "lower_bound" in printed and "certified" not in printed
    out = tmp_path / "cert"
    assert main(["certify", "--heads", "2", "--context", "3", "--d-h", "3", "--N", "4,8", "--d", "4",
                 "--out", str(out)]) == 0
    frame = pd.read_csv(out / "results.csv")
    assert frame["rank"].tolist() == [4, 5] and (frame["shared_bound"] == 5).all()
    assert (out / "tolerance.png").exists() and (out / "rank_vs_N.png").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["memorize", "--heads", "0", "--context", "3", "--d-h", "2", "--N", "5"],
            "--heads takes values in 1..1000000",
        ),
        (
            ["memorize", "--heads", "2", "--context", "3", "--d-h", "32", "--N", "5", "--d", "8"],
            "exceeds d=8",
        ),
        (
            ["memorize", "--heads", "2", "--context", "3", "--d-h", "2", "--N", "0"],
            "--N takes values in 1..1000000",
        ),
        (["memorize", "--heads", "x", "--context", "3", "--d-h", "2", "--N", "5"], "--heads takes integers"),
        (["memorize", "--heads", "2"], "give --context, --d-h, --N"),
        (["certify", "--weights", "missing.safetensors"], "does not exist"),
        (["capacity"], "give a MODEL"),
    ],
)
def test_cli_user_errors_are_one_line(args, message, capsys, tmp_path):
    assert main([*args, "--out", str(tmp_path / "x")] if args[0] != "capacity" else args) == 2
    err = capsys.readouterr().err
    assert f"error: {message}" in err or message in err


def test_memorize_data_rejects_mismatched_shapes():
    with pytest.raises(AuditError, match="labels"):
        MemorizeData(torch.zeros(1, 3, 4), torch.zeros(5, 4), torch.zeros(4, dtype=torch.long))


# -- the capacity pipeline --------------------------------------------------------------------------
def _tokens(tmp_path, name: str, same_queries: bool):
    from auditor.audit.tokens import Tokens

    g = torch.Generator().manual_seed(0)
    contexts = torch.randn(40, 12, 24, generator=g)  # (N, n, d)
    if same_queries:  # like ViT's embedding layer: every CLS row is the same vector
        contexts[:, 0] = contexts[0, 0]
    path = tmp_path / f"{name}.safetensors"
    Tokens(
        contexts, contexts[:, 0].clone(), {"model": "synthetic", "representation": name, "query_index": "0"}
    ).save(path)
    return path


def _capacity_argv(tokens: Path, *extra: str) -> list[str]:
    """``audit capacity`` on one token file, seconds long: 4 context rows kept, tokens projected to width 8,
    3 classes, 20 subsets, one thread; ``extra`` (heads, steps, ...) goes last."""
    return ["capacity", "--tokens", str(tokens), "--rows", "4", "--dim", "8", "--classes", "3", "--subsets",
            "20", "--threads", "1", *extra]


def test_select_rows_keeps_the_query_row():
    from auditor.lab.capacity.experiment import select_rows

    rows = select_rows(197, 16, 0, seed=1)
    assert rows[0] == 0 and len(rows) == 16 and torch.equal(rows, rows.sort().values)
    assert torch.equal(rows, select_rows(197, 16, 0, seed=1))
    assert select_rows(10, 4, -1, seed=0).tolist().count(9) == 1
    with pytest.raises(AuditError, match="rows"):
        select_rows(8, 9, 0, seed=0)


def test_capacity_pipeline_reports_memorization_beside_the_assumptions(tmp_path):
    from auditor.lab.capacity.experiment import CapacityConfig, CapacitySettings, summarize

    files = [_tokens(tmp_path, "mixed", False), _tokens(tmp_path, "embedding", True)]
    settings = CapacitySettings(rows=4, dim=8, heads=(1, 2), classes=4, subsets=50)
    assert settings.seeds == (0, 1, 2)  # several seeds by default
    config = CapacityConfig(tokens=tuple(map(str, files)), settings=settings,
                            training=MemorizeSettings(steps=150, lr=3e-2, eval_every=25))
    frame, _ = run_experiment(get("capacity"), config, tmp_path / "out", plots=False, progress=False)
    assert len(frame) == 12 and set(frame["representation"]) == {"mixed", "embedding"}
    for verdict in ("holds", "fraction", "critical_rtol"):  # the audit's verdict columns, beside every row
        assert {f"assumption1_{verdict}", f"assumption2_{verdict}", f"original_assumption1_{verdict}"} <= set(
            frame
        )
    summary = summarize(frame)
    assert len(summary) == 4 and (summary["runs"] == 3).all()
    assert (
        summary["seeds"]
        == frame.groupby(["representation", "heads"], sort=False)["converged"].sum().to_numpy()
    ).all()
    has_ci = summary[summary["seeds"] >= 2]
    assert (
        (has_ci["memorized_low"] <= has_ci["memorized_mean"])
        & (has_ci["memorized_mean"] <= has_ci["memorized_high"])
    ).all()
    frame = frame[frame["seed"] == 0]
    by_rep = frame.groupby("representation").first()
    assert not by_rep.loc["embedding", "assumption1_holds"]  # identical queries: Kruskal rank 1 < n
    assert by_rep.loc["mixed", "assumption1_holds"] and by_rep.loc["mixed", "assumption2_holds"]
    assert (frame["context"] == 4).all() and (frame["d"] == 8).all() and (frame["n_original"] == 12).all()
    assert frame["lower_bound"].tolist() == [4, 7, 4, 7]
    assert frame["readout_hits"].notna().all() and (frame["rank"] <= frame["rank_ceiling"]).all()


@pytest.mark.slow
def test_capacity_end_to_end_on_a_tiny_random_vit(tmp_path):
    """Extraction API -> token files -> trained and certified layers (bundled photos, offline)."""
    from auditor.lab.capacity.experiment import CapacityConfig, CapacitySettings, extract_tokens

    tiny = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}
    files = extract_tokens("vit-base", "random", None, 8, ["embedding", "block.0"], tmp_path, progress=False,
                           config_overrides=tiny)
    config = CapacityConfig(tokens=tuple(str(p) for p in files.values()),
                            settings=CapacitySettings(rows=4, dim=8, heads=(1,), classes=3, subsets=20),
                            training=MemorizeSettings(steps=60, lr=3e-2, eval_every=20))
    frame, _ = run_experiment(get("capacity"), config, tmp_path, plots=False, progress=False)
    assert set(frame["representation"]) == {"embedding", "block.0"}
    assert (frame["n_original"] == 197).all() and (frame["model"] == "vit-base").all()
    emb = frame[frame["representation"] == "embedding"].iloc[0]
    assert not emb[
        "original_assumption1_holds"
    ]  # the paper's finding: embedding-layer CLS queries are identical


def test_cli_capacity_on_a_token_file(tmp_path, capsys):
    path = _tokens(tmp_path, "block.0", False)
    assert main(_capacity_argv(path, "--heads", "1,2", "--steps", "40", "--out", str(tmp_path / "cap"))) == 0
    assert (tmp_path / "cap" / "results.csv").exists() and (
        tmp_path / "cap" / "memorized_vs_heads_block.0.png"
    ).exists()
    assert "assumption1_holds" in capsys.readouterr().out


def test_capacity_samples_with_a_token_file_takes_its_first_examples_or_is_refused(tmp_path, capsys):
    """--samples is honoured with --tokens (the first N examples of the file train), and refused with one
    line when the file holds fewer; without it every example trains."""
    path = _tokens(tmp_path, "block.0", False)  # 40 examples
    common = _capacity_argv(path, "--heads", "1", "--steps", "20", "--seeds", "0")
    assert main([*common, "--samples", "12", "--out", str(tmp_path / "twelve")]) == 0
    assert (pd.read_csv(tmp_path / "twelve" / "results.csv")["N"] == 12).all()
    capsys.readouterr()
    assert main([*common, "--samples", "41", "--out", str(tmp_path / "too-many")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--samples 41 exceeds the 40 examples of token file" in err


# -- convergence, not budgets ---------------------------------------------------------------------
def test_subset_copies_members_exactly_and_loads_them_back():
    configs = [
        MHAConfig(heads=h, d=6, d_h=dh, d_v=dh, outputs=5, seed=h) for h, dh in ((1, 2), (3, 6), (2, 4))
    ]
    full = MHAEnsemble(configs)
    sub = full.subset([2, 0])  # padded to its own largest member (H 2, d_h 4), not the ensemble's
    assert sub.W_Q.shape[1:] == (2, 6, 4)
    for j, i in enumerate((2, 0)):
        for a, b in zip(sub.member(j).parameters(), full.member(i).parameters()):
            assert torch.equal(a, b)
    with torch.no_grad():
        for p in sub.parameters():
            p.add_(1.0)
    before = full.member(1).state_dict()
    full.load_members(sub, [2, 0])
    assert torch.equal(full.member(2).W_Q, sub.member(0).W_Q)
    assert all(torch.equal(before[k], v) for k, v in full.member(1).state_dict().items())  # others untouched
    assert torch.count_nonzero(full.W_Q[0, 1:]) == 0  # padding stays zero


def test_rounds_stop_at_full_memorization_at_a_plateau_or_at_the_step_limit(tmp_path):
    easy = make_data(DataConfig(N=6, context=4, d=6, classes=3, seed=0))
    stuck = make_data(
        DataConfig(N=40, context=1, d=6, classes=5, seed=1)
    )  # one shared row: a constant output
    configs = [MHAConfig(heads=4, d=6, d_h=6, d_v=6, outputs=5, seed=0), MHAConfig(heads=1, d=6, d_h=6, d_v=6,
                                                                                   outputs=5, seed=1)]
    settings = MemorizeSettings(steps=150, lr=3e-2, eval_every=10, rounds=3, plateau=0.01)
    model = MHAEnsemble(configs)
    result = train_rounds(model, [easy, stuck], settings, checkpoint=str(tmp_path / "c.pt"))
    assert result.stop_reason == ["all_memorized", "plateau"] and result.converged == [True, True]
    assert result.memorized[0] == 6 and result.rounds_trained == [1, 2]
    # the constant output memorizes exactly the most frequent class
    assert result.memorized[1] == int(torch.bincount(stuck.labels).max())
    assert result.steps_trained[1] == 2 * 150 and set(result.history["round"]) == {1, 2}
    assert (tmp_path / "c.round2.pt").exists()
    again = train_rounds(MHAEnsemble(configs), [easy, stuck], settings, checkpoint=str(tmp_path / "c.pt"))
    assert again.memorized == result.memorized and again.steps_trained == result.steps_trained  # resumed
    one = train_rounds(
        MHAEnsemble(configs[1:]), [stuck], MemorizeSettings(steps=50, lr=3e-2, eval_every=10, rounds=1)
    )
    assert one.stop_reason == ["step_limit"] and one.converged == [False]  # no second round to compare with


def test_settings_refuse_bad_rounds_and_plateau():
    with pytest.raises(AuditError, match="rounds must be in 1..100"):
        MemorizeSettings(rounds=0)
    with pytest.raises(AuditError, match=r"plateau .* must be in \(0, 1\)"):
        MemorizeSettings(plateau=1.5)


def test_mean_ci_is_the_student_t_interval():
    mean, low, high = mean_ci([1.0, 2.0, 3.0])
    half = 4.302652729911275 * (1.0 / math.sqrt(3))  # t(0.975, df 2) x sem
    assert mean == pytest.approx(2.0) and (low, high) == pytest.approx((2.0 - half, 2.0 + half))
    assert mean_ci([5.0, 5.0, 5.0]) == (5.0, 5.0, 5.0)
    assert math.isnan(mean_ci([4.0])[1]) and math.isnan(mean_ci([])[0])


def test_summaries_and_fits_leave_out_runs_stopped_at_the_step_limit():
    rows = []
    for seed, slope in zip((0, 1, 2), (10.0, 12.0, 14.0)):
        for H in (1, 2, 3):
            rows.append(
                {
                    "N": 100,
                    "heads": H,
                    "seed": seed,
                    "memorized": slope * H,
                    "accuracy": slope * H / 100,
                    "lower_bound": H * 3 + 1,
                    "converged": True,
                }
            )
    rows.append({"N": 100, "heads": 3, "seed": 3, "memorized": 99.0, "accuracy": 0.99, "lower_bound": 10,
                 "converged": False})  # stopped at the step limit: it must not move the mean or the fit
    frame = pd.DataFrame(rows)
    summary = sweep_summary(frame, "heads").set_index("heads")
    assert summary.loc[3, "memorized_mean"] == pytest.approx(36.0) and summary.loc[3, "seeds"] == 3
    assert summary.loc[3, "runs"] == 4
    fit = sweep_fits(frame, "heads").iloc[0]
    assert fit["slope"] == pytest.approx(12.0) and fit["seeds"] == 3
    assert (fit["slope_low"], fit["slope_high"]) == pytest.approx(mean_ci([10.0, 12.0, 14.0])[1:])
    unflagged = frame.drop(columns="converged")  # a CSV without the column: every run counts
    assert sweep_summary(unflagged, "heads").set_index("heads").loc[3, "runs"] == 4
