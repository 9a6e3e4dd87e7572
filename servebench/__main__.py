"""``python -m servebench``: the CLI without installing the console script."""

import sys

from servebench.cli import main

sys.exit(main())
