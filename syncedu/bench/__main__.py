"""`python -m syncedu.bench ...`: see `syncedu/bench/__init__.py`."""

import sys

from syncedu.bench import main

sys.exit(main())
