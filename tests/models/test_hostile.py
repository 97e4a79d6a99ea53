"""Hostile checkpoints, tokenizers and options: each is refused in one line that names its path, before
anything from it runs or is read, and nothing is left behind.

Folders are tiny ``save_pretrained`` models (random weights); the malformed safetensors files are written
byte by byte, so the library's own header checks are what refuses them. Nothing is mocked.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import sys
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from test_families import save, tiny_config

from auditor.cli import main
from auditor.core.errors import AuditError
from auditor.models import load_model

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore")]

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
    code = main([*argv, *([] if argv[0] == "compare" else ["--quiet"])])
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


# ---------------------------------------------------------------------------------------------------
# Silently wrong numbers: every tensor's shape and dtype are the config's, or nothing is read
# ---------------------------------------------------------------------------------------------------


def tampered(folder: Path, change, model_type: str = "llama", layers: int = 2, config_change=None) -> Path:
    """A tiny single-file checkpoint whose tensors (and config.json) went through ``change``."""
    save(tiny_config(model_type, layers=layers), folder)
    tensors = load_file(folder / "model.safetensors")
    change(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    if config_change is not None:
        values = json.loads((folder / "config.json").read_text())
        config_change(values)
        (folder / "config.json").write_text(json.dumps(values))
    return folder


def test_a_table_with_more_or_fewer_rows_than_the_config_is_refused(tmp_path):
    grow = tampered(tmp_path / "grow", lambda t: t.update(
        {"embed_tokens.weight": torch.cat([t["embed_tokens.weight"], t["embed_tokens.weight"][:8]])}))
    refused(lambda: audit_block0(load(grow)), str(grow / "model.safetensors"), "'embed_tokens.weight'",
            "has shape [520, 64] but the config implies [512, 64]")
    shrink = tampered(tmp_path / "shrink", lambda t: t.update(
        {"embed_tokens.weight": t["embed_tokens.weight"][:300].clone()}))
    refused(lambda: audit_block0(load(shrink)), "has shape [300, 64] but the config implies [512, 64]")
    norm = tampered(tmp_path / "norm", lambda t: t.update(
        {"layers.0.input_layernorm.weight": torch.ones(32)}))
    refused(lambda: audit_block0(load(norm)), "'layers.0.input_layernorm.weight' has shape [32]")


def raw_safetensors(path: Path, header: object, data: bytes = b"", length: int | None = None) -> Path:
    """A safetensors file written byte by byte: 8-byte little-endian header length, JSON header, data."""
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + data)
    return path


@pytest.mark.parametrize("model_type, first, second", [
    ("llama", "embed_tokens.weight", "layers.0.mlp.up_proj.weight"),  # read block by block
    ("gpt2", "wte.weight", "h.0.mlp.c_fc.weight"),  # read whole by transformers, after the checks
])
def test_overlapping_and_malformed_headers_are_refused_by_the_library_in_one_line(model_type, first, second,
                                                                                   tmp_path):
    folder = tmp_path / "model"
    save(tiny_config(model_type, layers=1), folder)
    weights = folder / "model.safetensors"
    entry = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}
    cases = {
        "overlap": ({first: entry, second: entry}, b"\0" * 16, None),
        "no data_offsets": ({first: {"dtype": "F32", "shape": [2, 2]}}, b"\0" * 16, None),
        "list for an entry": ({first: [1, 2]}, b"\0" * 16, None),
        "header of 2^63 bytes": ({}, b"", 2**63),
        "offsets past the end": ({first: {**entry, "data_offsets": [0, 64]}}, b"\0" * 16, None),
        "not json": (None, b"", None),
    }
    for name, (header, data, length) in cases.items():
        if header is None:
            weights.write_bytes(struct.pack("<Q", 5) + b"{nope")
        else:
            raw_safetensors(weights, header, data, length)
        text = refused(lambda: load(folder), str(weights), "not a readable safetensors file")
        assert "Traceback" not in text, name


def test_float8_weights_with_scales_are_refused_naming_the_scheme(tmp_path):
    def to_float8(t):
        for key in [k for k in t if k.startswith("layers.") and k.endswith("proj.weight")]:
            t[key] = t[key].to(torch.float8_e4m3fn)
            t[key + "_scale"] = torch.ones(())

    quant = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic"}
    folder = tampered(tmp_path / "fp8", to_float8,
                      config_change=lambda v: v.update(quantization_config=quant))
    refused(lambda: load(folder), "quantized", "quant_method 'fp8'", str(folder / "config.json"))
    no_config = tampered(tmp_path / "fp8-bare", to_float8)  # the scales alone show it
    refused(lambda: audit_block0(load(no_config)), "quantized", "weight_scale")
    bare = tampered(tmp_path / "fp8-no-scales", lambda t: t.update(
        {"layers.0.mlp.up_proj.weight": t["layers.0.mlp.up_proj.weight"].to(torch.float8_e4m3fn)}))
    refused(lambda: audit_block0(load(bare)), "quantized", "stored as float8_e4m3fn")
    gpt2 = tampered(tmp_path / "gpt2", lambda t: None, "gpt2", config_change=lambda v: v.update(
        quantization_config={"quant_method": "bitsandbytes", "bits": 4}))
    refused(lambda: load(gpt2), "quant_method 'bitsandbytes' (bits 4)")


def test_a_missing_block_tensor_is_reported_by_its_own_name(tmp_path):
    folder = tampered(tmp_path / "model", lambda t: t.pop("layers.1.mlp.down_proj.weight"))
    loaded = load(folder)
    audit_block0(loaded)  # block 0 is whole: its audit reads nothing of block 1
    with pytest.raises(AuditError) as info:
        loaded.model.ensure(1)
    assert "layers.1.mlp.down_proj.weight" in one_line(info.value)


def test_whole_model_families_refuse_tensors_of_other_shapes(tmp_path):
    folder = tampered(tmp_path / "gpt2", lambda t: t.update(
        {"wte.weight": torch.cat([t["wte.weight"], t["wte.weight"][:8]])}), "gpt2")
    refused(lambda: load(folder), str(folder), "wte.weight")


# ---------------------------------------------------------------------------------------------------
# Configs are data: checked before anything is allocated
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "bert", "gpt2"])
@pytest.mark.parametrize("change, fragments", [
    ({"intermediate_size": 10**12, "n_inner": 10**12}, ["more than this machine's", "GiB of memory"]),
    ({"vocab_size": 10**10}, ["more than this machine's", "vocab_size = 10,000,000,000"]),
    ({"hidden_size": "64", "n_embd": "64"}, ["expected int, got str (value: '64')"]),
    ({"num_hidden_layers": 0, "n_layer": 0, "layer_types": []}, ["no blocks to audit"]),
    ({"num_attention_heads": 5, "n_head": 5}, ["is not a multiple of", "5"]),
    ({"max_position_embeddings": -1, "n_positions": -1}, ["= -1; valid: 1.."]),
])
def test_a_hostile_config_is_one_line_naming_the_field(model_type, change, fragments, tmp_path, capsys):
    folder = tmp_path / model_type
    save(tiny_config(model_type, layers=1), folder)
    values = json.loads((folder / "config.json").read_text())
    values.update({k: v for k, v in change.items() if k in values})
    (folder / "config.json").write_text(json.dumps(values))
    text = refused(lambda: load(folder), str(folder), *fragments)
    assert "Traceback" not in text
    cli_refused([str(folder), "-w", str(folder), "--out", str(tmp_path / "r")], capsys, *fragments)
    assert not (tmp_path / "r").exists()


def test_an_unknown_model_type_mentions_trust_remote_code(tmp_path, capsys):
    folder = tmp_path / "custom"
    save(tiny_config("llama", layers=1), folder)
    values = json.loads((folder / "config.json").read_text())
    values.update(model_type="my_custom_lm", auto_map={"AutoConfig": "configuration_my.MyConfig"})
    (folder / "config.json").write_text(json.dumps(values))
    cli_refused([str(folder), "--out", str(tmp_path / "r")], capsys, "'my_custom_lm'", "--trust-remote-code")


def test_huge_memory_budget_is_a_clean_error(tmp_path, capsys):
    cli_refused(["gpt2", "--memory-budget", "1e300", "--out", str(tmp_path / "r")], capsys,
                "memory_budget", "(0, 1,048,576]")


# ---------------------------------------------------------------------------------------------------
# Faults: a full disk while writing tokens leaves nothing behind and says so in one line
# ---------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def small_files(size: int):
    """Inside the block, files larger than ``size`` bytes cannot be written (RLIMIT_FSIZE, as a full disk:
    the write fails with EFBIG instead of ENOSPC). The limit is lifted when the block ends, before pytest
    writes its own report: with the limit on, pytest's output to a file (a CI log) would fail too."""
    import resource
    import signal

    sys.stdout.flush()
    sys.stderr.flush()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write instead of a killed process
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def test_saving_tokens_on_a_full_disk_is_one_line_and_leaves_no_file(tmp_path):
    from auditor.audit.tokens import Tokens

    contexts = torch.randn(64, 8, 16, generator=torch.Generator().manual_seed(0))  # (N, n, d)
    with small_files(4096), pytest.raises(AuditError) as info:
        Tokens(contexts, contexts[:, 0].clone(), {"n": "8"}).save(tmp_path / "t.safetensors")
    assert "cannot write the token file" in one_line(info.value) and str(tmp_path) in str(info.value)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("limit", [64, 2048])  # the header itself, then a chunk of contexts
