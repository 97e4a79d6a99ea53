"""Data loading: image folders (conversions and unreadable files counted), text windows without padding."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from conftest import shared_data, tiny_model
from PIL import Image

from auditor.data import Inputs, load_inputs
from auditor.data.images import list_image_files
from auditor.data.samples import SKIMAGE_PHOTOS, bundled_image_files, bundled_text
from auditor.data.text import chunks, pair_windows, split_sentences, stream_windows
from auditor.errors import AuditError
from auditor.models import TextTokenizer, hub_reachable
from auditor.models.gpt2 import _BYTE_TO_ID, byte_fallback_tokenizer


@pytest.fixture(scope="module")
def photo() -> Image.Image:
    """A real photograph (scikit-image's astronaut), RGB."""
    return Image.open(bundled_image_files()[0][0]).convert("RGB")


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub_reachable.cache_clear()
    yield
    hub_reachable.cache_clear()


def _jpeg_bytes(image: Image.Image, **kwargs) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=90, **kwargs)
    return buf.getvalue()


@pytest.fixture
def messy_folder(tmp_path, photo):
    """ImageNet layout with an RGB, a grayscale and a CMYK image, a zero-byte, a truncated file and notes."""
    (tmp_path / "n001").mkdir()
    (tmp_path / "n002").mkdir()
    photo.crop((0, 0, 256, 256)).save(tmp_path / "n001" / "a_rgb.JPEG")
    photo.crop((256, 0, 512, 256)).convert("L").save(tmp_path / "n001" / "b_gray.png")
    photo.crop((0, 256, 256, 512)).convert("CMYK").save(tmp_path / "n002" / "c_cmyk.jpg")
    (tmp_path / "n002" / "d_empty.JPEG").write_bytes(b"")
    (tmp_path / "n002" / "e_truncated.JPEG").write_bytes(_jpeg_bytes(photo)[:2000])
    (tmp_path / "labels.csv").write_text("not an image\n")
    return tmp_path


# --- images -------------------------------------------------------------------------------------------


def test_image_folder_counts_conversions_and_skips_unreadable(messy_folder):
    loaded = tiny_model("vit-base")
    assert [p.name for p in list_image_files(messy_folder)] == [
        "a_rgb.JPEG",
        "b_gray.png",
        "c_cmyk.jpg",
        "d_empty.JPEG",
        "e_truncated.JPEG",
    ]
    inputs = load_inputs(loaded, str(messy_folder), samples=10, progress=False)
    assert inputs.N == 3 and inputs.n == 17
    assert dict(inputs.counts) == {
        "converted_grayscale": 1,
        "converted_cmyk": 1,
        "converted_other": 0,
        "skipped_unreadable": 2,
    }
    (batch,) = list(inputs.batches(8))
    pixels = batch["pixel_values"]
    assert pixels.shape == (3, 3, 32, 32) and pixels.dtype == torch.float32
    assert float(pixels.min()) >= -1.0 and float(pixels.max()) <= 1.0  # mean = std = 0.5
    gray = pixels[1]
    assert torch.equal(gray[0], gray[1]) and torch.equal(gray[1], gray[2])  # gray -> RGB copies the channel


def test_samples_limit_takes_the_first_readable_in_sorted_order(messy_folder):
    loaded = tiny_model("vit-base")
    two = load_inputs(loaded, str(messy_folder), samples=2, progress=False)
    three = load_inputs(loaded, str(messy_folder), samples=3, progress=False)
    assert two.N == 2
    assert torch.equal(two.tensors["pixel_values"], three.tensors["pixel_values"][:2])


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "missing", "does not exist"),
        (lambda p: p, "no image files"),
        (lambda p: (p / "x.jpg").write_bytes(b"\xff\xd8 not really") and p, "no readable image"),
    ],
)
def test_image_source_errors(tmp_path, make, message):
    with pytest.raises(AuditError, match=message):
        load_inputs(tiny_model("vit-base"), str(make(tmp_path)), samples=4, progress=False)


