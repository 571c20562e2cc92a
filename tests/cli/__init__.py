"""The pt2b command line."""
