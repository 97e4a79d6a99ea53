"""Weights read from the checkpoint when their module runs: the CPU memory of an audit stays small.

Holding the audited blocks upcast to float32 costs 4 bytes per weight: 0.8 GiB for one block of a
7B-class model, more than the whole checkpoint's share the audit needs. On the CPU the partial loader
therefore keeps no weight of a linear layer and no row of the input embedding in memory between batches:

- a linear layer computes its outputs in chunks of 16 MiB of weight rows, each chunk read from the
  safetensors file, upcast and dropped before the next: neither the whole float32 weight (0.22 GiB for
  the MLP's at d = 4096, MLP 14336) nor the packed copy a CPU matrix product makes of it is ever resident
  (a linear layer of another class reads its whole weight before it runs and drops it after);
- the input embedding reads only the rows of the ids in the batch (a (vocab, d) table is never read
  whole); the module then runs on those rows with the ids renumbered, so a family's own embedding code
  (Gemma's scaling by sqrt(d)) is kept;
- everything else (norms, position tables, class tokens, buffers) is small and stays resident.

The files are read through the safetensors library (``safe_open`` and its slices, which check the header
and every tensor's byte range first), opened for each read and closed after it, so pages of tensors the
audit does not use never count in the process's memory, nor those of a chunk once it is used. The price
is re-reading the weights for each batch (from the page cache after the first), which is small beside a
block's forward pass over a batch. Tokens are the same as with
resident weights up to float32 rounding (upcasting is exact; a chunked product may sum in another order).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from auditor.core.errors import AuditError

CHUNK_BYTES = 16 << 20  # bytes read per call while upcasting one tensor (the transient beside the result)

_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
REAL_FLOATS = ("F64", "F32", "F16", "BF16")  # what a weight may be stored as (float8 needs its scales)


@dataclass(frozen=True)
class Entry:
    """One tensor of a safetensors file, as its (validated) header describes it."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    stored: str  # the header's dtype name (F32, BF16, F8_E4M3, ...)


