"""Offline default data: small real samples shipped inside installed dependencies.

Images: the colour photographs bundled with scikit-image (``skimage.data``): astronaut, cat (chelsea),
coffee, Hubble deep field, immunohistochemistry slide, the two motorcycle stereo views, retina and
rocket. Nine real photos, nothing synthesised; an audit on them is labelled as such and is a smoke
test, not a reproduction (paper A used 2000 ImageNet images).

Text: the help topics of the Python reference manual shipped with the standard library
(``pydoc_data.topics``), about 0.7 MB of real English prose and code.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from auditor.errors import AuditError

log = logging.getLogger(__name__)

# file names in skimage.data's folder of the colour photographs (not charts, textures or masks)
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
)


def bundled_image_files() -> tuple[list[Path], str]:
    """Paths of the bundled scikit-image photographs present in this installation, and their label."""
    try:
        import skimage.data
    except ImportError:
        raise AuditError("no --data given and scikit-image is not installed; give --data <folder>") from None
    folder = Path(skimage.data.data_dir)
    files = [folder / name for name in SKIMAGE_PHOTOS if (folder / name).is_file()]
    missing = sorted(set(SKIMAGE_PHOTOS) - {p.name for p in files})
    if missing:
        log.warning("scikit-image lacks bundled photos %s; using the other %d", missing, len(files))
    if not files:
        raise AuditError("no --data given and no bundled scikit-image photo was found; give --data <folder>")
    return files, f"bundled:skimage.data ({len(files)} photos; offline default)"


def bundled_text() -> tuple[str, str]:
    """The Python reference manual's help topics (sorted by topic) as one text, and its label."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise AuditError("no --data given and this Python lacks pydoc_data; give --data <file.txt>") from None
    text = "\n\n".join(topics[key].strip() for key in sorted(topics))
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    return (
        text,
        f"bundled:pydoc_data.topics (Python {version} reference text, {len(text)} chars; offline default)",
    )
