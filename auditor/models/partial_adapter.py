"""The adapter of the families loaded block by block (see :mod:`auditor.models.partial`).

A family states its config and model classes, where its blocks are (``block_path``), which parameters
come after the blocks (``after_blocks``: never read), how its inputs are made and how it is called. Its
steps of :meth:`~auditor.models.base.Adapter.load` read the config (and open the checkpoint) without any
weights, and build a :class:`~auditor.models.partial.PartialModel`: the network is built when the
extractor says how deep it reads (:meth:`PartialAdapter.prepare`), so ``weights='random'`` for an 8B model
builds the embedding and block 0 only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from auditor.core.errors import AuditError
from auditor.models.base import HFAdapter, LoadRequest, weights_dtype
from auditor.models.checkpoint import quantized_error
from auditor.models.hub import (
    WeightsUnavailable,
    first_line,
    quiet_transformers,
)
from auditor.models.limits import FIX_HINT, check_config, check_resident, config_error
from auditor.models.partial import (
    CheckpointReader,
    PartialModel,
    block_of,
    checkpoint_names,
    checkpoint_prefix,
    cut_config,
    parameters_on_meta,
)
from auditor.models.placement import (
    BEFORE_BLOCKS,
    device_of,
    dispatch,
    gpu_free,
    move_to_plan,
    plan_placement,
    unit_sizes,
)
from auditor.models.streamed import Readers, attach, streamed_names


class PartialAdapter(HFAdapter):
    """A Hugging Face family whose model is cut to the audited blocks and read tensor by tensor."""

    block_path: str  # attribute path of the block list inside the model ("layers", "encoder.layer", ...)
    after_blocks: tuple[str, ...] = ()  # parameter-name prefixes of modules after the blocks (never read)
    options: tuple[str, ...] = ()  # extra load options this family accepts ("query", "bos")
    model_kwargs: Mapping[str, Any] = {}

    # -- configs -----------------------------------------------------------------------------------
    def width(self, config: Any) -> int:
        return int(self.tower(config).hidden_size)

    def depth(self, config: Any) -> int:
        return int(self.tower(config).num_hidden_layers)

    def read_config(self, source: str, reader: CheckpointReader | None = None) -> Any:
        """The (tower) config of a folder or hub id, without any weights."""
        reader = reader or CheckpointReader(source)
        path = reader.file("config.json")
        if path is None:
            raise AuditError(f"{source}: no config.json")
        try:
            values = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise AuditError(f"cannot read the config of {source!r}: {first_line(err)}") from None
        if not isinstance(values, dict):
            raise AuditError(f"{path} holds a {type(values).__name__}, not a config object; {FIX_HINT}")
        found = str(values.get("model_type", ""))
        if found not in self.model_types:
            raise AuditError(f"{source} holds a {found or 'unknown'} model, not a {self.family} model")
        if values.get("quantization_config") is not None:
            raise quantized_error(path, values["quantization_config"])
        values = self.tower_dict(values)
        from transformers import CONFIG_MAPPING

        kind = str(values.get("model_type", found))
        if kind not in CONFIG_MAPPING:
            raise AuditError(f"{path}: unknown model_type {kind!r} for the {self.family} family; {FIX_HINT}")
        try:
            with quiet_transformers():
                config = CONFIG_MAPPING[kind].from_dict(values)
        except Exception as err:  # noqa: BLE001 - transformers' validation raises StrictDataclassError & co
            raise config_error(err, str(path)) from None
        check_config(self.tower(config), str(path))
        return config

    def tower_dict(self, values: dict[str, Any]) -> dict[str, Any]:
        """The tower's part of a config.json (identity unless the family has towers)."""
        return values

    def folder_config(self, folder: Path) -> Any:
        return self.read_config(str(folder))

    # -- what the extractor calls -------------------------------------------------------------------
    def prepare(self, model: nn.Module, deepest: int) -> None:
        """Build (or grow) the network to blocks 0 .. ``deepest`` (-1: the embedding only)."""
        if isinstance(model, PartialModel):
            model.ensure(deepest)

    def block_path_of(self, config: Any) -> str:
        """Where the blocks are in a model of this config."""
        return self.block_path

    def blocks_of(self, net: nn.Module, config: Any) -> Sequence[nn.Module]:
        """The block list of a built network."""
        obj: Any = net
        for attr in self.block_path_of(config).split("."):
            obj = getattr(obj, attr)
        return obj

    def blocks(self, model: nn.Module) -> Sequence[nn.Module]:
        if not isinstance(model, PartialModel):
            raise TypeError(f"{type(model).__name__}: the {self.family} family runs a PartialModel")
        obj: Any = model.net if model.net is not None else model.ensure(-1)
        for attr in model.block_path.split("."):
            obj = getattr(obj, attr)
        return obj

    def forward(self, model: nn.Module, batch: Mapping[str, torch.Tensor]) -> None:
        """Call ``model.net`` (built by :meth:`prepare`) on one batch."""
        raise NotImplementedError

    # -- the steps of Adapter.load ---------------------------------------------------------------------
    def read_architecture(self, request: LoadRequest) -> Any:
        if request.kind == "random":
            return self.random_config(request.spec, request.overrides, request.dtype)
        request.reader = CheckpointReader(request.source)
        config = self.read_config(request.source, request.reader)
        request.reader.keys()  # the index and every header checked now, before anything is built or read
        return config

    def build(self, request: LoadRequest, config: Any) -> tuple[nn.Module, Any]:
        """A :class:`PartialModel`: nothing is built until the extractor says how deep it reads."""
        tower, details = self.tower(config), request.details
        details.update(
            weights_source=request.source if request.reader is not None else (
                f"random init (torch.manual_seed({request.seed}) outside the blocks, block L from seed "
                f"({request.seed}, L))"),
            architecture=self.model_class_for(tower).__name__,
            compute_dtype=str(request.dtype).removeprefix("torch."),
            loading="embedding and audited blocks only (partial load)",
        )
        if request.reader is None:
            build = self._random_builder(tower, request.seed, request.device, request.dtype, details)
        else:
            build = self._checkpoint_builder(tower, request.reader, request.device, request.dtype, details)
        model = PartialModel(self.depth(config), build)
        model.reader = request.reader  # which tensors were read (tests, benchmarks)
        model.block_path = self.block_path_of(tower)
        return model, config

    def keep_state(self, model: nn.Module, state: Mapping[str, Any]) -> None:
        model.state = state  # read by forward (the BOS id)

    def model_class_for(self, config: Any) -> type[nn.Module]:
        """The Hugging Face base model class of a config (``LlamaModel`` for a ``LlamaConfig``, ...)."""
        from transformers import MODEL_MAPPING

        return MODEL_MAPPING[type(config)]

    def _instantiate(self, config: Any) -> nn.Module:
        with quiet_transformers():
            return self.model_class_for(config)(config, **self.model_kwargs)

    def _random_builder(
        self, config: Any, seed: int, device: torch.device, dtype: torch.dtype, details: dict
    ):
        def build(structure: int, weighted: int) -> nn.Module:
            check_resident(config, structure, max(4, dtype.itemsize), "the random weights")
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                net = self._instantiate(cut_config(config, structure))
                reinitialise(net, self.blocks_of(net, config), seed)
            details["weights_dtype"] = weights_dtype(net.parameters())  # as initialised, before the cast
            plan = self._placement(net, config, weighted, dtype, device)
            if plan is None:
                return net.to(device=device, dtype=dtype)
            move_to_plan(net.to(dtype), self.block_path_of(config), plan)
            self._dispatch(net, config, plan, details)
            return net

        return build

    def _checkpoint_builder(
        self, config: Any, reader: CheckpointReader, device: torch.device, dtype: torch.dtype, details: dict
    ):
        def build(structure: int, weighted: int) -> nn.Module:
            with parameters_on_meta():
                net = self._instantiate(cut_config(config, structure))
            names = [name for name, _ in net.named_parameters()]
            wanted = [
                name for name in names
                if not name.startswith(self.after_blocks)
                and ((block := block_of(name, self.block_path_of(config))) is None or block < weighted)
            ]
            names_in_file = checkpoint_names(
                net, reader.keys()
            )  # the model's name of each tensor -> the file's
            prefix = checkpoint_prefix(wanted, list(names_in_file))
            persistent = set(net.state_dict()) - set(names)  # buffers the checkpoint may hold (position ids)
            wanted += [name for name in persistent if prefix + name in names_in_file]
            missing = [name for name in wanted if prefix + name not in names_in_file]
            if missing:
                raise WeightsUnavailable(
                    f"{reader.source}: the checkpoint lacks {len(missing)} tensors the audit needs (e.g. "
                    f"{prefix + missing[0]}); it is not a complete checkpoint of this architecture"
                )
            stored = {name: names_in_file[prefix + name] for name in wanted}
            reader.require(list(stored.values()))
            made = dict(net.named_parameters()) | dict(net.named_buffers())  # shapes the config implies
            reader.check_stored({stored[name]: (tuple(made[name].shape), made[name].is_floating_point())
                                 for name in wanted})  # before any tensor is read
            reader.note_stored(list(stored.values()))
            streamed = set(streamed_names(net, stored) if self.streams(device, reader) else [])
            readers = Readers(reader.load, reader.load_rows, reader.load_span)
            attach(net, {name: stored[name] for name in streamed}, readers, dtype, device)
            resident = [name for name in wanted if name not in streamed]
            plan = self._placement(net, config, weighted, dtype, device) or {BEFORE_BLOCKS: str(device)}
            path = self.block_path_of(config)
            groups: dict[str, list[str]] = {}  # target device -> model names placed there
            for name in resident:
                groups.setdefault(device_of(name, path, plan), []).append(name)
            for target, names in groups.items():
                tensors = reader.read([stored[n] for n in names], dtype=dtype, device=torch.device(target))
                net.load_state_dict({n: tensors[stored[n]] for n in names}, strict=False, assign=True)
            move_to_plan(net, path, plan)  # buffers are made on the CPU; parameters were placed as read
            self._dispatch(net, config, plan, details)
            details["weights_dtype"] = reader.weights_dtype
            if streamed:
                details["loading"] = ("embedding rows looked up and audited blocks only; on the CPU the "
                                      "linear layers' weights are read from the checkpoint as each runs "
                                      "(streamed)")
            return net

        return build

    def _placement(self, net: nn.Module, config: Any, weighted: int, dtype: torch.dtype,
                   device: torch.device) -> dict[str, str] | None:
        """On a GPU, where each unit goes (:mod:`auditor.models.placement`); None elsewhere."""
        if device.type != "cuda":
            return None
        return plan_placement(unit_sizes(net, self.blocks_of(net, config), weighted, dtype), gpu_free(device))

    def _dispatch(self, net: nn.Module, config: Any, plan: dict[str, str], details: dict) -> None:
        """Hooks that carry the hidden states across GPUs, when the plan uses more than one."""
        used = sorted(set(plan.values()))
        if len(used) > 1:
            dispatch(self.blocks_of(net, config), plan)
            details["placement"] = ", ".join(f"{unit} on {where}" for unit, where in plan.items())

    def streams(self, device: torch.device, reader: CheckpointReader) -> bool:
        """Whether the big weights are read as their modules run (:mod:`auditor.models.streamed`): on the CPU,
        from safetensors files. On a GPU they are placed once: memory there is for the resident blocks."""
        return device.type == "cpu" and reader.streams


def block_seed(seed: int, index: int) -> int:
    """The seed of block ``index``'s random weights: a SeedSequence of (seed, index), so every block's weights
    are fixed by the seed alone, whatever the depth built."""
    return int(np.random.SeedSequence([seed % 2**64, index]).generate_state(1, dtype=np.uint64)[0] >> 1)


def reinitialise(net: nn.Module, blocks: Sequence[nn.Module], seed: int) -> None:
    """Draw the random weights of ``net`` part by part with the model's own initialiser (``_init_weights``):
    the modules outside the blocks after ``torch.manual_seed(seed)``, block L after ``block_seed(seed, L)``.

    Building a model draws its weights in an order that depends on its depth (every layer's construction
    consumes the generator before the model initialises), so this makes block L's weights the same
    whether 1 or 32 blocks are built."""
    inside = {id(m) for block in blocks for m in block.modules()} | {id(blocks)}
    torch.manual_seed(seed)
    for module in net.modules():
        if id(module) not in inside:
            net._init_weights(module)
    for index, block in enumerate(blocks):
        torch.manual_seed(block_seed(seed, index))
        for module in block.modules():
            net._init_weights(module)

