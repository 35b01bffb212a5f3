"""Image dimensions read from the bytes' header (server.domain.image_size): PNG, JPEG,
GIF and WebP, built here byte by byte; anything else, or a broken header, is None."""

from __future__ import annotations

import struct

from server.domain.image_size import actual_type, image_size, measurable
from tests.helpers import gif_bytes as gif
from tests.helpers import png_bytes as png


def jpeg(width: int, height: int, sof: int = 0xC0, app: bytes = b"") -> bytes:
    """A JPEG's segments up to its frame header: SOI, APP0 (JFIF), an optional APP1,
    a quantization table, then the SOF naming the size; scan data is not needed."""
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    app1 = b"\xff\xe1" + struct.pack(">H", len(app) + 2) + app if app else b""
    dqt = b"\xff\xdb" + struct.pack(">H", 67) + b"\x00" + b"\x01" * 64
    frame = b"\xff" + bytes([sof]) + struct.pack(">HBHHB", 11, 8, height, width, 1)
    frame += b"\x01\x11\x00"
    return b"\xff\xd8" + app0 + app1 + dqt + b"\xff\xff" + frame + b"\xff\xd9"


def riff(chunk: bytes, body: bytes) -> bytes:
    payload = b"WEBP" + chunk + struct.pack("<I", len(body)) + body
    return b"RIFF" + struct.pack("<I", len(payload)) + payload


def webp_lossy(width: int, height: int) -> bytes:
    return riff(
        b"VP8 ", b"\x00\x00\x00\x9d\x01\x2a" + struct.pack("<HH", width, height) + b"\0" * 10
    )


def webp_lossless(width: int, height: int) -> bytes:
    bits = (width - 1) | ((height - 1) << 14)
    return riff(b"VP8L", b"\x2f" + struct.pack("<I", bits) + b"\0" * 10)


