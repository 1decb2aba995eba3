"""matplotlib figure builders, one module per topic (collectives, dp, ps, ...).

Each function takes results (a `RunResult`, a history, a table) and returns a
`matplotlib.figure.Figure`; nothing here runs ranks.
"""
