"""General utilities the package uses in several places, owned by no pipeline step: atomic file
replacement (atomic.py) and pausing the cyclic garbage collector (gc_pause.py)."""
