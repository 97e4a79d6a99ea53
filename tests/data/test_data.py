"""Data loading: image folders (conversions and unreadable files counted), text windows without padding,
seeded random draws or the first examples, files that are never read, non-UTF-8 text."""

from __future__ import annotations

import io
import weakref

import numpy as np
import pytest
import torch
from conftest import shared_data, tiny_model
from PIL import Image

from auditor.core.errors import AuditError
from auditor.data import Inputs, load_inputs
from auditor.data.images import ImagesOnDemand, list_image_files, permute_rows, pick_images
from auditor.data.inputs import Fingerprint
from auditor.data.samples import (
    CROPS_PER_PHOTO,
    MATPLOTLIB_PHOTOS,
    SKIMAGE_PHOTOS,
    bundled_image_files,
    crop_boxes,
    halton,
    reference_text,
)
from auditor.data.selection import random_order, selection_note
from auditor.data.text import chunks, pair_windows, read_text_file, split_sentences, stream_windows
from auditor.models import TextTokenizer
from auditor.models.gpt2 import _BYTE_TO_ID, byte_fallback_tokenizer


@pytest.fixture(scope="module")
def photo() -> Image.Image:
    """A real photograph (scikit-image's astronaut), RGB."""
    return Image.open(bundled_image_files()[0][0]).convert("RGB")


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


def test_first_takes_the_first_readable_in_sorted_order(messy_folder):
    loaded = tiny_model("vit-base")
    two = load_inputs(loaded, str(messy_folder), samples=2, first=True, progress=False)
    three = load_inputs(loaded, str(messy_folder), samples=3, first=True, progress=False)
    assert two.N == 2 and "first 2 of 5 image files" in two.data_source
    # exact: uint8 pixels, the same decoder on the same file bytes gives the same pixels
    assert torch.equal(two.examples()["pixel_values"], three.examples()["pixel_values"][:2])
    assert "first 3 of 5 image files" in three.data_source and three.counts["skipped_unreadable"] == 0
    every = load_inputs(loaded, str(messy_folder), samples=5, first=True, progress=False)
    assert (
        every.N == 3 and "all 5 image files" in every.data_source and every.counts["skipped_unreadable"] == 2
    )


def test_samples_are_a_seeded_random_draw_in_source_order(tmp_path, photo):
    """More images than asked for: a uniform random subset fixed by the seed, put back in source order."""
    for i in range(12):
        photo.crop((i * 20, 0, i * 20 + 64, 64)).save(tmp_path / f"img{i:02d}.png")
    loaded = tiny_model("vit-base")
    every = load_inputs(loaded, str(tmp_path), samples=12, progress=False).examples()["pixel_values"]
    assert every.shape[0] == 12
    draws = {}
    for seed in (0, 0, 1):
        inputs = load_inputs(loaded, str(tmp_path), samples=5, seed=seed, progress=False)
        assert f"5 of 12 image files drawn at random (seed {seed})" in inputs.data_source
        rows = [  # exact: uint8 pixels, the same decoder on the same file bytes gives the same pixels
            next(j for j in range(12) if torch.equal(every[j], image))
            for image in inputs.examples()["pixel_values"]
        ]
        assert rows == sorted(rows) and len(set(rows)) == 5  # distinct images, in source order
        draws.setdefault(seed, []).append(rows)
    assert draws[0][0] == draws[0][1] == sorted(random_order(12, 0)[:5])
    assert draws[1][0] != draws[0][0]


def test_rows_are_put_in_source_order_in_place():
    """permute_rows(t, order) is t[order] computed in place (the decoded pixels are held once)."""
    gen = torch.Generator().manual_seed(0)
    for size in (1, 2, 7, 50):
        for _ in range(5):
            order = torch.randperm(size, generator=gen).tolist()
            tensor = torch.randint(0, 255, (size, 3, 2, 2), generator=gen, dtype=torch.uint8)
            want = tensor[order]
            pointer = tensor.data_ptr()
            got = permute_rows(tensor, order)
            assert torch.equal(got, want) and got.data_ptr() == pointer  # exact: rows moved, none computed


