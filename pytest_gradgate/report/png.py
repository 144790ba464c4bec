"""A minimal PNG encoder: an image of palette indices (8 bits per pixel) and its palette.

PNG (ISO/IEC 15948): the 8-byte signature, then chunks, each its length (4 bytes, big
endian), its type, its data and the CRC-32 of type and data: IHDR (size, bit depth 8, colour
type 3 = palette), PLTE (the palette's RGB triples), IDAT (the zlib stream of the rows, each
preceded by its filter type) and IEND. The pictures of the HTML report are flat blocks of few
colours, so a palette (one byte per pixel) and filter 0 ("none") compress well; rows that repeat
the one above are deflate's long back-references.
"""

import struct
import zlib

import numpy as np

SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def encode_indexed(pixels, palette, level=6):
    """PNG bytes of `pixels` (2-D uint8 array of palette indices, rows top to bottom) with
    `palette` (a sequence of up to 256 (r, g, b) triples, 0-255). zlib's level 6: level 9 takes
    about four times as long for files 3% smaller."""
    pixels = np.asarray(pixels)
    if pixels.ndim != 2 or pixels.dtype != np.uint8:
        raise ValueError(f"pixels must be a 2-D uint8 array, not {pixels.dtype} of shape {pixels.shape}")
    height, width = pixels.shape
    if not (0 < width < 2**31 and 0 < height < 2**31):
        raise ValueError(f"a PNG is 1 to 2^31-1 pixels each way, not {width} x {height}")
    colours = np.asarray(palette, dtype=np.int64).reshape(-1, 3)
    if not 0 < len(colours) <= 256 or colours.min() < 0 or colours.max() > 255:
        raise ValueError("a palette has 1 to 256 RGB triples, each 0-255")
    if int(pixels.max()) >= len(colours):
        raise ValueError(f"pixel index {int(pixels.max())} is past the palette's {len(colours)} colours")
    rows = np.zeros((height, width + 1), dtype=np.uint8)     # column 0: each row's filter type, 0
    rows[:, 1:] = pixels
    header = struct.pack(">IIBBBBB", width, height, 8, 3, 0, 0, 0)
    return b"".join((SIGNATURE, _chunk(b"IHDR", header), _chunk(b"PLTE", colours.astype(np.uint8).tobytes()),
                     _chunk(b"IDAT", zlib.compress(rows.tobytes(), level)), _chunk(b"IEND", b"")))
