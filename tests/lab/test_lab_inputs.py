"""Bad input to the capacity lab's commands: one line ``error: ...``, exit code 2, nothing left behind.

Also the options every lab command shares: ``--threads`` (set for the run, restored afterwards) and
``--executor ray`` without Ray installed (simulated by hiding the module). Every error case here is
refused before any training starts, so each test takes well under a second.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click
import pytest
import torch

from auditor.cli import main
from auditor.core import execution
from auditor.core.errors import AuditError
from auditor.core.options import MAX_SEED, MAX_VALUES, parse_floats, parse_ints, parse_seeds, parse_sizes
from auditor.lab import sweep
from auditor.lab.cli import lab_commands, output_folder, torch_threads

pytestmark = pytest.mark.usefixtures("one_thread")

TOO_BIG = str(2**70)
LAB_COMMANDS: dict[str, click.Command] = lab_commands()
SMALL_MEMORIZE = ["memorize", "--heads", "1", "--context", "3", "--d-h", "2", "--N", "5", "--d", "4"]


def one_error_line(args: list[str], capsys) -> str:
    """Run ``audit ARGS``; assert exit code 2 and exactly one stderr line ``error: ...``; return it."""
    code = main(args)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """An empty current folder: a command's default ``runs/`` folder would land here."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def left_behind(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# -- --threads --------------------------------------------------------------------------------------
def test_every_lab_command_takes_threads_with_torchs_default():
    assert set(LAB_COMMANDS) >= {"facts generate", "facts rank", "facts train", "facts width", "facts plot",
                                 "recall scaling", "recall tradeoff", "recall dynamics", "recall all"}
    for name, command in LAB_COMMANDS.items():
        threads = [p for p in command.params if p.name == "threads"]
        assert len(threads) == 1, name
        assert threads[0].opts == ["--threads"] and threads[0].default is None, name


def test_threads_are_set_for_the_run_and_restored(workdir, monkeypatch):
    from auditor.lab.facts.database import DatabaseSpec

    seen = []
    build = DatabaseSpec.build

    def build_and_record(self):
        seen.append(torch.get_num_threads())
        return build(self)

    monkeypatch.setattr(DatabaseSpec, "build", build_and_record)
    torch.set_num_threads(3)
    try:
        assert (
            main(["facts", "generate", "--keys", "4", "--queries", "2", "-o", "db.csv", "--threads", "1"])
            == 0
        )
        assert seen == [1] and torch.get_num_threads() == 3
        assert main(["facts", "generate", "--keys", "4", "--queries", "2", "-o", "db.csv"]) == 0
        assert seen == [1, 3]  # without --threads torch keeps its setting
    finally:
        torch.set_num_threads(1)


def test_torch_threads_restores_after_an_error():
    with pytest.raises(RuntimeError), torch_threads(2):
        assert torch.get_num_threads() == 2
        raise RuntimeError("boom")
    assert torch.get_num_threads() == 1


@pytest.mark.parametrize("threads", ["0", "-2", TOO_BIG])
def test_bad_threads_are_one_line(threads, workdir, capsys):
    line = one_error_line([*SMALL_MEMORIZE, "--threads", threads, "--out", "m"], capsys)
    assert "--threads takes an integer in 1..1024" in line
    assert left_behind(workdir) == []


