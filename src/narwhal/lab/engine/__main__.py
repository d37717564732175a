"""`python -m narwhal.lab.engine serve MODEL_DIR [vllm serve flags]`: one emulated engine."""

from __future__ import annotations

import sys

from narwhal.lab.engine.server import main

if __name__ == "__main__":
    sys.exit(main())
