"""Every error Vigil raises on purpose descends from :class:`VigilError`."""


class VigilError(Exception):
    """Base class of Vigil's own errors."""


class ConfigError(VigilError):
    """A setting, rule pack or judge definition is invalid. The message names the file and field."""
