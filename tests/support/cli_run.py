"""Test utility: the ``pt2b`` command line run in this process, its stdout and stderr captured."""

from __future__ import annotations

import io
import sys

from exporter import cli


def run_cli(*argv):
    """(exit status, stdout, stderr) of ``pt2b ARGV...`` (each argument turned into a string)."""
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = out, err
    try:
        code = cli.main([str(a) for a in argv])
    finally:
        sys.stdout, sys.stderr = old
    return code, out.getvalue(), err.getvalue()
