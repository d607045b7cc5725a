"""
mqproxy.runtime
~~~~~~~~~~~~~~~

What a protocol handler gets from the server core at run time, without importing the core: its
connection's context (:mod:`.context`), the stream wrappers the pipeline hands it (:mod:`.streams`), the
shape of a protocol service the core routes connections to (:mod:`.handlers`), and background tasks bound to
a block (:mod:`.tasks`).
"""
