"""General utilities the package uses in several places, owned by no pipeline step: atomic file
replacement (atomic.py), pausing the cyclic garbage collector (gc_pause.py), text shown as visible escapes
(visible.py) and more (docs/architecture.md lists them)."""