# -- --executor ray without Ray ---------------------------------------------------------------------
@pytest.fixture
def no_ray(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError


@pytest.mark.parametrize("args", [
    ["assoc", "--memory", "linear", "--dims", "8", "--seeds", "0"],
    SMALL_MEMORIZE,
    ["capacity", "--tokens", "missing.safetensors"],
    ["facts", "width", "--scale", "quick"],
    ["recall", "scaling", "--dims", "8", "--seeds", "0"],
], ids=lambda args: args[0])
def test_executor_ray_without_ray_is_one_line_and_leaves_nothing(args, no_ray, workdir, capsys):
    line = one_error_line([*args, "--executor", "ray", "--out", "out"], capsys)
    assert "Ray" in line and "not installed" in line
    assert 'pip install "attention-auditor[ray]"' in line and "--executor local" in line
    assert left_behind(workdir) == []


def test_connect_ray_and_run_sweep_without_ray(no_ray, tmp_path):
    with pytest.raises(AuditError, match="not installed") as err:
        execution.connect_ray(None)  # also the entry of auditor.audit.shard's Ray executor
    assert 'pip install "attention-auditor[ray]"' in str(err.value)
    with pytest.raises(AuditError, match="--executor local"):
        sweep.run_sweep(lambda config: {"x": 1}, [{"i": 0}], tmp_path / "s", executor="ray")
    assert not (tmp_path / "s").exists()


# -- error tolerance of audit memorize -------------------------------------------------------------
@pytest.mark.parametrize("tolerance", ["inf", "nan", "-0.1", "0", "0.5", "1e309"])
def test_memorize_refuses_a_meaningless_tolerance(tolerance, workdir, capsys):
    line = one_error_line(
        [*SMALL_MEMORIZE, "--task", "regression", "--error-tolerance", tolerance, "--out", "m"], capsys
    )
    assert "tolerance must be in (0, 0.5)" in line
    assert left_behind(workdir) == []


def test_memorize_preset_refuses_an_infinite_tolerance_too(workdir, capsys):
    assert "tolerance" in one_error_line(["memorize", "--figure", "a", "--error-tolerance", "inf"], capsys)
    assert left_behind(workdir) == []


# -- audit certify --weights ------------------------------------------------------------------------
def _weights(tmp_path: Path, name: str, payload) -> str:
    path = tmp_path / name
    torch.save(payload, path)
    return str(path)


@pytest.mark.parametrize(("payload", "message"), [
    ({"W_Q": [[[1.0]]], "W_K": torch.ones(1, 1, 1)}, "W_Q is a list, not a tensor"),
    ({"W_Q": torch.ones(1, 2, 2), "W_K": "abc"}, "W_K is a str, not a tensor"),
    ({"W_Q": torch.ones(1, 2, 2, dtype=torch.bool), "W_K": torch.ones(1, 2, 2)}, "dtype bool"),
    ({"W_Q": torch.ones(1, 2, 2, dtype=torch.complex64), "W_K": torch.ones(1, 2, 2)}, "must be real"),
    ({"W_Q": torch.full((1, 2, 2), float("nan")), "W_K": torch.ones(1, 2, 2)}, "finite"),
    ({"W_Q": torch.full((1, 2, 2), 1e300, dtype=torch.float64), "W_K": torch.ones(1, 2, 2)}, "finite"),
    ({"W_Q": torch.ones(0, 2, 2), "W_K": torch.ones(0, 2, 2)}, "none of them 0"),
    ({"W_Q": torch.ones(2, 2), "W_K": torch.ones(2, 2)}, "must both be (H, d, d_h)"),
    (torch.ones(1, 2, 2), "needs tensors 'W_Q' and 'W_K'"),
], ids=["list", "str", "bool", "complex", "nan", "overflow", "empty", "2-d", "bare-tensor"])
def test_certify_refuses_weights_that_are_not_real_tensors(payload, message, workdir, capsys):
    path = _weights(workdir, "w.pt", payload)
    line = one_error_line(["certify", "--weights", path, "--out", "c"], capsys)
    assert message in line
    assert left_behind(workdir) == ["w.pt"]


def test_certify_refuses_unreadable_files_and_folders(workdir, capsys):
    (workdir / "w.safetensors").write_text("not a safetensors file")
    (workdir / "folder").mkdir()
    assert "not a readable weights file" in one_error_line(["certify", "--weights", "w.safetensors"], capsys)
    assert "is not a file" in one_error_line(["certify", "--weights", "folder"], capsys)
    assert left_behind(workdir) == ["folder", "w.safetensors"]


# -- list sizes and value bounds --------------------------------------------------------------------
def test_parse_ints_refuses_huge_lists_before_building_them():
    start = time.perf_counter()
    for text in ("1:1000000000", "0:1000000000000000000000000000000", "1:20000,1"):
        with pytest.raises(AuditError, match=f"more than {MAX_VALUES:,} values"):
            parse_ints(text, "--x", low=0, high=10**40)
    assert time.perf_counter() - start < 1.0  # nothing of size 10**9 was built
    assert len(parse_ints(f"1:{MAX_VALUES}", "--x")) == MAX_VALUES


@pytest.mark.parametrize(("text", "parse", "message"), [
    ("1:1000000000", parse_sizes, "--x takes values in 1..1000000; got 1000000000"),
    ("0,1", parse_sizes, "takes values in 1..1000000; got 0"),
    ("3:-5", parse_sizes, "lists no values"),
    (TOO_BIG, parse_seeds, f"takes values in 0..{MAX_SEED}; got {TOO_BIG}"),
    ("-1", parse_seeds, "got -1"),
    ("1:2:0", parse_ints, "ranges like 1:8"),
])
def test_parse_ints_bounds(text, parse, message):
    with pytest.raises(AuditError) as err:
        parse(text, "--x")
    assert message in str(err.value)


def test_parse_sizes_and_seeds_accept_their_whole_range():
    assert parse_sizes("1,1000000", "--x") == [1, 1_000_000]
    assert parse_seeds(f"0,{MAX_SEED}", "--x") == [0, MAX_SEED]
    assert parse_ints("0:60:20,-3", "--x") == [0, 20, 40, 60, -3]


def test_parse_floats():
    assert parse_floats("1e-2, 3e-2,1e-2", "--lr", positive=True) == [1e-2, 3e-2]
    for text, message in (
        ("inf", "finite"),
        ("nan", "finite"),
        ("0", "positive"),
        ("x", "numbers like"),
        (",", "no values"),
    ):
        with pytest.raises(AuditError, match=message):
            parse_floats(text, "--lr", positive=True)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["memorize", "--heads", "1:1000000000", "--context", "3", "--d-h", "2", "--N", "5"],
            "--heads takes values in 1..",
        ),
        (
            ["memorize", "--heads", "1", "--context", "1:20000", "--d-h", "2", "--N", "5"],
            "--context lists more than 10,000",
        ),
        (["certify", "--N", "1000000000000"], "--N takes values in 1..1000000"),
        (["assoc", "--dims", "2:100000"], "--dims lists more than 10,000 values"),
        (["recall", "scaling", "--dims", "1:1000000000"], "--dims takes values in 1.."),
        (["capacity", "--tokens", "t.safetensors", "--heads", "1:1000000000"], "--heads takes values in 1.."),
        (
            ["memorize", "--heads", "1", "--context", "3", "--d-h", "2", "--N", "5", "--d", "1000000000"],
            "'--d'",
        ),
    ],
)
def test_huge_lists_and_sizes_are_refused_at_once(args, message, workdir, capsys):
    assert message in one_error_line([*args, "--out", "x"], capsys)
    assert left_behind(workdir) == []


