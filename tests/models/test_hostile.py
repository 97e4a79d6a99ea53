"""Hostile checkpoints, tokenizers and options: each is refused in one line that names its path, before
anything from it runs or is read, and nothing is left behind.

Folders are tiny ``save_pretrained`` models (random weights); the malformed safetensors files are written
byte by byte, so the library's own header checks are what refuses them. Nothing is mocked.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import save_file
from test_families import save, tiny_config

from auditor.cli import main
from auditor.core.errors import AuditError
from auditor.models import load_model

pytestmark = [pytest.mark.fast, pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore")]

INDEX = "model.safetensors.index.json"


def one_line(err: BaseException) -> str:
    text = str(err)
    assert text.strip() and "\n" not in text.strip(), text
    return text


def refused(call, *fragments: str) -> str:
    """The one-line AuditError of ``call()``, holding every fragment."""
    with pytest.raises(AuditError) as info:
        call()
    text = one_line(info.value)
    for fragment in fragments:
        assert fragment in text, text
    return text


def cli_refused(argv: list[str], capsys, *fragments: str) -> str:
    """``audit ARGV`` ends with exit 2 and one ``error:`` line holding every fragment, no traceback."""
    capsys.readouterr()  # what the fixtures printed (save_pretrained's progress bars)
    code = main([*argv, "--quiet"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def sharded(folder: Path, model_type: str = "llama", layers: int = 2) -> Path:
    """A tiny model saved in several shards with their index."""
    save(tiny_config(model_type, layers=layers), folder, max_shard_size="40KB")
    assert (folder / INDEX).is_file()
    return folder


def rewrite_index(folder: Path, change) -> dict:
    index = json.loads((folder / INDEX).read_text())
    change(index["weight_map"])
    (folder / INDEX).write_text(json.dumps(index))
    return index


def load(folder: Path, **kwargs):
    return load_model(str(folder), str(folder), device="cpu", **kwargs)


def audit_block0(loaded) -> None:
    """Read what an audit of block 0 reads (the embedding rows and block 0's weights)."""
    from auditor.audit.extract import extract
    from auditor.data import load_inputs

    inputs = load_inputs(loaded, None, 2, progress=False, first=True)
    extract(loaded, inputs, ["block.0"], progress=False, batch_size=2)


# ---------------------------------------------------------------------------------------------------
# Security: shards outside the folder, Slurm flags as shell text, tokenizer code, silent local runs
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["parent", "absolute", "link"])
def test_a_shard_outside_the_checkpoint_folder_is_refused_before_it_is_read(where, tmp_path):
    folder = sharded(tmp_path / "model")
    outside = tmp_path / "secret.safetensors"
    save_file({"x": torch.zeros(2)}, outside)
    first = json.loads((folder / INDEX).read_text())["weight_map"]["embed_tokens.weight"]
    if where == "link":  # a shard replaced by a link to a file outside the folder
        (folder / first).unlink()
        (folder / first).symlink_to(outside)
    else:
        name = "../secret.safetensors" if where == "parent" else str(outside)
        rewrite_index(folder, lambda m: m.update({k: name for k, v in m.items() if v == first}))
    before = os.stat(outside).st_atime_ns
    text = refused(lambda: audit_block0(load(folder)), str(folder))
    assert ("outside the checkpoint folder" in text) if where == "link" else ("not a .safetensors file name"
                                                                              in text)
    assert os.stat(outside).st_atime_ns == before or where == "link"
    # the whole-model families (GPT-2, BERT, ViT) go through transformers, which reads the index itself
    gpt2 = sharded(tmp_path / "gpt2", "gpt2")
    first = json.loads((gpt2 / INDEX).read_text())["weight_map"]["wte.weight"]
    rewrite_index(gpt2, lambda m: m.update({k: "../secret.safetensors" for k, v in m.items() if v == first}))
    refused(lambda: load(gpt2), "not a .safetensors file name", INDEX)


def test_a_hugging_face_cache_snapshot_whose_files_link_to_its_blobs_is_read(tmp_path):
    """The hub cache's layout (snapshots/<rev>/* -> ../../blobs/<hash>) is no escape: it loads."""
    saved = tmp_path / "saved"
    save(tiny_config("llama", layers=1), saved)
    snapshot = tmp_path / "models--x--y" / "snapshots" / "abc"
    blobs = tmp_path / "models--x--y" / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for i, path in enumerate(sorted(saved.iterdir())):
        (blobs / f"blob{i}").write_bytes(path.read_bytes())
        (snapshot / path.name).symlink_to(Path("../../blobs") / f"blob{i}")
    audit_block0(load(snapshot))


