"""Every error Vigil raises on purpose descends from :class:`VigilError`."""

import traceback


class VigilError(Exception):
    """Base class of Vigil's own errors."""


class ConfigError(VigilError):
    """A setting, rule pack or judge definition is invalid. The message names the file and field."""


FRAMES_DROPPED = "Traceback (most recent call last; kept as text, its frames dropped):"


def without_frames(exc: BaseException) -> None:
    """Drop the frames ``exc`` carries (its traceback, and its causes' and contexts'), keeping their text.

    A caught error's traceback holds the frames it was raised through and, from them, every frame below
    up to the thread's first: their locals stay alive as long as the error does. A library that keeps
    the error in a local of a frame it was raised through (SQLAlchemy wrapping a driver's error does)
    makes a cycle, freed only when the garbage collector next runs, whatever the caller did with it.
    Called on an error handled and not raised again, it frees those locals at once.

    Each traceback is first written out as a note on its error (file, line, function and source line;
    no locals): a later error raised while this one is handled (a split batch's half, a dead letter's
    write) is logged with this one as its context, and the log then still says where this one came from."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if e.__traceback__ is not None:
            e.add_note(FRAMES_DROPPED + "\n" + "".join(traceback.format_tb(e.__traceback__)).rstrip("\n"))
            e.__traceback__ = None
        e = e.__cause__ or e.__context__
