"""Format versions and the operator schema table of pt2b artifacts."""
