"""pt2b's test suite, grouped by area (one folder each); shared helpers live in tests/support/."""