def test_a_full_temporary_folder_while_streaming_is_one_line_and_cleaned(limit, tmp_path, monkeypatch):
    import tempfile

    from auditor.audit.stream import ContextReducer

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gen = torch.Generator().manual_seed(0)
    reducer = ContextReducer(16, 4, 8, torch.float32, torch.device("cpu"), tests=("assumption2",), rtol=None,
                             robustness=True, geometry=False, save=None, chunk=8)
    with small_files(limit), pytest.raises(AuditError) as info:
        for _ in range(2):
            reducer.add(torch.randn(8, 4, 8, generator=gen), torch.randn(8, 8, generator=gen), {"n": "4"})
        reducer.finish()
    text = one_line(info.value)
    assert str(tmp_path) in text and "TMPDIR" in text
    assert not list(tmp_path.iterdir())


def test_a_local_hf_dataset_writes_nothing_to_the_datasets_cache(tmp_path, monkeypatch):
    import tempfile

    import datasets
    from conftest import shared_data

    from auditor.data.hf import load_hf_dataset

    text = tmp_path / "text"
    text.mkdir()
    (text / "a.txt").write_text(shared_data("wikitext-2/valid.txt").read_text()[:20000])
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    cache = Path(datasets.config.HF_DATASETS_CACHE)
    before = set(cache.rglob("*")) if cache.exists() else set()
    data, _ = load_hf_dataset(f"hf:{text}", "text", (".txt",))
    assert len(data) > 10 and data[0]["text"] is not None  # read into memory: usable after the cache is gone
    assert (set(cache.rglob("*")) if cache.exists() else set()) == before
    assert not [p for p in scratch.iterdir() if p.name.startswith("auditor-datasets-")]


