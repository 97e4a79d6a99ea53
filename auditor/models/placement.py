"""Audited blocks across GPUs: a device map when the embedding and blocks do not fit one GPU.

``--device cuda`` puts the model on GPU 0 when it fits there. When it does not (a deep audit of a 70B
model), :func:`plan_placement` spreads the units in forward order (everything before the blocks, then
block 0, 1, ...) over the visible GPUs, filling each before the next, and accelerate's
``AlignDevicesHook`` on every block moves its inputs (hidden states, rotary tables, masks) to the block's
GPU. ``--device cuda:i`` names one GPU: there the model must fit. Only what the audit reads is counted:
the cut model holds the embedding and the audited blocks, nothing after them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from auditor.core.errors import AuditError
from auditor.models.partial import block_of

HEADROOM = 0.9  # share of a GPU's free memory given to weights; the rest holds a batch's activations
BEFORE_BLOCKS = "before-blocks"  # the unit of everything that runs before block 0 (embeddings, rotary)
GIB = 2**30


def plan_placement(sizes: Sequence[tuple[str, int]], free: Sequence[tuple[str, int]]) -> dict[str, str]:
    """Units in forward order (``(name, bytes)``) onto devices in order (``(device, free bytes)``), each
    unit on the device where the previous one went if it still has room there, else on the next: a
    forward pass crosses each device boundary once. Raises a one-line AuditError when the devices cannot
    hold them."""
    if not free:
        raise AuditError("no GPU to place the model on; use --device cpu")
    plan: dict[str, str] = {}
    at, used = 0, 0
    for name, size in sizes:
        while at < len(free) and used + size > free[at][1] * HEADROOM:
            at, used = at + 1, 0
        if at == len(free):
            need = sum(s for _, s in sizes) / GIB
            have = sum(f for _, f in free) * HEADROOM / GIB
            raise AuditError(
                f"the embedding and audited blocks need {need:.1f} GiB but {len(free)} GPU(s) have "
                f"{have:.1f} GiB free for weights ({name} did not fit); audit fewer layers, use more GPUs "
                "(--device cuda) or --device cpu"
            )
        plan[name] = free[at][0]
        used += size
    return plan


def unit_sizes(
    net: nn.Module, blocks: Sequence[nn.Module], weighted: int, dtype: torch.dtype
) -> list[tuple[str, int]]:
    """Bytes in ``dtype`` of each unit of a (meta or real) cut model: the parameters and buffers outside
    the blocks (the small modules after them included), then each of the ``weighted`` blocks.
    Returns ``[(BEFORE_BLOCKS, bytes), ("block.0", bytes), ...]``."""

    def size(tensors) -> int:
        return sum(
            t.numel() * (dtype.itemsize if t.is_floating_point() else t.element_size()) for t in tensors
        )

    inside = {id(t) for block in blocks for t in (*block.parameters(), *block.buffers())}
    outside = [t for t in (*net.parameters(), *net.buffers()) if id(t) not in inside]
    units = [(BEFORE_BLOCKS, size(outside))]
    units += [(f"block.{i}", size((*blocks[i].parameters(), *blocks[i].buffers()))) for i in range(weighted)]
    return units


def gpu_free(device: torch.device) -> list[tuple[str, int]]:
    """``[(device, free bytes)]``: every visible GPU from 0 for ``cuda``, the one named for ``cuda:i``."""
    indices = range(torch.cuda.device_count()) if device.index is None else [device.index]
    return [(f"cuda:{i}", int(torch.cuda.mem_get_info(i)[0])) for i in indices]


def dispatch(blocks: Sequence[nn.Module], plan: Mapping[str, str]) -> None:
    """Attach accelerate's hooks that move each block's inputs to its GPU (its weights are already there)."""
    try:
        from accelerate.hooks import AlignDevicesHook, add_hook_to_module
    except ImportError:
        raise AuditError(
            "the audited blocks need more than one GPU, which takes accelerate: "
            "pip install 'attention-auditor[gpu]'"
        ) from None
    for index, block in enumerate(blocks):
        device = plan.get(f"block.{index}")
        if device is not None:
            add_hook_to_module(
                block, AlignDevicesHook(execution_device=device, io_same_device=False, place_submodules=True)
            )


def device_of(name: str, block_path: str, plan: Mapping[str, str]) -> str:
    """The device of tensor ``name`` (``layers.3.mlp.up_proj.weight``: block 3's) under ``plan``."""
    block = block_of(name, block_path)
    return plan.get(f"block.{block}", plan[BEFORE_BLOCKS]) if block is not None else plan[BEFORE_BLOCKS]


def move_to_plan(net: nn.Module, block_path: str, plan: Mapping[str, str]) -> None:
    """Move every parameter and buffer of ``net`` to its unit's device under ``plan``."""
    for prefix, module in net.named_modules():
        for store in (module._parameters, module._buffers):
            for key, tensor in store.items():
                if tensor is None or tensor.is_meta:
                    continue
                target = torch.device(device_of(f"{prefix}.{key}" if prefix else key, block_path, plan))
                if tensor.device != target:
                    moved = tensor.to(target)
                    store[key] = (
                        nn.Parameter(moved, requires_grad=False)
                        if isinstance(tensor, nn.Parameter)
                        else moved
                    )
