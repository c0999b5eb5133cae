"""What a ``jt.print`` line looks like, in one place for every backend.

A line is the block's tag, then the format's literal pieces interleaved with the values:
``[block 3] row 3 max 2.5`` (``[block (1, 0)] ...`` on a grid of several axes, batch axes
last). Values are scalars, written as C's ``printf`` writes them so that every backend prints
the same text: integers in decimal, floats with ``%g`` (six significant digits; every NaN as
``nan``: its sign bit differs between backends' arithmetic), bools as ``True``/``False``.
The reference semantics render the line in Python (:func:`render`), the CPU runtime and the
device header in C.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any

import numpy as np


def pieces(fmt: str, count: int) -> tuple[str, ...] | str:
    """The literal pieces around ``fmt``'s ``{}`` placeholders (one more than their number),
    or a message saying why ``fmt`` does not fit ``count`` values."""
    if not isinstance(fmt, str):
        return f"the format must be a str, got {type(fmt).__name__}"
    out, text = [], ""
    try:
        parsed = list(string.Formatter().parse(fmt))
    except ValueError as e:
        return f"bad format {fmt!r}: {e} (write a literal brace as {{{{ or }}}})"
    for literal, field, spec, conversion in parsed:
        text += literal
        if field is None:
            continue
        if field or spec or conversion:
            given = "{" + field + ("!" + conversion if conversion else "") + (
                ":" + spec if spec else "") + "}"
            return (f"placeholder {given} in {fmt!r}: only plain {{}} placeholders are "
                    "supported (values print as C's printf does: %d, %g)")
        out.append(text)
        text = ""
    out.append(text)
    if "\0" in fmt:
        return "the format contains a NUL character"
    if len(out) - 1 != count:
        return (f"the format {fmt!r} has {len(out) - 1} placeholder(s) for {count} "
                f"value(s)")
    return tuple(out)


def tag(indices: Sequence[int]) -> str:
    """The tag of the block at ``indices``: ``[block 3] `` or ``[block (1, 0)] ``."""
    inner = str(indices[0]) if len(indices) == 1 else \
        "(" + ", ".join(str(i) for i in indices) + ")"
    return f"[block {inner}] "


def segments(text: Sequence[str], tag: int) -> list[str | int]:
    """The line of a ``print`` op as literal strings and operand positions (into its
    operands after the condition: the ``tag`` block indices, then the values), in order;
    what the compiled backends write piece by piece."""
    out: list[str | int] = []
    if tag:
        out.append("[block " + ("(" if tag > 1 else ""))
        for i in range(tag):
            out += [i] if i == 0 else [", ", i]
        out.append(")] " if tag > 1 else "] ")
    out.append(text[0])
    for k, piece in enumerate(text[1:]):
        out += [tag + k, piece]
    return [x for x in out if x != ""]


def render_value(value: Any) -> str:
    """One scalar as the C backends print it (see the module doc)."""
    v = np.asarray(value)
    if v.dtype == np.bool_:
        return "True" if bool(v) else "False"
    if np.issubdtype(v.dtype, np.integer):
        return str(int(v))
    return f"{float(v):g}"


def render(text: Sequence[str], indices: Sequence[int], values: Sequence[Any]) -> str:
    """The whole line (without its newline)."""
    line = tag(indices) + text[0]
    for v, piece in zip(values, text[1:]):
        line += render_value(v) + piece
    return line


def kind(dtype: Any) -> str:
    """How a value of ``dtype`` is printed: ``bool``, ``int`` (signed, as int64), ``uint``
    (as uint64) or ``float`` (as double)."""
    d = np.dtype(dtype)
    if d == np.bool_:
        return "bool"
    if np.issubdtype(d, np.signedinteger):
        return "int"
    if np.issubdtype(d, np.unsignedinteger):
        return "uint"
    return "float"


def c_string(text: str) -> str:
    """``text`` as a C string literal (UTF-8; non-ASCII and control bytes as octal escapes,
    which unlike hex escapes cannot swallow a following digit)."""
    out = []
    for b in text.encode():
        c = chr(b)
        if c in '"\\':
            out.append("\\" + c)
        elif 0x20 <= b < 0x7f and c != "?":  # "?" could start a trigraph
            out.append(c)
        else:
            out.append(f"\\{b:03o}")
    return '"' + "".join(out) + '"'


def printf_text(text: str) -> str:
    """Literal text made safe inside a printf format."""
    return text.replace("%", "%%")
