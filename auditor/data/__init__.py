"""Data for the audit: real images or text turned into batched model inputs.

``load_inputs(loaded, data, samples)`` reads, for the model's modality:

- images: a local folder (ImageNet layout ``class/xxx.JPEG`` or flat), ``hf:<dataset>[:<config>]:<split>``
  or ``hf:<local folder>``; grayscale/CMYK images are converted to RGB and counted, unreadable files
  are skipped and counted;
- text: a ``.txt`` file, a folder of them, or ``hf:...``; GPT-2 gets contiguous windows of exactly n
  tokens, BERT ``[CLS] s1 [SEP] s2 [SEP]`` pairs of exactly n tokens, so no padding ever exists;
- nothing (``data=None``): a small real sample bundled with installed packages, labelled as such.

Selection is deterministic (sorted files, text from its start): the same call gives the same inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

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
    data_source: str  # e.g. "/data/imagenet-sample (folder; sorted, first 64)"
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
    loaded: LoadedModel, data: str | None, samples: int, *, seed: int = 0, progress: bool = True
) -> Inputs:
    """Model inputs for ``loaded`` from ``data`` (folder, file, ``hf:...`` or None for the bundled sample).

    At most ``samples`` examples, in a deterministic order (``seed`` is recorded by callers; selection
    does not depend on it). Raises AuditError for a missing/empty source or text shorter than one window.
    """
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise AuditError(f"samples must be a positive integer; got {samples!r}")
    if loaded.modality == "image":
        from auditor.data.images import load_image_inputs

        return load_image_inputs(loaded, data, samples, progress=progress)
    if loaded.modality == "text":
        from auditor.data.text import load_text_inputs

        return load_text_inputs(loaded, data, samples, progress=progress)
    raise AuditError(f"unsupported modality {loaded.modality!r}")


__all__ = ["HF_PREFIX", "Inputs", "load_inputs"]
