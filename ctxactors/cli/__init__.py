"""The ``ctxactors`` command: `main` and the subcommands, one module each.

``demo``, ``logs``, ``loadtest`` and ``top`` live here; ``serve`` is the transports'
(`ctxactors.cli.serve`) and ``shards`` the Ray backend's.
"""

from ctxactors.cli.main import (
    COMMANDS,
    add_settings_argument,
    import_server,
    main,
    settings_from_args,
)

__all__ = ["COMMANDS", "add_settings_argument", "import_server", "main", "settings_from_args"]
