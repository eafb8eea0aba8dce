"""`python -m gpu_runtime serve ...`: see gpu_runtime.cli."""

import sys

from gpu_runtime.cli import main

sys.exit(main())
