"""Helpers shared by the tests: real services, a scripted judge, runtimes and clients."""
