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
from auditor.models.hub import (
    CONVERT_HINT,
    INDEX_FILE,
    SAFETENSORS,
    SHARDS,
    TORCH_BIN,
    TORCH_BINS,
    WeightsUnavailable,
    first_line,
    hub_reachable,
    quiet_transformers,
)


def _roots(folder: Path) -> list[Path]:
    """Where the files of ``folder`` may lie once links are resolved: the folder itself, and for a Hugging
    Face cache snapshot (``.../snapshots/<revision>``, whose files link to ``../../blobs``) its blobs."""
    real = folder.resolve()
    return [real, real.parent.parent / "blobs"] if real.parent.name == "snapshots" else [real]


def inside_folder(folder: Path, path: Path, what: str) -> Path:
    """``path`` when, links resolved, it lies inside ``folder``; else a one-line AuditError naming it."""
    real = path.resolve()
    if not any(real.is_relative_to(root) for root in _roots(folder)):
        raise AuditError(
            f"{what} ({path}) resolves to {real}, outside the checkpoint folder {folder}; refused: a "
            "checkpoint may only read files inside its folder (copy the file in if you trust it)"
        )
    return path


def shard_name(name: object, index: Path | str) -> str:
    """A shard name from a safetensors index: a plain file name (no folder part, no ``..``); else a
    one-line AuditError (an index naming ``../x`` or ``/etc/x`` would read outside the checkpoint)."""
    if (not isinstance(name, str) or not name.strip() or name in (".", "..") or "/" in name or "\\" in name
            or "\0" in name or not name.endswith(".safetensors")):
        raise AuditError(
            f"{index} names the shard {name!r}, which is not a .safetensors file name beside the index; "
            "refused: every shard must lie in the checkpoint's folder (fix the index's weight_map)"
        )
    return name


def read_index(path: Path, where: str | None = None) -> dict[str, str]:
    """The ``weight_map`` of a safetensors index (tensor name -> shard file name), every shard name checked
    (:func:`shard_name`); a one-line AuditError for a malformed index."""
    import json

    label = where or str(path)
    try:
        weight_map = json.loads(path.read_text())["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError(f"weight_map is a {type(weight_map).__name__}, not an object")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise AuditError(
            f"{label} is not a safetensors index (an object with a weight_map of tensor -> shard): "
            f"{first_line(err)}; re-save the checkpoint with save_pretrained"
        ) from None
    return {str(key): shard_name(value, label) for key, value in weight_map.items()}


QUANTIZED_NAMES = ("weight_scale", "weight_scale_inv", "input_scale", "qweight", "qzeros", "scales",
                   "weight_zero_point", "SCB")  # tensors only a quantized checkpoint holds


def quantized_error(where: Path | str, scheme: object) -> AuditError:
    """The one line refusing a quantized checkpoint (``scheme``: its quantization_config, or what shows
    it), naming the scheme."""
    if isinstance(scheme, dict):
        method = scheme.get("quant_method") or scheme.get("quant_type") or "unnamed"
        detail = ", ".join(f"{k} {scheme[k]}" for k in ("fmt", "bits", "weight_block_size") if k in scheme)
        scheme = f"quant_method {method!r}" + (f" ({detail})" if detail else "")
    return AuditError(
        f"{where}: the checkpoint is quantized ({scheme}); the auditor reads unquantized weights only "
        "(float32, float16 or bfloat16), since its stored numbers are not the model's without their scales: "
        "audit the model's unquantized release"
    )


def check_not_quantized(folder: Path) -> None:
    """Refuse a folder whose config.json declares a quantization_config (one line naming the scheme)."""
    import json

    path = folder / "config.json"
    try:
        values = json.loads(path.read_text())
    except (OSError, ValueError):
        return  # an unreadable config fails where the config is read, with its own message
    if isinstance(values, dict) and values.get("quantization_config") is not None:
        raise quantized_error(path, values["quantization_config"])


def weight_files(folder: Path) -> list[Path]:
    """The weights files a ``save_pretrained`` folder holds, in the format that is read: safetensors
    (single or sharded) when present, else ``pytorch_model*.bin``; sorted by name. An index's shards must
    be plain file names, and every file must lie inside the folder once links are resolved
    (:func:`inside_folder`): a one-line AuditError otherwise."""
    index = folder / INDEX_FILE
    named: set[str] = set()
    if index.is_file():
        inside_folder(folder, index, "the safetensors index")
        named = set(read_index(index).values())
        for name in sorted(named):
            inside_folder(folder, folder / name, f"{index}: shard {name!r}")
    for pattern in (SHARDS, TORCH_BINS):
        found = sorted({p for p in folder.glob(pattern) if p.is_file()} | {
            folder / n for n in named if pattern == SHARDS and (folder / n).is_file()})
        if found:
            return [inside_folder(folder, p, "the weights file") for p in found]
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
        if dtype.upper().startswith(("F8", "FLOAT8")) or name.rsplit(".", 1)[-1] in QUANTIZED_NAMES:
            raise quantized_error(path, f"tensor {name!r} is stored as {dtype}" if dtype.upper().startswith(
                ("F8", "FLOAT8")) else f"it holds the quantization tensor {name!r}")
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
        check_not_quantized(folder)
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
                    ignore_mismatched_sizes=True,  # reported below, by name, and refused
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
        mismatched = list(info.get("mismatched_keys", ()))
        if mismatched:
            key, stored, wanted = (list(mismatched[0]) + [None, None])[:3]
            raise AuditError(
                f"{source}: tensor {key!r} has shape {list(stored or [])} but the config implies "
                f"{list(wanted or [])} ({len(mismatched)} such tensors); the weights do not match "
                "config.json: use the config they were saved with"
            )
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
