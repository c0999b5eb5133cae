"""Pictures of CUDA tile layouts, for ``Lowered.plot_layout``: SVG text, or a PNG through
matplotlib where it is installed.

A register tile (``fragment``): one cell per element, saying which thread holds it and in
which slot of that thread's local array (``T5`` / ``r3``), coloured by lane (hue) and warp
(lightness). A shared tile: one cell per element, saying the 4-byte bank its swizzled address
falls in, coloured by bank, so that a column of distinct colours shows a conflict-free access.

In the SVG each cell is a ``<rect>`` carrying its facts as ``data-*`` attributes
(``data-row``, ``data-col``, then ``data-thread``/``data-slot`` or ``data-offset``/
``data-bank``) and a ``<title>`` tooltip, so that a test or a script can read the picture back
with any XML parser. The SVG is plain text: no drawing library is needed.
"""

from __future__ import annotations

import colorsys
import dataclasses
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


@dataclasses.dataclass(frozen=True)
class Cell:
    """One element of the tile: where it is drawn, its colour and what it says."""

    row: int
    col: int
    hue: int
    """Degrees."""
    saturation: int
    lightness: int
    """Percent."""
    lines: tuple[str, ...]
    title: str
    """The tooltip: the cell's facts in words."""
    data: dict[str, int]

    @property
    def rgb(self) -> tuple[float, float, float]:
        return colorsys.hls_to_rgb(self.hue / 360, self.lightness / 100, self.saturation / 100)


@dataclasses.dataclass(frozen=True)
class Picture:
    """A tile's cells and a title, drawn as SVG (:meth:`svg`) or PNG (:meth:`save_png`)."""

    rows: int
    cols: int
    title: str
    cells: tuple[Cell, ...]

    def svg(self) -> str:
        width = 2 * MARGIN + self.cols * CELL_W
        height = TITLE_H + 2 * MARGIN + self.rows * CELL_H
        top = TITLE_H + MARGIN
        out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
               f'viewBox="0 0 {width} {height}" font-family="monospace">',
               f'<text x="{MARGIN}" y="{TITLE_H - 6}" font-size="14">{escape(self.title)}</text>']
        # Column numbers above and row numbers left of the grid.
        out += [f'<text x="{MARGIN + c * CELL_W + CELL_W // 2}" y="{top - 6}" font-size="9" '
                f'text-anchor="middle">{c}</text>' for c in range(self.cols)]
        out += [f'<text x="{MARGIN - 4}" y="{top + r * CELL_H + CELL_H // 2 + 3}" '
                f'font-size="9" text-anchor="end">{r}</text>' for r in range(self.rows)]
        for cell in self.cells:
            x, y = MARGIN + cell.col * CELL_W, top + cell.row * CELL_H
            fill = f"hsl({cell.hue}, {cell.saturation}%, {cell.lightness}%)"
            attrs = " ".join(f"data-{k}={quoteattr(str(v))}" for k, v in cell.data.items())
            text = "".join(
                f'<text x="{x + CELL_W // 2}" y="{y + 10 + 9 * i}" font-size="8" '
                f'text-anchor="middle">{escape(line)}</text>' for i, line in enumerate(cell.lines))
            out.append(f'<g><rect x="{x}" y="{y}" width="{CELL_W}" height="{CELL_H}" '
                       f'fill="{fill}" stroke="white" data-row="{cell.row}" '
                       f'data-col="{cell.col}" {attrs}><title>{escape(cell.title)}</title>'
                       f"</rect>{text}</g>")
        out.append("</svg>")
        return "\n".join(out) + "\n"

    def save_png(self, path: str) -> None:
        """Draw the picture with matplotlib (ImportError where it is not installed)."""
        import matplotlib

        matplotlib.use("Agg")  # no display needed, and none is touched
        from matplotlib import pyplot as plt

        scale = 1 / 72  # the SVG's pixel sizes, as inches at 72 dpi
        fig = plt.figure(figsize=((2 * MARGIN + self.cols * CELL_W) * scale,
                                  (TITLE_H + 2 * MARGIN + self.rows * CELL_H) * scale))
        ax = fig.add_axes((0, 0, 1, 1))
        ax.set_xlim(-MARGIN / CELL_W, self.cols + MARGIN / CELL_W)
        ax.set_ylim(self.rows + MARGIN / CELL_H, -(TITLE_H + MARGIN) / CELL_H)
        ax.axis("off")
        ax.text(-MARGIN / CELL_W, -(MARGIN + 6) / CELL_H, self.title, fontsize=10,
                family="monospace")
        for c in range(self.cols):
            ax.text(c + 0.5, -6 / CELL_H, str(c), fontsize=5, ha="center", va="bottom")
        for r in range(self.rows):
            ax.text(-4 / CELL_W, r + 0.5, str(r), fontsize=5, ha="right", va="center")
        for cell in self.cells:
            ax.add_patch(matplotlib.patches.Rectangle((cell.col, cell.row), 1, 1,
                                                      facecolor=cell.rgb, edgecolor="white"))
            ax.text(cell.col + 0.5, cell.row + 0.5, "\n".join(cell.lines), fontsize=5,
                    ha="center", va="center", family="monospace")
        fig.savefig(path, dpi=144)
        plt.close(fig)


