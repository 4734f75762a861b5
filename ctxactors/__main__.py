"""``python -m ctxactors``: the same as the ``ctxactors`` command."""

import sys

from ctxactors.cli import main

sys.exit(main())
