"""`python -m exporter.cli ...`: the same command line as `pt2b ...`."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
