"""The HTML report's pictures of gradients, drawn with numpy into palette PNGs (report/png.py).

A slice picture (heatmap_png) has three panels, analytic | numeric | analytic - numeric, each a
heatmap of one 2-D slice [:, :, i2, i3] (rows i1, columns i0) with its colour bar and the bar's
limits. Analytic and numeric share one symmetric scale, so a value in the wrong cell shows as
the same colour in another place; the difference has its own. In a slice of at most
MAX_ANNOTATED cells each cell's value is printed in it; along a dimension of at most MAX_TICKS
the indices are printed beside the heatmap. The overview (overview_png) puts all drawn slices
side by side, one row each for analytic, numeric and difference, with grey gaps between slices.

Colours: a diverging map, blue (negative) through near-white (0) to red (positive), linear
between the ANCHORS; light grey for NaN and for the gaps. Cells are sx x sy pixel blocks, sized
from the slice so that a small one is legible and a large one stays within a few hundred pixels.
Text uses a small bitmap font (FONT, 7 pixels high), white on strong colours, black otherwise.
"""

import functools
import math

import numpy as np

from pytest_gradgate.report.png import encode_indexed

MAX_SLICES = 8          # per parameter: beyond this, the slices with the largest error are shown
MAX_ANNOTATED = 96      # cells per slice up to which each cell's value is printed in it
MAX_TICKS = 32          # a dimension up to this size has its indices printed

# (position on the scale, -1 = -limit .. +1 = +limit; RGB): the map is linear between these
ANCHORS = ((-1.0, (25, 60, 160)), (-0.5, (100, 150, 215)), (0.0, (246, 246, 246)),
           (0.5, (235, 140, 110)), (1.0, (180, 20, 35)))
WHITE, BLACK, GREY, FRAME = 0, 1, 2, 3           # palette indices of the fixed colours
FIXED = ((255, 255, 255), (0, 0, 0), (221, 221, 221), (136, 136, 136))
# levels on each side of 0, 2 * HALF + 1 in all: steps of 1/32 of the limit are not seen, and a
# palette of 69 colours rather than 255 makes each PNG about 0.5 KB smaller
HALF = 32
FIRST_LEVEL = len(FIXED)                         # palette index of -limit; FIRST_LEVEL + HALF is 0


def map_colour(t):
    """The map's RGB (floats) at t in [-1, 1] (array or scalar)."""
    t = np.asarray(t, dtype=np.float64)
    xs = [a for a, _ in ANCHORS]
    return np.stack([np.interp(t, xs, [c[k] for _, c in ANCHORS]) for k in range(3)], axis=-1)


def _palette():
    levels = np.rint(map_colour(np.arange(2 * HALF + 1) / HALF - 1.0)).astype(int)
    return [tuple(c) for c in FIXED] + [tuple(c) for c in levels]


PALETTE = _palette()


