"""Topic names, topic filters and shared subscriptions (section 4.7 and 4.8.2), and `topic_matches`.

Rules enforced:
- a topic name (PUBLISH, will) is non-empty and has no `+` or `#` -> else 0x90 Topic Name Invalid;
- a topic filter is non-empty; `+` fills a whole level; `#` fills the whole last level -> else 0x8F;
- `$share/<group>/<filter>`: the group is non-empty without `/`, `+`, `#`; the filter is valid -> else 0x8F.
UTF-8 validity and U+0000 are checked where the string is decoded (encoding.py), as for every string.
"""

from __future__ import annotations

from dataclasses import dataclass

from mqproxy.codecs.mqtt.errors import MqttCodecError
from mqproxy.codecs.mqtt.reason_codes import ReasonCode

SHARE_PREFIX = "$share/"


@dataclass(frozen=True, slots=True)
class TopicFilter:
    """A parsed topic filter: `share_group` is set for `$share/<group>/<filter>`, and `filter` is the rest."""

    filter: str
    share_group: str | None = None

    @property
    def has_wildcards(self) -> bool:
        """True if the filter contains `+` or `#`."""
        return "+" in self.filter or "#" in self.filter


def validate_topic_name(topic: str) -> None:
    """Raise MqttCodecError(0x90) unless `topic` is a valid PUBLISH / will topic name."""
    if not topic:
        raise MqttCodecError(ReasonCode.TOPIC_NAME_INVALID, "topic name is empty")
    if "+" in topic or "#" in topic:
        raise MqttCodecError(ReasonCode.TOPIC_NAME_INVALID, f"wildcard in topic name {topic!r}")


def _check_filter_levels(topic_filter: str) -> None:
    if not topic_filter:
        raise MqttCodecError(ReasonCode.TOPIC_FILTER_INVALID, "topic filter is empty")
    if "+" not in topic_filter and "#" not in topic_filter:
        return
    levels = topic_filter.split("/")
    last = len(levels) - 1
    for index, level in enumerate(levels):
        if level in ("+", "#"):
            if level == "#" and index != last:
                raise MqttCodecError(ReasonCode.TOPIC_FILTER_INVALID, f"'#' not last in {topic_filter!r}")
        elif "+" in level or "#" in level:
            raise MqttCodecError(
                ReasonCode.TOPIC_FILTER_INVALID, f"wildcard does not fill a level in {topic_filter!r}"
            )


def parse_topic_filter(topic_filter: str) -> TopicFilter:
    """Validate a SUBSCRIBE / UNSUBSCRIBE topic filter and split off a `$share/<group>/` prefix.

    Raises MqttCodecError(0x8F Topic Filter Invalid).
    """
    if topic_filter.startswith(SHARE_PREFIX):
        group, sep, inner = topic_filter[len(SHARE_PREFIX) :].partition("/")
        if not sep or not group or "+" in group or "#" in group:
            raise MqttCodecError(ReasonCode.TOPIC_FILTER_INVALID, f"bad shared subscription {topic_filter!r}")
        _check_filter_levels(inner)
        return TopicFilter(inner, group)
    _check_filter_levels(topic_filter)
    return TopicFilter(topic_filter)


def topic_matches(topic_filter: str, topic: str) -> bool:
    """True if the topic name `topic` matches `topic_filter` (a valid filter, possibly `$share/...`).

    A leading `+` or `#` never matches a topic that starts with `$` ([MQTT-4.7.2-1]); `a/#` also matches `a`.
    """
    if topic_filter.startswith(SHARE_PREFIX):
        topic_filter = topic_filter[len(SHARE_PREFIX) :].partition("/")[2]
    if "+" not in topic_filter and "#" not in topic_filter:
        return topic_filter == topic
    if topic.startswith("$") and topic_filter[0] in "+#":
        return False
    filter_levels = topic_filter.split("/")
    topic_levels = topic.split("/")
    for index, level in enumerate(filter_levels):
        if level == "#":
            return True
        if index >= len(topic_levels):
            return False
        if level != "+" and level != topic_levels[index]:
            return False
    return len(filter_levels) == len(topic_levels)
