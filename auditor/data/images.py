"""Images -> ViT inputs: a seeded random draw (or the first files), RGB conversion and
unreadable files counted.

A source with more images than asked for is read in a seeded random order until enough images decode;
the kept ones are put back in source order (``first=True``: sorted order from the start). Every image
is decoded once, converted to RGB (grayscale and CMYK conversions are counted), resized
by the model's preprocessor and written as uint8 into one array (150 KB per 224 x 224 image, held once:
no stacked or reordered copy); batches are standardised
to float on the fly. A file that cannot be decoded (zero bytes, truncated, not an image) is skipped and
counted, never fatal; a source with no readable image is an AuditError.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from tqdm.auto import tqdm

from auditor.core.errors import AuditError
from auditor.data.hf import load_hf_dataset
from auditor.data.inputs import HF_PREFIX, Inputs
from auditor.data.selection import left_out_note, reading_order, selection_note, visible_files
from auditor.models.base import ImagePreprocessor, LoadedModel

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")
GRAYSCALE_MODES = ("1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F")
COUNT_KEYS = ("converted_grayscale", "converted_cmyk", "converted_other", "skipped_unreadable")


# an image to decode: a file, encoded bytes, or a loader of an image derived in memory (bundled crops)
Source = Path | bytes | Callable[[], Image.Image]


def list_image_files(folder: Path, exclude: str | Path | None = None) -> list[Path]:
    """Image files under ``folder`` (recursively), sorted by relative path; other files are ignored, and so
    are ``exclude`` (the report being written), earlier audit reports and hidden folders."""
    if not folder.exists():
        raise AuditError(f"image folder {str(folder)!r} does not exist")
    if not folder.is_dir():
        raise AuditError(f"{str(folder)!r} is not a folder; give a folder of images")
    files = visible_files(folder, IMAGE_SUFFIXES, exclude)
    if not files:
        raise AuditError(f"no image files ({', '.join(IMAGE_SUFFIXES)}) under {str(folder)!r}"
                         + left_out_note(folder, IMAGE_SUFFIXES, exclude))
    return files


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


def _open(source: Source) -> Image.Image:
    if isinstance(source, Path):
        return Image.open(source)
    if isinstance(source, bytes):
        return Image.open(io.BytesIO(source))
    return source()


def decode(source: Source, preprocessor: ImagePreprocessor, counts: dict[str, int]) -> torch.Tensor | None:
    """(3, H, W) uint8 pixels of one image, or None (counted) if it cannot be read."""
    try:
        with _open(source) as image:
            image.load()  # decode now: truncated or corrupt data fails here
            return preprocessor.to_uint8(to_rgb(image, counts))
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
        counts["skipped_unreadable"] += 1
        log.info("skipping unreadable image %s: %s", source if isinstance(source, Path) else "<bytes>", err)
        return None


def decode_images(
    sources: Iterable[Source],
    preprocessor: ImagePreprocessor,
    samples: int,
    *,
    total: int | None = None,
    progress: bool = True,
) -> tuple[torch.Tensor, dict[str, int], list[int]]:
    """The first ``samples`` readable images of ``sources`` as (N, 3, H, W) uint8, the conversion/skip
    counts, and the positions in ``sources`` of the kept images.

    With ``total`` known, each image is written into one preallocated (min(samples, total), 3, H, W)
    array as it is decoded, so the pixels are held once (a list then ``torch.stack`` held them twice)."""
    counts = dict.fromkeys(COUNT_KEYS, 0)
    rows = min(samples, total) if total is not None else None
    pixels = torch.empty((rows, 3, *preprocessor.size), dtype=torch.uint8) if rows is not None else None
    held: list[torch.Tensor] = []  # source of unknown size: the images, stacked at the end
    kept: list[int] = []
    with tqdm(total=total, disable=not progress, desc="images", unit="file") as bar:
        for position, source in enumerate(sources):
            image = decode(source, preprocessor, counts)  # (3, H, W) uint8 or None
            bar.update(1)
            if image is not None:
                if pixels is not None and len(kept) < len(pixels):
                    pixels[len(kept)] = image
                else:
                    held.append(image)
                kept.append(position)
                if len(kept) == samples:
                    break
    if pixels is not None and not held:  # (N, 3, H, W): copied only when unreadable files left rows unused
        return (pixels if len(kept) == len(pixels) else pixels[: len(kept)].clone()), counts, kept
    if not kept:
        return torch.empty((0, 3, *preprocessor.size), dtype=torch.uint8), counts, kept
    first = [pixels[: len(kept) - len(held)]] if pixels is not None else []
    return torch.cat([*first, torch.stack(held)]), counts, kept  # (N, 3, H, W)


def permute_rows(tensor: torch.Tensor, order: Sequence[int]) -> torch.Tensor:
    """``tensor[order]`` computed in place, one row of scratch at a time (no second copy of ``tensor``)."""
    done = [False] * len(order)
    for start in range(len(order)):
        if done[start] or order[start] == start:
            done[start] = True
            continue
        saved = tensor[start].clone()  # follow the cycle start <- order[start] <- order[order[start]] ...
        at = start
        while True:
            done[at] = True
            source = order[at]
            if source == start:
                tensor[at] = saved
                break
            tensor[at] = tensor[source]
            at = source
    return tensor


def pick_images(
    sources: Sequence[Source] | Callable[[int], Source],
    total: int,
    preprocessor: ImagePreprocessor,
    samples: int,
    *,
    seed: int,
    first: bool,
    progress: bool,
) -> tuple[torch.Tensor, dict[str, int]]:
    """``samples`` readable images of a source of ``total`` (by index: a sequence or a getter), tried in
    :func:`reading_order` and returned in source order: pixels (N, 3, H, W) uint8 and the counts."""
    get = sources.__getitem__ if isinstance(sources, Sequence) else sources
    order = reading_order(total, samples, seed, first)
    pixels, counts, kept = decode_images(
        (get(i) for i in order), preprocessor, samples, total=min(total, samples), progress=progress
    )
    chosen = [order[p] for p in kept]
    ranks = sorted(range(len(chosen)), key=chosen.__getitem__)  # back to source order
    return permute_rows(pixels, ranks), counts


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


def _hf_image_column(data: Any) -> tuple[Any, str]:
    """The dataset with its image column left encoded (decoded by :func:`decode`, so failures are counted
    the same way), and that column's name."""
    import datasets

    features = data.features or {}
    column = next((k for k, f in features.items() if isinstance(f, datasets.Image)), None)
    if column is None:
        raise AuditError(f"the dataset has no image column (columns: {', '.join(features) or 'unknown'})")
    return data.cast_column(column, datasets.Image(decode=False)), column


