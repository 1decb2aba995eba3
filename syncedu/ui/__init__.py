"""What every lesson's notebook shares: `show` (a function's source), the widget
base (`widgets.py`), common figures (`plots.py`: the ledger bars) and the
exercise checkers' helpers (`checkers.py`). Each topic's own figures, widgets and
checkers live in its folder (`syncedu/dp/lesson03.py`, ...).

The only code besides those topic helpers that imports ipywidgets or matplotlib.
"""
