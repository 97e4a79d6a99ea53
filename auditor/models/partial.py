"""Load only what an audit reads: everything before the blocks and blocks 0 .. L of a Hugging Face model.

The theory looks at the first layers, so the families of large models (Llama, Qwen, Mistral,
Gemma, Phi, OLMo, Pythia, RoBERTa, DeBERTa-v3, ModernBERT, DINOv2, CLIP, SigLIP) never build the whole
network. A :class:`PartialModel` holds a copy of the model whose config is cut to the blocks the audit
needs (``num_hidden_layers = deepest audited block + 1``); it grows when a deeper block is asked for.

- Random weights: the cut model is built under ``torch.manual_seed(seed)``. Hugging Face initialises the
  modules in order (embedding, then block 0, 1, ...), so block L gets the same weights whatever the depth
  built; the tests check it.
- Checkpoints (a ``save_pretrained`` folder or hub files, single or sharded with their index): the cut
  model is made with its parameters on the meta device (no memory), then only the tensors of the
  embedding and of the audited blocks are read from the safetensors files (the byte ranges their headers
  name, tensor by tensor), checked (real, finite) and cast to the compute dtype. On the CPU the linear
  layers and the embedding's rows are read as their modules run (:mod:`auditor.models.streamed`); on a
  GPU every tensor is placed once, over several GPUs when one cannot hold them
  (:mod:`auditor.models.placement`). The modules after the last audited block (final norm, pooler,
  heads) stay on the meta device: the forward pass stops before them. A ``pytorch_model.bin`` has no
  index into it, so it is read whole (``weights_only``) and its tensors are placed once.

Memory thus grows with the audited depth, not with the model (see reports/benchmarks-memory.md).
"""

from __future__ import annotations

import contextlib
import math
import pickle
import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from auditor.core.errors import AuditError
from auditor.models.checkpoint import QUANTIZED_NAMES, inside_folder, quantized_error, read_index
from auditor.models.hub import (
    CONVERT_HINT,
    INDEX_FILE,
    SAFETENSORS,
    SHARDS,
    TORCH_BIN,
    WeightsUnavailable,
    first_line,
    hub_reachable,
)
from auditor.models.streamed import SafetensorsFile

WEIGHT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)  # a weight as stored


# ---------------------------------------------------------------------------------------------------
# Configs cut to a depth, and models whose parameters live on the meta device
# ---------------------------------------------------------------------------------------------------


def cut_config(config: Any, depth: int, field: str = "num_hidden_layers") -> Any:
    """A copy of ``config`` with ``depth`` blocks (and per-layer lists such as ``layer_types`` cut too)."""
    values = config.to_dict()
    values[field] = depth
    for key in ("layer_types",):
        if isinstance(values.get(key), list):
            values[key] = values[key][:depth]
    for key in ("stage_names", "out_features", "out_indices"):  # backbone outputs, named after the depth
        values.pop(key, None)
    return type(config).from_dict(values)


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device (no memory, initialisation is free);
    buffers such as rotary frequencies and position ids stay real, since they are made from the config."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None:
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


# ---------------------------------------------------------------------------------------------------
# Reading selected tensors of a checkpoint
# ---------------------------------------------------------------------------------------------------


def _hub_file(repo: str, filename: str) -> Path | None:
    """A file of a hub repository (downloaded, or from the cache when offline); None when it has none."""
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo, filename, local_files_only=not hub_reachable()))
    except Exception as err:  # noqa: BLE001 - EntryNotFound, offline cache miss, gated repo, ...
        text = type(err).__name__ + str(err)
        if not type(err).__name__.startswith("LocalEntry") and ("EntryNotFound" in text or "404" in text):
            return None  # the repository has no such file
        reason = (
            "the Hugging Face hub is unreachable and the file is not in the local cache"
            if not hub_reachable()
            else first_line(err)
        )
        raise WeightsUnavailable(f"pretrained weights for {repo!r} unavailable: {reason}") from None