@pytest.mark.parametrize(("samples", "first"), [(3, False), (4, True), (10, False)])
def test_images_decoded_per_batch_are_the_images_held(messy_folder, photo, samples, first):
    """A folder's images are decoded per batch, never held: the same pixels, counts, label and fingerprint
    as decoding every chosen image up front, for random draws, the first files and unreadable files."""
    for i in range(4):
        photo.crop((i * 30, 40, i * 30 + 90, 130)).save(messy_folder / f"z{i}.png")
    loaded = tiny_model("vit-base")
    inputs = load_inputs(loaded, str(messy_folder), samples=samples, first=first, seed=2, progress=False)
    assert not inputs.tensors and isinstance(inputs.on_demand, ImagesOnDemand)
    files = list_image_files(messy_folder)
    held, counts = pick_images(files, loaded.image_preprocessor, samples, seed=2, first=first, progress=False)
    assert len(held) == inputs.N and dict(inputs.counts) == counts
    # exact: both decode the same bytes to the same uint8 pixels, then run the same elementwise float32
    # ops on them (no sums), so the batch size cannot change a value
    assert torch.equal(torch.cat([b["pixel_values"] for b in inputs.batches(3)]),
                       loaded.image_preprocessor.normalize(held))
    want = Fingerprint.of([("pixel_values", held)])
    assert inputs.fingerprint() == want  # digested while the batches were decoded in order
    again = load_inputs(loaded, str(messy_folder), samples=samples, first=first, seed=2, progress=False)
    assert again.fingerprint() == want  # nothing decoded yet: decoded for it
    part = again.part(1, 3)
    # exact (here and below): uint8 pixels, the same decoder on the same file bytes gives the same pixels
    assert torch.equal(part.examples()["pixel_values"], held[1:3])
    assert part.fingerprint() == Fingerprint.of([("pixel_values", held[1:3])])
    cloudpickle = pytest.importorskip("cloudpickle")  # how Ray and Slurm ship a shard
    shipped = cloudpickle.loads(cloudpickle.dumps(again.part(1, 3, copy=True).on_demand))
    assert torch.equal(shipped.take(0, 2)["pixel_values"], held[1:3])
    assert shipped.fingerprint() == part.fingerprint()  # the copy digests its own images


def test_images_on_demand_hold_one_batch_at_a_time(tmp_path, photo, monkeypatch):
    """Serving N images in batches of 4 never has more than two batches of decoded pixels alive (the batch
    being made and the one the caller still holds), whatever N."""
    for i in range(40):
        photo.crop((i * 5, 0, i * 5 + 64, 64)).save(tmp_path / f"img{i:02d}.png")
    alive: weakref.WeakSet[torch.Tensor] = weakref.WeakSet()
    peak = [0]
    take = ImagesOnDemand.take

    def counted(self, start, stop):
        out = take(self, start, stop)
        alive.add(out["pixel_values"])
        peak[0] = max(peak[0], sum(len(t) for t in alive))  # decoded images alive now
        return out

    monkeypatch.setattr(ImagesOnDemand, "take", counted)
    inputs = load_inputs(tiny_model("vit-base"), str(tmp_path), samples=40, progress=False)
    assert inputs.N == 40 and not inputs.tensors
    total = sum(len(b["pixel_values"]) for b in inputs.batches(4))
    assert total == 40 and 4 <= peak[0] <= 8


def test_an_image_that_changes_after_it_was_chosen_is_a_one_line_error(tmp_path, photo):
    for i in range(3):
        photo.crop((i * 20, 0, i * 20 + 64, 64)).save(tmp_path / f"img{i}.png")
    inputs = load_inputs(tiny_model("vit-base"), str(tmp_path), samples=3, progress=False)
    (tmp_path / "img1.png").write_bytes(b"")
    with pytest.raises(AuditError, match=r"img1\.png was readable when the images were chosen but cannot be "
                       r"decoded now; was it changed or removed during the audit\? Rerun the audit$"):
        list(inputs.batches(2))


