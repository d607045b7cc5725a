"""
mqproxy.fuzz
~~~~~~~~~~~~

The fuzzing campaign's harness: a deterministic structure-aware mutator (:mod:`.mutator`), one target per
codec (:mod:`.targets`) and a multi-process runner with a per-input time cap and a memory-retention check
(:mod:`.runner`). ``python -m mqproxy.fuzz --help`` runs it; the ``fuzz`` test tier calls the same code.
"""
