"""``python benchmarks/bench_decode.py ...``: the decode half of ``genrec bench kernels`` (see :mod:`genrec.bench.decode`)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from genrec.bench.decode import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
