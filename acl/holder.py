"""
mqproxy.acl.holder
~~~~~~~~~~~~~~~~~~

:class:`AclHolder` keeps the live :class:`~mqproxy.acl.rules.AclRules`. Protocol layers read ``.rules`` on
every check (``None`` means no ``[acl] file`` is configured: nothing is checked); a reload calls
:meth:`AclHolder.replace`, an atomic attribute swap, so a check sees either the old or the new rules whole.
"""

from __future__ import annotations

from mqproxy.acl.rules import AclRules

__all__ = ["AclHolder"]


class AclHolder:
    """The current rules; swapped whole on reload."""

    def __init__(self, rules: AclRules | None = None) -> None:
        self.rules: AclRules | None = rules
        #: Bumped on every replace, so caches keyed on the rules can notice a reload.
        self.generation = 0

    def replace(self, rules: AclRules) -> None:
        self.rules = rules
        self.generation += 1
