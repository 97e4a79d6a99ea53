"""Reading weights safely: only safetensors or plain-tensor pickles, only real finite numbers.

Before a local checkpoint is handed to a model, every weights file it holds is opened without running
any code: safetensors headers name each tensor's dtype; a ``.bin`` is read with
``torch.load(weights_only=True)``, which refuses a pickle that is more than tensors. A complex tensor,
a NaN or an infinity is refused with an error naming the file and the tensor (casting would silently
drop the imaginary part; a NaN would reach every rank test). Weights read from the hub or its cache are
checked for NaN and infinity after loading.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from auditor.core.errors import AuditError
from auditor.models.hub import WeightsUnavailable, first_line, hub_reachable, quiet_transformers

SAFETENSORS, TORCH_BIN = "model.safetensors", "pytorch_model.bin"
CONVERT_HINT = "convert it to model.safetensors (safetensors.torch.save_file or save_pretrained)"


def weight_files(folder: Path) -> list[Path]:
    """The weights files a ``save_pretrained`` folder holds, in the format that is read: safetensors
    (single or sharded) when present, else ``pytorch_model*.bin``; sorted by name."""
    for pattern in ("model*.safetensors", "pytorch_model*.bin"):
        found = sorted(p for p in folder.glob(pattern) if p.is_file())
        if found:
            return found
    return []


def _tensors(path: Path) -> Iterator[tuple[str, torch.Tensor | None, str]]:
    """(name, tensor or None when its dtype cannot be read, dtype name) of every tensor in one file."""
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                    dtype = str(f.get_slice(name).get_dtype())
                    if dtype.startswith("C"):  # C64: complex, which torch cannot read from safetensors here
                        yield name, None, dtype
                    else:
                        yield name, f.get_tensor(name), dtype
        except Exception as err:  # noqa: BLE001 - safetensors raises its own SafetensorError
            raise AuditError(f"{path} is not a readable safetensors file: {first_line(err)}") from None
        return
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if str(err).startswith("Weights only load failed"):
            raise AuditError(
                f"{path} is not a plain weights file: it pickles more than tensors, so it was refused "
                f"(nothing in it ran); {CONVERT_HINT}"
            ) from None
        raise AuditError(f"{path} is not a readable torch checkpoint: {first_line(err)}") from None
    except (OSError, RuntimeError, EOFError) as err:
        raise AuditError(f"{path} is not a readable torch checkpoint: {first_line(err)}") from None
    if not isinstance(state, Mapping):
        raise AuditError(f"{path} holds a {type(state).__name__}, not a dict of named tensors")
    for name, tensor in state.items():
        if isinstance(tensor, torch.Tensor):
            yield str(name), tensor, str(tensor.dtype).removeprefix("torch.")


def check_weight_file(path: Path) -> None:
    """Refuse a weights file with complex or non-finite tensors, or a pickle that is more than tensors."""
    for name, tensor, dtype in _tensors(path):
        if tensor is None or tensor.is_complex():
            raise AuditError(
                f"{path}: tensor {name!r} is complex ({dtype}); model weights must be real numbers"
            )
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise AuditError(
                f"{path}: tensor {name!r} contains NaN or infinite values; the checkpoint is corrupt"
            )


def check_finite_parameters(model: nn.Module, source: str) -> None:
    """Refuse a loaded model whose parameters or buffers hold NaN or infinity (weights from the hub)."""
    for name, tensor in (*model.named_parameters(), *model.named_buffers()):
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise AuditError(
                f"weights of {source}: {name!r} contains NaN or infinite values; the checkpoint is corrupt"
            )


def load_pretrained(
    model_class: Any, source: str, *, model_kwargs: Mapping[str, Any], optional: tuple[str, ...]
):
    """``model_class.from_pretrained(source)`` with safe formats only, or :class:`WeightsUnavailable`.

    A local folder is checked file by file first (:func:`check_weight_file`). safetensors first; a
    checkpoint with only ``pytorch_model.bin`` is read by transformers with ``torch.load(weights_only=True)``.
    Weights the checkpoint lacks (other than the ``optional`` heads such as the pooler) mean it is not a
    checkpoint of this architecture: that is refused, not random-filled.
    """
    folder = Path(source)
    local = folder.is_dir()
    offline = not local and not hub_reachable()
    formats: tuple[bool, ...] = (True, False)  # use_safetensors: safetensors first, then weights-only .bin
    if local:
        files = weight_files(folder)
        if not files:
            raise WeightsUnavailable(f"{source}: no {SAFETENSORS} or {TORCH_BIN} in the folder")
        for path in files:
            check_weight_file(path)
        formats = (files[0].suffix == ".safetensors",)
    failures: list[BaseException] = []
    for use_safetensors in formats:
        try:
            with quiet_transformers():  # the load report lists the unused pooler/heads: checked below
                model, info = model_class.from_pretrained(
                    source,
                    use_safetensors=use_safetensors,
                    local_files_only=local or offline,
                    output_loading_info=True,
                    **model_kwargs,
                )
        except pickle.UnpicklingError:  # a hub .bin that is more than tensors: never unpickled unsafely
            raise AuditError(
                f"the checkpoint of {source!r} pickles more than tensors, so it was refused (nothing in it "
                f"ran); {CONVERT_HINT}"
            ) from None
        except (OSError, ValueError, RuntimeError) as err:
            failures.append(err)
            continue
        missing = [k for k in info.get("missing_keys", ()) if not k.startswith(optional)]
        if missing:
            raise WeightsUnavailable(
                f"{source}: the checkpoint lacks {len(missing)} weights of {model_class.__name__} "
                f"(e.g. {sorted(missing)[0]}); it is not a checkpoint of this architecture"
            )
        if not local:
            check_finite_parameters(model, source)
        return model
    reason = (
        "the Hugging Face hub is unreachable and the weights are not in the local cache"
        if offline
        else first_line(failures[0])
    )
    raise WeightsUnavailable(f"pretrained weights for {source!r} unavailable: {reason}")


def load_state_file(folder: Path) -> dict[str, torch.Tensor]:
    """The checked state dict of a folder's single weights file (timm folders), safetensors first."""
    files = weight_files(folder)
    if not files:
        raise AuditError(f"{folder}: no {SAFETENSORS} or {TORCH_BIN} to load weights from")
    if len(files) > 1:
        raise AuditError(
            f"{folder}: sharded weights ({len(files)} files) are not supported here; save one file"
        )
    check_weight_file(files[0])
    if files[0].suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(files[0]))
    return torch.load(files[0], map_location="cpu", weights_only=True)
