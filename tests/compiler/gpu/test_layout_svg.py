"""``Lowered.plot_layout``: SVG pictures of CUDA tile layouts, read back with an XML parser
and checked against the PTX ISA's fragment table and jaxtile's documented swizzle
(docs/ptx_facts.md), written out here independently of compiler/gpu/layout.py."""

import sys
import xml.etree.ElementTree as ET

import jax.numpy as jnp
import numpy as np
import pytest

import jaxtile as jt


@jt.kernel(threads=128)
def matmul(a, b, *, bm=64, bn=64, bk=32):
    m, _ = a.shape
    _, n = b.shape
    out = jt.empty((m, n), jnp.float32)
    i, j = jt.grid(m // bm, n // bn)
    a_s = jt.shared((bm, bk), a.dtype)
    b_s = jt.shared((bk, bn), b.dtype)
    acc = jt.fragment((bm, bn), jnp.float32)
    acc[...] = jnp.zeros((bm, bn), jnp.float32)

    @jt.pipelined(a.shape[1] // bk, stages=2)
    def _(kk):
        jt.copy(a.at[i * bm, kk * bk], a_s)
        jt.copy(b.at[kk * bk, j * bn], b_s)
        jt.gemm(a_s, b_s, acc)

    jt.copy(acc, out.at[i * bm, j * bn])
    return out


@pytest.fixture(scope="module")
def lowered():
    a = jnp.ones((128, 128), jnp.float16)
    return matmul.lower(a, a, target="cuda:sm_80")


def _cells(svg: str) -> dict[tuple[int, int], dict[str, str]]:
    root = ET.fromstring(svg)
    rects = root.iter("{http://www.w3.org/2000/svg}rect")
    return {(int(r.get("data-row")), int(r.get("data-col"))): r.attrib for r in rects}


def _mma_c_owner(row: int, col: int, wm: int, wn: int, rows: int, cols: int):
    """(thread, slot) of the f32 accumulator element at (row, col) of a rows x cols tile over
    wm x wn warps (row-major), from the PTX ISA's m16n8k16 C/D table: lane L = 4 g + t holds
    c0, c1 at row g, columns 2t, 2t + 1 of an m16n8 atom, and c2, c3 at row g + 8."""
    warp_rows, warp_cols = rows // wm, cols // wn
    warp = row // warp_rows * wn + col // warp_cols
    r, c = row % warp_rows, col % warp_cols
    atom_m, atom_n = r // 16, c // 8
    g, t = r % 16 % 8, c % 8 // 2
    i = 2 * (r % 16 >= 8) + c % 2
    slot = (atom_m * (warp_cols // 8) + atom_n) * 4 + i
    return 32 * warp + 4 * g + t, slot


def test_an_accumulator_picture_shows_the_ptx_fragment_owners(lowered):
    svg = lowered.plot_layout("acc")
    assert "#mma(m16n8k16, warps 2x2)" in svg
    cells = _cells(svg)
    assert len(cells) == 64 * 64
    for (row, col), cell in cells.items():
        thread, slot = _mma_c_owner(row, col, 2, 2, 64, 64)
        assert (int(cell["data-thread"]), int(cell["data-slot"])) == (thread, slot), (row, col)
        assert cell["data-replicas"] == "1"
    # The cell says it in words too: thread 5 is lane 5 (g = 1, t = 1), c1 of atom (0, 0).
    assert _cells(svg)[(1, 3)]["data-thread"] == "5"
    assert "T5" in svg and "<title>[1, 3]: thread 5 (warp 0, lane 5), slot 1</title>" in svg
    # The IR name draws the same picture.
    assert lowered.plot_layout("frag0") == svg


def test_a_shared_operand_picture_shows_its_swizzle_and_banks(lowered, tmp_path):
    path = tmp_path / "a_s.svg"
    svg = lowered.plot_layout("a_s", path=str(path))
    assert path.read_text() == svg
    assert "swizzled" in svg
    cells = _cells(svg)
    assert len(cells) == 64 * 32
    for (row, col), cell in cells.items():
        # 64-byte rows of float16: 16-byte chunk ^ ((row / 2) % 4), 8 halves per chunk.
        chunk = col // 8 ^ row // 2 % 4
        offset = row * 32 + chunk * 8 + col % 8
        assert int(cell["data-offset"]) == offset, (row, col)
        assert int(cell["data-bank"]) == offset * 2 // 4 % 32, (row, col)
    # What the swizzle is for: the 8 rows one ldmatrix phase reads (16 bytes each) fall in 8
    # distinct groups of 4 banks.
    groups = {int(cells[(row, 0)]["data-bank"]) // 4 for row in range(8)}
    assert len(groups) == 8


def test_an_unknown_tile_is_an_error_naming_the_tiles(lowered):
    tiles = r"a_s \(smem0\), b_s \(smem1\), acc \(frag0\)"
    with pytest.raises(jt.KernelError, match=rf"'nope'.*{tiles}"):
        lowered.plot_layout("nope")
    with pytest.raises(jt.KernelError, match="no on-chip tile named 'a'"):
        lowered.plot_layout("a")  # an input, not an on-chip tile


def test_a_cpu_lowering_has_no_layouts():
    a = jnp.ones((128, 128), jnp.float16)
    with pytest.raises(jt.KernelError, match="has no GPU code"):
        matmul.lower(a, a).plot_layout("acc")


def _small_picture():
    from jaxtile.compiler.gpu import layout, layout_svg

    return layout_svg.fragment_picture(layout.mma_accumulator((16, 8), (1, 1)), "16 x 8")


def test_a_png_shows_each_cell_in_its_colour(tmp_path):
    image = pytest.importorskip("matplotlib.image", reason="PNG pictures need matplotlib")
    from jaxtile.compiler.gpu import layout_svg as ls

    picture = _small_picture()
    path = tmp_path / "acc.png"
    picture.save_png(str(path))
    pixels = image.imread(str(path))
    height, width = pixels.shape[:2]
    # The axes span the whole figure: data x from -MARGIN/CELL_W to cols + MARGIN/CELL_W,
    # data y from -(TITLE_H + MARGIN)/CELL_H (top) to rows + MARGIN/CELL_H (bottom).
    x0, x1 = -ls.MARGIN / ls.CELL_W, picture.cols + ls.MARGIN / ls.CELL_W
    y0, y1 = -(ls.TITLE_H + ls.MARGIN) / ls.CELL_H, picture.rows + ls.MARGIN / ls.CELL_H
    for cell in picture.cells:
        # Near the cell's top-left corner, clear of its border and its text.
        px = int((cell.col + 0.15 - x0) / (x1 - x0) * width)
        py = int((cell.row + 0.12 - y0) / (y1 - y0) * height)
        np.testing.assert_allclose(pixels[py, px, :3], cell.rgb, atol=0.02,
                                   err_msg=str((cell.row, cell.col)))
    # Lane 5 (g = 1, t = 1) holds c1 of the atom at row 1, column 3, and the cell says so.
    cell = next(c for c in picture.cells if (c.row, c.col) == (1, 3))
    assert cell.lines == ("T5", "r1")


def test_a_png_without_matplotlib_is_a_clear_error(lowered, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    with pytest.raises(jt.KernelError, match="needs matplotlib"):
        lowered.plot_layout("acc", str(tmp_path / "acc.png"))
    assert not (tmp_path / "acc.png").exists()
