"""``python -m runners``: see runners.cli."""

import sys

from runners.cli import main

if __name__ == "__main__":
    sys.exit(main())