class SafetensorsFile:
    """One safetensors file read through the safetensors library: :func:`safetensors.safe_open` checks the
    header (its length, its JSON, every tensor's dtype, shape and byte range: inside the file, matching
    the shape, no overlap and no gap) before anything is read, and its slices read only the bytes asked
    for. The file is opened for each read and closed after it, so the pages it maps are released at once:
    only the rows being used count in the process's memory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, Entry] = {}
        with self._open() as fh:
            for key in fh.keys():  # noqa: SIM118 - safe_open is not a mapping
                view = fh.get_slice(key)
                kind, shape = str(view.get_dtype()), tuple(int(s) for s in view.get_shape())
                if kind.startswith("C"):
                    raise AuditError(
                        f"{path}: tensor {key!r} is complex ({kind}); model weights must be real numbers"
                    )
                if kind not in _DTYPES:
                    raise AuditError(
                        f"{path}: tensor {key!r} has dtype {kind}, which the auditor cannot read (valid: "
                        f"{', '.join(REAL_FLOATS)} for weights)"
                    )
                self.entries[key] = Entry(_DTYPES[kind], shape, kind)

    @contextlib.contextmanager
    def _open(self) -> Iterator[Any]:
        from safetensors import safe_open

        try:
            handle = safe_open(str(self.path), framework="pt")
        except Exception as err:  # noqa: BLE001 - SafetensorError, OSError: one line naming the file
            raise AuditError(f"{self.path} is not a readable safetensors file ({_one_line(err)}); "
                             "download or save the checkpoint again") from None
        try:
            with handle as fh:
                yield fh
        except AuditError:
            raise
        except Exception as err:  # noqa: BLE001 - a file changed or cut short after its header was read
            raise AuditError(f"{self.path}: reading a tensor failed ({_one_line(err)}); the file may have "
                             "changed or been cut short: download or save the checkpoint again") from None

    def _rows_per_chunk(self, entry: Entry) -> int:
        row_bytes = max(1, math.prod(entry.shape[1:]) * entry.dtype.itemsize)
        return max(1, CHUNK_BYTES // row_bytes)

    def tensor(self, key: str, dtype: torch.dtype) -> torch.Tensor:
        """Tensor ``key`` on the CPU, floating ones cast to ``dtype`` in chunks of rows (no stored copy)."""
        entry = self.entries[key]
        target = dtype if entry.dtype.is_floating_point else entry.dtype
        if len(entry.shape) == 0 or entry.shape[0] == 0:
            with self._open() as fh:
                return fh.get_tensor(key).to(target)
        out = torch.empty(entry.shape, dtype=target)
        step = self._rows_per_chunk(entry)
        for start in range(0, entry.shape[0], step):
            stop = min(start + step, entry.shape[0])
            with self._open() as fh:  # closed after each chunk: its mapped pages are released
                out[start:stop].copy_(fh.get_slice(key)[start:stop])
        return out

    def span(self, key: str, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
        """Rows ``start:stop`` of the table ``key`` (V, ...) -> (stop - start, ...) in ``dtype``."""
        entry = self.entries[key]
        if not 0 <= start <= stop <= entry.shape[0]:
            raise AuditError(f"{self.path}: rows {start}:{stop} of {key!r} asked for, which has "
                             f"{entry.shape[0]} rows")
        with self._open() as fh:
            return fh.get_slice(key)[start:stop].to(dtype)

    def rows(self, key: str, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows ``ids`` (U,) of the table ``key`` (V, ...) -> (U, ...) in ``dtype``; only those are read."""
        entry = self.entries[key]
        wanted = ids.tolist()
        if wanted and not 0 <= min(wanted) <= max(wanted) < entry.shape[0]:
            raise AuditError(f"{self.path}: rows {min(wanted)}..{max(wanted)} of {key!r} asked for, which "
                             f"has {entry.shape[0]} rows")
        with self._open() as fh:
            view = fh.get_slice(key)
            try:  # a list of rows in one call (safetensors gathers them from the mapped file)
                return view[wanted].to(dtype) if wanted else torch.empty((0, *entry.shape[1:]), dtype=dtype)
            except (TypeError, ValueError):  # an older safetensors: one slice per row
                out = torch.empty((len(wanted), *entry.shape[1:]), dtype=dtype)  # (U, ...)
                for i, index in enumerate(wanted):
                    out[i] = view[index : index + 1][0]
                return out


def _one_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


# ---------------------------------------------------------------------------------------------------
# Hooks that read a module's weights when it runs
# ---------------------------------------------------------------------------------------------------

Load = Callable[[str, torch.dtype], torch.Tensor]  # checkpoint key -> the whole tensor in the compute dtype
LoadRows = Callable[[str, torch.Tensor, torch.dtype], torch.Tensor]  # key, sorted ids (U,) -> rows (U, ...)
LoadSpan = Callable[[str, int, int, torch.dtype], torch.Tensor]  # key, start, stop -> rows start:stop


@dataclass(frozen=True)
class Readers:
    """How the hooks read the checkpoint (a :class:`auditor.models.partial.CheckpointReader`'s methods)."""

    load: Load
    rows: LoadRows
    span: LoadSpan


def streamed_names(net: nn.Module, wanted: Mapping[str, str]) -> list[str]:
    """The parameters of ``wanted`` (model name -> checkpoint key) that are read when their module runs:
    those of every ``nn.Linear`` and the input embedding's table; the rest is small and stays resident."""
    embedding = net.get_input_embeddings() if hasattr(net, "get_input_embeddings") else None
    out: list[str] = []
    for prefix, module in net.named_modules():
        if isinstance(module, nn.Linear) or (module is embedding and isinstance(module, nn.Embedding)):
            out += [
                name
                for name in (
                    f"{prefix}.{p}" if prefix else p for p, _ in module.named_parameters(recurse=False)
                )
                if name in wanted
            ]
    return out


