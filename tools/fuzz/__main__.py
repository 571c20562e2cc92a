"""``python -m tools.fuzz``: the fuzzer's command line (tools/fuzz/cli.py)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
