"""Developer tools of pt2b (not installed with the package): the artifact fuzzer."""
