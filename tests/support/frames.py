"""What a block of a test left for the garbage collector: the frames of Vigil's code in cycles.

Only Vigil's own modules count, by the package's directory: a checkout under a folder named ``vigil``
(its ``.venv`` inside) put every library's frames under a path with ``/vigil/`` in it, and the
TestClient's own garbage (anyio's, starlette's) failed the check whatever Vigil did.
"""

from __future__ import annotations

import gc
import os
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager

import vigil

PACKAGE = os.path.dirname(os.path.abspath(vigil.__file__)) + os.sep


def _vigils(frames: list[types.FrameType]) -> list[str]:
    return sorted({f.f_code.co_name for f in frames if os.path.abspath(f.f_code.co_filename).startswith(PACKAGE)})


@contextmanager
def garbage_frames(finished: frozenset[str] = frozenset()) -> Iterator[list[str]]:
    """The names of Vigil's frames that the block left for the garbage collector (filled on exit), and of
    those named in ``finished`` (functions the block ran to their end) still alive at all: an error that
    something else still refers to (an answered request's future) is not garbage yet, but will be. A frame
    some thread is running at the end is not one of those (another thread's function of the same name)."""
    held: list[str] = []
    gc.collect()
    gc.disable()
    try:
        yield held
        running: set[int] = set()
        for top in sys._current_frames().values():
            f: types.FrameType | None = top
            while f is not None:
                running.add(id(f))
                f = f.f_back
        alive = [
            o
            for o in gc.get_objects()
            if isinstance(o, types.FrameType) and o.f_code.co_name in finished and id(o) not in running
        ]
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        frames = [o for o in gc.garbage if isinstance(o, types.FrameType)] + alive
        held += _vigils(frames)
        del alive, frames
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
