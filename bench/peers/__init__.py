"""Other servers hosting the same pipeline, for side-by-side comparison."""
