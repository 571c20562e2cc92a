"""`python -m exporter ...`: the same command line as `pt2b ...` (exporter/cli/)."""

from .cli import console

if __name__ == "__main__":
    console()
