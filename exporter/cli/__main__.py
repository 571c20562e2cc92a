"""`python -m exporter.cli ...`: the same command line as `pt2b ...`."""

from . import console

if __name__ == "__main__":
    console()