def levels(data, limit):
    """Palette indices of `data` on the symmetric scale [-limit, +limit]; NaN is grey, values
    beyond the limit (infinities too) take the end colours."""
    data = np.asarray(data, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        t = np.clip(data / limit, -1.0, 1.0)
    out = np.full(data.shape, GREY, dtype=np.uint8)
    ok = ~np.isnan(t)
    out[ok] = FIRST_LEVEL + np.rint((t[ok] + 1.0) * HALF).astype(np.uint8)
    return out


def colour_of(value, limit):
    """The RGB a cell of this value is drawn in, on the scale [-limit, +limit]."""
    return PALETTE[int(levels(np.array([value]), limit)[0])]


def difference(analytic, numeric):
    """analytic - numeric as floats, quietly (inf - inf is NaN, drawn grey)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(analytic, dtype=np.float64) - np.asarray(numeric, dtype=np.float64)


def symmetric_limit(*arrays):
    """The scale's limit: the largest |value| of the arrays (1 when there is none, or it is not finite)."""
    m = max((float(np.nanmax(np.abs(a))) for a in arrays if np.size(a) and not np.isnan(a).all()), default=0.0)
    return m if m > 0 and np.isfinite(m) else 1.0


# -- the font: 7 rows per glyph, '#' ink; glyphs are as wide as their rows ---------------------
_GLYPHS = {
    "0": ".###. #...# #..## #.#.# ##..# #...# .###.",
    "1": "..#.. .##.. ..#.. ..#.. ..#.. ..#.. .###.",
    "2": ".###. #...# ....# ...#. ..#.. .#... #####",
    "3": "##### ...#. ..#.. ...#. ....# #...# .###.",
    "4": "...#. ..##. .#.#. #..#. ##### ...#. ...#.",
    "5": "##### #.... ####. ....# ....# #...# .###.",
    "6": "..##. .#... #.... ####. #...# #...# .###.",
    "7": "##### ....# ...#. ..#.. .#... .#... .#...",
    "8": ".###. #...# #...# .###. #...# #...# .###.",
    "9": ".###. #...# #...# .#### ....# ...#. .##..",
    ".": ".. .. .. .. .. ## ##",
    ",": ".. .. .. .. ## .# #.",
    ":": ".. ## ## .. ## ## ..",
    "-": ".... .... .... #### .... .... ....",
    "+": "..... ..#.. ..#.. ##### ..#.. ..#.. .....",
    "_": "..... ..... ..... ..... ..... ..... #####",
    " ": "... ... ... ... ... ... ...",
    "[": "### #.. #.. #.. #.. #.. ###",
    "]": "### ..# ..# ..# ..# ..# ###",
    "(": "..# .#. #.. #.. #.. .#. ..#",
    ")": "#.. .#. ..# ..# ..# .#. #..",
    "?": ".###. #...# ....# ...#. ..#.. ..... ..#..",
    "a": "..... ..... .###. ....# .#### #...# .####",
    "b": "#.... #.... #.##. ##..# #...# #...# ####.",
    "c": "..... ..... .###. #.... #.... #...# .###.",
    "d": "....# ....# .##.# #..## #...# #...# .####",
    "e": "..... ..... .###. #...# ##### #.... .###.",
    "f": "..## .#.. #### .#.. .#.. .#.. .#..",
    "g": "..... ..... .#### #...# .#### ....# .###.",
    "h": "#.... #.... #.##. ##..# #...# #...# #...#",
    "i": ".#. ... ##. .#. .#. .#. ###",
    "j": "..#. .... .##. ..#. ..#. #.#. .#..",
    "k": "#... #... #..# #.#. ##.. #.#. #..#",
    "l": "##. .#. .#. .#. .#. .#. ###",
    "m": "..... ..... ##.#. #.#.# #.#.# #...# #...#",
    "n": "..... ..... #.##. ##..# #...# #...# #...#",
    "o": "..... ..... .###. #...# #...# #...# .###.",
    "p": "..... ..... ####. #...# ####. #.... #....",
    "q": "..... ..... .#### #...# .#### ....# ....#",
    "r": "..... ..... #.##. ##..# #.... #.... #....",
    "s": "..... ..... .#### #.... .###. ....# ####.",
    "t": ".#.. .#.. #### .#.. .#.. .#.. ..##",
    "u": "..... ..... #...# #...# #...# #..## .##.#",
    "v": "..... ..... #...# #...# #...# .#.#. ..#..",
    "w": "..... ..... #...# #...# #.#.# #.#.# .#.#.",
    "x": "..... ..... #...# .#.#. ..#.. .#.#. #...#",
    "y": "..... ..... #...# #...# .#### ....# .###.",
    "z": "..... ..... ##### ...#. ..#.. .#... #####",
}
FONT = {ch: np.array([[c == "#" for c in row] for row in rows.split()], dtype=bool) for ch, rows in _GLYPHS.items()}
TEXT_HEIGHT = 7


@functools.lru_cache(maxsize=4096)
def text_mask(text, scale=1):
    """The ink of `text` as a read-only boolean array (TEXT_HEIGHT * scale rows); a character
    the font lacks is drawn as '?'; one column between characters."""
    glyphs = [FONT.get(ch, FONT["?"]) for ch in str(text)]
    if not glyphs:
        return np.zeros((TEXT_HEIGHT * scale, 0), dtype=bool)
    parts = []
    for k, g in enumerate(glyphs):
        if k:
            parts.append(np.zeros((TEXT_HEIGHT, 1), dtype=bool))
        parts.append(g)
    mask = np.concatenate(parts, axis=1)
    if scale > 1:
        mask = np.kron(mask, np.ones((scale, scale), dtype=bool))
    mask.flags.writeable = False          # shared by every caller (cached)
    return mask


def text_width(text, scale=1):
    return text_mask(text, scale).shape[1]


def draw_text(canvas, x, y, text, colour=BLACK, scale=1):
    """Ink `text` into `canvas` (palette indices) with its top-left corner at (x, y), clipped."""
    mask = text_mask(text, scale)
    h, w = mask.shape
    x0, y0 = max(x, 0), max(y, 0)
    x1, y1 = min(x + w, canvas.shape[1]), min(y + h, canvas.shape[0])
    if x1 <= x0 or y1 <= y0:
        return
    region = canvas[y0:y1, x0:x1]
    region[mask[y0 - y:y1 - y, x0 - x:x1 - x]] = colour


def cell_text(v):
    """A cell's value in at most 6 characters: 2 decimals from 0.01 to 10, fewer above, a
    one-digit mantissa and its exponent beyond (0.004 -> 4e-3, 12345 -> 1e4)."""
    v = float(v)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    a = abs(v)
    if a == 0:
        return "0"
    for bound, digits in ((9.995, 2), (99.95, 1), (999.5, 0)):
        if 0.00995 <= a < bound:
            return f"{v:.{digits}f}"
    mantissa, exponent = f"{v:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def limit_text(limit):
    return f"{limit:.3g}".replace("e+", "e").replace("e-0", "e-").replace("e0", "e")


# -- pictures ----------------------------------------------------------------------------------
class Panel:
    """Where a heatmap lies in its picture: the top-left pixel of cell [0, 0] (x, y), each cell's
    size in pixels (sx, sy), and the scale's limit."""

    def __init__(self, title, x, y, sx, sy, rows, cols, limit, block_step=0):
        self.title, self.x, self.y, self.sx, self.sy = title, x, y, sx, sy
        self.rows, self.cols, self.limit, self.block_step = rows, cols, limit, block_step

    def cell(self, i1, i0, block=0):
        """(y0, y1, x0, x1): the pixel rows and columns of cell [i1, i0] in the picture (in the
        overview: of the block-th slice drawn, block_step pixels from one to the next)."""
        y0, x0 = self.y + i1 * self.sy, self.x + block * self.block_step + i0 * self.sx
        return y0, y0 + self.sy, x0, x0 + self.sx

    def moved(self, dx, dy):
        return Panel(self.title, self.x + dx, self.y + dy, self.sx, self.sy, self.rows, self.cols, self.limit,
                     self.block_step)


class Picture:
    """Palette indices (pixels) and the panels in them; png() encodes them."""

    def __init__(self, pixels, panels):
        self.pixels, self.panels = pixels, panels

    def png(self):
        return encode_indexed(self.pixels, PALETTE)


BAR_HEIGHT, BAR_MIN_WIDTH, GAP = 8, 96, 6


def _ticks(count, cell, label_size):
    """Indices to print along a dimension of `count` cells of `cell` pixels: every k-th, with
    k the smallest of 1, 2, 5, 10, 20 that leaves room for a label of `label_size` pixels; past
    MAX_TICKS cells only where every index fits."""
    if count > MAX_TICKS and cell < label_size + 2:
        return []
    step = next((k for k in (1, 2, 5, 10, 20) if k * cell >= label_size + 2), 40)
    return list(range(0, count, step))


def _paste(canvas, part, x, y):
    canvas[y:y + part.shape[0], x:x + part.shape[1]] = part


def _panel(heat, title, limit, rows, cols, sx, sy, x_labels, x_axis, y_ticks=True):
    """One heatmap (its pixels `heat`, rows x cols cells of sx x sy) with its title, the axis
    names and indices, a frame, and under it its colour bar, -limit to +limit left to right,
    with -limit, 0 and +limit printed under the bar's ends and middle.
    x_labels: [(pixel centre within heat, text)] printed above the heat. Returns (canvas, Panel).

    The bar lies under the heatmap, not beside it: each of its pixel columns is one colour, so
    its rows repeat and cost the PNG almost nothing (a bar beside the heatmap made every row of
    the picture a new one, and the file twice as large)."""
    hh, hw = heat.shape
    y_labels = [(i * sy + sy // 2, str(i)) for i in _ticks(rows, sy, TEXT_HEIGHT)] if y_ticks else []
    tick_w = max((text_width(t) for _, t in y_labels), default=0)
    left = max(text_width("i1"), tick_w) + GAP           # the indices of i1, with its name above them
    title_h = 2 * TEXT_HEIGHT + GAP
    axis_h = TEXT_HEIGHT + 3
    ticks_h = TEXT_HEIGHT + 3 if x_labels else 0
    top = title_h + axis_h + ticks_h + 1                       # + 1: the frame
    limits = ("-" + limit_text(limit), "0", "+" + limit_text(limit))
    bar_w = max(hw, sum(text_width(t) for t in limits) + 4 * GAP, BAR_MIN_WIDTH)
    bar_y = top + hh + 1 + GAP
    width = max(left + bar_w + 2, text_width(title, 2) + 2, left + text_width(x_axis) + 2)
    height = bar_y + BAR_HEIGHT + 3 + TEXT_HEIGHT + 2
    canvas = np.full((height, width), WHITE, dtype=np.uint8)
    draw_text(canvas, 0, 0, title, BLACK, 2)
    draw_text(canvas, left + max((hw - text_width(x_axis)) // 2, 0), title_h, x_axis)
    for centre, text in x_labels:
        draw_text(canvas, left + centre - text_width(text) // 2, title_h + axis_h, text)
    draw_text(canvas, left - GAP - text_width("i1"), top - 1 - (TEXT_HEIGHT + 3), "i1")
    for centre, text in y_labels:
        draw_text(canvas, left - GAP - text_width(text), top + centre - TEXT_HEIGHT // 2, text)
    canvas[top - 1:top + hh + 1, left - 1:left + hw + 1] = FRAME
    _paste(canvas, heat, left, top)
    t = 2.0 * np.arange(bar_w) / max(bar_w - 1, 1) - 1.0
    canvas[bar_y - 1:bar_y + BAR_HEIGHT + 1, left - 1:left + bar_w + 1] = FRAME
    _paste(canvas, levels(t, 1.0)[None, :].repeat(BAR_HEIGHT, axis=0), left, bar_y)
    ly = bar_y + BAR_HEIGHT + 3
    draw_text(canvas, left, ly, limits[0])
    draw_text(canvas, left + bar_w // 2 - text_width(limits[1]) // 2, ly, limits[1])
    draw_text(canvas, left + bar_w - text_width(limits[2]), ly, limits[2])
    return canvas, Panel(title, left, top, sx, sy, rows, cols, limit)


def _arrange(parts, across, name):
    """Panels side by side (across) or one above the other, under a line with `name`."""
    head = TEXT_HEIGHT + GAP if name else 0
    gap = 3 * GAP
    if across:
        width = sum(c.shape[1] for c, _ in parts) + gap * (len(parts) - 1)
        height = head + max(c.shape[0] for c, _ in parts)
    else:
        width = max(c.shape[1] for c, _ in parts)
        height = head + sum(c.shape[0] for c, _ in parts) + gap * (len(parts) - 1)
    width = max(width, text_width(name) + 2 if name else 1)
    canvas = np.full((height, width), WHITE, dtype=np.uint8)
    if name:
        draw_text(canvas, 0, 0, name)
    x, y, panels = 0, head, {}
    for part, panel in parts:
        _paste(canvas, part, x, y)
        panels[panel.title] = panel.moved(x, y)
        if across:
            x += part.shape[1] + gap
        else:
            y += part.shape[0] + gap
    return canvas, panels


MAX_ACROSS = 1500      # pixels: wider than this, the three panels go one above the other
TITLES = ("analytic", "numeric", "analytic - numeric")


def _annotate(heat, data, limit, sx, sy):
    """Each cell's value, centred in it: white on strong colours, black otherwise."""
    rows, cols = data.shape
    for i1 in range(rows):
        for i0 in range(cols):
            v = data[i1, i0]
            text = cell_text(v)
            colour = WHITE if np.isfinite(v) and abs(v) > 0.6 * limit else BLACK
            draw_text(heat, i0 * sx + (sx - text_width(text)) // 2, i1 * sy + (sy - TEXT_HEIGHT) // 2, text, colour)


def cell_size(rows, cols, annotate, values=()):
    """(sx, sy): pixels per cell. Annotated: square cells wide enough for the widest value.
    Otherwise about 256 pixels along the longer side (1 to 24 per cell); square unless one side
    is more than 8 times the other, so a long thin slice is not a line of pixels."""
    if annotate:
        s = max([30] + [text_width(cell_text(v)) + 6 for v in values])
        return s, s
    sx = min(max(256 // cols, 1), 24)
    sy = min(max(256 // rows, 1), 24)
    if max(rows, cols) <= 8 * min(rows, cols):
        sx = sy = min(sx, sy)
    return sx, sy


def slice_picture(name, analytic, numeric, vmax=None):
    """The Picture of one slice (2-D, [i1, i0]): analytic | numeric | analytic - numeric."""
    analytic = np.asarray(analytic, dtype=np.float64)
    numeric = np.asarray(numeric, dtype=np.float64)
    diff = difference(analytic, numeric)
    rows, cols = analytic.shape
    vmax = vmax or symmetric_limit(analytic, numeric)
    dmax = symmetric_limit(diff)
    annotate = rows * cols <= MAX_ANNOTATED
    sx, sy = cell_size(rows, cols, annotate, np.concatenate([analytic.ravel(), numeric.ravel(), diff.ravel()]))
    parts = []
    for data, title, limit in ((analytic, TITLES[0], vmax), (numeric, TITLES[1], vmax), (diff, TITLES[2], dmax)):
        heat = np.repeat(np.repeat(levels(data, limit), sy, axis=0), sx, axis=1)
        if annotate:
            _annotate(heat, data, limit, sx, sy)
        x_labels = [(i * sx + sx // 2, str(i)) for i in _ticks(cols, sx, text_width(str(cols - 1)))]
        parts.append(_panel(heat, title, limit, rows, cols, sx, sy, x_labels, "i0"))
    across = sum(c.shape[1] for c, _ in parts) + 6 * GAP <= MAX_ACROSS
    return Picture(*_arrange(parts, across, name))


def heatmap_png(name, analytic, numeric, vmax=None):
    """One slice (2-D, [i1, i0]) as PNG bytes: analytic | numeric | analytic - numeric.

    Analytic and numeric share one colour scale (vmax, or the largest |value| of the two), so a
    value in the wrong cell shows as the same colour in another place; the difference has its own."""
    return slice_picture(name, analytic, numeric, vmax).png()


def overview_picture(name, analytic, numeric, pairs):
    """The Picture of all drawn slices side by side (analytic, numeric: [i3, i2, i1, i0])."""
    analytic = np.asarray(analytic, dtype=np.float64)
    numeric = np.asarray(numeric, dtype=np.float64)
    diff = difference(analytic, numeric)
    ne1, ne0 = analytic.shape[2], analytic.shape[3]
    total = len(pairs) * ne0 + len(pairs) - 1                    # in cells, one between slices
    s = min(max(min(1100 // total, 120 // ne1), 1), 24)
    sx, sy = s, max(s, -(-16 // ne1))                            # rows at least 16 pixels high
    gap = max(sx, 3)
    vmax = symmetric_limit(analytic, numeric)
    parts = []
    for data, title, limit in ((analytic, TITLES[0], vmax), (numeric, TITLES[1], vmax), (diff, TITLES[2],
                                                                                           symmetric_limit(diff))):
        blocks, x_labels, x = [], [], 0
        for k, (i2, i3) in enumerate(pairs):
            if k:
                blocks.append(np.full((ne1 * sy, gap), GREY, dtype=np.uint8))     # a gap between slices
                x += gap
            blocks.append(np.repeat(np.repeat(levels(data[i3, i2], limit), sy, axis=0), sx, axis=1))
            x_labels.append((x + ne0 * sx // 2, f"[:,:,{i2},{i3}]"))
            x += ne0 * sx
        axis = "slices"
        if max(text_width(t) for _, t in x_labels) + 4 > ne0 * sx + gap:     # too narrow: "i2,i3" only
            x_labels, axis = [(c, t[5:-1]) for c, t in x_labels], "slices: i2,i3"
        widest = max(text_width(t) for _, t in x_labels)
        step = next((k for k in range(1, len(pairs) + 1) if k * (ne0 * sx + gap) >= widest + 4), len(pairs))
        heat = np.concatenate(blocks, axis=1)
        canvas, panel = _panel(heat, title, limit, ne1, ne0, sx, sy, x_labels[::step], axis)
        panel.block_step = ne0 * sx + gap
        parts.append((canvas, panel))
    canvas, panels = _arrange(parts, False, f"{name}: all slices" if name else "")
    return Picture(canvas, panels)


def overview_png(name, analytic, numeric, pairs):
    """All drawn slices side by side as PNG bytes, one row each for analytic, numeric and
    difference. A gradient read with the wrong strides shows here as its values sliding from
    slice to slice (diagonal bands across the blocks) where the numeric one has none."""
    return overview_picture(name, analytic, numeric, pairs).png()


# -- which slices -------------------------------------------------------------------------------
def as_array(values, ne):
    """Logical order, i0 fastest -> numpy array indexed [i3, i2, i1, i0]."""
    ne = (list(ne) + [1, 1, 1, 1])[:4]
    return np.asarray(values, dtype=np.float64).reshape(ne[3], ne[2], ne[1], ne[0])


def slice_name(param, i2, i3):
    return f"{param}[:, :, {i2}, {i3}]"


def pick_slices(analytic, numeric, limit=MAX_SLICES):
    """(i2, i3) pairs to draw, in logical order; when there are too many, those with the
    largest |analytic - numeric| (the interesting ones)."""
    ne3, ne2 = analytic.shape[0], analytic.shape[1]
    pairs = [(i2, i3) for i3 in range(ne3) for i2 in range(ne2)]
    if len(pairs) <= limit:
        return pairs, len(pairs)
    err = np.abs(analytic - numeric).max(axis=(2, 3))          # [i3, i2]
    top = sorted(pairs, key=lambda p: -err[p[1], p[0]])[:limit]
    return [p for p in pairs if p in top], len(pairs)
