"""Layer 3, lab: training loop, benchmarks, cost model, data and models."""
