"""Developer tools of pt2b (not installed with the package): the test corpora (corpus/), the artifact fuzzer,
the real-model sweep, the release matrix."""
