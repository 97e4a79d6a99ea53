"""Images -> ViT inputs: deterministic file order, RGB conversion and unreadable files counted.

Every image is decoded once, converted to RGB (grayscale and CMYK conversions are counted), resized
by the model's preprocessor and kept as uint8 (150 KB per 224 x 224 image); batches are standardised
to float on the fly. A file that cannot be decoded (zero bytes, truncated, not an image) is skipped and
counted, never fatal; a source with no readable image is an AuditError.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from tqdm.auto import tqdm

from auditor.data import HF_PREFIX, Inputs
from auditor.errors import AuditError
from auditor.models.base import ImagePreprocessor, LoadedModel, first_line, hub_reachable

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")
GRAYSCALE_MODES = ("1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F")
COUNT_KEYS = ("converted_grayscale", "converted_cmyk", "converted_other", "skipped_unreadable")


def list_image_files(folder: Path) -> list[Path]:
    """Image files under ``folder`` (recursively), sorted by relative path; other files are ignored."""
    if not folder.exists():
        raise AuditError(f"image folder {str(folder)!r} does not exist")
    if not folder.is_dir():
        raise AuditError(f"{str(folder)!r} is not a folder; give a folder of images")
    files = [p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]
    if not files:
        raise AuditError(f"no image files ({', '.join(IMAGE_SUFFIXES)}) under {str(folder)!r}")
    return sorted(files, key=lambda p: p.relative_to(folder).as_posix())


def to_rgb(image: Image.Image, counts: dict[str, int]) -> Image.Image:
    """The image in RGB, counting grayscale, CMYK and other (palette, alpha, ...) conversions."""
    if image.mode == "RGB":
        return image
    if image.mode in GRAYSCALE_MODES:
        counts["converted_grayscale"] += 1
        if image.mode not in ("1", "L", "LA"):  # 16/32-bit integer or float gray: to 8 bits first
            arr = np.asarray(image, dtype=np.float64)
            scale = 1.0 if image.mode == "F" else 1.0 / 257.0  # 65535 -> 255
            image = Image.fromarray(np.clip(np.rint(arr * scale), 0, 255).astype(np.uint8), mode="L")
    elif image.mode == "CMYK":
        counts["converted_cmyk"] += 1
    else:
        counts["converted_other"] += 1
    return image.convert("RGB")


def decode(
    source: Path | bytes, preprocessor: ImagePreprocessor, counts: dict[str, int]
) -> torch.Tensor | None:
    """(3, H, W) uint8 pixels of one image file or encoded bytes, or None (counted) if it cannot be read."""
    try:
        with Image.open(source if isinstance(source, Path) else io.BytesIO(source)) as image:
            image.load()  # decode now: truncated or corrupt data fails here
            return preprocessor.to_uint8(to_rgb(image, counts))
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        counts["skipped_unreadable"] += 1
        log.info("skipping unreadable image %s: %s", source if isinstance(source, Path) else "<bytes>", err)
        return None


def decode_images(
    sources: Iterable[Path | bytes],
    preprocessor: ImagePreprocessor,
    samples: int,
    *,
    total: int | None = None,
    progress: bool = True,
) -> tuple[torch.Tensor, dict[str, int]]:
    """The first ``samples`` readable images as (N, 3, H, W) uint8, and the conversion/skip counts."""
    counts = dict.fromkeys(COUNT_KEYS, 0)
    pixels: list[torch.Tensor] = []
    with tqdm(total=total, disable=not progress, desc="images", unit="file") as bar:
        for source in sources:
            image = decode(source, preprocessor, counts)  # (3, H, W) uint8 or None
            bar.update(1)
            if image is not None:
                pixels.append(image)
                if len(pixels) == samples:
                    break
    if not pixels:
        return torch.empty((0, 3, *preprocessor.size), dtype=torch.uint8), counts
    return torch.stack(pixels), counts  # (N, 3, H, W)


def image_inputs(
    pixels: torch.Tensor, counts: dict[str, int], loaded: LoadedModel, data_source: str
) -> Inputs:
    """Wrap decoded pixels (N, 3, H, W) uint8 as :class:`Inputs` standardised per batch."""
    preprocessor = loaded.image_preprocessor
    if preprocessor is None:
        raise AuditError(f"{loaded.name} takes no images")
    if pixels.shape[0] == 0:
        raise AuditError(f"no readable image in {data_source} ({counts['skipped_unreadable']} unreadable)")

    def prepare(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"pixel_values": preprocessor.normalize(batch["pixel_values"])}  # (B, 3, H, W) float32

    return Inputs(
        N=int(pixels.shape[0]),
        n=loaded.n,
        data_source=data_source,
        tokenizer=preprocessor.name,
        counts=counts,
        tensors={"pixel_values": pixels},
        prepare=prepare,
    )


def _parse_hf(spec: str) -> tuple[str, str | None, str]:
    """``hf:<name>[:<config>]:<split>`` or ``hf:<name>`` -> (name, config, split); split defaults to train."""
    parts = spec[len(HF_PREFIX) :].split(":")
    if not parts[0] or len(parts) > 3:
        raise AuditError(
            f"bad dataset {spec!r}; use hf:<name>, hf:<name>:<split> or hf:<name>:<config>:<split>"
        )
    if len(parts) == 1:
        return parts[0], None, "train"
    if len(parts) == 2:
        return parts[0], None, parts[1]
    return parts[0], parts[1], parts[2]


def load_hf_dataset(spec: str, local_builder: str) -> tuple[Any, str]:
    """A (streamed, for the hub) dataset split and its label; unreachable or unknown -> AuditError."""
    import datasets

    name, config, split = _parse_hf(spec)
    folder = Path(name).expanduser()
    try:
        if folder.exists():
            files = str(folder / "**") if folder.is_dir() else str(folder)
            data = datasets.load_dataset(local_builder, data_files={split: files}, split=split)
            return data, f"{spec} ({local_builder} builder on local files, split {split})"
        if not hub_reachable():
            raise AuditError(
                f"could not reach the Hugging Face hub for dataset {name!r}; give a local folder or hf:<path>"
            )
        data = datasets.load_dataset(name, config, split=split, streaming=True)
        return data, f"{spec} (Hugging Face hub, streamed)"
    except AuditError:
        raise
    except Exception as err:  # noqa: BLE001 - datasets raises many types (not found, bad split, ...)
        raise AuditError(f"cannot load dataset {spec!r}: {first_line(err)}") from None


def _hf_image_sources(data: Any) -> Iterator[bytes | Path]:
    """Encoded images of a dataset (decoded by :func:`decode`, so failures are counted the same way)."""
    import datasets

    features = data.features or {}
    column = next((k for k, f in features.items() if isinstance(f, datasets.Image)), None)
    if column is None:
        raise AuditError(f"the dataset has no image column (columns: {', '.join(features) or 'unknown'})")
    for row in data.cast_column(column, datasets.Image(decode=False)):
        item = row[column] or {}
        if item.get("bytes") is not None:
            yield item["bytes"]
        elif item.get("path"):
            yield Path(item["path"])
        else:
            yield b""  # an empty cell: counted as unreadable


def load_image_inputs(
    loaded: LoadedModel, data: str | None, samples: int, *, progress: bool = True
) -> Inputs:
    """Image inputs from a folder, ``hf:...`` or (None) the bundled skimage photographs."""
    preprocessor = loaded.image_preprocessor
    if preprocessor is None:
        raise AuditError(f"{loaded.name} takes no images")
    if data is None:
        from auditor.data.samples import bundled_image_files

        files, label = bundled_image_files()
        pixels, counts = decode_images(files, preprocessor, samples, total=len(files), progress=progress)
        return image_inputs(pixels, counts, loaded, label)
    if data.startswith(HF_PREFIX):
        dataset, label = load_hf_dataset(data, "imagefolder")
        total = len(dataset) if hasattr(dataset, "__len__") else None
        pixels, counts = decode_images(
            _hf_image_sources(dataset), preprocessor, samples, total=total, progress=progress
        )
        return image_inputs(pixels, counts, loaded, label)
    folder = Path(data).expanduser()
    files = list_image_files(folder)
    pixels, counts = decode_images(
        files, preprocessor, samples, total=min(len(files), samples), progress=progress
    )
    label = f"{folder} (folder, {len(files)} image files, sorted; first {int(pixels.shape[0])} readable)"
    return image_inputs(pixels, counts, loaded, label)
