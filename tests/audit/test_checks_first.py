"""Everything checkable is checked before any test runs, every refusal's advice is accepted by the command
it names (each test below follows its suggestion), a save_pretrained folder's weights are named by the
folder, and a run stopped by an error after finished rows still leaves a report of them that
``audit compare`` reads."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
import transformers

import auditor
from auditor.audit.compare import compare
from auditor.cli import main
from auditor.core.errors import AuditError

pytestmark = pytest.mark.usefixtures("one_thread")
TEXT = "The quick brown fox jumps over the lazy dog. " * 3  # 135 bytes: 4 windows of 32 byte tokens


def _decoder_folder(folder, d: int):
    """A tiny random Qwen3 (width d, 2 blocks, 130 positions) saved with save_pretrained, no tokenizer
    files (the audit then reads text as bytes)."""
    config = transformers.Qwen3Config(hidden_size=d, num_attention_heads=4, num_key_value_heads=2,
                                      head_dim=16, intermediate_size=2 * d, num_hidden_layers=2,
                                      vocab_size=512, max_position_embeddings=130, bos_token_id=1,
                                      eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    transformers.Qwen3Model(config).save_pretrained(folder)
    return str(folder)


def _dinov2_folder(folder, *, d: int, image_size: int):
    config = transformers.Dinov2Config(hidden_size=d, num_attention_heads=4, intermediate_size=2 * d,
                                       num_hidden_layers=1, image_size=image_size, patch_size=8)
    torch.manual_seed(0)
    transformers.Dinov2Model(config).save_pretrained(folder)
    return str(folder)


def _argv(model, out, *extra):
    return [model, "--subsets", "10", "-r", "embedding", "--tests", "assumption2,general_position",
            "--device", "cpu", "-q", "--threads", "1", "--out", str(out), *extra]


def _one_line(capsys, argv) -> str:
    capsys.readouterr()  # what came before (save_pretrained's progress)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "short.txt"
    path.write_text(TEXT)
    return path


def test_a_folder_models_weights_are_named_by_the_folder_not_pretrained(tmp_path, text_file):
    folder = _decoder_folder(tmp_path / "tiny-qwen3", 64)
    assert main(_argv(folder, tmp_path / "out", "--data", str(text_file), "--context-length", "16")) == 0
    rows = pd.read_csv(tmp_path / "out" / "results.csv")
    assert set(rows["weights"]) == {"random", folder}  # the default random,pretrained: pretrained: the folder
    assert "pretrained" not in (tmp_path / "out" / "summary.md").read_text()
    assert rows["tokenizer"].str.startswith("bytes (offline fallback").all()  # no tokenizer files: bytes


def test_every_weights_sources_inputs_are_read_before_any_test(tmp_path, text_file, capsys):
    """Two weights sources of different widths, so of different default n: the second's data is too short
    for --samples; the run stops before the first source is tested (no row, no file), and the advice
    (--samples <= what the data gives) is then accepted."""
    narrow, wide = _decoder_folder(tmp_path / "narrow", 64), _decoder_folder(tmp_path / "wide", 256)
    out = tmp_path / "out"
    argv = _argv(narrow, out, "--data", str(text_file), "-w", f"random,{wide}", "--samples", "3")
    err = _one_line(capsys, argv)
    assert "--samples 3 asks for more examples than the data gives: 1 (windows of n = 128 tokens)" in err
    assert "valid: --samples <= 1" in err
    assert not out.exists()  # nothing was tested, nothing written
    assert main([*argv[:-2], "--samples", "1", "--out", str(out)]) == 0  # the advice, followed


def test_n_above_d_is_refused_with_advice_the_command_accepts(tmp_path, text_file, capsys):
    folder = _decoder_folder(tmp_path / "qwen3", 64)
    data = ("--data", str(text_file))
    err = _one_line(capsys, _argv(folder, tmp_path / "a", *data, "--context-length", "100"))
    assert "use --context-length <= 64" in err
    assert main(_argv(folder, tmp_path / "a", "--data", str(text_file), "--context-length", "64",
                      "--samples", "2", "-w", "random")) == 0
    # an image model's n is fixed by its image and patch size: the advice names no option
    wide = _dinov2_folder(tmp_path / "dinov2", d=64, image_size=64)  # n = 64 patches + CLS = 65 > 64
    err = _one_line(capsys, _argv(wide, tmp_path / "b", "-w", wide, "--samples", "2"))
    assert "n = 65 exceeds the width d = 64" in err and "no option changes it" in err
    assert "--context-length" not in err
    err = _one_line(capsys, _argv(wide, tmp_path / "b", "-w", wide, "--samples", "2",
                                  "--context-length", "64"))
    assert "fixed by the image size" in err  # indeed no option changes it
    # tensors given in Python: the contexts fix n
    contexts = torch.randn(4, 8, 6, dtype=torch.float64)
    with pytest.raises(AuditError, match="give contexts of at most 6 tokens"):
        auditor.audit_tokens(contexts, contexts[:, 0], progress=False)
    assert len(auditor.audit_tokens(contexts[:, :6], contexts[:, 0], subsets=5, progress=False))


def test_a_run_stopped_after_finished_rows_reports_them_for_compare(tmp_path, text_file, monkeypatch, capsys):
    """The second weights source fails while its tokens are extracted (a fault injected there): the rows of
    the first are reported (summary.md says the run is incomplete and why; results.csv and config.json as
    always), audit compare reads the folder, and the same command resumes from them."""
    import auditor.audit.sources as sources

    folder = _decoder_folder(tmp_path / "qwen3", 64)
    out = tmp_path / "out"
    argv = _argv(folder, out, "--data", str(text_file), "--context-length", "16", "--samples", "4")
    real = sources._extract_group

    def fail_on_the_folder(loaded, *args, **kwargs):
        if loaded.weights == folder:
            raise AuditError("injected: the disk went away")
        return real(loaded, *args, **kwargs)

    monkeypatch.setattr(sources, "_extract_group", fail_on_the_folder)
    err = _one_line(capsys, argv)
    assert err.startswith("error: injected: the disk went away; the 2 rows finished before it are reported")
    summary = (out / "summary.md").read_text()
    assert "**Incomplete**: the run stopped after the rows below, with the error: injected" in summary
    assert json.loads((out / "config.json").read_text())["incomplete"].startswith("injected")
    rows = pd.read_csv(out / "results.csv")
    assert set(rows["weights"]) == {"random"} and set(rows["status"]) == {"ok"}
    table = compare([out], tmp_path / "cmp", root=tmp_path, plots=False)
    assert len(table) == 2 and set(table["weights"]) == {"random"}
    monkeypatch.setattr(sources, "_extract_group", real)
    assert main(argv) == 0  # the same command finishes it
    assert set(pd.read_csv(out / "results.csv")["weights"]) == {"random", folder}
    assert "Incomplete" not in (out / "summary.md").read_text()
    assert "incomplete" not in json.loads((out / "config.json").read_text())


def test_a_tokenizer_that_makes_no_tokens_is_refused_as_such_before_any_test(tmp_path, text_file, capsys):
    """A folder whose tokenizer files hold no vocabulary (a tokenizer built from the config alone and saved):
    refused before any test, as a tokenizer problem (not "text too short"); its advice, removing the
    tokenizer files so that text is read as bytes, is then accepted."""
    from transformers import AutoTokenizer

    bare = _decoder_folder(tmp_path / "bare", 64)  # no tokenizer files
    folder = tmp_path / "empty-vocabulary"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        (folder / name).write_bytes((tmp_path / "bare" / name).read_bytes())
    empty = AutoTokenizer.from_pretrained(bare, local_files_only=True)  # config only: no vocabulary
    assert empty("The quick brown fox")["input_ids"] == []
    empty.save_pretrained(folder)
    argv = _argv(str(folder), tmp_path / "out", "--data", str(text_file), "--context-length", "16",
                 "--samples", "2")
    err = _one_line(capsys, argv)
    assert "makes no tokens of text" in err and "remove its tokenizer files" in err
    assert "too short" not in err and not (tmp_path / "out").exists()
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
        (folder / name).unlink(missing_ok=True)
    assert main(argv) == 0  # the advice, followed: text read as bytes
    assert pd.read_csv(tmp_path / "out" / "results.csv")["tokenizer"].str.startswith("bytes").all()