def webp_extended(width: int, height: int) -> bytes:
    body = b"\x10\0\0\0" + (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    return riff(b"VP8X", body + b"\0" * 8)


def png_header(width: int, height: int) -> bytes:
    """The signature and IHDR of a PNG (what is read; the pixels are not)."""
    return png(1, 1)[:16] + struct.pack(">II", width, height) + b"\x08\x00\x00\x00\x00"


def gif_header(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HH", width, height) + b"\x80\x00\x00"


def test_each_format_states_its_width_and_height() -> None:
    # Whole files (small ones) and headers (of any size).
    for w, h in ((1, 1), (3, 2), (40, 30)):
        assert image_size("image/png", png(w, h)) == (w, h)
        assert image_size("image/gif", gif(w, h)) == (w, h)
    for w, h in ((1, 1), (3, 2), (8001, 600), (700, 2001), (16383, 16383)):
        assert image_size("image/png", png_header(w, h)) == (w, h)
        assert image_size("image/gif", gif_header(w, h)) == (w, h)
        assert image_size("image/jpeg", jpeg(w, h)) == (w, h)
        assert image_size("image/webp", webp_lossy(w, h)) == (w, h)
        assert image_size("image/webp", webp_lossless(w, h)) == (w, h)
        assert image_size("image/webp", webp_extended(w, h)) == (w, h)
    # Above 16,383 only PNG, GIF, JPEG and the extended WebP can say so.
    assert image_size("image/png", png_header(20000, 1)) == (20000, 1)
    assert image_size("image/gif", gif_header(65535, 2)) == (65535, 2)
    assert image_size("image/jpeg", jpeg(65535, 3)) == (65535, 3)
    assert image_size("image/webp", webp_extended(20000, 9000)) == (20000, 9000)


def test_jpeg_frames_of_every_kind_after_any_segments() -> None:
    """Progressive (C2) and other frame kinds are read; DHT (C4), which shares the
    marker range, is skipped like any segment, as is an EXIF APP1 stating other sizes."""
    for sof in (0xC0, 0xC1, 0xC2, 0xC3, 0xC9, 0xCF):
        assert image_size("image/jpeg", jpeg(640, 480, sof)) == (640, 480), hex(sof)
    exif = b"Exif\x00\x00" + struct.pack(">HH", 1234, 5678) * 20
    assert image_size("image/jpeg", jpeg(4032, 3024, app=exif)) == (4032, 3024)
    assert image_size("image/jpg", jpeg(10, 20)) == (10, 20)
    dht_first = jpeg(5, 6).replace(b"\xff\xdb", b"\xff\xc4", 1)
    assert image_size("image/jpeg", dht_first) == (5, 6)


def test_bytes_that_are_not_the_declared_type_measure_none() -> None:
    # The placeholder bytes the older tests upload: a PNG signature and filler.
    assert image_size("image/png", b"\x89PNG\r\n\x1a\n" + b"\x01" * 600) is None
    assert image_size("image/png", gif(5, 5)) is None
    assert image_size("image/jpeg", png(5, 5)) is None
    assert image_size("image/gif", b"GIF89a\x01") is None
    assert image_size("image/webp", riff(b"VP8 ", b"\0" * 20)) is None  # no start code
    assert image_size("image/webp", b"RIFF\0\0\0\0WAVE" + b"\0" * 30) is None
    # A JPEG cut before its frame header, or scan data before any frame.
    whole = jpeg(100, 100)
    assert image_size("image/jpeg", whole[: whole.index(b"\xff\xc0") + 4]) is None
    assert image_size("image/jpeg", b"\xff\xd8\xff\xda\x00\x08" + b"\0" * 20) is None
    # A zero side is no image.
    assert image_size("image/png", png_header(0, 5)) is None
    assert image_size("image/gif", gif_header(5, 0)) is None
    # Types not read here.
    assert image_size("image/svg+xml", b"<svg width='9000'/>") is None
    assert image_size("application/pdf", png(5, 5)) is None
    assert [measurable(t) for t in ("image/PNG", "image/webp", "image/bmp", "text/plain")] == [
        True,
        True,
        False,
        False,
    ]


def _padded_jpeg(segments: int, fill: int = 1) -> bytes:
    """A JPEG whose frame header comes after `segments` empty COM segments, each marker
    led by `fill` 0xFF bytes."""
    frame = jpeg(640, 480)
    com = b"\xff" * fill + b"\xfe\x00\x02"
    return frame[:2] + com * segments + frame[2:]


def test_the_jpeg_walk_is_bounded() -> None:
    """An upload of megabytes of tiny segments or fill bytes must not cost a step of
    Python per byte: past 1,024 segments or 64 fill bytes before a marker the bytes
    measure as unreadable (real files have a few dozen segments and a fill byte or two)."""
    assert image_size("image/jpeg", _padded_jpeg(1_000)) == (640, 480)
    assert image_size("image/jpeg", _padded_jpeg(1_100)) is None
    assert image_size("image/jpeg", _padded_jpeg(3, fill=60)) == (640, 480)
    assert image_size("image/jpeg", _padded_jpeg(3, fill=100)) is None
    # 20 MiB of either: refused within the bounds, not walked to the end.
    assert image_size("image/jpeg", b"\xff\xd8" + b"\xff" * (20 << 20)) is None
    assert image_size("image/jpeg", b"\xff\xd8" + b"\xff\xfe\x00\x02" * (5 << 20)) is None


def test_an_image_declared_as_another_type_read_here_is_what_its_bytes_are() -> None:
    """actual_type: bytes that are a well-formed image of another of the types read here
    than the one declared; None when they read as declared, as none of them, or were
    declared as a type not read here (kept as declared)."""
    assert actual_type("image/png", jpeg(640, 480)) == "image/jpeg"
    assert actual_type("image/jpeg", png(3, 2)) == "image/png"
    assert actual_type("image/jpg", png(3, 2)) == "image/png"
    assert actual_type("IMAGE/PNG", gif(3, 2)) == "image/gif"
    assert actual_type("image/gif", webp_lossless(3, 2)) == "image/webp"
    assert actual_type("image/png", png(3, 2)) is None
    assert actual_type("image/jpg", jpeg(3, 2)) is None
    assert actual_type("image/png", b"\x89PNG\r\n\x1a\n" + b"\0" * 64) is None
    assert actual_type("image/svg+xml", png(3, 2)) is None
    assert actual_type("application/octet-stream", jpeg(3, 2)) is None
