"""``ctxactors loadtest``: the command (`command`), its options, the workload and its
checker, the targets it drives, the server it restarts under load (`chaos`), and the hostile
tenant it runs beside the checked ones (`hostile`, counting its `refusals`)."""

from ctxactors.cli.loadtest.command import add_arguments, run

__all__ = ["add_arguments", "run"]
