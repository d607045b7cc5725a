"""The ``[acl] file`` at start and on change.

:func:`initial_rules` reads it before the server binds (a malformed file is a
:class:`~mqproxy.settings.SettingsError` naming ``acl.file`` and ``path:line``, so ``mqproxy serve`` exits
with status 2). :func:`watch_acl_file` is the server's task that polls the file's stamp (modification time,
size, inode) every ``acl.reload_interval_s`` and re-reads it when that changed: a good file replaces the
rules (``acl.reloaded``), a malformed or unreadable one leaves the old rules in force
(``acl.reload_failed``, once per change).
"""

from __future__ import annotations

import structlog
import trio

from mqproxy.acl.holder import AclHolder
from mqproxy.acl.loader import FileStamp, load_acl_file, stamp_of
from mqproxy.acl.rules import AclFileError, AclRules
from mqproxy.settings import AclSettings, SettingsError

__all__ = ["initial_rules", "watch_acl_file"]

_log = structlog.get_logger("mqproxy.acl")


def initial_rules(settings: AclSettings) -> tuple[AclRules | None, FileStamp | None]:
    """The rules of ``settings.file`` (None when unset) and the file's stamp taken before it was read;
    :class:`SettingsError` when it is malformed or unreadable."""
    if not settings.file:
        return None, None
    stamp = stamp_of(settings.file)
    try:
        return load_acl_file(settings.file), stamp
    except AclFileError as exc:
        raise SettingsError(f"acl.file: {exc}") from None


async def watch_acl_file(
    settings: AclSettings,
    holder: AclHolder,
    stamp: FileStamp | None,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Reload ``settings.file`` into ``holder`` whenever its stamp differs from ``stamp`` (the one taken
    before the rules in force were read), until cancelled."""
    path = settings.file
    task_status.started()
    while True:
        await trio.sleep(settings.reload_interval_s)
        current = stamp_of(path)
        if current == stamp:
            continue
        stamp = current
        try:
            rules = await trio.to_thread.run_sync(load_acl_file, path)
        except AclFileError as exc:
            _log.error("acl.reload_failed", path=path, line=exc.line, detail=exc.message)
            continue
        holder.replace(rules)
        _log.info("acl.reloaded", path=path, accounts=len(rules.accounts))
