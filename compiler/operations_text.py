"""What each Tile IR operation computes, in words, for ``docs/operations.md``.

:data:`DESCRIPTIONS` maps an operation's name in that page -- an op kind (``"reduce"``), or
a kind and its function (``"elementwise.exp"``) -- to markdown that
:mod:`.operations_doc` prints under the operation; ``tests/compiler/test_operation_matrix.py``
checks that every name is one the page lists.
"""

DESCRIPTIONS: dict[str, str] = {}