def _hf_source(item: Any) -> Source:
    item = item or {}
    if item.get("bytes") is not None:
        return item["bytes"]
    if item.get("path"):
        return Path(item["path"])
    return b""  # an empty cell: counted as unreadable


def load_image_inputs(
    loaded: LoadedModel,
    data: str | None,
    samples: int,
    *,
    seed: int = 0,
    first: bool = False,
    exclude: str | Path | None = None,
    progress: bool = True,
) -> Inputs:
    """Image inputs from a folder, ``hf:...`` or (None) crops of the bundled skimage photographs."""
    preprocessor = loaded.image_preprocessor
    if preprocessor is None:
        raise AuditError(f"{loaded.name} takes no images")
    pick = dict(seed=seed, first=first, progress=progress)
    if data is None:
        from auditor.data.samples import bundled_image_crops, release_photos

        crops, label = bundled_image_crops()
        try:
            pixels, counts = pick_images(crops, len(crops), preprocessor, samples, **pick)
        finally:
            release_photos()
        note = selection_note(len(pixels), len(crops), "crops", samples=samples, seed=seed, first=first)
        return image_inputs(pixels, counts, loaded, f"{label}; {note}")
    if data.startswith(HF_PREFIX):
        dataset, label = load_hf_dataset(data, "imagefolder", IMAGE_SUFFIXES, exclude)
        dataset, column = _hf_image_column(dataset)
        if hasattr(dataset, "__len__"):  # a local dataset: random access
            total = len(dataset)
            pixels, counts = pick_images(lambda i: _hf_source(dataset[i][column]), total, preprocessor,
                                         samples, **pick)
            note = selection_note(len(pixels), total, "images", samples=samples, seed=seed, first=first)
        else:  # streamed from the hub: its size is unknown, so the first images are read
            sources = (_hf_source(row[column]) for row in dataset)
            pixels, counts, _ = decode_images(sources, preprocessor, samples, progress=progress)
            note = f"first {len(pixels)} readable images (a streamed dataset is read from its start)"
        return image_inputs(pixels, counts, loaded, f"{label}; {note}")
    folder = Path(data).expanduser()
    files = list_image_files(folder, exclude)
    pixels, counts = pick_images(files, len(files), preprocessor, samples, **pick)
    note = selection_note(len(pixels), len(files), "image files", samples=samples, seed=seed, first=first)
    return image_inputs(pixels, counts, loaded, f"{folder} (folder, {len(files)} image files; {note})")