def test_vit_preprocessing_equals_the_transformers_pil_processor(photo):
    processor_module = pytest.importorskip("transformers.models.vit.image_processing_pil_vit")
    loaded = tiny_model("vit-base", image_size=224, patch_size=16)
    pre = loaded.image_preprocessor
    ours = pre.normalize(pre.to_uint8(photo)[None])  # (1, 3, 224, 224)
    reference = processor_module.ViTImageProcessorPil()(images=[photo], return_tensors="pt")["pixel_values"]
    assert ours.shape == reference.shape == (1, 3, 224, 224)
    torch.testing.assert_close(ours, reference.to(torch.float32), rtol=0, atol=1e-6)


def test_timm_preprocessing_equals_timms_own_transform(photo):
    timm = pytest.importorskip("timm")
    loaded = tiny_model("timm:vit_tiny_patch16_224")
    pre = loaded.image_preprocessor
    cfg = timm.data.resolve_data_config({"input_size": (3, 32, 32)}, model=loaded.model)
    reference = timm.data.create_transform(**cfg)(photo)  # (3, 32, 32)
    torch.testing.assert_close(pre.normalize(pre.to_uint8(photo)[None])[0], reference, rtol=0, atol=1e-6)


def test_bundled_photos_are_labelled_offline_default():
    files, label = bundled_image_files()
    assert [f.name for f in files] == list(SKIMAGE_PHOTOS)
    assert label == "bundled:skimage.data (9 photos; offline default)"
    inputs = load_inputs(tiny_model("vit-base"), None, samples=100, progress=False)
    assert inputs.N == 9 and inputs.data_source == label
    assert inputs.counts["skipped_unreadable"] == 0 and inputs.counts["converted_grayscale"] == 0


def test_hf_imagefolder_on_local_files(messy_folder):
    loaded = tiny_model("vit-base")
    direct = load_inputs(loaded, str(messy_folder), samples=10, progress=False)
    via_hf = load_inputs(loaded, f"hf:{messy_folder}", samples=10, progress=False)
    assert via_hf.N == 3 and dict(via_hf.counts) == dict(direct.counts)
    assert sorted(map(bytes, via_hf.tensors["pixel_values"].flatten(1).numpy())) == sorted(
        map(bytes, direct.tensors["pixel_values"].flatten(1).numpy())
    )


def test_hf_hub_dataset_offline_is_a_one_line_error(offline):
    with pytest.raises(AuditError, match="could not reach the Hugging Face hub for dataset 'imagenet-1k'"):
        load_inputs(tiny_model("vit-base"), "hf:imagenet-1k:validation", samples=4, progress=False)


def test_shared_imagenet_sample_reads_in_sorted_order():
    folder = shared_data("imagenet-sample")
    inputs = load_inputs(tiny_model("vit-base"), str(folder), samples=16, progress=False)
    assert inputs.N == 16 and inputs.counts["skipped_unreadable"] == 0
    assert str(folder) in inputs.data_source


# --- text ---------------------------------------------------------------------------------------------


def test_gpt2_windows_are_the_contiguous_byte_stream(tmp_path, offline):
    text = bundled_text()[0][:20_000]
    path = tmp_path / "doc.txt"
    path.write_text(text, encoding="utf-8")
    loaded = tiny_model("gpt2", context_length=32)
    assert loaded.tokenizer.name.startswith("gpt2-bytes")  # no BPE files offline: known answer below
    inputs = load_inputs(loaded, str(path), samples=10, progress=False)
    ids = inputs.tensors["input_ids"]
    assert ids.shape == (10, 32) and set(inputs.tensors) == {"input_ids"}
    expected = _BYTE_TO_ID[np.frombuffer(text.encode("utf-8"), dtype=np.uint8)][: 10 * 32]
    assert torch.equal(ids.flatten(), torch.from_numpy(expected))


