"""``python -m jaxtile``: the ``jaxtile`` command (see :mod:`jaxtile.cli`)."""

import sys

from jaxtile.cli import main

sys.exit(main())
