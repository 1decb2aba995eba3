"""Public face of `syncedu.lab.cost`: the alpha-beta model, calibration, what-ifs."""

from syncedu.lab.cost import *  # noqa: F401,F403
from syncedu.lab.cost import (  # noqa: F401
    BUS_FACTOR,
    COLLECTIVES,
    algbw,
    allreduce_time,
    best_algorithm,
    busbw,
    calibrate,
    collective_time,
    fit_alpha_beta,
    fit_network,
    pingpong,
    ps_time,
    terms,
    what_if,
)
