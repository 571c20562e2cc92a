"""runtime_ref: running lowered programs, planning from the graph table, grad-mode regions."""
