"""What every data source produces: :class:`Inputs`, N examples of model inputs served in batches."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import torch

from auditor.core.errors import AuditError

HF_PREFIX = "hf:"


@dataclass(frozen=True, eq=False)
class Inputs:
    """N examples of model inputs, served in batches.

    ``tensors`` hold every example along dim 0 (compact form: uint8 pixels, int64 token ids);
    ``prepare`` turns one batch of them into what the model's forward takes (e.g. float pixel values).
    """

    N: int  # noqa: N815 - the paper's name for the number of examples
    n: int  # tokens per example the model will see
    data_source: str  # e.g. "/data/imagenet-sample (folder, 1000 image files; 64 of 1000 ... drawn at random
                      # (seed 0))"
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
