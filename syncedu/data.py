"""Public face of `syncedu.lab.data`."""

from syncedu.lab.data import *  # noqa: F401,F403
