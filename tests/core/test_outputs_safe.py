"""Nothing is ever written outside ``--out``, by any command.

Each command runs once into a fresh folder (plots and summaries on) to learn every file and folder it
writes. Then a second folder is planted with a link at every one of those names: each file a link to a
file outside, each subfolder (``units``, ``tokens``, a sweep's folder, ...) a link to a folder outside,
holding copies of what the first run wrote (an audit's rows, so the folder reads as the audit's own;
garbage elsewhere, so every unit runs again and every file is written again). The second run must leave
every file outside byte for byte as it was, and replace every link by a real file or folder.

Also: an existing ``--out`` holding files the command did not write is refused with one line, and
nothing in it changes (``audit MODEL --out .`` once replaced a user's config.json and summary.md and
deleted their sweep.csv and depth.csv).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import save_tiny_vit, shared_data

from auditor.cli import main

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore")]

GARBAGE = b"written by the user, outside --out\n"
KEEP_CONTENT = {
    "results.csv",
    "config.json",
    "results.partial.csv",
    "results.partial.json",
}  # an audit's marks
KEEP_SUFFIXES = (".pt",)  # training checkpoints: a run resumes from them (garbage there is refused, rightly)


@pytest.fixture(scope="module")
def vit(tmp_path_factory) -> str:
    return save_tiny_vit(tmp_path_factory.mktemp("tiny-vit"))


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("images")
    for path in sorted(shared_data("imagenet-sample").glob("*.JPEG"))[:20]:
        (folder / path.name).write_bytes(path.read_bytes())
    return folder


def audit_argv(vit: str, images: Path, out: Path) -> list[str]:
    """A tiny audit that writes every kind of file: rows, sweep, depth profile, tokens, every plot."""
    return [vit, "--data", str(images), "--samples", "20", "--first", "-w", "random", "--layers", "0:2",
            "--tests", "assumption2,assumption1", "--subsets", "20", "--sweep", "--sweep-subsets", "20",
            "--save-tokens", "--device", "cpu", "-q", "--out", str(out)]


def snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every entry under ``folder``: a file's bytes, a link's target, ``"<dir>"`` for a folder."""
    found: dict[str, bytes | str] = {}
    for dirpath, dirs, names in os.walk(folder):
        for name in [*dirs, *names]:
            path = Path(dirpath) / name
            key = str(path.relative_to(folder))
            found[key] = (f"-> {os.readlink(path)}" if path.is_symlink() else "<dir>" if path.is_dir()
                          else path.read_bytes())
    return found


def plant(written: Path, out: Path, outside: Path) -> list[Path]:
    """A link in ``out`` at every top-level name the first run wrote into ``written``: files to copies outside
    (garbage unless the content marks the folder as the command's own), folders to copies outside with
    every file in them garbage but checkpoints. Returns the links."""
    out.mkdir()
    links = []
    for entry in sorted(written.iterdir()):
        target = outside / entry.name
        if entry.is_dir():
            shutil.copytree(entry, target)
            for dirpath, _, names in os.walk(target):
                for name in names:
                    if not name.endswith(KEEP_SUFFIXES):
                        (Path(dirpath) / name).write_bytes(GARBAGE)
        elif entry.name in KEEP_CONTENT:
            shutil.copyfile(entry, target)
        else:
            target.write_bytes(GARBAGE)
        (out / entry.name).symlink_to(target, target_is_directory=entry.is_dir())
        links.append(out / entry.name)
    return links


def check_confined(tmp_path: Path, run) -> None:
    """``run(out)`` into a fresh folder, then into one planted with links: nothing outside changes."""
    first = tmp_path / "first"
    assert run(first) == 0
    written = snapshot(first)
    assert written, "the first run wrote nothing"
    outside = tmp_path / "outside"
    outside.mkdir()
    links = plant(first, tmp_path / "planted", outside)
    before = snapshot(outside)
    assert run(tmp_path / "planted") == 0
    assert snapshot(outside) == before, "a file outside --out changed"
    still = [p.name for p in links if p.is_symlink()]
    assert not still, f"links left in place (written through or not rewritten): {still}"
    again = snapshot(tmp_path / "planted")
    assert {k for k, v in again.items() if v == "<dir>"} == {k for k, v in written.items() if v == "<dir>"}


def test_audit_writes_nothing_through_links(tmp_path, vit, images):
    check_confined(tmp_path, lambda out: main(audit_argv(vit, images, out)))