class CheckpointReader:
    """Tensors of a ``save_pretrained`` checkpoint (a folder or a hub id), read one by one by name.

    ``read`` fetches only the files holding the tensors asked for (on the hub: only those shards are
    downloaded) and records every tensor name it read in :attr:`read_keys`; ``load`` and ``load_rows``
    serve the weights read when their module runs (:mod:`auditor.models.streamed`). Safetensors files are
    read with plain reads of the byte ranges their headers name, never memory-mapped whole.
    """

    def __init__(self, source: str) -> None:
        self.source = source
        folder = Path(source).expanduser()
        self.folder = folder if folder.is_dir() else None
        self.read_keys: list[str] = []
        self.dtypes: Counter[str] = Counter()
        self._where: dict[str, str] | None = None  # checkpoint key -> file name
        self._files: dict[str, SafetensorsFile] = {}
        self._checked_keys: set[str] = set()
        self._bin: dict[str, torch.Tensor] | None = None

    def file(self, name: str) -> Path | None:
        """The file ``name`` of the checkpoint (None when it has none); in a folder it must lie inside the
        folder once links are resolved (:func:`auditor.models.checkpoint.inside_folder`)."""
        if self.folder is not None:
            path = self.folder / name
            if not path.is_file():
                return None
            return inside_folder(self.folder, path, f"{name} of the checkpoint")
        return _hub_file(self.source, name)

    def _index(self) -> dict[str, str]:
        if self._where is not None:
            return self._where
        index = self.file(INDEX_FILE)
        if index is not None:
            self._where = read_index(index)  # every shard a plain file name beside the index
            return self._where
        single = self.file(SAFETENSORS)
        files = [single] if single is not None else []
        if self.folder is not None and not files:  # shards without an index: their headers name the tensors
            files = [inside_folder(self.folder, p, "the weights file")
                     for p in sorted(self.folder.glob(SHARDS)) if p.is_file()]
        if files:
            where: dict[str, str] = {}
            for path in files:
                self._files[path.name] = SafetensorsFile(path)
                where.update({key: path.name for key in self._files[path.name].entries})
            self._where = where
            return where
        binary = self.file(TORCH_BIN)
        if binary is None:
            raise WeightsUnavailable(
                f"{self.source}: no {SAFETENSORS}, {INDEX_FILE} or {TORCH_BIN} to read"
            )
        self._bin = _load_bin(binary)
        self._where = {key: TORCH_BIN for key in self._bin}
        return self._where

    def _header(self, filename: str) -> SafetensorsFile:
        if filename not in self._files:
            path = self.file(filename)
            if path is None:
                raise WeightsUnavailable(f"{self.source}: the index names {filename}, which is missing")
            self._files[filename] = SafetensorsFile(path)
        return self._files[filename]

    def _entry_file(self, key: str) -> SafetensorsFile:
        header = self._header(self._index()[key])
        if key not in header.entries:
            raise WeightsUnavailable(
                f"{self.source}: the index puts {key!r} in {header.path.name}, which lacks it")
        return header

    def keys(self) -> list[str]:
        """Every tensor name of the checkpoint (from the index or the file headers; no tensor is read)."""
        return list(self._index())

    @property
    def streams(self) -> bool:
        """Whether tensors can be read one by one when used (safetensors; a pickle is read whole)."""
        self._index()
        return self._bin is None

    def require(self, names: Sequence[str]) -> None:
        """Fail unless the checkpoint holds every tensor of ``names``."""
        where = self._index()
        missing = [name for name in names if name not in where]
        if missing:
            raise WeightsUnavailable(
                f"{self.source}: the checkpoint lacks {len(missing)} tensors the audit needs "
                f"(e.g. {missing[0]}); "
                "it is not a checkpoint of this architecture"
            )

    def describe(self, key: str) -> tuple[tuple[int, ...], torch.dtype, str]:
        """(shape, dtype, where) of tensor ``key`` as stored, from the header alone (no data is read)."""
        if self._bin is not None:
            tensor = self._bin[key]
            return tuple(tensor.shape), tensor.dtype, f"{self.source}/{TORCH_BIN}"
        file = self._entry_file(key)
        entry = file.entries[key]
        return entry.shape, entry.dtype, str(file.path)

    def check_stored(self, expected: Mapping[str, tuple[tuple[int, ...], bool]]) -> None:
        """Refuse, before any tensor is read, a checkpoint whose tensors ``expected`` (checkpoint key ->
        (the shape the config implies, whether it is a floating weight)) are stored with another shape, as
        a quantized or non-real dtype, or that holds quantization tensors (scales): one line naming the
        file and the tensor."""
        for key in self.keys():
            if key.rsplit(".", 1)[-1] in QUANTIZED_NAMES:
                where = self._where.get(key, "") if self._where else ""
                raise quantized_error(f"{self.source}/{where}", f"it holds the quantization tensor {key!r}")
        for key, (shape, floating) in expected.items():
            stored, dtype, where = self.describe(key)
            if floating and dtype not in WEIGHT_DTYPES:
                name = str(dtype).removeprefix("torch.")
                if name.startswith("float8"):
                    raise quantized_error(where, f"tensor {key!r} is stored as {name}")
                raise AuditError(f"{where}: tensor {key!r} is stored as {name}; a weight must be float32, "
                                 "float16, bfloat16 or float64 (re-save the checkpoint in one of these)")
            if tuple(stored) != tuple(shape):
                raise AuditError(
                    f"{where}: tensor {key!r} has shape {list(stored)} but the config implies {list(shape)}; "
                    "the weights do not match config.json: use the config they were saved with"
                )

    def note_stored(self, names: Sequence[str]) -> None:
        """Count the stored dtypes of ``names`` from their headers (:attr:`weights_dtype`); reads no data."""
        for name in names:
            if self._bin is not None:
                tensor = self._bin[name]
                self.dtypes[str(tensor.dtype).removeprefix("torch.")] += tensor.numel()
            else:
                entry = self._entry_file(name).entries[name]
                self.dtypes[str(entry.dtype).removeprefix("torch.")] += math.prod(entry.shape)

    def read(
        self, names: Sequence[str], *, dtype: torch.dtype, device: torch.device
    ) -> dict[str, torch.Tensor]:
        """The tensors ``names`` (checkpoint names), each checked and cast to ``dtype`` on ``device``."""
        self.require(names)
        return {name: self.load(name, dtype).to(device) for name in names}

    def load(self, key: str, dtype: torch.dtype) -> torch.Tensor:
        """Tensor ``key`` on the CPU, floating ones cast to ``dtype``; checked (finite) the first time."""
        if self._bin is not None:
            tensor = self._bin[key]
            tensor = tensor.to(dtype) if tensor.is_floating_point() else tensor
        else:
            tensor = self._entry_file(key).tensor(key, dtype)
        return self._checked(tensor, key)

    def load_rows(self, key: str, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows ``ids`` (U,) of the table ``key``, cast to ``dtype``; only these rows are read and checked."""
        if self._bin is not None:
            rows = self._bin[key][ids].to(dtype)
        else:
            rows = self._entry_file(key).rows(key, ids, dtype)
        self._checked_keys.discard(key)  # other rows than last time: check these
        return self._checked(rows, key)

    def load_span(self, key: str, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
        """Rows ``start:stop`` of tensor ``key``, cast to ``dtype``; checked (finite) each time."""
        rows = self._bin[key][start:stop].to(dtype) if self._bin is not None else self._entry_file(key).span(
            key, start, stop, dtype)
        self._checked_keys.discard(key)
        return self._checked(rows, key)

    def _checked(self, tensor: torch.Tensor, key: str) -> torch.Tensor:
        if key in self._checked_keys:
            return tensor
        if tensor.is_complex():
            raise AuditError(f"{self.source}: tensor {key!r} is complex; model weights must be real numbers")
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            where = self._where.get(key, "") if self._where else ""
            raise AuditError(f"{self.source}/{where}: tensor {key!r} contains NaN or infinite values; "
                             "the checkpoint is corrupt")
        self._checked_keys.add(key)
        if key not in self.read_keys:
            self.read_keys.append(key)
        return tensor

    @property
    def weights_dtype(self) -> str:
        """The dtype most of the tensors read so far were stored in."""
        return self.dtypes.most_common(1)[0][0] if self.dtypes else "unknown"


def _load_bin(path: Path) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise AuditError(
            f"{path} pickles more than tensors, so it was refused (nothing in it ran); {CONVERT_HINT}"
        ) from None
    except (OSError, RuntimeError, EOFError) as err:
        raise AuditError(f"{path} is not a readable torch checkpoint: {first_line(err)}") from None
    if not isinstance(state, dict):
        raise AuditError(f"{path} holds a {type(state).__name__}, not a dict of named tensors")
    return state


def checkpoint_names(net: nn.Module, stored: Sequence[str]) -> dict[str, str]:
    """The model's name of each stored tensor -> its name in the checkpoint, by the renamings transformers
    applies when it loads (legacy names such as ``attention.attention.query`` -> ``attention.q_proj``).
    A tensor that only a conversion (a split, a merge) could turn into a parameter keeps its stored name,
    so asking for that parameter fails as a missing tensor rather than loading something else."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, rename_source_key
    except ImportError:  # transformers 4: checkpoints hold the module names
        return {key: key for key in stored}
    transforms = get_model_conversion_mapping(net)
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    renamings = [t for t in transforms if not isinstance(t, WeightConverter)]
    out: dict[str, str] = {}
    for key in stored:
        renamed, converted = rename_source_key(key, renamings, converters)
        out[key if converted is not None else renamed] = key
    return out


def checkpoint_prefix(model_keys: Sequence[str], checkpoint_keys: Sequence[str]) -> str:
    """The prefix that maps the cut model's tensor names onto the checkpoint's: '' for a base model saved
    alone, ``model.`` for a causal LM, ``roberta.`` for a masked LM, ``model.language_model.`` ...: the one
    under which most of ``model_keys`` are found (so a missing tensor is then reported by its own name)."""
    wanted = set(checkpoint_keys)
    counts: Counter[str] = Counter()
    for key in model_keys:
        for stored in checkpoint_keys:
            if stored.endswith(key):
                prefix = stored[: -len(key)]
                if not prefix or prefix.endswith("."):
                    counts[prefix] += 1
    if not counts:
        raise WeightsUnavailable(
            f"the checkpoint has no tensor named like {model_keys[0]!r} (e.g. it holds "
            f"{sorted(wanted)[0] if wanted else 'nothing'!r}); it is not a checkpoint of this architecture"
        )
    return max(counts, key=lambda prefix: (counts[prefix], -len(prefix)))


# ---------------------------------------------------------------------------------------------------
# The model an audit runs
# ---------------------------------------------------------------------------------------------------


class PartialModel(nn.Module):
    """A Hugging Face model cut to the blocks audited so far; :meth:`ensure` grows it.

    ``build(structure, weighted)`` returns the model with ``structure`` blocks whose blocks below
    ``weighted`` hold real weights (block 0 must exist for the embedding hook even when only the
    embedding is read; from a checkpoint its weights are then never read).
    """

    def __init__(self, depth: int, build: Callable[[int, int], nn.Module]) -> None:
        super().__init__()
        self.depth = depth  # blocks of the full model
        self._build = build
        self.net: nn.Module | None = None
        self.weighted = -1  # blocks 0 .. weighted - 1 hold real weights (-1: nothing built yet)

    def ensure(self, deepest: int) -> nn.Module:
        """Build (or grow to) blocks 0 .. ``deepest``; -1: the embedding only."""
        if not -1 <= deepest < self.depth:
            raise AuditError(f"block {deepest} is out of range: the model has {self.depth} blocks")
        if self.net is None or deepest + 1 > self.weighted:
            weighted = max(deepest + 1, self.weighted, 0)
            self.net = None  # the smaller copy is released before the larger one is built
            self.net = self._build(max(weighted, 1), weighted).eval()
            self.weighted = weighted
        return self.net

    def forward(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - the adapter calls .net
        raise RuntimeError("a PartialModel is run through its adapter (auditor.audit.extract)")


_BLOCK_KEY = re.compile(r"(?:^|\.)(\d+)\.")


def block_of(key: str, block_path: str) -> int | None:
    """Index of the block a tensor name belongs to (``layers.3.mlp.up_proj.weight`` -> 3), else None."""
    marker = block_path + "."
    at = key.find(marker)
    if at < 0 or (at > 0 and key[at - 1] != "."):
        return None
    match = _BLOCK_KEY.match(key[at + len(marker) - 1 :])
    return int(match.group(1)) if match else None
