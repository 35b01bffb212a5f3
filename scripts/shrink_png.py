"""Shrinks screenshots for the repository: a 256-colour palette PNG, visually the same.
Usage: python scripts/shrink_png.py docs/inspector/*.png"""

from __future__ import annotations

import sys
from pathlib import Path

from PIL import Image


def main(paths: list[str]) -> None:
    for name in paths:
        path = Path(name)
        image = Image.open(path).convert("RGB").quantize(colors=256)
        image.save(path, optimize=True)
        print(f"{path} {path.stat().st_size:,} bytes")


if __name__ == "__main__":
    main(sys.argv[1:])