@pytest.mark.parametrize("command", [
    ["assoc", "--scale", "quick", "--dims", "8"],
    ["facts", "width", "--scale", "quick"],
    ["certify", "--scale", "quick"],
    ["memorize", "--scale", "quick"],
])
def test_lab_commands_write_nothing_through_links(tmp_path, command):
    check_confined(tmp_path, lambda out: main([*command, "--threads", "1", "--out", str(out)]))


def test_facts_rank_writes_nothing_through_links(tmp_path):
    database = tmp_path / "db.csv"
    assert main(["facts", "generate", "-o", str(database), "--keys", "8", "--queries", "4"]) == 0
    check_confined(tmp_path / "rank", lambda out: main(["facts", "rank", str(database), "--scale", "quick",
                                                        "--threads", "1", "--out", str(out)]))


@pytest.mark.slow
def test_capacity_writes_nothing_through_links(tmp_path, vit, images):
    """Tokens, checkpoints, histories, units and plots of `audit capacity` on a tiny ViT."""
    check_confined(
        tmp_path,
        lambda out: main(
            [
                "capacity",
                vit,
                "--data",
                str(images),
                "--samples",
                "20",
                "--scale",
                "quick",
                "--threads",
                "1",
                "--out",
                str(out),
            ]
        ),
    )


@pytest.mark.slow
def test_recall_all_writes_nothing_through_links(tmp_path):
    check_confined(tmp_path, lambda out: main(["recall", "all", "--scale", "quick", "--threads", "1", "--out",
                                               str(out)]))


def test_bits_writes_nothing_through_links(tmp_path):
    lab = tmp_path / "lab"
    assert (
        main(["assoc", "--scale", "quick", "--dims", "8", "--threads", "1", "--no-plots", "--out", str(lab)])
        == 0
    )
    check_confined(tmp_path / "bits", lambda out: main(["bits", str(lab), "--out", str(out)]))


def test_compare_writes_nothing_through_links(tmp_path, vit, images):
    reports = tmp_path / "reports"
    for name in ("tiny-a", "tiny-b"):
        argv = [vit, "--data", str(images), "--samples", "20", "--first", "-w", "random", "--layers", "0:1",
                "--tests", "assumption2,assumption1", "--subsets", "20", "--device", "cpu", "-q",
                "--out", str(reports / name)]
        assert main(argv) == 0
    check_confined(
        tmp_path / "compare",
        lambda out: main(["compare", str(reports / "tiny-a"), str(reports / "tiny-b"), "--out", str(out)]),
    )


# ---------------------------------------------------------------------------------------------------
# An existing --out that holds the user's files: refused, nothing changed
# ---------------------------------------------------------------------------------------------------


def users_folder(folder: Path) -> dict[str, bytes | str]:
    """A folder of someone's own work whose names clash with the audit's files."""
    folder.mkdir(parents=True)
    for name in ("config.json", "summary.md", "sweep.csv", "depth.csv", "README.md", "notes.txt"):
        (folder / name).write_text(f"the user's {name}\n")
    return snapshot(folder)


def test_an_audit_into_a_folder_of_the_users_files_is_refused(tmp_path, vit, images, capsys):
    folder = tmp_path / "project"
    before = users_folder(folder)
    assert main(audit_argv(vit, images, folder)) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "already holds files that an audit did not write" in err
    assert "README.md" in err and str(folder) in err
    assert snapshot(folder) == before


def test_an_audit_into_a_folder_with_only_its_names_but_no_audit_is_refused(tmp_path, vit, images, capsys):
    folder = tmp_path / "mine"
    folder.mkdir()
    for name in ("config.json", "summary.md", "sweep.csv"):
        (folder / name).write_text("the user's own\n")
    before = snapshot(folder)
    assert main(audit_argv(vit, images, folder)) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no audit's results" in err and "config.json" in err
    assert snapshot(folder) == before


@pytest.mark.parametrize(
    "command", [["assoc", "--scale", "quick", "--dims", "8"], ["bits"], ["compare", "minilm"]]
)
def test_other_commands_refuse_a_folder_of_the_users_files(tmp_path, command, capsys, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # compare and bits read the committed reports
    folder = tmp_path / "project"
    before = users_folder(folder)
    assert main([*command, "--out", str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "already holds files" in err and str(folder) in err
    assert snapshot(folder) == before


def test_a_lab_rerun_into_its_own_folder_resumes(tmp_path):
    out = tmp_path / "run"
    argv = ["facts", "width", "--scale", "quick", "--threads", "1", "--no-plots", "--out", str(out)]
    assert main(argv) == 0
    table = (out / "results.csv").read_bytes()
    assert main(argv) == 0  # its own folder (units inside): accepted, same table
    assert (out / "results.csv").read_bytes() == table
