"""What every data source produces: :class:`Inputs`, N examples of model inputs served in batches.

The examples are either held (``tensors``: token ids, or the bundled crops' pixels) or made on demand
(``on_demand``: images decoded per batch, so memory follows the batch, not N); :meth:`Inputs.examples`,
:meth:`Inputs.part` and :meth:`Inputs.batches` serve both alike, and :class:`Fingerprint` digests either
to the same value.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import torch

from auditor.core.errors import AuditError

HF_PREFIX = "hf:"


class Fingerprint:
    """16 hex digits of SHA-256 over named tensors: for each, ``name:dtype:shape;`` then its bytes, which may
    be fed in consecutive row blocks (the digest of the whole tensor, without holding it)."""

    def __init__(self) -> None:
        self._digest = hashlib.sha256()

    def start(self, name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
        """Begin the tensor ``name`` of ``dtype`` and ``shape``."""
        self._digest.update(f"{name}:{dtype}:{tuple(shape)};".encode())

    def add(self, rows: torch.Tensor) -> None:
        """The next rows of the current tensor."""
        self._digest.update(rows.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())

    def hex(self) -> str:
        return self._digest.hexdigest()[:16]

    @classmethod
    def of(cls, tensors: list[tuple[str, torch.Tensor]]) -> str:
        """The fingerprint of whole tensors, in the order given."""
        digest = cls()
        for name, tensor in tensors:
            digest.start(name, tensor.dtype, tuple(tensor.shape))
            digest.add(tensor)
        return digest.hex()


class OnDemand(Protocol):
    """Examples made when they are asked for (e.g. images decoded per batch) instead of held."""

    def __len__(self) -> int: ...

    def take(self, start: int, stop: int) -> dict[str, torch.Tensor]:
        """Examples ``start .. stop - 1`` in compact form: name -> (stop - start, ...)."""

    def part(self, start: int, stop: int) -> OnDemand:
        """Examples ``start .. stop - 1`` as their own source (nothing made yet)."""

    def fingerprint(self) -> str:
        """:meth:`Fingerprint.of` the compact tensors of every example, as if they were held."""


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
    tensors: Mapping[str, torch.Tensor] = field(default_factory=dict)  # name -> (N, ...), held
    prepare: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None
    on_demand: OnDemand | None = None  # the examples made per batch instead of held in ``tensors``

    def __post_init__(self) -> None:
        if self.N < 1:
            raise AuditError(f"no examples from {self.data_source}")
        if self.on_demand is not None and (self.tensors or len(self.on_demand) != self.N):
            raise ValueError(f"Inputs: {len(self.on_demand)} examples on demand and {len(self.tensors)} held "
                             f"tensors; expected N = {self.N} examples on demand and none held")
        for name, tensor in self.tensors.items():
            if tensor.shape[0] != self.N:
                raise ValueError(f"Inputs: {name} has {tensor.shape[0]} rows, expected N = {self.N}")

    def examples(self, start: int = 0, stop: int | None = None) -> dict[str, torch.Tensor]:
        """Examples ``start .. stop - 1`` (default: all) in compact form (uint8 pixels, token ids)."""
        stop = self.N if stop is None else min(stop, self.N)
        if self.on_demand is not None:
            return self.on_demand.take(start, stop)
        return {k: v[start:stop] for k, v in self.tensors.items()}

    def part(self, start: int, stop: int, *, copy: bool = False) -> Inputs:
        """Examples ``start .. stop - 1`` as their own Inputs (held rows are views, or copies with ``copy``
        so that a shard ships only its own); the labels and counts stay those of the whole source."""
        stop = min(stop, self.N)
        if self.on_demand is not None:
            return dataclasses.replace(self, N=stop - start, on_demand=self.on_demand.part(start, stop))
        tensors = {k: v[start:stop].clone() if copy else v[start:stop] for k, v in self.tensors.items()}
        return dataclasses.replace(self, N=stop - start, tensors=tensors)

    def fingerprint(self) -> str:
        """16 hex digits that are equal only for equal examples (held or made on demand alike)."""
        if self.on_demand is not None:
            return self.on_demand.fingerprint()
        return Fingerprint.of(sorted(self.tensors.items()))

    def batches(self, batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
        """Consecutive batches of at most ``batch_size`` examples, in order."""
        for start in range(0, self.N, batch_size):
            batch = self.examples(start, start + batch_size)
            yield self.prepare(batch) if self.prepare is not None else batch
