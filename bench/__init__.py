"""Benchmarks: run from the checkout as ``python -m bench.<name>``; each prints its figures."""
