"""Freeing what a task's output files held once it is sent (output.py): the blocks before a position are punched out
(FALLOC_FL_PUNCH_HOLE), so on disk the files hold only what is not yet published, while offsets stay valid."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_PAGE = 4096
_libc: Any = None
_punch_works = True


def punch(path: Path, upto: int) -> None:
    """Free the blocks of `path` before `upto` (the file keeps its size and offsets; reads there return zeros)."""
    global _libc, _punch_works
    length = upto - upto % _PAGE
    if length <= 0 or not _punch_works:
        return
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if _libc.fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, 0, length) != 0:
            errno = ctypes.get_errno()
            _punch_works = False  # a file system without holes: the files just keep what was sent until the end
            log.warning("cannot free sent output (fallocate: %s); output files keep it until the task ends",
                        os.strerror(errno))  # fmt: skip
    finally:
        os.close(fd)
