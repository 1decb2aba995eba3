"""Show the package's own code beside the lesson: `show(collectives.ring_allreduce)`.

A lesson that teaches an algorithm displays the very function it runs, so the
code a learner reads is the code the checked cells execute (no copy in the
notebook to drift). In a notebook the source appears syntax-highlighted
(Pygments HTML through `IPython.display`), with its file named on top; outside
IPython it is printed as plain text.
"""

from __future__ import annotations

import inspect
import os
import textwrap

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def where(obj) -> str:
    """The file that defines `obj`, relative to the repository (syncedu/dp/buckets.py)."""
    obj = inspect.unwrap(obj)  # a decorated function (e.g. @torch.no_grad) is shown as written
    path = inspect.getsourcefile(obj) or "?"
    rel = os.path.relpath(path, _ROOT)
    if not rel.startswith(".."):
        return rel.replace(os.sep, "/")
    # Outside the repository (an installed library): the path below site-packages, the same
    # on every machine.
    head, sep, tail = path.replace(os.sep, "/").rpartition("site-packages/")
    return tail if sep else os.path.basename(path)


def source(*objs) -> str:
    """The dedented source of each object, one after another, each headed by its file.

    `objs`: functions, classes, methods or modules written in Python.
    """
    if not objs:
        raise ValueError("objs: pass at least one function, class, method or module")
    parts = []
    for obj in objs:
        try:
            code = textwrap.dedent(inspect.getsource(obj)).rstrip()
        except (TypeError, OSError) as e:
            raise ValueError(f"objs: {obj!r} has no Python source to show; pass a function, "
                             f"class, method or module defined in a .py file ({e})") from None
        parts.append(f"# {where(obj)}\n{code}")
    return "\n\n\n".join(parts)


def _html(code: str) -> str:
    """Pygments HTML with inline styles (renders in JupyterLab and on GitHub alike);
    Pygments comes with IPython, the only place this runs."""
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import PythonLexer

    return highlight(code, PythonLexer(), HtmlFormatter(noclasses=True, style="default"))


def show(*objs) -> None:
    """Display the source of `objs` (see `source`): highlighted in a notebook, else printed."""
    code = source(*objs)
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        get_ipython = None
    if get_ipython is None or get_ipython() is None:
        print(code)
        return
    display({"text/plain": code, "text/html": _html(code)}, raw=True)
