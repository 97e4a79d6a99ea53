"""Devices and dtypes: ``auto``/``cpu``/``cuda[:i]`` and dtype names, checked with one-line errors."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

import torch

from auditor.core.errors import AuditError

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float64": torch.float64,
    "fp64": torch.float64,
    "double": torch.float64,
}


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A floating torch dtype from a dtype or its name ("float32", "bf16", ...)."""
    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point:
            raise AuditError(f"dtype must be a floating type; got {dtype_name(dtype)}")
        return dtype
    key = str(dtype).lower().removeprefix("torch.")
    if key not in _DTYPES:
        raise AuditError(f"unknown dtype {dtype!r}; valid: float32, float16, bfloat16, float64")
    return _DTYPES[key]


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"`` (the string stamped on rows and token files)."""
    return str(dtype).removeprefix("torch.")


def weights_dtype(tensors: Iterable[torch.Tensor]) -> str:
    """The dtype most of the floating weights are held in, by element count (``"unknown"`` when none are):
    the report's ``weights_dtype``, read before the weights are cast to the compute dtype."""
    counts: Counter[str] = Counter()
    for tensor in tensors:
        if tensor.is_floating_point():
            counts[dtype_name(tensor.dtype)] += tensor.numel()
    return counts.most_common(1)[0][0] if counts else "unknown"


def valid_devices() -> list[str]:
    """The device names that work on this machine: ``auto``, ``cpu`` and one ``cuda:<i>`` per visible GPU."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return ["auto", "cpu", *(["cuda"] if count else []), *(f"cuda:{i}" for i in range(count))]


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``auto`` (CUDA when available, else CPU), ``cpu`` or ``cuda[:i]``; a missing GPU is a user error."""
    text = str(device)
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if text == "cpu":
        return torch.device("cpu")
    match = re.fullmatch(r"cuda(?::(\d+))?", text)
    if match is None:
        raise AuditError(f"unknown device {text!r}; valid: auto, cpu, cuda, cuda:<index>")
    if not torch.cuda.is_available():
        raise AuditError(
            f"device {text!r} requested but CUDA is not available here; "
            f"valid here: {', '.join(valid_devices())}"
        )
    index = int(match.group(1) or 0)
    if index >= torch.cuda.device_count():
        raise AuditError(
            f"device {text!r}: only {torch.cuda.device_count()} CUDA device(s) visible; "
            f"valid here: {', '.join(valid_devices())}"
        )
    return torch.device("cuda", index)


def check_precision(dtype: torch.dtype | str, rtol: float | None, d: int) -> None:
    """Refuse a default rank tolerance that cannot separate anything: the default rtol is max(k, d) x eps of
    the dtype tokens are computed in, and k <= d in every test, so it is d x eps; bfloat16 (eps 2^-7) reaches
    1 at d = 128 and float16 (eps 2^-10) at d = 1024, where every subset would count as dependent."""
    kind = resolve_dtype(dtype)
    eps = torch.finfo(kind).eps
    if rtol is None and d * eps >= 1:
        raise AuditError(
            f"tokens computed in {dtype_name(kind)} (eps {eps:.3g}) give the default "
            "rank tolerance d x eps = "
            f"{d * eps:.3g} >= 1 at d = {d}: every subset would count as dependent; compute them in float32 "
            f"(--dtype float32, the default; the weights may stay {dtype_name(kind)} on disk) or give --rtol"
        )
