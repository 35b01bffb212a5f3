"""An image's width and height in pixels, read from its bytes' header (R-IMG-1).

Only the formats every provider takes are read: PNG, JPEG, GIF and WebP (lossy VP8,
lossless VP8L and extended VP8X). Nothing is decoded beyond the header that states the
size, so a file whose pixel data is damaged still measures; bytes that are not a
well-formed header of the named type measure as None.
"""

from __future__ import annotations

# MIME type -> the format read. image/jpg is a common misspelling clients send.
_FORMATS = {
    "image/png": "png",
    "image/jpeg": "jpeg",
    "image/jpg": "jpeg",
    "image/gif": "gif",
    "image/webp": "webp",
}


def measurable(mime_type: str) -> bool:
    """Whether image_size reads images of this MIME type."""
    return mime_type.lower() in _FORMATS


# The MIME type of each format read, as an upload of another declared type is stored.
_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "gif": "image/gif", "webp": "image/webp"}


def actual_type(mime_type: str, data: bytes) -> str | None:
    """The type `data` is, when it was declared as one of the types read here but is a
    well-formed image of another of them (a JPEG screenshot a tool saved as `.png`);
    None when it reads as declared, as none of them, or was declared as another type.
    Anthropic refuses an image whose bytes are not its `media_type` ("Image does not
    match the provided media type image/png"), and every later request holding it."""
    declared = _FORMATS.get(mime_type.lower())
    if declared is None or image_size(mime_type, data) is not None:
        return None
    for kind, mime in _TYPES.items():
        if kind != declared and image_size(mime, data) is not None:
            return mime
    return None


def image_size(mime_type: str, data: bytes) -> tuple[int, int] | None:
    """(width, height) of `data` read as `mime_type`; None when the type is not one read
    here or the bytes are not a well-formed image of it (or state a zero side)."""
    kind = _FORMATS.get(mime_type.lower())
    if kind == "png":
        size = _png(data)
    elif kind == "jpeg":
        size = _jpeg(data)
    elif kind == "gif":
        size = _gif(data)
    elif kind == "webp":
        size = _webp(data)
    else:
        return None
    if size is None or size[0] <= 0 or size[1] <= 0:
        return None
    return size


def _png(data: bytes) -> tuple[int, int] | None:
    # Signature, then the IHDR chunk first: length 13, type, width, height (big-endian).
    if len(data) < 24 or data[:8] != b"\x89PNG\r\n\x1a\n" or data[8:16] != b"\x00\x00\x00\rIHDR":
        return None
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def _gif(data: bytes) -> tuple[int, int] | None:
    # The logical screen's size (little-endian) follows the signature.
    if len(data) < 10 or data[:6] not in (b"GIF87a", b"GIF89a"):
        return None
    return int.from_bytes(data[6:8], "little"), int.from_bytes(data[8:10], "little")


# Start-of-frame markers: baseline, extended, progressive, lossless, and their
# differential and arithmetic-coded forms; not DHT (C4), JPG (C8) or DAC (CC).
_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})
# Markers that stand alone, without a length: TEM and the restart markers.
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})


# Bounds of the walk to the frame header. Real files have a few dozen segments before it
# (APPn metadata, ICC profile chunks of 64 KiB, tables) and a fill byte or two; an upload
# of 32 MiB of tiny segments or fill bytes would otherwise cost millions of steps of
# Python, so past these it measures as unreadable.
_MAX_SEGMENTS = 1_024
_MAX_FILL = 64


def _jpeg(data: bytes) -> tuple[int, int] | None:
    # Walk the segments after SOI to the first start-of-frame: its height, then width.
    if data[:2] != b"\xff\xd8":
        return None
    i, n = 2, len(data)
    for _ in range(_MAX_SEGMENTS):
        if i >= n or data[i] != 0xFF:
            return None
        start = i
        while i < n and data[i] == 0xFF:  # fill bytes
            i += 1
            if i - start > _MAX_FILL:
                return None
        if i >= n:
            return None
        marker = data[i]
        i += 1
        if marker in _STANDALONE:
            continue
        if marker in (0xD8, 0xD9, 0xDA):  # a second SOI, EOI or scan data before a frame
            return None
        if i + 2 > n:
            return None
        length = int.from_bytes(data[i : i + 2], "big")
        if length < 2:
            return None
        if marker in _SOF:
            if length < 7 or i + 7 > n:
                return None
            height = int.from_bytes(data[i + 3 : i + 5], "big")
            width = int.from_bytes(data[i + 5 : i + 7], "big")
            return width, height
        i += length
    return None


def _webp(data: bytes) -> tuple[int, int] | None:
    if len(data) < 30 or data[:4] != b"RIFF" or data[8:12] != b"WEBP":
        return None
    chunk, body = data[12:16], data[20:]
    if chunk == b"VP8 ":
        # Frame tag (3 bytes), start code, then 14-bit width and height.
        if body[3:6] != b"\x9d\x01\x2a":
            return None
        w = int.from_bytes(body[6:8], "little") & 0x3FFF
        h = int.from_bytes(body[8:10], "little") & 0x3FFF
        return w, h
    if chunk == b"VP8L":
        # Signature 0x2f, then 14 bits width-1 and 14 bits height-1.
        if body[0] != 0x2F:
            return None
        bits = int.from_bytes(body[1:5], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":
        # Flags (4 bytes), then 24-bit canvas width-1 and height-1.
        w = int.from_bytes(body[4:7], "little") + 1
        h = int.from_bytes(body[7:10], "little") + 1
        return w, h
    return None