def test_random_order_and_selection_notes_are_fixed():
    assert random_order(10, 0) == random_order(10, 0) and sorted(random_order(10, 3)) == list(range(10))
    assert random_order(10, 0) != random_order(10, 1)
    assert selection_note(5, 5, "crops", samples=9, seed=0, first=False) == "all 5 crops"
    assert selection_note(3, 9, "files", samples=3, seed=2, first=True) == "first 3 of 9 files"
    assert (
        selection_note(3, 9, "files", samples=3, seed=2, first=False)
        == "3 of 9 files drawn at random (seed 2)"
    )


def test_report_folders_hidden_folders_and_exclude_are_never_read(tmp_path, photo):
    """``--data .`` must not read the report being written, earlier reports or hidden folders."""
    photo.crop((0, 0, 64, 64)).save(tmp_path / "real.png")
    out = tmp_path / "reports" / "now"
    old = tmp_path / "reports" / "old"
    hidden = tmp_path / ".venv" / "lib"
    for folder in (out, old, hidden):
        folder.mkdir(parents=True)
        photo.crop((64, 64, 128, 128)).save(folder / "plot.png")
    (old / "results.csv").write_text("model\n")
    (old / "summary.md").write_text("# audit\n")
    listed = [p.relative_to(tmp_path).as_posix() for p in list_image_files(tmp_path)]
    assert listed == ["real.png", "reports/now/plot.png"]  # reports/now holds no results yet
    assert list_image_files(tmp_path, exclude=out) == [tmp_path / "real.png"]
    inputs = load_inputs(tiny_model("vit-base"), str(tmp_path), samples=10, exclude=str(out), progress=False)
    assert inputs.N == 1 and "(folder, 1 image files; all 1 image files)" in inputs.data_source


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


def normalize_atol(pre, reference: torch.Tensor) -> float:
    """(x / 255 - mean) / std from the same uint8 pixels in float32, by two implementations: each rounds
    x / 255 and the difference (values <= 1: eps / 2 each, divided by std) and the quotient (eps / 2 of
    the result, + a cast), so they differ by at most 2 eps (1 / min std + max |result|)."""
    return 2 * torch.finfo(torch.float32).eps * (1 / min(pre.std) + reference.abs().max().item())


def test_vit_preprocessing_equals_the_transformers_pil_processor(photo):
    processor_module = pytest.importorskip("transformers.models.vit.image_processing_pil_vit")
    loaded = tiny_model("vit-base", image_size=224, patch_size=16)
    pre = loaded.image_preprocessor
    ours = pre.normalize(pre.to_uint8(photo)[None])  # (1, 3, 224, 224)
    reference = processor_module.ViTImageProcessorPil()(images=[photo], return_tensors="pt")["pixel_values"]
    assert ours.shape == reference.shape == (1, 3, 224, 224)
    torch.testing.assert_close(ours, reference.to(torch.float32), rtol=0, atol=normalize_atol(pre, reference))


def test_timm_preprocessing_equals_timms_own_transform(photo):
    timm = pytest.importorskip("timm")
    loaded = tiny_model("timm:vit_tiny_patch16_224")
    pre = loaded.image_preprocessor
    cfg = timm.data.resolve_data_config({"input_size": (3, 32, 32)}, model=loaded.model)
    reference = timm.data.create_transform(**cfg)(photo)  # (3, 32, 32)
    ours = pre.normalize(pre.to_uint8(photo)[None])[0]
    torch.testing.assert_close(ours, reference, rtol=0, atol=normalize_atol(pre, reference))


def test_bundled_default_is_486_labelled_crops_of_the_real_photos():
    files, _ = bundled_image_files()
    assert [f.name for f in files] == list(SKIMAGE_PHOTOS + MATPLOTLIB_PHOTOS)
    inputs = load_inputs(tiny_model("vit-base"), None, samples=2000, progress=False)
    assert inputs.N == len(files) * CROPS_PER_PHOTO == 486 > 197  # k = n = 197 for ViT-base
    assert inputs.data_source == (
        "bundled:skimage.data and matplotlib photo crops (486 crops of 18 photos; derived, offline default); "
        "all 486 crops"
    )
    assert inputs.counts["skipped_unreadable"] == 0
    assert inputs.counts["converted_grayscale"] == 8 * CROPS_PER_PHOTO  # cameraman, coins, moon, ... gravel
    pixels = inputs.examples()["pixel_values"].flatten(1)
    assert len({bytes(row.numpy()) for row in pixels}) == 486  # no two crops alike
    again = load_inputs(tiny_model("vit-base"), None, samples=50, seed=4, progress=False)
    assert again.N == 50 and "50 of 486 crops drawn at random (seed 4)" in again.data_source
    kept = sorted(random_order(486, 4)[:50])
    # exact: uint8 pixels, the same crops of the same photos through the same decoder and resize
    assert torch.equal(again.examples()["pixel_values"], inputs.examples()["pixel_values"][kept])


