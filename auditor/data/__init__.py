"""Data for the audit: real images or text turned into batched model inputs.

``load_inputs(loaded, data, samples)`` reads, for the model's modality:

- images: a local folder (ImageNet layout ``class/xxx.JPEG`` or flat), ``hf:<dataset>[:<config>]:<split>``
  or ``hf:<local folder>``; grayscale/CMYK images are converted to RGB and counted, unreadable files
  are skipped and counted;
- text: a UTF-8 ``.txt`` file, a folder of them, or ``hf:...``; GPT-2 gets contiguous windows of exactly
  n tokens, BERT ``[CLS] s1 [SEP] s2 [SEP]`` pairs of exactly n tokens, so no padding ever exists;
- nothing (``data=None``): real data derived from installed packages, labelled ``bundled:...``: 486
  crops of scikit-image's 9 colour photos, or Python's reference text and standard-library docstrings
  (see :mod:`auditor.data.samples`).

Selection is reproducible: a source with more than ``samples`` examples gives a uniform random subset
drawn with ``seed`` (kept in source order), or with ``first=True`` its first ``samples`` in sorted
order; ``data_source`` says which. Files under ``exclude`` (the report being written), earlier audit
reports and hidden folders are never read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from auditor.errors import AuditError
from auditor.models.base import LoadedModel

HF_PREFIX = "hf:"


@dataclass(frozen=True, eq=False)
class Inputs:
    """N examples of model inputs, served in batches.

    ``tensors`` hold every example along dim 0 (compact form: uint8 pixels, int64 token ids);
    ``prepare`` turns one batch of them into what the model's forward takes (e.g. float pixel values).
    """

    N: int  # noqa: N815 - the paper's name for the number of examples
    n: int  # tokens per example the model will see
    data_source: str  # e.g. "/data/imagenet-sample (folder, 1000 image files; 64 of 1000 ... drawn at random (seed 0))"
    tokenizer: str  # tokenizer or image preprocessing used
    counts: Mapping[str, int] = field(default_factory=dict)  # converted_grayscale, skipped_unreadable, ...
    tensors: Mapping[str, torch.Tensor] = field(default_factory=dict)  # name -> (N, ...)
    prepare: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None

    def __post_init__(self) -> None:
        if self.N < 1:
            raise AuditError(f"no examples from {self.data_source}")
        for name, tensor in self.tensors.items():
            if tensor.shape[0] != self.N:
                raise ValueError(f"Inputs: {name} has {tensor.shape[0]} rows, expected N = {self.N}")

    def batches(self, batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
        """Consecutive batches of at most ``batch_size`` examples, in order."""
        for start in range(0, self.N, batch_size):
            batch = {k: v[start : start + batch_size] for k, v in self.tensors.items()}
            yield self.prepare(batch) if self.prepare is not None else batch


def load_inputs(
    loaded: LoadedModel,
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


__all__ = ["HF_PREFIX", "Inputs", "load_inputs"]