def attach(
    net: nn.Module, keys: Mapping[str, str], read: Readers, dtype: torch.dtype, device: torch.device
) -> None:
    """Make the parameters ``keys`` (model name -> checkpoint key; from :func:`streamed_names`) placeholders
    on the meta device and read them when their module runs (the hooks live as long as ``net``)."""
    embedding = net.get_input_embeddings() if hasattr(net, "get_input_embeddings") else None
    for prefix, module in net.named_modules():
        own = {
            p: keys[f"{prefix}.{p}" if prefix else p]
            for p, _ in module.named_parameters(recurse=False)
            if (f"{prefix}.{p}" if prefix else p) in keys
        }
        if not own:
            continue
        holders = {
            p: nn.Parameter(
                torch.empty(module._parameters[p].shape, dtype=dtype, device="meta"), requires_grad=False
            )
            for p in own
        }
        module._parameters.update(holders)
        if module is embedding:
            _rows_on_demand(module, own["weight"], read.rows, dtype, device)
        elif type(module) is nn.Linear and "weight" in own:
            _linear_by_chunks(module, own, read, dtype, device)
        else:
            _weights_on_demand(module, own, holders, read.load, dtype, device)


def _weights_on_demand(
    module: nn.Module,
    own: Mapping[str, str],
    holders: Mapping[str, nn.Parameter],
    load: Load,
    dtype: torch.dtype,
    device: torch.device,
) -> None:
    def read(mod: nn.Module, args: Any) -> None:
        for name, key in own.items():
            mod._parameters[name] = nn.Parameter(load(key, dtype).to(device), requires_grad=False)

    def drop(mod: nn.Module, args: Any, output: Any) -> None:
        mod._parameters.update(holders)

    module.register_forward_pre_hook(read)
    module.register_forward_hook(drop, always_call=True)


def _linear_by_chunks(
    module: nn.Linear, own: Mapping[str, str], read: Readers, dtype: torch.dtype, device: torch.device
) -> None:
    """``module`` computes its output features in chunks of :data:`CHUNK_BYTES` of weight rows, each read just
    before it is used: neither the whole weight nor the copy a matrix product packs it into is ever resident.
    Each output is the same dot product as the whole layer's (summation order aside: equal up to rounding)."""
    rows_per_chunk = max(1, CHUNK_BYTES // (module.in_features * dtype.itemsize))
    bias = own.get("bias")

    def forward(x: torch.Tensor) -> torch.Tensor:  # x: (..., in_features) -> (..., out_features)
        out = torch.empty((*x.shape[:-1], module.out_features), dtype=x.dtype, device=x.device)
        for start in range(0, module.out_features, rows_per_chunk):
            stop = min(start + rows_per_chunk, module.out_features)
            weight = read.span(own["weight"], start, stop, dtype).to(device)  # (stop - start, in_features)
            part = read.span(bias, start, stop, dtype).to(device) if bias is not None else None
            out[..., start:stop] = nn.functional.linear(x, weight, part)  # (..., stop - start)
        return out

    module.forward = forward  # type: ignore[method-assign] - this instance only; hooks still run around it


def _rows_on_demand(
    module: nn.Embedding, key: str, load_rows: LoadRows, dtype: torch.dtype, device: torch.device
) -> None:
    holder = module.weight
    padding = module.padding_idx
    vocab = holder.shape[0]

    def read(mod: nn.Embedding, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        ids = args[0] if args else kwargs["input"]  # (B, n) token ids
        unique, inverse = torch.unique(ids, return_inverse=True)  # (U,) sorted, (B, n) positions in it
        if len(unique) and not 0 <= int(unique[0]) <= int(unique[-1]) < vocab:
            raise IndexError(
                f"token ids {int(unique[0])}..{int(unique[-1])} outside the embedding's {vocab} rows"
            )
        mod._parameters["weight"] = nn.Parameter(
            load_rows(key, unique.cpu(), dtype).to(device), requires_grad=False
        )
        mod.padding_idx = None  # it names a row of the whole table; at inference it changes no value
        return ((inverse, *args[1:]), kwargs) if args else ((), {**kwargs, "input": inverse})

    def drop(mod: nn.Embedding, args: Any, output: Any) -> None:
        mod._parameters["weight"] = holder
        mod.padding_idx = padding

    module.register_forward_pre_hook(read, with_kwargs=True)
    module.register_forward_hook(drop, always_call=True)
