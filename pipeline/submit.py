"""Entry point for `spark-submit pipeline/submit.py --traces DIR [--out DIR] [--json]`.

The same job as `mqfed audit`; spark-submit's `--master` (and other settings) apply.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != here]
    from sidecar.cli import main

    raise SystemExit(main(["audit", *sys.argv[1:]]))
