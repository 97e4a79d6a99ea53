"""Offline default data: real samples shipped inside installed dependencies, labelled as such.

Images: crops of the 18 photographs shipped with two dependencies: scikit-image's ``skimage.data``
(colour: astronaut, cat (chelsea), coffee, Hubble deep field, immunohistochemistry slide, the two
motorcycle stereo views, retina, rocket; grayscale, converted to RGB and counted: cameraman, coins, moon,
page, text, brick, grass, gravel) and matplotlib's sample data (Grace Hopper). Each photo gives 27
square crops whose size (30-90 % of the photo's shorter side) and position follow a Halton sequence,
the same on every machine: 486 crops, enough for k = n = 197 subsets of ViT tokens. Nothing is
synthesised, but crops of one photo overlap: an audit on them is a working default, not a reproduction
(the paper used 2000 ImageNet images). With only the 9 colour photos (54 crops each) the near-duplicate
crops made the random-attention CLS tokens of a random ViT-base look dependent where 486 ImageNet images
show them independent; with these 18 photos both give the same verdicts.

Text: the help topics of the Python reference manual (``pydoc_data.topics``, about 0.5 MB), then the
docstrings of the standard library's modules, classes and functions (about 1.6 MB; read from the
source files with ``ast``, nothing is imported; test packages left out), in sorted module order, each
paragraph kept only the first time it appears (so no two examples are the same text). That
is about 490,000 uncased WordPiece tokens (951 BERT pairs of n = 512, 3708 of n = 128) or 1.9 million
bytes (GPT-2's offline byte tokens: 7522 windows of n = 256, 1880 of n = 1024), on Python 3.11.
"""

from __future__ import annotations

import ast
import functools
import itertools
import logging
import os
import sys
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path

from PIL import Image

from auditor.core.errors import AuditError

log = logging.getLogger(__name__)

# photographs (not charts, masks or synthetic images) in skimage.data's folder, colour then grayscale
SKIMAGE_PHOTOS = (
    "astronaut.png",
    "chelsea.png",
    "coffee.png",
    "hubble_deep_field.jpg",
    "ihc.png",
    "motorcycle_left.png",
    "motorcycle_right.png",
    "retina.jpg",
    "rocket.jpg",
    "camera.png",
    "coins.png",
    "moon.png",
    "page.png",
    "text.png",
    "brick.png",
    "grass.png",
    "gravel.png",
)
MATPLOTLIB_PHOTOS = ("grace_hopper.jpg",)  # in matplotlib's mpl-data/sample_data
CROPS_PER_PHOTO = 27
CROP_SIDES = (0.3, 0.9)  # crop side as a fraction of the photo's shorter side
# standard-library folders whose docstrings are not part of the default text: tests and demos (which
# distributions may strip), third-party packages
STDLIB_SKIP = {"test", "tests", "idle_test", "idlelib", "lib2to3", "turtledemo", "ensurepip",
               "site-packages", "dist-packages", "__pycache__"}


def _photo_folders() -> list[tuple[Path, tuple[str, ...]]]:
    """(folder, photo names) of each installed package that ships photographs."""
    found = []
    try:
        import skimage.data

        found.append((Path(skimage.data.data_dir), SKIMAGE_PHOTOS))
    except ImportError:
        pass
    try:
        import matplotlib

        found.append((Path(matplotlib.get_data_path()) / "sample_data", MATPLOTLIB_PHOTOS))
    except ImportError:
        pass
    return found


def bundled_image_files() -> tuple[list[Path], str]:
    """Paths of the bundled photographs present in this installation (scikit-image's, then
    matplotlib's), and their label."""
    wanted = [folder / name for folder, names in _photo_folders() for name in names]
    files = [p for p in wanted if p.is_file()]
    missing = sorted(p.name for p in wanted if not p.is_file())
    if missing:
        log.warning("the installed packages lack bundled photos %s; using the other %d", missing, len(files))
    if not files:
        raise AuditError(
            "no --data given and no bundled photo was found (scikit-image and matplotlib ship them); "
            "give --data <folder>"
        )
    return files, f"bundled:skimage.data and matplotlib sample photos ({len(files)} photos; offline default)"


def halton(index: int, base: int) -> float:
    """The ``index``-th point (index >= 1) of the van der Corput sequence in ``base``, in [0, 1)."""
    value, scale = 0.0, 1.0
    while index:
        scale /= base
        index, digit = divmod(index, base)
        value += digit * scale
    return value


