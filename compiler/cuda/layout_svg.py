"""Pictures of CUDA tile layouts as SVG text, for ``Lowered.plot_layout``.

A register tile (``fragment``): one cell per element, saying which thread holds it and in
which slot of that thread's local array (``T5`` / ``r3``), coloured by lane (hue) and warp
(lightness). A shared tile: one cell per element, saying the 4-byte bank its swizzled address
falls in, coloured by bank, so that a column of distinct colours shows a conflict-free access.

Each cell is a ``<rect>`` carrying its facts as ``data-*`` attributes (``data-row``,
``data-col``, then ``data-thread``/``data-slot`` or ``data-offset``/``data-bank``) and a
``<title>`` tooltip, so that a test or a script can read the picture back with any XML parser.
Plain text only: no drawing library is needed.
"""

from __future__ import annotations

from collections.abc import Iterator
from xml.sax.saxutils import escape, quoteattr

import numpy as np

from .gemm_plan import SharedTile
from .layout import Layout

CELL_W = 34
CELL_H = 24
MARGIN = 30
TITLE_H = 24
BANKS = 32
BANK_BYTES = 4


def _lane_colour(thread: int) -> str:
    lane, warp = thread % 32, thread // 32
    # Neighbouring lanes far apart in hue (11 is coprime with 32); alternate warps lighter.
    return f"hsl({lane * 11 % 32 * 360 // 32}, 65%, {82 if warp % 2 == 0 else 68}%)"


def _bank_colour(bank: int) -> str:
    return f"hsl({bank * 11 % BANKS * 360 // BANKS}, 70%, 75%)"


def _frame(rows: int, cols: int, title: str, body: Iterator[str]) -> str:
    width = 2 * MARGIN + cols * CELL_W
    height = TITLE_H + 2 * MARGIN + rows * CELL_H
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="monospace">',
           f'<text x="{MARGIN}" y="{TITLE_H - 6}" font-size="14">{escape(title)}</text>']
    top = TITLE_H + MARGIN
    # Column numbers above and row numbers left of the grid.
    out += [f'<text x="{MARGIN + c * CELL_W + CELL_W // 2}" y="{top - 6}" font-size="9" '
            f'text-anchor="middle">{c}</text>' for c in range(cols)]
    out += [f'<text x="{MARGIN - 4}" y="{top + r * CELL_H + CELL_H // 2 + 3}" font-size="9" '
            f'text-anchor="end">{r}</text>' for r in range(rows)]
    out += list(body)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _cell(r: int, c: int, fill: str, lines: tuple[str, ...], title: str,
          data: dict[str, int | str]) -> str:
    x, y = MARGIN + c * CELL_W, TITLE_H + MARGIN + r * CELL_H
    attrs = " ".join(f"data-{k}={quoteattr(str(v))}" for k, v in data.items())
    text = "".join(
        f'<text x="{x + CELL_W // 2}" y="{y + 10 + 9 * i}" font-size="8" '
        f'text-anchor="middle">{escape(line)}</text>' for i, line in enumerate(lines))
    return (f'<g><rect x="{x}" y="{y}" width="{CELL_W}" height="{CELL_H}" fill="{fill}" '
            f'stroke="white" data-row="{r}" data-col="{c}" {attrs}>'
            f"<title>{escape(title)}</title></rect>{text}</g>")


def fragment_svg(layout: Layout, title: str) -> str:
    """The picture of a 1-D or 2-D register tile's layout: for each element, the thread that
    holds it (the lowest, with how many others hold copies where the layout replicates) and
    its slot in that thread's local array."""
    if len(layout.shape) not in (1, 2):
        raise ValueError(f"a picture of a {len(layout.shape)}-D tile: only 1-D and 2-D tiles "
                         "are drawn")
    threads, slots = layout.owners()
    if len(layout.shape) == 1:
        threads, slots = threads[None], slots[None]
    rows, cols = slots.shape

    def cells() -> Iterator[str]:
        for r in range(rows):
            for c in range(cols):
                holders = [int(t) for t in threads[r, c] if t >= 0]
                t, k = holders[0], int(slots[r, c])
                copies = f" (also threads {', '.join(map(str, holders[1:]))})" \
                    if len(holders) > 1 else ""
                yield _cell(r, c, _lane_colour(t), (f"T{t}", f"r{k}"),
                            f"[{r}, {c}]: thread {t} (warp {t // 32}, lane {t % 32}), "
                            f"slot {k}{copies}",
                            {"thread": t, "slot": k, "replicas": len(holders)})

    return _frame(rows, cols, title, cells())


def shared_svg(tile: SharedTile, title: str) -> str:
    """The picture of a shared tile: for each element, its element offset in the buffer (the
    swizzle's permutation) and the bank its first byte falls in."""
    offsets = tile.offsets()
    itemsize = np.dtype(tile.dtype).itemsize

    def cells() -> Iterator[str]:
        for r in range(tile.rows):
            for c in range(tile.cols):
                off = int(offsets[r, c])
                bank = off * itemsize // BANK_BYTES % BANKS
                # The swizzle permutes 16-byte chunks within a row: say which one it chose.
                chunk = (off - r * tile.cols) * itemsize // 16
                lines = (f"b{bank}", f"c{chunk}") if tile.swizzled else (f"b{bank}",)
                yield _cell(r, c, _bank_colour(bank), lines,
                            f"[{r}, {c}]: offset {off}, bank {bank}"
                            + (f", 16-byte chunk {chunk} of its row" if tile.swizzled else ""),
                            {"offset": off, "bank": bank})

    return _frame(tile.rows, tile.cols, title, cells())
