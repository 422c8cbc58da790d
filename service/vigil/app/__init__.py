"""Vigil's processes and command line, assembled from the stages."""
