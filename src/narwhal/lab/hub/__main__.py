"""`python -m narwhal.lab.hub`: see cli.py."""

import sys

from narwhal.lab.hub.cli import main

sys.exit(main(sys.argv[1:]))
