"""``python -m genrec.cli``: the ``genrec`` command."""

from __future__ import annotations

import sys

from genrec.cli import app

if __name__ == "__main__":
    app(sys.argv[1:])
