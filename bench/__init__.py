"""Benchmarks: the server against the engine limit and against itself without batching."""
