"""
mqproxy.model
~~~~~~~~~~~~~

The shared message model: messages as produced and as stored, send and pull results, topic and group
metadata, filters (tags and SQL92), message ids, topic naming rules, well-known property keys and the one
error tree. Plain data and pure functions: codecs, protocols, the facade and every backend import it; it
imports nothing else of mqproxy.
"""