def test_crop_boxes_are_spread_inside_the_photo():
    assert [halton(i, 2) for i in range(1, 5)] == [0.5, 0.25, 0.75, 0.125]
    boxes = crop_boxes(600, 400)
    assert len(boxes) == CROPS_PER_PHOTO and len(set(boxes)) == CROPS_PER_PHOTO
    assert set(boxes).isdisjoint(crop_boxes(600, 400, start=CROPS_PER_PHOTO))  # each photo its own layout
    for left, top, right, bottom in boxes:
        assert right - left == bottom - top and 0.29 * 400 <= right - left <= 0.91 * 400
        assert left >= 0 and right <= 600 and top >= 0 and bottom <= 400


def test_hf_imagefolder_on_local_files(messy_folder):
    loaded = tiny_model("vit-base")
    direct = load_inputs(loaded, str(messy_folder), samples=10, progress=False)
    via_hf = load_inputs(loaded, f"hf:{messy_folder}", samples=10, progress=False)
    assert via_hf.N == 3 and dict(via_hf.counts) == dict(direct.counts)
    # exact: uint8 pixels, both paths hand the same file bytes to the same decoder
    assert sorted(map(bytes, via_hf.examples()["pixel_values"].flatten(1).numpy())) == sorted(
        map(bytes, direct.examples()["pixel_values"].flatten(1).numpy())
    )


def test_hf_hub_dataset_offline_is_a_one_line_error(offline):
    with pytest.raises(AuditError, match="could not reach the Hugging Face hub for dataset 'imagenet-1k'"):
        load_inputs(tiny_model("vit-base"), "hf:imagenet-1k:validation", samples=4, progress=False)


def test_shared_imagenet_sample_is_drawn_at_random():
    folder = shared_data("imagenet-sample")
    inputs = load_inputs(tiny_model("vit-base"), str(folder), samples=16, progress=False)
    assert inputs.N == 16 and inputs.counts["skipped_unreadable"] == 0
    assert inputs.data_source.startswith(
        str(folder)
    ) and "16 of 1000 image files drawn at random (seed 0)" in (inputs.data_source)


# --- text ---------------------------------------------------------------------------------------------


def test_gpt2_windows_are_the_contiguous_byte_stream(tmp_path, offline):
    text = reference_text()[:20_000]
    path = tmp_path / "doc.txt"
    path.write_text(text, encoding="utf-8")
    loaded = tiny_model("gpt2", context_length=32)
    assert loaded.tokenizer.name.startswith("gpt2-bytes")  # no BPE files offline: known answer below
    inputs = load_inputs(loaded, str(path), samples=10, first=True, progress=False)
    ids = inputs.tensors["input_ids"]
    assert ids.shape == (10, 32) and set(inputs.tensors) == {"input_ids"}
    expected = _BYTE_TO_ID[np.frombuffer(text.encode("utf-8"), dtype=np.uint8)][: 10 * 32]
    assert torch.equal(ids.flatten(), torch.from_numpy(expected))


def test_bert_pairs_have_exactly_n_real_tokens_and_no_padding():
    loaded = tiny_model("bert-base", context_length=48)
    tok = loaded.tokenizer
    inputs = load_inputs(loaded, None, samples=12, first=True, progress=False)
    ids, types = inputs.tensors["input_ids"], inputs.tensors["token_type_ids"]
    assert ids.shape == types.shape == (12, 48)
    assert not (ids == 0).any()  # [PAD] never appears
    assert (ids[:, 0] == tok.cls_id).all() and (ids[:, -1] == tok.sep_id).all()
    assert ((ids == tok.sep_id).sum(dim=1) == 2).all()
    for row, kinds in zip(ids, types):
        first_sep = int((row == tok.sep_id).nonzero()[0])
        assert (kinds[: first_sep + 1] == 0).all() and (kinds[first_sep + 1 :] == 1).all()
    first_sentence = split_sentences(reference_text())[0]
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
    text = reference_text()[:8000]
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

    text = reference_text()[:60_000] + "\n\n  indented\n \n tail\n"
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
    assert "drawn at random (seed 0)" in gpt2.data_source and "drawn at random (seed 0)" in bert.data_source


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