def test_bert_pairs_have_exactly_n_real_tokens_and_no_padding():
    loaded = tiny_model("bert-base", context_length=48)
    tok = loaded.tokenizer
    inputs = load_inputs(loaded, None, samples=12, progress=False)
    ids, types = inputs.tensors["input_ids"], inputs.tensors["token_type_ids"]
    assert ids.shape == types.shape == (12, 48)
    assert not (ids == 0).any()  # [PAD] never appears
    assert (ids[:, 0] == tok.cls_id).all() and (ids[:, -1] == tok.sep_id).all()
    assert ((ids == tok.sep_id).sum(dim=1) == 2).all()
    for row, kinds in zip(ids, types):
        first_sep = int((row == tok.sep_id).nonzero()[0])
        assert (kinds[: first_sep + 1] == 0).all() and (kinds[first_sep + 1 :] == 1).all()
    first_sentence = split_sentences(bundled_text()[0])[0]
    s1 = tok.encode(first_sentence)[: (48 - 3) // 2]
    assert ids[0, 1 : 1 + len(s1)].tolist() == s1


def test_pairs_start_at_fresh_sentences_and_s2_is_the_following_text():
    tok = TextTokenizer("words", lambda texts: [[len(w) + 10 for w in t.split()] for t in texts], 100, 1, 2)
    text = "a bb. ccc dddd eeeee. ffffff g. hh iii jjjj.\n"
    ids, types, _ = pair_windows(tok, [text], n=7, samples=5)  # 4 text tokens per row: s1 2, s2 2
    assert ids.tolist() == [[1, 11, 13, 2, 13, 14, 2], [1, 16, 12, 2, 12, 13, 2]]
    assert types.tolist() == [[0, 0, 0, 0, 1, 1, 1]] * 2


def test_text_too_short_names_tokens_found_and_n(tmp_path, offline):
    path = tmp_path / "short.txt"
    path.write_text("Too short for a window.\n")
    with pytest.raises(AuditError, match=r"gave 24 tokens .* window of n = 64 needs 64"):
        load_inputs(tiny_model("gpt2", context_length=64), str(path), samples=2, progress=False)


def test_text_folder_and_hf_text_builder_agree(tmp_path):
    text = bundled_text()[0][:8000]
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "part.txt").write_text(text)
    loaded = tiny_model("gpt2", context_length=16)
    folder = load_inputs(loaded, str(tmp_path / "docs"), samples=20, progress=False)
    via_hf = load_inputs(loaded, f"hf:{tmp_path / 'docs' / 'part.txt'}", samples=20, progress=False)
    assert torch.equal(folder.tensors["input_ids"], via_hf.tensors["input_ids"])
    with pytest.raises(AuditError, match="does not exist"):
        load_inputs(loaded, str(tmp_path / "nope.txt"), samples=2, progress=False)


def test_chunked_tokenization_equals_whole_text_with_a_real_byte_level_bpe():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    text = bundled_text()[0][:60_000] + "\n\n  indented\n \n tail\n"
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2's regex and byte map
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator([text], trainers.BpeTrainer(vocab_size=600, show_progress=False))
    tok = TextTokenizer("bpe", lambda texts: [e.ids for e in bpe.encode_batch(texts)], bpe.get_vocab_size())
    pieces = list(chunks(text, size=500))
    assert len(pieces) > 50 and "".join(pieces) == text
    whole = tok.encode(text)
    windows, seen = stream_windows(tok, pieces, n=64, samples=10**6)
    assert seen == len(whole)
    assert windows.flatten().tolist() == whole[: len(whole) // 64 * 64]


def test_wikitext_windows_for_gpt2_and_bert():
    path = shared_data("wikitext-2/test.txt")
    gpt2 = load_inputs(tiny_model("gpt2", context_length=32), str(path), samples=64, progress=False)
    bert = load_inputs(tiny_model("bert-base", context_length=64), str(path), samples=64, progress=False)
    assert gpt2.tensors["input_ids"].shape == (64, 32) and bert.tensors["input_ids"].shape == (64, 64)
    assert not (bert.tensors["input_ids"] == 0).any()
    assert "wikitext-2/test.txt" in gpt2.data_source and "contiguous windows of n=32" in gpt2.data_source


def test_inputs_batches_cover_every_example_once():
    inputs = Inputs(
        N=10, n=4, data_source="x", tokenizer="t", tensors={"input_ids": torch.arange(40).view(10, 4)}
    )
    got = torch.cat([b["input_ids"] for b in inputs.batches(3)])
    assert torch.equal(got, torch.arange(40).view(10, 4))
    with pytest.raises(AuditError, match="samples must be a positive integer"):
        load_inputs(tiny_model("gpt2"), None, samples=0)


def test_byte_fallback_round_trip_is_lossless():
    tok = byte_fallback_tokenizer()
    text = "naïve café — 東京\n"
    inverse = {int(i): b for b, i in enumerate(_BYTE_TO_ID)}
    assert bytes(inverse[i] for i in tok.encode(text)).decode("utf-8") == text
