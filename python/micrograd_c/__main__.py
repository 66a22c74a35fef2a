"""``python -m micrograd_c``: the micrograd-c command."""
import sys

from .cli import main

sys.exit(main())
