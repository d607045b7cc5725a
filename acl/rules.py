"""
mqproxy.acl.rules
~~~~~~~~~~~~~~~~~

The RocketMQ ACL 1.0 account file (``plain_acl.yml``) parsed into immutable :class:`AclRules`.

Format (keys as RocketMQ's ``AclConstants``)::

    globalWhiteRemoteAddresses: ["10.10.103.*", "192.168.0.*"]
    accounts:
      - accessKey: RocketMQ
        secretKey: "12345678"
        whiteRemoteAddress: ""
        admin: false
        defaultTopicPerm: DENY
        defaultGroupPerm: SUB
        topicPerms: ["topicA=DENY", "topicB=PUB|SUB"]
        groupPerms: ["groupA=DENY", "groupB=PUB|SUB"]

A permission string is ``DENY``, ``PUB``, ``SUB``, ``PUB|SUB`` or ``SUB|PUB``; anything else means DENY,
as in RocketMQ. Group permissions are keyed by the plain group name (a ``%RETRY%`` prefix in the file is
removed). Structural problems (bad YAML, a missing key, a bad address pattern, a ``name=PERM`` item without
``=``, a repeated accessKey) raise :class:`AclFileError` with the line. An empty file has no accounts.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import yaml

from mqproxy.acl.addresses import compile_pattern

__all__ = ["RETRY_PREFIX", "Account", "AclFileError", "AclRules", "Perm", "parse_acl", "parse_perm"]

RETRY_PREFIX = "%RETRY%"


class Perm(enum.IntFlag):
    """RocketMQ ``Permission`` bits. DENY always wins; ANY asks for PUB or SUB."""

    DENY = 1
    ANY = 2
    PUB = 4
    SUB = 8


_PERMS = {
    "DENY": Perm.DENY,
    "PUB": Perm.PUB,
    "SUB": Perm.SUB,
    "PUB|SUB": Perm.PUB | Perm.SUB,
    "SUB|PUB": Perm.PUB | Perm.SUB,
}


def parse_perm(text: object) -> Perm:
    """RocketMQ's ``parsePermFromString``: the five known strings, anything else is DENY."""
    if not isinstance(text, str):
        return Perm.DENY
    return _PERMS.get(text.strip(), Perm.DENY)


def plain_group(group: str) -> str:
    """``%RETRY%g`` -> ``g``; other names unchanged."""
    return group[len(RETRY_PREFIX) :] if group.startswith(RETRY_PREFIX) else group


@dataclass(frozen=True)
class Account:
    """One ``accounts`` entry."""

    access_key: str
    secret_key: str
    white_remote_address: str
    admin: bool
    default_topic_perm: Perm
    default_group_perm: Perm
    topic_perms: Mapping[str, Perm]
    group_perms: Mapping[str, Perm]

    def __repr__(self) -> str:  # never print the secret
        return f"Account(access_key={self.access_key!r}, admin={self.admin})"


@dataclass(frozen=True)
class AclRules:
    """Every account by access key plus the global white address patterns."""

    accounts: Mapping[str, Account]
    global_white_remote_addresses: tuple[str, ...]

    def account(self, access_key: str) -> Account | None:
        return self.accounts.get(access_key)

    def globally_white(self, ip: str) -> bool:
        """Whether ``ip`` matches a global white pattern (such requests skip every check)."""
        return any(compile_pattern(pattern).matches(ip) for pattern in self.global_white_remote_addresses)

    def account_white(self, account: Account, ip: str) -> bool:
        """Whether ``ip`` matches the account's whiteRemoteAddress: such a request names the account but skips
        the signature, admin and permission checks, as RocketMQ's PlainPermissionManager does."""
        return compile_pattern(account.white_remote_address).matches(ip)


class AclFileError(ValueError):
    """A malformed account file; ``str()`` is ``path:line: message`` (``path: message`` without a line)."""

    def __init__(self, path: str, line: int | None, message: str) -> None:
        self.path = path
        self.line = line
        self.message = message
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {message}")


