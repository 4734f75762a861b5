"""``ctxactors loadtest``: the command (`command`), its options, the workload and its
checker, the targets it drives, and the server it restarts under load (`chaos`)."""

from ctxactors.cli.loadtest.command import add_arguments, run

__all__ = ["add_arguments", "run"]
