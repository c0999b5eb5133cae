"""Building the hand-written kernels of tests/emulator/kernels for the emulator."""

from pathlib import Path

from jaxtile.compiler.emulator import Buffer, EmulatedKernel, LaunchConfig, Scalar

KERNELS = Path(__file__).parent / "kernels"


def kernel_source(name: str) -> str:
    """The text of tests/emulator/kernels/<name>.cu."""
    return (KERNELS / f"{name}.cu").read_text()


def mutate(source: str, tag: str, old: str, new: str) -> str:
    """`source` with `old` replaced by `new` on the single line marked `// MUTATE:<tag>`."""
    lines = source.splitlines(keepends=True)
    marked = [i for i, line in enumerate(lines) if f"MUTATE:{tag}" in line]
    assert len(marked) == 1, f"exactly one line must be marked MUTATE:{tag}"
    i = marked[0]
    assert old in lines[i], f"{old!r} is not on the line marked MUTATE:{tag}"
    lines[i] = lines[i].replace(old, new)
    return "".join(lines)


def marked_line(source: str, tag: str) -> int:
    """1-based number of the line marked `// MUTATE:<tag>`."""
    return next(n for n, line in enumerate(source.splitlines(), 1) if f"MUTATE:{tag}" in line)


def gemm(M: int, N: int, K: int, source: str | None = None) -> EmulatedKernel:
    """gemm_f16.cu for C[M, N] = A[M, K] @ B[K, N] (f16 in, f32 out)."""
    return EmulatedKernel.build(
        source or kernel_source("gemm_f16"),
        "gemm_f16",
        [
            Buffer("A", "float16"),
            Buffer("B", "float16"),
            Buffer("C", "float32"),
            Scalar("M", M),
            Scalar("N", N),
            Scalar("K", K),
        ],
        LaunchConfig(((N + 127) // 128, (M + 127) // 128, 1), (128, 1, 1)),
        file="gemm_f16.cu",
    )


def softmax(rows: int, n: int, source: str | None = None) -> EmulatedKernel:
    """softmax_rows.cu over a rows x n f32 matrix (one warp per row)."""
    return EmulatedKernel.build(
        source or kernel_source("softmax_rows"),
        "softmax_rows",
        [Buffer("x", "float32"), Buffer("y", "float32"), Scalar("rows", rows), Scalar("n", n)],
        LaunchConfig(((rows + 3) // 4, 1, 1), (128, 1, 1)),
        file="softmax_rows.cu",
    )


def block_sum(blocks: int, source: str | None = None) -> EmulatedKernel:
    """block_sum.cu: one sum per 128 floats."""
    return EmulatedKernel.build(
        source or kernel_source("block_sum"),
        "block_sum",
        [Buffer("x", "float32"), Buffer("y", "float32")],
        LaunchConfig((blocks, 1, 1), (128, 1, 1)),
        file="block_sum.cu",
    )
