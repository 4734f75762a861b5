"""``python -m ctxactors.cli``: the same as the ``ctxactors`` command."""

import sys

from ctxactors.cli.main import main

sys.exit(main())
