"""Data package: the default mqproxy.toml and the log-event JSON Schema. Holds no code."""
