"""`python -m exporter ...`: the same command line as `pt2b ...` (exporter/cli/)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
