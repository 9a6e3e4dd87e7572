import sys

from runners.traffic.client import main

sys.exit(main(sys.argv[1:]))
