"""`python -m benchmarks ...`: see `benchmarks/__init__.py`."""

import sys

from benchmarks import main

sys.exit(main())
