"""The opset explorer: the decomposition audit, coverage, the explorer page."""
