"""Trace loaders and generators: everything becomes a `JobTrace`."""
