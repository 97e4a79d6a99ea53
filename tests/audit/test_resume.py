"""The report folder across runs: resume, reuse, locking, links, full disks and tidying.

A tiny random ViT (3 blocks, d = 32, n = 17, saved as a model folder) on 20 real ImageNet images copied
into a folder of the test; every run takes about a second.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import save_tiny_vit, shared_data, tiny_audit_argv

import probes
from auditor.audit import runner
from auditor.cli import main

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore")]


@pytest.fixture(scope="module")
def vit(tmp_path_factory) -> str:
    return save_tiny_vit(tmp_path_factory.mktemp("tiny-vit"))


@pytest.fixture
def images(tmp_path) -> Path:
    """20 real images in a folder the test may change."""
    folder = tmp_path / "images"
    folder.mkdir()
    for path in sorted(shared_data("imagenet-sample").glob("*.JPEG"))[:20]:
        (folder / path.name).write_bytes(path.read_bytes())
    return folder


def files(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``folder`` (links as their own path) with its bytes and modification time."""
    out = {}
    for dirpath, _, names in os.walk(folder):
        for name in names:
            path = Path(dirpath) / name
            out[str(path.relative_to(folder))] = (path.read_bytes(), path.lstat().st_mtime_ns)
    return out


@pytest.fixture
def count_assumption1(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = probes.assumption1
    monkeypatch.setattr(probes, "assumption1", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


# ---------------------------------------------------------------------------------------------------
# Mistakes never cost an interrupted run its rows; a second audit into the same folder is refused
# ---------------------------------------------------------------------------------------------------

BAD_OPTIONS = [
    ("typo-in-model", {0: "vit-bse"}, "did you mean 'vit-base'"),
    ("missing-data", {"--data": "{tmp}/nowhere"}, "does not exist"),
    ("block-out-of-range", {"-r": "block.99"}, "the model has 3 blocks"),
    ("no-images-in-data", {"--data": "{tmp}/empty"}, "no image files"),
    ("zero-subsets", {"--subsets": "0"}, "subsets must be a positive integer"),
    ("huge-subsets", {"--subsets": "1000000000"}, "valid: 1 .. 10,000,000"),
    ("huge-seed", {"--seed": str(2**70)}, "seed must be an integer in [-2**63, 2**63 - 1]"),
    ("zero-threads", {"--threads": "0"}, "threads must be a positive integer"),
    pytest.param("cuda-on-a-cpu-machine", {"--device": "cuda"}, "CUDA is not available",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")),
]


@pytest.mark.parametrize("case, change, fragment", BAD_OPTIONS)
def test_a_mistake_never_touches_an_interrupted_runs_partial_rows(
    case, change, fragment, vit, images, tmp_path, capsys
):
    out = tmp_path / "report"
    out.mkdir()
    (tmp_path / "empty").mkdir()
    (out / "results.partial.csv").write_text("model,representation,weights,test,status\nx,embedding,random,"
                                             "assumption1,ok\n")
    (out / "results.partial.json").write_text('{"subsets": 40}')
    before = files(out)
    args = tiny_audit_argv(vit, images, out)
    for key, value in change.items():
        value = value.format(tmp=tmp_path)
        if key == 0:
            args[0] = value
        elif key in args:
            args[args.index(key) + 1] = value
        else:
            args += [key, value]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and fragment in err, err
    assert files(out) == before  # the partial rows (and nothing else) are there, untouched


def test_a_second_audit_into_a_held_folder_is_refused(vit, images, tmp_path, capsys):
    import fcntl

    out = tmp_path / "report"
    out.mkdir()
    with open(out / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert main(tiny_audit_argv(vit, images, out)) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"error: another audit is writing into {str(out)!r} (it holds .lock); wait for it to " \
                      "finish or choose another --out"
        assert sorted(p.name for p in out.iterdir()) == [".lock"]
    # released: the next run proceeds and removes the lock file
    assert main(tiny_audit_argv(vit, images, out)) == 0
    assert not (out / ".lock").exists() and (out / "results.csv").is_file()


# ---------------------------------------------------------------------------------------------------
# Links are replaced, never written through; a full disk leaves no half report
# ---------------------------------------------------------------------------------------------------


def test_links_in_the_report_folder_are_replaced_not_followed(vit, images, tmp_path):
    out, victim = tmp_path / "report", tmp_path / "victim"
    out.mkdir()
    victim.mkdir()
    (victim / "tokens").mkdir()
    names = ["results.csv", "summary.md", "config.json", "context_ranks.png", "margins.png", ".lock",
             "results.partial.csv"]
    for name in names:
        (victim / name).write_text(f"precious {name}\n")
        (out / name).symlink_to(victim / name)
    (out / "tokens").symlink_to(victim / "tokens", target_is_directory=True)
    before = files(victim)
    assert main(tiny_audit_argv(vit, images, out, "--save-tokens")) == 0
    assert files(victim) == before  # no target written, none removed
    for name in ("results.csv", "summary.md", "config.json", "context_ranks.png", "margins.png"):
        assert (out / name).is_file() and not (out / name).is_symlink(), name
    assert not (
        out / "results.partial.csv"
    ).exists()  # a stale link of this tool's name: removed, target kept
    assert (out / "tokens").is_dir() and not (out / "tokens").is_symlink()
    assert sorted(p.name for p in (out / "tokens").iterdir()) == ["block.0@random.safetensors",
                                                                 "embedding@random.safetensors"]


def test_a_full_disk_while_plotting_leaves_no_png_and_keeps_the_rows_for_a_resume(vit, images, tmp_path,
                                                                                    monkeypatch, capsys,
                                                                                    count_assumption1):
    import matplotlib.figure

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    out = tmp_path / "report"
    with monkeypatch.context() as patch:
        patch.setattr(matplotlib.figure.Figure, "savefig", full)
        assert main(tiny_audit_argv(vit, images, out)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: cannot write the report into {str(out)!r} (No space left on device)")
    assert "\n" not in err
    assert sorted(p.name for p in out.iterdir()) == ["results.partial.csv", "results.partial.json"]
    assert len(count_assumption1) == 2
    assert main(tiny_audit_argv(vit, images, out)) == 0
    assert len(count_assumption1) == 2  # both Kruskal rows came from the partial file
    rows = pd.read_csv(out / "results.csv")
    assert rows.loc[rows.test == "assumption1", "note"].str.contains("reused from the interrupted run").all()
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "context_ranks.pdf",
        "context_ranks.png",
        "margins.pdf",
        "margins.png",
        "report.html",
        "results.csv",
        "rtol_sweep.pdf",
        "rtol_sweep.png",
        "summary.md",
    ]


def test_a_failed_run_leaves_no_folder_it_created(vit, images, tmp_path, monkeypatch):
    from auditor.audit.tokens import Tokens

    def full(self, path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Tokens, "save", full)
    out = tmp_path / "a" / "b" / "report"
    # tokens/ was made, then the save failed
    assert main(tiny_audit_argv(vit, images, out, "--save-tokens")) == 2
    assert not (tmp_path / "a").exists()
    (tmp_path / "empty").mkdir()
    bad = tiny_audit_argv(vit, images, out)
    bad[bad.index("--data") + 1] = str(tmp_path / "empty")  # found only once the model is loaded
    assert main(bad) == 2
    assert not (tmp_path / "a").exists()


# ---------------------------------------------------------------------------------------------------
# Reuse: same configuration and same data only; stale files of other runs are removed
# ---------------------------------------------------------------------------------------------------


def test_a_finished_report_is_reused_only_for_the_same_configuration_and_data(vit, images, tmp_path,
                                                                              count_assumption1, monkeypatch):
    out = tmp_path / "report"
    assert main(tiny_audit_argv(vit, images, out)) == 0 and len(count_assumption1) == 2
    first = pd.read_csv(out / "results.csv")
    assert (
        first["data_fingerprint"].nunique() == 1
        and not first["note"].astype(str).str.contains("reused").any()
    )

    assert main(tiny_audit_argv(vit, images, out)) == 0 and len(count_assumption1) == 2  # nothing recomputed
    again = pd.read_csv(out / "results.csv")
    a1 = again[again.test == "assumption1"]
    assert a1["note"].str.endswith("reused from the finished run's results.csv").all()
    pd.testing.assert_frame_equal(
        a1[["fraction", "share_meets_threshold", "statement", "rank_counts", "witness", "min_margin"]],
        first[first.test == "assumption1"][["fraction", "share_meets_threshold", "statement", "rank_counts",
                                            "witness", "min_margin"]],
    )

    # another config
    assert main(tiny_audit_argv(vit, images, out, "--seed", "1")) == 0 and len(count_assumption1) == 4

    # same path, same configuration, other content: computed again
    replacement = sorted(shared_data("imagenet-sample").glob("*.JPEG"))[30].read_bytes()
    (sorted(images.iterdir())[0]).write_bytes(replacement)
    assert main(tiny_audit_argv(vit, images, out, "--seed", "1")) == 0 and len(count_assumption1) == 6
    rows = pd.read_csv(out / "results.csv")
    assert not rows["note"].astype(str).str.contains("reused").any()
    assert rows["data_fingerprint"].iloc[0] != first["data_fingerprint"].iloc[0]

    # same configuration and data, other code (another commit): computed again, stamped with it
    stamp = runner.provenance()
    monkeypatch.setattr(runner, "provenance", lambda: {**stamp, "git_commit": "0123456789ab"})
    assert main(tiny_audit_argv(vit, images, out, "--seed", "1")) == 0 and len(count_assumption1) == 8
    rows = pd.read_csv(out / "results.csv", dtype={"git_commit": str})
    assert not rows["note"].astype(str).str.contains("reused").any()
    assert (rows["git_commit"] == "0123456789ab").all()


def test_a_second_interruption_keeps_the_rows_of_the_first(
    vit, images, tmp_path, monkeypatch, count_assumption1
):
    """Run 1 finishes both representations' tests, then is interrupted in the sweep; run 2 is interrupted
    before it reaches block.0: the partial file must still hold block.0's row from run 1."""
    real_sweep = probes.kruskal_sweep
    sweeps = []

    def interrupt_at(call: int):
        def sweep(*args, **kwargs):
            sweeps.append(1)
            if len(sweeps) == call:
                raise KeyboardInterrupt
            return real_sweep(*args, **kwargs)
        return sweep

    out = tmp_path / "report"
    args = tiny_audit_argv(vit, images, out, "--sweep", "--sweep-ks", "4,8")
    monkeypatch.setattr(probes, "kruskal_sweep", interrupt_at(2))
    assert main(args) == 130 and len(count_assumption1) == 2
    sweeps.clear()
    monkeypatch.setattr(probes, "kruskal_sweep", interrupt_at(1))
    assert main(args) == 130 and len(count_assumption1) == 2
    partial = pd.read_csv(out / "results.partial.csv")
    assert set(zip(partial.representation, partial.test)) == {
        ("embedding", "assumption2"), ("embedding", "assumption1"), ("block.0", "assumption1")}
    monkeypatch.setattr(probes, "kruskal_sweep", real_sweep)
    assert main(args) == 0 and len(count_assumption1) == 2
    assert not (out / "results.partial.csv").exists()


def test_a_run_without_sweep_or_tokens_removes_the_previous_ones(vit, images, tmp_path):
    out = tmp_path / "report"
    (tmp_path / "notes.md").write_text("mine\n")
    assert main(tiny_audit_argv(vit, images, out, "--sweep", "--sweep-ks", "4,8", "--save-tokens")) == 0
    (out / "notes.md").write_text("a file of the user's\n")
    assert {"sweep.csv", "kruskal_curve.png", "tokens"} <= {p.name for p in out.iterdir()}
    assert main(tiny_audit_argv(vit, images, out)) == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "context_ranks.pdf", "context_ranks.png",
                                                     "margins.pdf", "margins.png", "notes.md", "report.html",
                                                     "results.csv", "rtol_sweep.pdf", "rtol_sweep.png",
                                                     "summary.md"]
    summary = (out / "summary.md").read_text()
    assert "kruskal_curve" not in summary and "Kruskal rank of the queries" not in summary
    assert json.loads((out / "config.json").read_text())["sweep"] is False