# --- text: random windows, encodings, files never read -------------------------------------------------


def test_text_windows_are_a_seeded_random_subset_in_source_order(tmp_path, offline):
    path = tmp_path / "doc.txt"
    path.write_text(reference_text()[:30_000], encoding="utf-8")
    loaded = tiny_model("gpt2", context_length=32)
    every = load_inputs(loaded, str(path), samples=10**5, progress=False)
    assert every.data_source.endswith(f"all {every.N} contiguous windows of n=32 tokens")
    drawn = load_inputs(loaded, str(path), samples=20, seed=3, progress=False)
    assert f"20 of {every.N} contiguous windows of n=32 tokens drawn at random (seed 3)" in drawn.data_source
    kept = sorted(random_order(every.N, 3)[:20])
    assert torch.equal(drawn.tensors["input_ids"], every.tensors["input_ids"][kept])
    first = load_inputs(loaded, str(path), samples=20, seed=3, first=True, progress=False)
    assert first.data_source.endswith("first 20 contiguous windows of n=32 tokens")
    assert torch.equal(first.tensors["input_ids"], every.tensors["input_ids"][:20])


def test_bert_pair_token_types_survive_the_random_draw():
    loaded = tiny_model("bert-base", context_length=24)
    inputs = load_inputs(loaded, None, samples=8, seed=1, first=True, progress=False)
    ids, types = inputs.tensors["input_ids"], inputs.tensors["token_type_ids"]
    first_sep = (ids == loaded.tokenizer.sep_id).int().argmax(dim=1)  # (N,)
    assert torch.equal(types, (torch.arange(24)[None, :] > first_sep[:, None]).long())


def test_latin1_text_is_counted_and_binary_or_mostly_latin1_text_is_refused(tmp_path, offline):
    words = reference_text()[:5000]
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(words.encode("ascii", "replace") + "café crème".encode("latin-1"))
    counts: dict[str, int] = {}
    text = read_text_file(latin1, counts)
    assert counts == {"undecodable_bytes": 2} and text.endswith("caf\ufffd cr\ufffdme")
    inputs = load_inputs(tiny_model("gpt2", context_length=16), str(latin1), samples=4, progress=False)
    assert inputs.counts["undecodable_bytes"] == 2 and inputs.counts["tokens_read"] > 5000
    mostly = tmp_path / "mostly.txt"
    mostly.write_bytes(("é" * 200 + words[:1000]).encode("latin-1", "replace"))
    binary = tmp_path / "binary.txt"
    binary.write_bytes(words.encode() + b"\x00\x01\x02" * 10)
    utf16 = tmp_path / "utf16.txt"
    utf16.write_text(words, encoding="utf-16")
    for path, message in (
        (mostly, "200 of its 1200 bytes are not valid UTF-8"),
        (binary, "contains NUL bytes"),
        (utf16, "contains NUL bytes"),
    ):
        with pytest.raises(AuditError, match="text must be UTF-8") as err:
            load_inputs(tiny_model("gpt2", context_length=16), str(path), samples=4, progress=False)
        assert message in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def test_text_folder_skips_excluded_and_report_folders(tmp_path, offline):
    (tmp_path / "corpus.txt").write_text(reference_text()[:4000] + "\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("x" * 4000)
    loaded = tiny_model("gpt2", context_length=16)
    inputs = load_inputs(loaded, str(tmp_path), samples=1000, exclude=tmp_path / "out", progress=False)
    assert "(folder, 1 .txt files, sorted)" in inputs.data_source
    assert inputs.counts["tokens_read"] == len(reference_text()[:4000].encode()) + 1
