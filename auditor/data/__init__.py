"""Data for the audit: real images or text turned into batched model inputs.

``load_inputs(loaded, data, samples)`` reads, for the model's modality:

- images: a local folder (ImageNet layout ``class/xxx.JPEG`` or flat), ``hf:<dataset>[:<config>]:<split>``
  or ``hf:<local folder>``; grayscale/CMYK images are converted to RGB and counted, unreadable files
  are skipped and counted;
- text: a UTF-8 ``.txt`` file, a folder of them, or ``hf:...``; GPT-2 gets contiguous windows of exactly
  n tokens, BERT ``[CLS] s1 [SEP] s2 [SEP]`` pairs of exactly n tokens, so no padding ever exists;
- nothing (``data=None``): real data derived from installed packages, labelled ``bundled:...``: 486
  crops of 18 photos shipped with scikit-image and matplotlib, or Python's reference text and
  standard-library docstrings (see :mod:`auditor.data.samples`).

Selection is reproducible: a source with more than ``samples`` examples gives a uniform random subset
drawn with ``seed`` (kept in source order), or with ``first=True`` its first ``samples`` in sorted
order; ``data_source`` says which. Files under ``exclude`` (the report being written), earlier audit
reports and hidden folders are never read.
"""

from __future__ import annotations

from pathlib import Path

from auditor.core.errors import AuditError
from auditor.data.feed import Fed
from auditor.data.inputs import HF_PREFIX, Inputs  # noqa: F401  (public here)

BUNDLED_MIN_SAMPLES = 512


def default_samples(n: int, data: str | None, cap: int) -> int:
    """N when no sample count is given: ``cap`` (the paper's 2000) for the user's data; for the bundled
    offline sample (``data=None``) max(2n, 512) within ``cap``: k = n subsets with room to spare, and a
    default audit that ends in minutes on two CPU cores (ViT-base 486 crops, GPT-2 and MiniLM 512
    windows, BERT 1024 pairs, gpt2-large 2000 windows)."""
    return cap if data is not None else min(cap, max(2 * n, BUNDLED_MIN_SAMPLES))


def load_inputs(
    loaded: Fed,
    data: str | None,
    samples: int,
    *,
    seed: int = 0,
    progress: bool = True,
    first: bool = False,
    exclude: str | Path | None = None,
) -> Inputs:
    """Model inputs for ``loaded`` from ``data`` (folder, file, ``hf:...`` or None for the bundled sample).

    At most ``samples`` examples: a uniform random subset drawn with ``seed`` when the source has more
    (in source order), or its first ``samples`` with ``first=True``. No file under ``exclude`` is read.
    Raises AuditError for a missing/empty source, text shorter than one window or non-UTF-8 text.
    """
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise AuditError(f"samples must be a positive integer; got {samples!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise AuditError(f"seed must be an integer; got {seed!r}")
    options = dict(seed=seed, first=first, exclude=exclude, progress=progress)
    if loaded.modality == "image":
        from auditor.data.images import load_image_inputs

        return load_image_inputs(loaded, data, samples, **options)
    if loaded.modality == "text":
        from auditor.data.text import load_text_inputs

        return load_text_inputs(loaded, data, samples, **options)
    raise AuditError(f"unsupported modality {loaded.modality!r}")


__all__ = ["BUNDLED_MIN_SAMPLES", "HF_PREFIX", "Inputs", "default_samples", "load_inputs"]
