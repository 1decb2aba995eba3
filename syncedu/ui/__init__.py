"""Layer 4, ui: matplotlib figure builders, ipywidgets dashboards, exercise checkers.

The only layer that imports ipywidgets or matplotlib.
"""
