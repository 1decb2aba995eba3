"""Lesson 08, Horovod next to DDP: the same job under both.

Open `training.py` (`train.run("horovod", ...)`, `run_jobs`) and `lines.py` (each line of
the recipe left out), then `launch.py` (`horovod.run` from a notebook) and `timeline.py`.
Horovod itself is imported only inside functions, and every import here is absolute: inside
`syncedu`, `import horovod` still means the real Horovod.
"""

from syncedu.horovod import training  # noqa: F401  (registers train.run's "horovod")