def parse_acl(text: str, path: str) -> AclRules:
    """Parse the file's text; ``path`` is only used in error messages."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        raise AclFileError(path, line, f"YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise AclFileError(path, None, f"YAML: {exc}") from None
    return _Builder(path).rules(root)


class _Builder:
    """Walks the composed YAML node tree so every error can name its line."""

    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, node: yaml.Node | None, message: str) -> AclFileError:
        return AclFileError(self.path, node.start_mark.line + 1 if node is not None else None, message)

    def rules(self, root: yaml.Node | None) -> AclRules:
        if root is None or (isinstance(root, yaml.ScalarNode) and root.tag.endswith(":null")):
            return AclRules(MappingProxyType({}), ())
        top = self.mapping(root, "the file")
        white = tuple(self.address(item) for item in self.sequence(top.get("globalWhiteRemoteAddresses")))
        accounts: dict[str, Account] = {}
        for item in self.sequence(top.get("accounts")):
            account = self.account(item)
            if account.access_key in accounts:
                raise self.fail(item, f"accessKey {account.access_key!r} is defined twice")
            accounts[account.access_key] = account
        return AclRules(MappingProxyType(accounts), white)

    def mapping(self, node: yaml.Node, what: str) -> dict[str, yaml.Node]:
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, f"{what} must be a mapping")
        out: dict[str, yaml.Node] = {}
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode):
                raise self.fail(key, "keys must be plain names")
            out[key.value] = value
        return out

    def sequence(self, node: yaml.Node | None) -> list[yaml.Node]:
        if node is None or (isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null")):
            return []
        if not isinstance(node, yaml.SequenceNode):
            raise self.fail(node, "expected a list")
        return list(node.value)

    def scalar(self, node: yaml.Node | None, what: str, *, required: bool = False) -> str:
        if node is not None and not isinstance(node, yaml.ScalarNode):
            raise self.fail(node, f"{what} must be a single value")
        value = "" if node is None or node.tag.endswith(":null") else str(node.value)
        if required and not value.strip():
            raise self.fail(node, f"{what} is missing or empty")
        return value

    def address(self, node: yaml.Node) -> str:
        pattern = self.scalar(node, "a white remote address")
        try:
            compile_pattern(pattern)
        except ValueError as exc:
            raise self.fail(node, f"white remote address: {exc}") from None
        return pattern

    def account(self, node: yaml.Node) -> Account:
        fields = self.mapping(node, "an account")
        access_key_node = fields.get("accessKey")
        if access_key_node is None:
            raise self.fail(node, "account without accessKey")
        access_key = self.scalar(access_key_node, "accessKey", required=True).strip()
        if "secretKey" not in fields:
            raise self.fail(node, f"account {access_key!r} has no secretKey")
        secret_key = self.scalar(fields["secretKey"], "secretKey", required=True)
        white_node = fields.get("whiteRemoteAddress")
        white = self.address(white_node) if white_node is not None else ""
        admin_node = fields.get("admin")
        admin = False
        if admin_node is not None:
            text = self.scalar(admin_node, "admin").strip().lower()
            if text not in ("true", "false", ""):
                raise self.fail(admin_node, f"admin must be true or false, not {text!r}")
            admin = text == "true"
        return Account(
            access_key=access_key,
            secret_key=secret_key,
            white_remote_address=white,
            admin=admin,
            default_topic_perm=parse_perm(self.scalar(fields.get("defaultTopicPerm"), "defaultTopicPerm")),
            default_group_perm=parse_perm(self.scalar(fields.get("defaultGroupPerm"), "defaultGroupPerm")),
            topic_perms=self.perms(fields.get("topicPerms"), group=False),
            group_perms=self.perms(fields.get("groupPerms"), group=True),
        )

    def perms(self, node: yaml.Node | None, *, group: bool) -> Mapping[str, Perm]:
        out: dict[str, Perm] = {}
        for item in self.sequence(node):
            text = self.scalar(item, "a permission item")
            name, eq, perm = text.partition("=")
            name = name.strip()
            if not eq or not name or "=" in perm:
                raise self.fail(item, f"permission item must be NAME=PERM, not {text!r}")
            out[plain_group(name) if group else name] = parse_perm(perm)
        return MappingProxyType(out)
