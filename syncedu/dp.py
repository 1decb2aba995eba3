"""Public face of `syncedu.strategies.dp`: data-parallel gradient synchronization."""

from syncedu.strategies.dp import *  # noqa: F401,F403
from syncedu.strategies.dp import (  # noqa: F401
    STRATEGIES,
    BucketedSync,
    DataParallel,
    FlatSync,
    GradSync,
    NaiveSync,
    register,
    trainable_parameters,
)
from syncedu.strategies.dp_buckets import Bucket, build_buckets  # noqa: F401
