"""The bad-input suite: malformed inputs across the CLI and the Python API.

Every case must end in exit code 2 with exactly one line on stderr (CLI) or a ValueError with a one-line
message (API) that says what is valid, never a traceback, and must leave the file system as it was: no
report folder, no partial file, the inputs untouched. Models are tiny random ViT / GPT-2 folders and
real but broken files built by the fixtures; nothing is mocked.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
from conftest import save_tiny_vit, shared_data, tiny_gpt2, tiny_memorize

from auditor.audit.tokens import Tokens
from auditor.cli import main

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Every malformed input of the suite (and two tiny model folders), in one
    read-only-by-convention tree."""
    from safetensors.torch import save_file
    from transformers import GPT2Config, GPT2Model

    root = tmp_path_factory.mktemp("bad")
    f: dict[str, Path] = {"root": root}
    f["vit"] = root / "tiny-vit"  # n = 17, d = 32, 3 blocks
    save_tiny_vit(f["vit"])
    f["gpt2"] = root / "tiny-gpt2"  # d = 32, 128 positions
    GPT2Model(GPT2Config(**tiny_gpt2())).save_pretrained(f["gpt2"])
    for name in ("empty", "zero-byte", "corrupt", "no-txt"):
        f[name] = root / name
        f[name].mkdir()
    (f["zero-byte"] / "a.jpg").touch()
    (f["zero-byte"] / "b.png").touch()
    real = sorted(shared_data("imagenet-sample").glob("*.JPEG"))[0].read_bytes()
    (f["corrupt"] / "truncated.JPEG").write_bytes(real[: len(real) // 3])
    (f["corrupt"] / "noise.jpg").write_bytes(bytes(range(256)) * 8)
    (f["no-txt"] / "notes.md").write_text("a markdown file is not a .txt corpus\n")
    f["short"] = root / "short.txt"
    f["short"].write_text("Too short for a window.\n")
    f["empty-txt"] = root / "empty.txt"
    f["empty-txt"].touch()
    f["file"] = root / "a-file"
    f["file"].write_text("not a folder\n")

    gen = torch.Generator().manual_seed(0)
    contexts = torch.randn(8, 4, 6, generator=gen)  # (N, n, d)
    queries = contexts[:, 0].clone()  # (N, d)
    f["ok"] = root / "ok.safetensors"
    Tokens(contexts, queries, {"n": "4", "d": "6"}).save(f["ok"])
    nan, inf = contexts.clone(), queries.clone()
    nan[1, 2, 3] = math.nan
    inf[0, 5] = math.inf
    tensors = {
        "nan": {"contexts": nan, "queries": queries},
        "inf": {"contexts": contexts, "queries": inf},
        "flat": {"contexts": contexts.reshape(8, 24), "queries": queries},  # (N, n*d): wrong shape
        "d-mismatch": {"contexts": contexts, "queries": torch.randn(8, 5, generator=gen)},
        "ints": {"contexts": contexts.to(torch.int32), "queries": queries.to(torch.int32)},
        "no-keys": {"x": contexts},
    }
    for name, content in tensors.items():
        f[name] = root / f"{name}.safetensors"
        save_file(content, f[name])
    f["meta"] = root / "meta.safetensors"
    save_file({"contexts": contexts, "queries": queries}, f["meta"], metadata={"n": "5"})
    whole = (root / "ok.safetensors").read_bytes()
    f["truncated"] = root / "truncated.safetensors"
    f["truncated"].write_bytes(whole[: len(whole) // 2])
    f["zero-tokens"] = root / "zero.safetensors"
    f["zero-tokens"].touch()
    return f


def snapshot(*roots: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under ``roots`` with its size and modification time."""
    state = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                path = Path(dirpath) / name
                stat = path.stat()
                state[str(path)] = (stat.st_size, stat.st_mtime_ns)
    return state


# (id, argv with {placeholders} for the fixture files, a fragment the one error line must contain)
CLI_CASES = [
    ("unknown-model", ["vit-bse"], "did you mean 'vit-base'"),
    ("unknown-timm-model", ["timm:vit_tny_patch16_224"], "did you mean 'vit_tiny_patch16_224'"),
    ("missing-data-folder", ["{vit}", "--data", "{root}/nowhere"], "does not exist"),
    ("empty-data-folder", ["{vit}", "--data", "{empty}"], "no image files"),
    ("zero-byte-images", ["{vit}", "--data", "{zero-byte}"], "no readable image"),
    ("corrupt-images", ["{vit}", "--data", "{corrupt}"], "no readable image"),
    ("data-is-a-file", ["{vit}", "--data", "{file}"], "is not a folder"),
    ("text-shorter-than-n", ["{gpt2}", "--data", "{short}", "--context-length", "32"], "text too short"),
    ("empty-text", ["{gpt2}", "--data", "{empty-txt}", "--context-length", "16"], "text too short"),
    ("no-txt-files", ["{gpt2}", "--data", "{no-txt}", "--context-length", "16"], "no .txt files"),
    ("n-greater-than-d", ["{gpt2}", "--context-length", "64"], "exceeds the width d = 32"),
    (
        "k-greater-than-N",
        ["{vit}", "--data", "{imagenet}", "--samples", "5", "--sweep", "--sweep-ks", "4,40"],
        "sweep k = 40 exceeds the N = 5 examples",
    ),
    ("sweep-ks-not-integers", ["{vit}", "--sweep", "--sweep-ks", "a,b"], "comma-separated integers"),
    ("zero-samples", ["{vit}", "--samples", "0"], "samples must be a positive integer"),
    ("negative-samples", ["{vit}", "--samples", "-3"], "samples must be a positive integer"),
    ("zero-subsets", ["{vit}", "--subsets", "0"], "subsets must be a positive integer"),
    (
        "negative-sweep-refine",
        ["{vit}", "--sweep", "--sweep-refine", "-1"],
        "sweep_refine must be an integer >= 0",
    ),
    ("zero-batch-size", ["{vit}", "--batch-size", "0"], "batch_size must be a positive integer"),
    ("zero-context-length", ["{gpt2}", "--context-length", "0"], "context_length must be a positive integer"),
    ("negative-sweep-k", ["{vit}", "--sweep", "--sweep-ks", "-3"], "sweep k must be a positive integer"),
    ("zero-threshold", ["{vit}", "--threshold", "0"], "threshold must be a number in (0, 1]"),
    ("threshold-above-one", ["{vit}", "--threshold", "1.5"], "threshold must be a number in (0, 1]"),
    ("nan-threshold", ["{vit}", "--threshold", "nan"], "threshold must be a number in (0, 1]"),
    (
        "negative-rtol",
        ["{vit}", "--rtol", "-1e-6"],
        "rtol (the relative rank tolerance) must be a number in (0, 1)",
    ),
    ("rtol-one", ["{vit}", "--rtol", "1"], "must be a number in (0, 1)"),
    ("rtol-zero", ["{vit}", "--rtol", "0"], "must be a number in (0, 1)"),
    ("nan-rtol", ["{vit}", "--rtol", "nan"], "must be a number in (0, 1)"),
    ("unknown-representation", ["{vit}", "-r", "embeding"], "did you mean 'embedding'"),
    ("block-out-of-range", ["{vit}", "-r", "block.9"], "the model has 3 blocks"),
    ("unknown-test", ["{vit}", "--tests", "assumption4"], "unknown test 'assumption4'"),
    ("unknown-weights", ["{vit}", "-w", "pretrainned"], "weights must be 'random', 'pretrained' or a folder"),
    ("unknown-device", ["{vit}", "--device", "tpu"], "valid: auto, cpu, cuda"),
    ("unwritable-out", ["{vit}", "--out", "{file}/report"], "cannot write to output folder"),
    ("huge-subsets", ["{vit}", "--subsets", "1000000000"], "valid: 1 .. 10,000,000"),
    ("subsets-beyond-memory", ["vit-base", "--subsets", "5000000"], "do not fit in memory"),
    ("huge-seed", ["{vit}", "--seed", str(2**70)], "seed must be an integer in [-2**63, 2**63 - 1]"),
    ("zero-threads", ["{vit}", "--threads", "0"], "threads must be a positive integer"),
    ("tokens-with-data", ["{vit}", "--tokens", "{ok}", "--data", "{empty}"], "do not apply when re-testing"),
    ("tokens-nan", ["{vit}", "--tokens", "{nan}"], "contain NaN or infinite values"),
    ("tokens-missing", ["{vit}", "--tokens", "{root}/none.safetensors"], "does not exist"),
    (
        "memorize-zero-heads",
        ["memorize", "--heads", "0", "--context", "4", "--d-h", "4", "--N", "16"],
        "--heads takes values in 1..",
    ),
    (
        "memorize-zero-N",
        ["memorize", "--heads", "1", "--context", "4", "--d-h", "4", "--N", "0"],
        "--N takes values in 1..",
    ),
    (
        "memorize-negative-d",
        ["memorize", "--heads", "1", "--context", "4", "--d-h", "4", "--N", "16", "--d", "-4"],
        "d must be >= 1",
    ),
    (
        "memorize-negative-lr",
        ["memorize", "--heads", "1", "--context", "4", "--d-h", "4", "--N", "16", "--lr", "-1"],
        "--lr takes positive finite numbers",
    ),
    (
        "memorize-bad-list",
        ["memorize", "--heads", "a", "--context", "4", "--d-h", "4", "--N", "16"],
        "takes integers like 1,2,4",
    ),
    ("capacity-nan-tokens", ["capacity", "--tokens", "{nan}"], "contain NaN or infinite values"),
    ("capacity-wrong-shape-tokens", ["capacity", "--tokens", "{flat}"], "contexts must be (N, n, d)"),
    (
        "capacity-truncated-tokens",
        ["capacity", "--tokens", "{truncated}"],
        "not a readable safetensors token file",
    ),
    ("certify-missing-weights", ["certify", "--weights", "{root}/none.safetensors"], "does not exist"),
]


def _fill(argv: list[str], files: dict[str, Path]) -> list[str]:
    places = {k: str(v) for k, v in files.items()}
    if any("{imagenet}" in a for a in argv):
        places["imagenet"] = str(shared_data("imagenet-sample"))
    return [a.format(**places) for a in argv]


@pytest.mark.parametrize("argv, fragment", [pytest.param(a, f, id=i) for i, a, f in CLI_CASES])
def test_cli_rejects_bad_input_in_one_line_and_writes_nothing(argv, fragment, files, tmp_path, capsys):
    if argv[0].startswith("timm:"):
        pytest.importorskip("timm")
    args = _fill(argv, files)
    is_audit = args[0] not in ("memorize", "capacity", "certify")
    if "--out" not in args:
        args += ["--out", str(tmp_path / "out" / "report")]
    if is_audit:
        args += ["--quiet"]
    before = snapshot(files["root"], tmp_path)
    code = main(args)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert "Traceback" not in err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert fragment in lines[0]
    assert snapshot(files["root"], tmp_path) == before  # no report folder, no partial file, inputs intact


# ---------------------------------------------------------------------------------------------------
# Python API
# ---------------------------------------------------------------------------------------------------


def _tiny(files, name="vit", **kwargs):
    from auditor.models import load_model

    return load_model(str(files[name]), "random", device="cpu", **kwargs)


def _inputs(files, count=6):
    from auditor.data import load_inputs

    return load_inputs(_tiny(files), str(shared_data("imagenet-sample")), count, progress=False)


def _load_tokens(name: str):
    return lambda f, t: Tokens.load(f[name])


def api_cases():
    """(id, callable taking the fixture files and a fresh tmp folder, a fragment of the message)."""
    import probes
    from auditor import audit_model, audit_tokens
    from auditor.audit.extract import extract
    from auditor.audit.runner import AuditConfig
    from auditor.audit.shard import ModelRecipe, extract_sharded, shard_bounds
    from auditor.data import load_inputs
    from auditor.lab.sweep import run_sweep
    from auditor.models import load_model

    good = torch.randn(6, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)  # (N, d)
    with_nan = good.clone()
    with_nan[2, 1] = math.nan
    with_inf = good.clone()
    with_inf[0, 0] = -math.inf
    return [
        ("audit-unknown-model", lambda f, t: audit_model("vit-bse", out=t / "r"), "did you mean 'vit-base'"),
        ("audit-unknown-option", lambda f, t: audit_model(str(f["vit"]), samplez=3), "unknown audit option"),
        (
            "audit-unwritable-out",
            lambda f, t: audit_model(str(f["vit"]), weights="random", out=f["file"] / "r"),
            "cannot write to output folder",
        ),
        (
            "audit-k-greater-than-N",
            lambda f, t: audit_model(
                str(f["vit"]),
                data=str(shared_data("imagenet-sample")),
                samples=4,
                weights="random",
                sweep=True,
                sweep_ks=(50,),
                out=t / "r",
                progress=False,
            ),
            "exceeds the N = 4",
        ),
        ("config-zero-samples", lambda f, t: AuditConfig(samples=0), "samples must be a positive integer"),
        ("config-nan-threshold", lambda f, t: AuditConfig(threshold=math.nan), "threshold must be a number"),
        ("config-negative-rtol", lambda f, t: AuditConfig(rtol=-0.5), "must be a number in (0, 1)"),
        ("config-float-seed", lambda f, t: AuditConfig(seed=1.5), "seed must be an integer"),
        ("config-huge-seed", lambda f, t: AuditConfig(seed=2**70), "seed must be an integer in [-2**63"),
        ("config-first-not-bool", lambda f, t: AuditConfig(first="yes"), "first must be True or False"),
        ("config-huge-subsets", lambda f, t: AuditConfig(subsets=10**9), "valid: 1 .. 10,000,000"),
        (
            "audit-processor-with-name",
            lambda f, t: audit_model("vit-base", "a processor"),
            "processor goes with a model",
        ),
        ("audit-tokens-bad-queries", lambda f, t: audit_tokens(None, good[0], n=2), "queries must be (N, d)"),
        (
            "audit-tokens-n-mismatch",
            lambda f, t: audit_tokens(good[:, None, :], good, n=2),
            "n = 2 but the contexts",
        ),
        ("model-unknown-weights", lambda f, t: load_model("vit-base", "pretrainned"), "weights must be"),
        (
            "extract-block-out-of-range",
            lambda f, t: extract(_tiny(f), _inputs(f), ["block.99"]),
            "out of range",
        ),
        (
            "extract-zero-batch",
            lambda f, t: extract(_tiny(f), _inputs(f), ["embedding"], batch_size=0),
            "batch_size must be a positive integer",
        ),
        (
            "data-zero-byte-images",
            lambda f, t: load_inputs(_tiny(f), str(f["zero-byte"]), 4, progress=False),
            "no readable image",
        ),
        ("data-zero-samples", lambda f, t: load_inputs(_tiny(f), str(f["empty"]), 0), "samples must be"),
        ("rank-nan", lambda f, t: probes.numerical_rank(with_nan), "only finite values are valid"),
        ("rank-inf", lambda f, t: probes.numerical_rank(with_inf), "only finite values are valid"),
        ("rank-bad-rtol", lambda f, t: probes.numerical_rank(good, rtol=1.5), "rtol must be a finite number"),
        ("kruskal-k-greater-than-N", lambda f, t: probes.kruskal_test(good, k=7), "valid: 1 <= k <= N"),
        ("assumption1-nan-queries", lambda f, t: probes.assumption1(with_nan, 2), "only finite values"),
        ("assumption1-zero-n", lambda f, t: probes.assumption1(good, 0), "must be a positive integer"),
        (
            "assumption2-wrong-shape",
            lambda f, t: probes.assumption2(good),
            "contexts must have shape (N, n, d)",
        ),
        *[
            (f"tokens-{name}", _load_tokens(name), fragment)
            for name, fragment in (
                ("nan", "contain NaN or infinite values"),
                ("inf", "contain NaN or infinite values"),
                ("flat", "contexts must be (N, n, d)"),
                ("d-mismatch", "disagree on N or d"),
                ("ints", "must be floating point"),
                ("no-keys", "missing tensor(s)"),
                ("meta", "metadata says n=5"),
                ("truncated", "not a readable safetensors token file"),
                ("zero-tokens", "not a readable safetensors token file"),
            )
        ],
        ("tokens-wrong-shape-object", lambda f, t: Tokens(good, good), "contexts must be (N, n, d)"),
        (
            "sweep-unknown-executor",
            lambda f, t: run_sweep(probes.numerical_rank, [{}], t / "s", executor="spark"),
            "valid: local, ray",
        ),
        (
            "sweep-unwritable-out",
            lambda f, t: run_sweep(probes.numerical_rank, [{}], f["file"] / "s"),
            "cannot write to output folder",
        ),
        (
            "sweep-negative-cpus",
            lambda f, t: run_sweep(probes.numerical_rank, [{}], t / "s", num_cpus=-1),
            "num_cpus must be a finite number >= 0",
        ),
        ("shard-zero-workers", lambda f, t: shard_bounds(10, 0, 4), "workers must be a positive integer"),
        (
            "shard-zero-threads",
            lambda f, t: extract_sharded(ModelRecipe("vit-base"), _inputs(f), ["embedding"], threads=0),
            "threads must be a positive integer",
        ),
        ("shard-empty-model-name", lambda f, t: ModelRecipe(" "), "must be a model name"),
    ]


API_CASES = api_cases()


@pytest.mark.parametrize("call, fragment", [pytest.param(c, m, id=i) for i, c, m in API_CASES])
def test_api_raises_one_line_value_error_and_writes_nothing(call, fragment, files, tmp_path):
    before = snapshot(files["root"], tmp_path)
    with pytest.raises(ValueError) as info:
        call(files, tmp_path)
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message.strip() and message.strip()
    assert snapshot(files["root"], tmp_path) == before


def test_resuming_from_a_truncated_training_checkpoint_is_refused_and_left_alone(tmp_path):
    """A sweep whose engine checkpoint was cut short: one-line error,
    checkpoint kept, nothing else written."""
    from auditor.lab.experiment import run_experiment
    from auditor.lab.room import get
    from auditor.lab.sweep import unit_key

    experiment = get("memorize")
    config = tiny_memorize(heads=(1,), steps=20, bucket_size=1)
    unit = experiment.units(config, tmp_path)[0]
    checkpoint = tmp_path / "checkpoints" / f"{unit_key(unit, experiment.key_defaults)}.pt"
    checkpoint.parent.mkdir()
    buffer = tmp_path / "whole.pt"
    torch.save({"format": 1, "model": {"w": torch.zeros(64)}}, buffer)
    checkpoint.write_bytes(buffer.read_bytes()[:100])  # cut short, as by a full disk
    buffer.unlink()
    before = snapshot(tmp_path)
    with pytest.raises(ValueError) as info:
        run_experiment(experiment, config, tmp_path, plots=False, progress=False)
    assert "unreadable" in str(info.value) and "delete it to restart" in str(info.value)
    assert "\n" not in str(info.value)
    after = snapshot(tmp_path)
    assert {p for p in after if p not in before} <= {str(tmp_path / "units")}  # the (empty) ledger only
    assert not list((tmp_path / "units").glob("*")) and not (tmp_path / "results.csv").exists()


# ---------------------------------------------------------------------------------------------------
# The Python API in its own words: paths, non-numeric arrays, tensors that require grad
# ---------------------------------------------------------------------------------------------------


def test_audit_tokens_says_what_to_pass_for_paths_and_non_numeric_arrays(tmp_path):
    import numpy as np

    from auditor import audit_tokens

    contexts = torch.randn(
        12, 3, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64
    )  # (N, n, d)
    cases = [
        (("tokens.safetensors", contexts[:, 0]), "audit_tokens takes tensors, not files"),
        (
            (tmp_path / "t.safetensors", contexts[:, 0]),
            "load a token file with auditor.audit.tokens.Tokens.load",
        ),
        (
            (np.array([[["a"] * 4] * 3] * 12, dtype=object), contexts[:, 0]),
            "array of numbers; got ndarray of dtype object",
        ),
        ((contexts, contexts[:, 0].to(torch.complex128)), "queries must hold real numbers"),
    ]
    for args, fragment in cases:
        with pytest.raises(TypeError) as info:
            audit_tokens(*args, subsets=5, progress=False)
        assert fragment in str(info.value) and "\n" not in str(info.value)
    assert not any(tmp_path.iterdir())


def test_tensors_that_require_grad_give_the_rows_of_their_values():
    import probes
    from auditor import audit_tokens

    contexts = torch.randn(
        12, 3, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64
    )  # (N, n, d)
    graded = contexts.clone().requires_grad_(True)
    plain = audit_tokens(contexts, contexts[:, 0], subsets=20, progress=False)
    rows = audit_tokens(graded, graded[:, 0], subsets=20, progress=False)
    assert (
        rows["fraction"].tolist() == plain["fraction"].tolist()
        and rows["share_meets_threshold"].tolist() == plain["share_meets_threshold"].tolist()
    )
    result = probes.kruskal_test(graded[:, 0], 3, subsets=20, seed=0)
    assert result.fraction == probes.kruskal_test(contexts[:, 0], 3, subsets=20, seed=0).fraction
    assert graded.grad is None  # nothing was differentiated


def test_probes_refuse_paths_and_non_numeric_arrays_in_their_own_words():
    import numpy as np

    import probes

    with pytest.raises(ValueError, match="got the path 'tokens.pt'; the probes take tensors"):
        probes.kruskal_test("tokens.pt", 2)
    with pytest.raises(TypeError, match="must hold numbers .* dtype <U1"):
        probes.numerical_rank(np.array([["a", "b"], ["c", "d"]]))


# ---------------------------------------------------------------------------------------------------
# OS errors name their path
# ---------------------------------------------------------------------------------------------------


def test_a_lock_that_is_a_folder_is_named(files, tmp_path, capsys):
    out = tmp_path / "report"
    (out / ".lock").mkdir(parents=True)
    argv = [
        str(files["vit"]),
        "--data",
        str(shared_data("imagenet-sample")),
        "--samples",
        "4",
        "-w",
        "random",
        "--out",
        str(out),
        "--quiet",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: {str(out / '.lock')!r} is a folder where the audit keeps its lock file; remove it or "
        "choose another --out"
    )
    assert sorted(p.name for p in out.iterdir()) == [".lock"]


def test_a_full_disk_names_the_file_it_could_not_write(tmp_path, capsys, monkeypatch):
    import errno

    from auditor.core import atomic

    def full(tmp, text):  # what write() raises on a full disk: no file name attached
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic, "_write_synced", full)
    out = tmp_path / "run"
    assert (
        main(["facts", "width", "--scale", "quick", "--threads", "1", "--no-plots", "--out", str(out)]) == 2
    )
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: No space left on device: ") and str(out / "units") in err
    assert not out.exists()  # nothing finished: the folder it made is gone


def test_text_data_inside_out_is_said_to_be_left_out(tmp_path):
    from auditor.core.errors import AuditError
    from auditor.data.text import read_documents

    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "notes.txt").write_text("some text\n")
    with pytest.raises(
        AuditError,
        match=r"no \.txt files under .* \(1 found, none read as data: 1 inside the "
        r"output folder --out",
    ):
        read_documents(str(tmp_path), exclude=tmp_path / "report")
