"""``python -m mqproxy`` is the ``mqproxy`` command."""

from mqproxy.cli import main

raise SystemExit(main())