def test_facts_train_refuses_huge_lists(workdir, capsys):
    assert main(["facts", "generate", "--keys", "4", "--queries", "2", "-o", "db.csv"]) == 0
    capsys.readouterr()
    line = one_error_line(["facts", "train", "db.csv", "--d-model", "1:1000000000", "--out", "t"], capsys)
    assert "--d-model takes values in 1..1000000" in line
    assert left_behind(workdir) == ["db.csv"]


# -- seeds ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args", [
    [*SMALL_MEMORIZE, "--seeds", TOO_BIG],
    ["certify", "--seeds", f"0,{TOO_BIG}"],
    ["assoc", "--seeds", TOO_BIG],
    ["recall", "dynamics", "--seeds", "-1"],
    ["facts", "width", "--db-seeds", TOO_BIG],
    ["capacity", "--tokens", "t.safetensors", "--seed", TOO_BIG],
    ["facts", "generate", "-o", "db.csv", "--seed", TOO_BIG],
], ids=lambda args: " ".join(args[:2]))
def test_overflowing_seeds_are_one_clear_line(args, workdir, capsys):
    if args[0] != "facts" or args[1] != "generate":
        args = [*args, "--out", "x"]
    line = one_error_line(args, capsys)
    assert "seed" in line.lower() and str(MAX_SEED) in line
    assert left_behind(workdir) == []


