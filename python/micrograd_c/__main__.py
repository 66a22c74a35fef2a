"""``python -m micrograd_c``: the micrograd-c command (:mod:`micrograd_c.app`)."""

import sys

from .app.commands import main

sys.exit(main())
