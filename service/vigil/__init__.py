"""Vigil: watches LLM agents in production."""

__version__ = "0.1.0"