def fragment_picture(layout: Layout, title: str) -> Picture:
    """A 1-D or 2-D register tile's layout: for each element, the thread that holds it (the
    lowest, with how many others hold copies where the layout replicates) and its slot in
    that thread's local array."""
    if len(layout.shape) not in (1, 2):
        raise ValueError(f"a picture of a {len(layout.shape)}-D tile: only 1-D and 2-D tiles "
                         "are drawn")
    threads, slots = layout.owners()
    if len(layout.shape) == 1:
        threads, slots = threads[None], slots[None]
    rows, cols = slots.shape
    cells = []
    for r in range(rows):
        for c in range(cols):
            holders = [int(t) for t in threads[r, c] if t >= 0]
            t, k = holders[0], int(slots[r, c])
            copies = f" (also threads {', '.join(map(str, holders[1:]))})" \
                if len(holders) > 1 else ""
            # Neighbouring lanes far apart in hue (11 is coprime with 32); odd warps darker.
            cells.append(Cell(r, c, t % 32 * 11 % 32 * 360 // 32, 65,
                              82 if t // 32 % 2 == 0 else 68, (f"T{t}", f"r{k}"),
                              f"[{r}, {c}]: thread {t} (warp {t // 32}, lane {t % 32}), "
                              f"slot {k}{copies}",
                              {"thread": t, "slot": k, "replicas": len(holders)}))
    return Picture(rows, cols, title, tuple(cells))


def shared_picture(tile: SharedTile, title: str) -> Picture:
    """A shared tile: for each element, its element offset in the buffer (the swizzle's
    permutation) and the bank its first byte falls in."""
    offsets = tile.offsets()
    itemsize = np.dtype(tile.dtype).itemsize
    # A wgmma tile's rows are ``span``-byte pieces of column blocks; the others' whole rows.
    row_bytes = tile.span or tile.cols * itemsize
    cells = []
    for r in range(tile.rows):
        for c in range(tile.cols):
            off = int(offsets[r, c])
            bank = off * itemsize // BANK_BYTES % BANKS
            # The swizzle permutes 16-byte chunks within a row: say which one it chose.
            chunk = off * itemsize % row_bytes // 16
            lines = (f"b{bank}", f"c{chunk}") if tile.swizzled else (f"b{bank}",)
            cells.append(Cell(r, c, bank * 11 % BANKS * 360 // BANKS, 70, 75, lines,
                              f"[{r}, {c}]: offset {off}, bank {bank}"
                              + (f", 16-byte chunk {chunk} of its row" if tile.swizzled
                                 else ""), {"offset": off, "bank": bank}))
    return Picture(tile.rows, tile.cols, title, tuple(cells))