# -- validation before the output folder ------------------------------------------------------------
@pytest.mark.parametrize(("args", "message"), [
    (["assoc", "--dims", "foo"], "--dims takes integers"),
    (["assoc", "--lr", "inf"], "--lr takes positive finite numbers"),
    (["assoc", "--memory", "linear", "--dims", "1"], "dims must be a non-empty list of integers >= 2"),
    (["recall", "tradeoff", "--seeds", "a"], "--seeds takes integers"),
    (["recall", "all", "--steps", "0"], "steps must be >= 1"),
    (["recall", "dynamics", "--lr", "0"], "--lr takes positive finite numbers"),
    (["memorize", "--heads", "2", "--context", "3", "--d-h", "32", "--N", "5", "--d", "8"], "exceeds d=8"),
    (["memorize", "--figure", "a", "--heads", "5"], "select none of the preset's runs"),
    (["certify", "--rtol", "2"], "rtol (the relative rank tolerance) must be in (0, 1)"),
    (["certify", "--d-h", "16", "--d", "8"], "exceeds d=8"),
    (["capacity", "--tokens", "missing.safetensors"], "does not exist"),
    (["capacity", "--tokens", "t.safetensors", "--lr", "inf"], "--lr takes positive finite numbers"),
    (["facts", "width", "--steps", "0"], "steps must be >= 1"),
    (["facts", "width", "--lr", "nan"], "--lr takes positive finite numbers"),
])
def test_a_refused_run_creates_no_folder(args, message, workdir, capsys):
    if "t.safetensors" in args:
        (workdir / "t.safetensors").write_bytes(b"")  # exists; never read because validation fails first
    line = one_error_line([*args, "--out", "out/sub"], capsys)
    assert message in line
    assert left_behind(workdir) == (["t.safetensors"] if "t.safetensors" in args else [])
    assert one_error_line(args, capsys) == line  # the default runs/<name>-<time> is not created either
    assert not (workdir / "runs").exists()


def test_output_folder_removes_what_a_failed_run_created(tmp_path):
    target = tmp_path / "a" / "b"
    with pytest.raises(KeyboardInterrupt), output_folder(target) as folder:
        (folder / "tokens").mkdir()
        (folder / "tokens" / "x.safetensors").write_text("partial")
        raise KeyboardInterrupt
    assert left_behind(tmp_path) == []


def test_output_folder_keeps_progress_and_folders_that_existed(tmp_path):
    with pytest.raises(AuditError), output_folder(tmp_path / "run") as folder:
        (folder / "units").mkdir()
        (folder / "units" / "0123.json").write_text("{}")
        raise AuditError("unit 2 failed")
    assert (tmp_path / "run" / "units" / "0123.json").exists()  # rerunning resumes from it
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(AuditError), output_folder(tmp_path / "mine"):
        raise AuditError("bad")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"


def test_output_folder_that_cannot_be_created_is_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    with (
        pytest.raises(AuditError, match="cannot create output folder"),
        output_folder(tmp_path / "file" / "run"),
    ):
        pass


# -- help texts stand on their own ------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(LAB_COMMANDS))
def test_help_texts_cite_no_internal_document(name, capsys):
    assert main([*name.split(), "--help"]) == 0
    text = capsys.readouterr().out
    assert "--threads" in text and "SPEC" not in text


@pytest.mark.parametrize(
    "argv",
    [
        ["memorize", "--steps", "10000001"],
        ["facts", "width", "--steps", str(2**40)],
        ["certify", "--steps", TOO_BIG],
        ["memorize", "--eval-every", "10000001"],
    ],
)
def test_step_counts_have_a_bound(argv, tmp_path, capsys):
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is not in the range x<=10000000" in err
    assert not (tmp_path / "out").exists()


def test_a_ray_address_that_does_not_answer_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    """Ray's client retries for ever against an address that takes the connection and stays silent."""
    import socket
    import threading

    pytest.importorskip("ray")
    monkeypatch.setattr(execution, "RAY_CONNECT_TIMEOUT_S", 0.5)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    held: list[socket.socket] = []
    threading.Thread(target=lambda: [held.append(silent.accept()[0]) for _ in range(8)], daemon=True).start()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: the connection is refused
    try:
        for port, fragment in ((silent.getsockname()[1], "no answer within 0.5 s"),
                               (closed.getsockname()[1], "Connection refused")):
            argv = ["assoc", "--scale", "quick", "--executor", "ray", "--address", f"127.0.0.1:{port}",
                    "--out", str(tmp_path / "out")]
            assert main(argv) == 2  # (without the check, Ray's client retried for ever here)
            err = capsys.readouterr().err.strip()
            assert err.count("\n") == 0 and f"cannot reach a Ray cluster at '127.0.0.1:{port}'" in err
            assert fragment in err
            assert not (tmp_path / "out").exists()
    finally:
        silent.close()
        closed.close()
        for conn in held:
            conn.close()
