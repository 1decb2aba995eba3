"""Lesson 08, Horovod next to DDP: the same job under both.

Inside `syncedu`, `import horovod` still means the real Horovod: every import here is
absolute. Open `training.py` (`train.run("horovod", ...)`, `run_jobs`) and `lines.py`
(each line of the recipe left out), then `launch.py` (`horovod.run` from a notebook) and
`timeline.py`; the notebook's helpers are `lesson08.py` and `exercises08.py`. Horovod
itself is imported only inside the functions that need it.
"""

from syncedu.horovod import training  # noqa: F401  (registers train.run's "horovod")