def crop_boxes(
    width: int, height: int, count: int = CROPS_PER_PHOTO, start: int = 0
) -> list[tuple[int, int, int, int]]:
    """``count`` square (left, top, right, bottom) boxes inside a width x height photo: side and position
    from points ``start + 1 ... start + count`` of the Halton sequence in bases 2, 3 and 5 (well spread,
    no random state). Photos take consecutive blocks of points, so no two photos share a box layout
    (the two motorcycle photos are a stereo pair: equal boxes would give near-duplicate crops)."""
    short = min(width, height)
    lo, hi = CROP_SIDES
    boxes = []
    for i in range(start + 1, start + count + 1):
        side = max(1, round((lo + (hi - lo) * halton(i, 2)) * short))
        left = round(halton(i, 3) * (width - side))
        top = round(halton(i, 5) * (height - side))
        boxes.append((left, top, left + side, top + side))
    return boxes


def bundled_image_crops() -> tuple[list[Callable[[], Image.Image]], str]:
    """The default images: one loader per crop (photo by photo, boxes in Halton order), and their label."""
    files, _ = bundled_image_files()
    loaders: list[Callable[[], Image.Image]] = []
    for path in files:
        with Image.open(path) as image:
            size = image.size  # (W, H), read from the header
        place = (SKIMAGE_PHOTOS + MATPLOTLIB_PHOTOS).index(path.name)  # a block of Halton points per photo
        boxes = crop_boxes(*size, start=place * CROPS_PER_PHOTO)
        loaders.extend(functools.partial(_crop, path, box) for box in boxes)
    label = (
        f"bundled:skimage.data and matplotlib photo crops ({len(loaders)} crops of {len(files)} photos; "
        "derived, offline default)"
    )
    return loaders, label


@functools.lru_cache(maxsize=len(SKIMAGE_PHOTOS) + len(MATPLOTLIB_PHOTOS))
def _photo(path: Path) -> Image.Image:
    with Image.open(path) as image:
        image.load()
        return image.copy()


def _crop(path: Path, box: tuple[int, int, int, int]) -> Image.Image:
    return _photo(path).crop(box)


def release_photos() -> None:
    """Drop the decoded photos kept while their crops were being read."""
    _photo.cache_clear()


def reference_text() -> str:
    """The Python reference manual's help topics (sorted by topic) as one text."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise AuditError("no --data given and this Python lacks pydoc_data; give --data <file.txt>") from None
    return "\n\n".join(topics[key].strip() for key in sorted(topics))


def _docstrings(tree: ast.AST) -> Iterator[str]:
    """Docstrings of a module, its classes and functions, in source order."""
    if isinstance(tree, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        doc = ast.get_docstring(tree, clean=True)
        if doc:
            yield doc
        for child in tree.body:
            yield from _docstrings(child)


def stdlib_modules() -> list[Path]:
    """The standard library's Python source files, sorted, without tests, demos and third-party packages."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if d not in STDLIB_SKIP and not d.startswith("config-")]
        files.extend(Path(folder, name) for name in names if name.endswith(".py"))
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


@functools.cache
def module_docstrings(path: Path) -> str:
    """The docstrings of one Python source file, separated by blank lines ("" if it cannot be parsed)."""
    try:
        tree = ast.parse(path.read_bytes())
    except (SyntaxError, ValueError, OSError):  # a file this Python cannot parse: not part of the text
        return ""
    return "\n\n".join(_docstrings(tree))


def stdlib_docstrings() -> Iterator[str]:
    """One text per standard-library module with docstrings, in sorted order, parsed as consumed (cached)."""
    for path in stdlib_modules():
        text = module_docstrings(path)
        if text:
            yield text


def bundled_text_documents() -> tuple[Iterator[str], str]:
    """The default text as documents (reference topics first, then the stdlib docstrings), and its label.

    Documents are produced lazily, so a caller that needs only the first windows parses no source file.
    """
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    label = (
        f"bundled:Python {version} reference text (pydoc_data.topics) and standard-library docstrings "
        "(offline default)"
    )

    def documents() -> Iterator[str]:
        seen: set[str] = set()
        for text in itertools.chain([reference_text()], stdlib_docstrings()):
            kept = unique_paragraphs(text, seen)
            if kept:
                yield kept

    return documents(), label


def unique_paragraphs(text: str, seen: set[str]) -> str:
    """``text`` without the paragraphs (blank-line separated) already in ``seen``, which it then extends.

    The reference topics repeat whole sections (``augassign`` is part of ``assignment``) and many
    docstrings are shared; repeated text would give identical examples, and one identical pair makes
    every subset that holds both rank deficient.
    """
    kept = []
    for paragraph in text.split("\n\n"):
        key = paragraph.strip()
        if key and key not in seen:
            seen.add(key)
            kept.append(paragraph)
    return "\n\n".join(kept)
