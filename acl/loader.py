"""
mqproxy.acl.loader
~~~~~~~~~~~~~~~~~~

Reading the account file from disk and noticing that it changed, without a clock or a task of its own:
:func:`load_acl_file` reads and parses it; :class:`FileStamp` is what a watcher compares between polls
(modification time in ns, size, inode), so an edit, a replace by rename or a removal is seen.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from mqproxy.acl.rules import AclFileError, AclRules, parse_acl

__all__ = ["FileStamp", "load_acl_file", "stamp_of"]


@dataclass(frozen=True, slots=True)
class FileStamp:
    mtime_ns: int
    size: int
    inode: int


def stamp_of(path: str) -> FileStamp | None:
    """The file's stamp, or None when it cannot be stat'ed (missing)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return FileStamp(st.st_mtime_ns, st.st_size, st.st_ino)


def load_acl_file(path: str) -> AclRules:
    """Read and parse ``path``; :class:`AclFileError` (no line) when it cannot be read or is not UTF-8."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise AclFileError(path, None, f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise AclFileError(path, None, f"not UTF-8: {exc.reason}") from None
    return parse_acl(text, path)