def test_sbatch_flags_are_single_tokens_never_shell_text():
    from submitit.slurm.slurm import _make_sbatch_string

    from auditor.core.slurm import SlurmOptions, parse_sbatch

    good = ["--account=abc", "--exclusive", "--constraint=a100&nvlink", "--nodelist=node[01-04]",
            "--mail-user=me@lab.org", "--mem=16G"]
    options = SlurmOptions(sbatch=tuple(good), folder="/tmp/logs")
    script = _make_sbatch_string("python -c pass", "/tmp/logs", **options.parameters("auditor-x"))
    lines = script.splitlines()
    assert "#SBATCH --exclusive" in lines  # submitit shell-quotes values: one #SBATCH line per flag
    for flag in good:
        assert sum(line.startswith("#SBATCH " + flag.split("=")[0]) for line in lines) == 1
    for bad in ("--comment=x\nrm -rf ~", "--comment=x\r\n#SBATCH --wrap=id", "--account=$(id)",
                "--account=a b", "--account='a'", "--x;id", "--account=`id`", "--qos=high\x00"):
        with pytest.raises(AuditError) as info:
            parse_sbatch([bad])
        assert "--slurm-sbatch" in one_line(info.value)
    for partition in ("gpu\n#SBATCH --wrap=id", "a b", "$(id)"):
        with pytest.raises(AuditError, match="--slurm-partition takes a partition name"):
            SlurmOptions(partition=partition)
    with pytest.raises(AuditError, match="without control characters"):
        SlurmOptions(folder="/tmp/x\n#SBATCH --wrap=id")


def test_sbatch_newline_from_the_command_line_is_one_error_line(tmp_path, capsys):
    pytest.importorskip("submitit")
    cli_refused(["gpt2", "--executor", "slurm", "--workers", "2", "--slurm-sbatch", "--comment=a\nid",
                 "--out", str(tmp_path / "r")], capsys, "--slurm-sbatch", "never shell text")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("executor", ["slurm", "ray"])
def test_an_executor_without_workers_says_there_is_nothing_to_distribute(executor, tmp_path, capsys):
    cli_refused(["gpt2", "--executor", executor, "--out", str(tmp_path / "r")], capsys,
                f"--executor {executor}", "add --workers N")
    assert not (tmp_path / "r").exists()


def word_tokenizer(folder: Path) -> None:
    """A small word-level tokenizer saved with save_pretrained (ids inside the tiny models' vocabulary)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[UNK]", "<s>", "</s>", "the", "a", "of", "and", "to", "in", "is"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="<s>",
                                                eos_token="</s>")
    fast.save_pretrained(folder)


def test_a_tokenizer_mapped_to_custom_code_never_runs_and_never_prompts(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "model"
    save(tiny_config("llama", layers=1), folder)
    word_tokenizer(folder)
    marker = tmp_path / "ran"
    (folder / "tokenization_evil.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "from transformers import PreTrainedTokenizerFast\n"
        "class EvilTokenizer(PreTrainedTokenizerFast):\n    pass\n"
    )
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": [None, "tokenization_evil.EvilTokenizer"]}
    config["tokenizer_class"] = "EvilTokenizer"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))

    def no_prompt(*args):
        raise AssertionError("something asked on standard input")

    monkeypatch.setattr("builtins.input", no_prompt)
    refused(lambda: load(folder), str(folder), "custom code", "--trust-remote-code")
    cli_refused([str(folder), "-w", str(folder), "--out", str(tmp_path / "r")], capsys, "--trust-remote-code")
    assert not marker.exists() and not (tmp_path / "r").exists()
    loaded = load(folder, trust_remote_code=True)  # asked for: the folder's code runs, as transformers does
    assert marker.exists() and "tokenizer of" in loaded.tokenizer_name


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "bert"])
def test_an_unreadable_saved_tokenizer_is_an_error_not_a_byte_fallback(model_type, tmp_path):
    folder = tmp_path / model_type
    save(tiny_config(model_type, layers=1), folder)
    word_tokenizer(folder)
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": ')  # cut short
    refused(lambda: load(folder), str(folder), "tokenizer saved with the weights cannot be read")
