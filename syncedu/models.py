"""Public face of `syncedu.lab.models`."""

from syncedu.lab.models import *  # noqa: F401,F403
