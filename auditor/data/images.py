"""Images -> ViT inputs: a seeded random draw (or the first files), RGB conversion and
unreadable files counted.

A source with more images than asked for is read in a seeded random order until enough images decode;
the kept ones are put back in source order (``first=True``: sorted order from the start). Each image is
decoded, converted to RGB (grayscale and CMYK conversions are counted) and resized by the model's
preprocessor to uint8 pixels (150 KB per 224 x 224 image). A file that cannot be decoded (zero bytes,
truncated, not an image) is skipped and counted, never fatal; a source with no readable image is an
AuditError.

Images of a folder or a dataset are chosen by decoding them once and dropping the pixels, then decoded
again per batch as the forward pass asks for them (:class:`ImagesOnDemand`): memory follows the batch,
not N. The bundled crops (at most 486) are decoded once and held in one array. Batches are standardised
to float on the fly.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from tqdm.auto import tqdm

from auditor.core.errors import AuditError
from auditor.data.feed import Fed, ImagePreprocessor
from auditor.data.hf import load_hf_dataset
from auditor.data.inputs import HF_PREFIX, Fingerprint, Inputs
from auditor.data.selection import left_out_note, reading_order, selection_note, visible_files

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
    total: int,
    progress: bool = True,
) -> tuple[torch.Tensor, dict[str, int], list[int]]:
    """The first ``samples`` readable images of ``sources`` (``total`` of them) as (N, 3, H, W) uint8, the
    conversion/skip counts, and the positions in ``sources`` of the kept images.

    Each image is written into one preallocated (min(samples, total), 3, H, W) array as it is decoded, so
    the pixels are held once."""
    counts = dict.fromkeys(COUNT_KEYS, 0)
    pixels = torch.empty((min(samples, total), 3, *preprocessor.size), dtype=torch.uint8)
    kept: list[int] = []
    with tqdm(total=total, disable=not progress, desc="images", unit="file") as bar:
        for position, source in enumerate(sources):
            image = decode(source, preprocessor, counts)  # (3, H, W) uint8 or None
            bar.update(1)
            if image is not None:
                pixels[len(kept)] = image
                kept.append(position)
                if len(kept) == samples:
                    break
    # (N, 3, H, W): copied only when unreadable files left rows unused
    return (pixels if len(kept) == len(pixels) else pixels[: len(kept)].clone()), counts, kept


def scan_images(
    sources: Iterable[Source],
    preprocessor: ImagePreprocessor,
    samples: int,
    *,
    total: int | None = None,
    progress: bool = True,
) -> tuple[list[int], dict[str, int]]:
    """The positions in ``sources`` of their first ``samples`` readable images, and the conversion/skip
    counts: each image is decoded as :func:`decode_images` decodes it, and dropped at once."""
    counts = dict.fromkeys(COUNT_KEYS, 0)
    kept: list[int] = []
    with tqdm(total=total, disable=not progress, desc="images", unit="file") as bar:
        for position, source in enumerate(sources):
            readable = decode(source, preprocessor, counts) is not None
            bar.update(1)
            if readable:
                kept.append(position)
                if len(kept) == samples:
                    break
    return kept, counts


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
    sources: Sequence[Source],
    preprocessor: ImagePreprocessor,
    samples: int,
    *,
    seed: int,
    first: bool,
    progress: bool,
) -> tuple[torch.Tensor, dict[str, int]]:
    """``samples`` readable images of ``sources``, tried in :func:`reading_order` and held in source order:
    pixels (N, 3, H, W) uint8 and the counts (the bundled crops: at most 486 images)."""
    total = len(sources)
    order = reading_order(total, samples, seed, first)
    pixels, counts, kept = decode_images(
        (sources[i] for i in order), preprocessor, samples, total=min(total, samples), progress=progress
    )
    chosen = [order[p] for p in kept]
    ranks = sorted(range(len(chosen)), key=chosen.__getitem__)  # back to source order
    return permute_rows(pixels, ranks), counts


def choose_images(
    get: Callable[[int], Source],
    total: int,
    preprocessor: ImagePreprocessor,
    samples: int,
    *,
    seed: int,
    first: bool,
    progress: bool,
) -> tuple[list[int], dict[str, int]]:
    """The indices, in source order, of ``samples`` readable images of a source of ``total`` (image ``i``
    is ``get(i)``), tried in :func:`reading_order` (the images :func:`pick_images` would hold), and the
    counts."""
    order = reading_order(total, samples, seed, first)
    kept, counts = scan_images((get(i) for i in order), preprocessor, samples, total=min(total, samples),
                               progress=progress)
    return sorted(order[p] for p in kept), counts


@dataclass(eq=False)
class _Digest:
    """The fingerprint of every chosen image, fed while they are decoded in order from the first."""

    total: int
    fingerprint: Fingerprint
    next: int = 0  # the image to feed next
    value: str | None = None


class ImagesOnDemand:
    """Chosen images decoded, converted and resized when a batch asks for them (``take``), as
    :func:`decode` gave them when they were chosen; none is kept. Image ``j`` is ``get(indices[j])``.

    The first pass in order (the forward pass) also digests them, so :meth:`fingerprint` then costs
    nothing; copies sent to other processes (shards) leave that to this process.
    """

    def __init__(self, get: Callable[[int], Source], indices: Sequence[int], preprocessor: ImagePreprocessor,
                 *, offset: int = 0, digest: _Digest | None = None) -> None:
        self.get, self.indices, self.preprocessor, self.offset = get, list(indices), preprocessor, offset
        if digest is None and offset == 0:
            digest = _Digest(len(self.indices), Fingerprint())
            digest.fingerprint.start("pixel_values", torch.uint8, (len(self.indices), 3, *preprocessor.size))
        self._digest = digest  # shared by the parts; None in a copy sent to another process

    def __len__(self) -> int:
        return len(self.indices)

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_digest": None}

    def take(self, start: int, stop: int) -> dict[str, torch.Tensor]:
        """Images ``start .. stop - 1``: ``{"pixel_values": (b, 3, H, W) uint8}``."""
        indices = self.indices[start:stop]
        pixels = torch.empty((len(indices), 3, *self.preprocessor.size), dtype=torch.uint8)
        counts = dict.fromkeys(COUNT_KEYS, 0)  # counted when the images were chosen
        for row, index in enumerate(indices):
            source = self.get(index)
            image = decode(source, self.preprocessor, counts)  # (3, H, W) uint8
            if image is None:
                name = source if isinstance(source, Path) else f"image {index} of the source"
                raise AuditError(f"{name} was readable when the images were chosen but cannot be decoded "
                                 "now; was it changed or removed during the audit? Rerun the audit")
            pixels[row] = image
        self._digested(self.offset + start, pixels)
        return {"pixel_values": pixels}

    def _digested(self, first: int, pixels: torch.Tensor) -> None:
        """Feed the digest with images ``first ..`` when they are the next in order."""
        digest = self._digest
        if digest is not None and digest.value is None and first == digest.next and len(pixels):
            digest.fingerprint.add(pixels)
            digest.next += len(pixels)
            if digest.next == digest.total:
                digest.value = digest.fingerprint.hex()

    def part(self, start: int, stop: int) -> ImagesOnDemand:
        return ImagesOnDemand(self.get, self.indices[start:stop], self.preprocessor,
                              offset=self.offset + start, digest=self._digest)

    def fingerprint(self) -> str:
        """:meth:`Fingerprint.of` the (N, 3, H, W) pixels; decodes only the images not yet digested."""
        whole = self._digest is not None and self.offset == 0 and len(self) == self._digest.total
        if not whole:
            fresh = ImagesOnDemand(self.get, self.indices, self.preprocessor)
            return fresh.fingerprint()
        step = 64
        while self._digest.value is None:
            self.take(self._digest.next, self._digest.next + step)
        return self._digest.value


def image_inputs(
    pixels: torch.Tensor | ImagesOnDemand, counts: dict[str, int], loaded: Fed, data_source: str
) -> Inputs:
    """Wrap pixels (N, 3, H, W) uint8, held or decoded on demand, as :class:`Inputs` standardised per
    batch."""
    preprocessor = loaded.image_preprocessor
    if preprocessor is None:
        raise AuditError(f"{loaded.name} takes no images")
    if len(pixels) == 0:
        raise AuditError(f"no readable image in {data_source} ({counts['skipped_unreadable']} unreadable)")

    def prepare(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"pixel_values": preprocessor.normalize(batch["pixel_values"])}  # (B, 3, H, W) float32

    held = isinstance(pixels, torch.Tensor)
    return Inputs(
        N=len(pixels),
        n=loaded.n,
        data_source=data_source,
        tokenizer=preprocessor.name,
        counts=counts,
        tensors={"pixel_values": pixels} if held else {},
        prepare=prepare,
        on_demand=None if held else pixels,
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
    loaded: Fed,
    data: str | None,
    samples: int,
    *,
    seed: int = 0,
    first: bool = False,
    exclude: str | Path | None = None,
    progress: bool = True,
) -> Inputs:
    """Image inputs from a folder or ``hf:...``, decoded per batch (:class:`ImagesOnDemand`), or (None) the
    crops of the bundled skimage photographs, held."""
    preprocessor = loaded.image_preprocessor
    if preprocessor is None:
        raise AuditError(f"{loaded.name} takes no images")
    pick = dict(seed=seed, first=first, progress=progress)
    if data is None:
        from auditor.data.samples import bundled_image_crops, release_photos

        crops, label = bundled_image_crops()
        try:
            pixels, counts = pick_images(crops, preprocessor, samples, **pick)
        finally:
            release_photos()
        note = selection_note(len(pixels), len(crops), "crops", samples=samples, seed=seed, first=first)
        return image_inputs(pixels, counts, loaded, f"{label}; {note}")
    if data.startswith(HF_PREFIX):
        dataset, label = load_hf_dataset(data, "imagefolder", IMAGE_SUFFIXES, exclude)
        dataset, column = _hf_image_column(dataset)
        if hasattr(dataset, "__len__"):  # a local dataset: random access
            total = len(dataset)

            def get(i: int) -> Source:
                return _hf_source(dataset[i][column])

            chosen, counts = choose_images(get, total, preprocessor, samples, **pick)
            note = selection_note(len(chosen), total, "images", samples=samples, seed=seed, first=first)
        else:  # streamed from the hub: its size is unknown, so the first images are read (and kept encoded)
            seen: list[Source] = []

            def remembered() -> Iterator[Source]:
                for row in dataset:
                    seen.append(_hf_source(row[column]))
                    yield seen[-1]

            kept, counts = scan_images(remembered(), preprocessor, samples, progress=progress)
            get, chosen = [seen[p] for p in kept].__getitem__, range(len(kept))
            del seen
            note = f"first {len(chosen)} readable images (a streamed dataset is read from its start)"
        return image_inputs(ImagesOnDemand(get, chosen, preprocessor), counts, loaded, f"{label}; {note}")
    folder = Path(data).expanduser()
    files = list_image_files(folder, exclude)
    chosen, counts = choose_images(files.__getitem__, len(files), preprocessor, samples, **pick)
    note = selection_note(len(chosen), len(files), "image files", samples=samples, seed=seed, first=first)
    return image_inputs(ImagesOnDemand(files.__getitem__, chosen, preprocessor), counts, loaded,
                        f"{folder} (folder, {len(files)} image files; {note})")
