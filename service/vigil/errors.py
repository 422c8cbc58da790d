"""Every error Vigil raises on purpose descends from :class:`VigilError`."""


class VigilError(Exception):
    """Base class of Vigil's own errors."""


class ConfigError(VigilError):
    """A setting, rule pack or judge definition is invalid. The message names the file and field."""


def without_frames(exc: BaseException) -> None:
    """Drop the frames ``exc`` carries (its traceback, and its causes' and contexts').

    A caught error's traceback holds the frames it was raised through and, from them, every frame below
    up to the thread's first: their locals stay alive as long as the error does. A library that keeps
    the error in a local of a frame it was raised through (SQLAlchemy wrapping a driver's error does)
    makes a cycle, freed only when the garbage collector next runs, whatever the caller did with it.
    Called on an error handled and not raised again, it frees those locals at once."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        e.__traceback__ = None
        e = e.__cause__ or e.__context__
