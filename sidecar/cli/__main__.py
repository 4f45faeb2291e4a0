"""`python -m sidecar.cli`: the `mqfed` command."""

import sys

from sidecar.cli.main import main

sys.exit(main())
