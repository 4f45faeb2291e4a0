"""The `mqfed` command line: one module per command, `main` builds the parser.

`sidecar.cli:main` is the console script's entry point and `python -m sidecar.cli` runs it.
The rest of `sidecar` must not import this package (the commands import the rest).
"""

from __future__ import annotations

from sidecar.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
