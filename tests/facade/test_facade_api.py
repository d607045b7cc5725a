"""The seam: every implementation of BrokerFacade offers every member with the same parameters."""

from __future__ import annotations

import inspect

import pytest

from mqproxy.backends.embedded.broker import EmbeddedBroker
from mqproxy.facade import api
from mqproxy.facade.routing import RoutingFacade

IMPLEMENTATIONS = [EmbeddedBroker, RoutingFacade]


def _members(protocol: type) -> dict[str, object]:
    members: dict[str, object] = {}
    for klass in reversed(protocol.__mro__):
        if klass in (object,) or not getattr(klass, "_is_protocol", False):
            continue
        for name, value in vars(klass).items():
            if not name.startswith("_"):
                members[name] = value
    return members


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS, ids=lambda c: c.__name__)
def test_implementation_has_every_member_with_its_parameters(implementation: type) -> None:
    members = _members(api.BrokerFacade)
    assert len(members) > 40
    for name, declared in members.items():
        assert hasattr(implementation, name), f"{implementation.__name__} lacks {name}"
        actual = getattr(implementation, name)
        if isinstance(declared, property):
            assert isinstance(actual, property), name
            continue
        want = inspect.signature(declared)  # type: ignore[arg-type]
        got = inspect.signature(actual)
        assert list(got.parameters) == list(want.parameters), name
        for param in want.parameters.values():
            assert got.parameters[param.name].kind == param.kind, (name, param.name)
        assert inspect.iscoroutinefunction(actual) == inspect.iscoroutinefunction(declared), name


def test_roles_do_not_overlap() -> None:
    roles = [api.Producing, api.Consuming, api.Popping, api.Offsets, api.Locking, api.Membership, api.Admin,
             api.LightQueues]
    seen: dict[str, str] = {}
    for role in roles:
        for name in vars(role):
            if name.startswith("_"):
                continue
            assert name not in seen, f"{name} is in {seen.get(name)} and {role.__name__}"
            seen[name] = role.__name__


#: Synchronous members the facade docstring accounts for: cached metadata or configuration, registrations
#: of things this process owns, and metrics gauges. Anything else a broker answers must be ``async``.
_SYNC_BY_DESIGN = {
    "topic_type",
    "group_config",
    "clamp_delay_level",
    "max_reconsume_times",
    "add_check_back",
    "set_lmq_dispatch",
    "watch_groups",
    "announce_producer",
    "unresolved_transactions",
    "pops_in_flight",
}


def test_only_cached_registered_or_gauge_members_are_synchronous() -> None:
    sync = {
        name
        for name, value in _members(api.BrokerFacade).items()
        if isinstance(value, property) or not inspect.iscoroutinefunction(value)
    }
    assert sync <= _SYNC_BY_DESIGN, sorted(sync - _SYNC_BY_DESIGN)
    for name in _SYNC_BY_DESIGN:
        assert name in (api.__doc__ or ""), f"the facade docstring does not account for {name}"