def test_token_metadata_cannot_put_a_path_into_a_plot_name(tmp_path):
    from auditor.audit.tokens import Tokens

    contexts = torch.randn(16, 4, 8, generator=torch.Generator().manual_seed(0))  # (N, n, d)
    tokens = tmp_path / "in" / "evil.safetensors"
    tokens.parent.mkdir()
    meta = {"n": "4", "d": "8", "representation": "../../evil"}
    Tokens(contexts, contexts[:, 0].clone(), meta).save(tokens)
    out = tmp_path / "a" / "b" / "run"
    assert main(["capacity", "--tokens", str(tokens), "--scale", "quick", "--threads", "1", "--out",
                 str(out)]) == 0
    plots = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.png"))
    assert plots == [Path("a/b/run/memorized_vs_heads_evil.png")]


def test_compare_refuses_a_report_whose_rtol_column_the_schema_no_longer_has(tmp_path, capsys):
    folder = tmp_path / "gpt2"
    save(tiny_config("gpt2", layers=1), folder)
    report = tmp_path / "report"
    assert main([str(folder), "-w", "random", "--samples", "8", "--context-length", "8", "--subsets", "20",
                 "--no-robustness", "--out", str(report), "--quiet"]) == 0
    results = report / "results.csv"
    header, rest = results.read_text().split("\n", 1)
    results.write_text(header.replace(",rtol,", ",rank_rtol,") + "\n" + rest)  # an older spelling
    cli_refused(["compare", str(report), str(report), "--out", str(tmp_path / "c")], capsys,
                str(results), "no column rtol", "rank_rtol")
    assert not (tmp_path / "c").exists()


def test_a_weights_folder_with_custom_config_code_never_prompts(tmp_path, monkeypatch, capsys):
    """``audit gpt2 -w FOLDER`` whose config is custom code: refused in one line, nothing asked or run."""
    folder = tmp_path / "custom"
    save(tiny_config("gpt2", layers=1), folder)
    marker = tmp_path / "ran"
    (folder / "configuration_my.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    values = json.loads((folder / "config.json").read_text())
    values.update(model_type="my_custom_lm", auto_map={"AutoConfig": "configuration_my.MyConfig"})
    (folder / "config.json").write_text(json.dumps(values))

    def no_prompt(*args):
        raise AssertionError("something asked on standard input")

    monkeypatch.setattr("builtins.input", no_prompt)
    cli_refused(["gpt2", "-w", str(folder), "--out", str(tmp_path / "r")], capsys, "my_custom_lm")
    assert not marker.exists() and not (tmp_path / "r").exists()


def test_audited_blocks_beyond_memory_are_refused_with_the_size_and_the_limit():
    from auditor.models.limits import check_resident

    config = tiny_config("llama", layers=32)
    one_block = 4 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128)  # q, o; k, v (2 KV heads of 16); MLP
    embedding = 4 * (512 * 64 + 130 * 64)
    check_resident(config, 4, 4, "tiny", limit=embedding + 4 * one_block)  # exactly fits
    with pytest.raises(AuditError, match=r"tiny: the embedding and 5 audited blocks take .* GiB at 4 bytes"):
        check_resident(config, 5, 4, "tiny", limit=embedding + 4 * one_block)
