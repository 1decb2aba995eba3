"""`draw_trace`: the messages the simulator really moved (`res.trace`) as a space-time
diagram: the "who sends which chunk to whom" picture of Patarasuk & Yuan (2009) and Thakur
et al. (2005)."""

from __future__ import annotations

US = 1e-6  # the time axis unit, seconds


def draw_trace(trace, ax=None, *, title: str | None = None, max_messages: int = 2000):
    """Draw `trace` (a `Trace`, e.g. `res.trace`) on `ax`; return the axes.

    1. keep the first `max_messages` messages;
    2. one arrow per message from (start, src) to (end, dst), coloured by chunk (or op);
       ranks down the y axis (rank 0 on top), time across in microseconds;
    3. a legend of the colours, the title and the axis labels.
    """
    import matplotlib.pyplot as plt
    from matplotlib import colormaps

    if not isinstance(max_messages, int) or max_messages < 1:
        raise ValueError(f"max_messages={max_messages!r} must be an int >= 1")
    records = list(trace)[:max_messages]  # Step 1
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3))
    keys = sorted({_key(r) for r in records}, key=str)
    cmap = colormaps["tab10" if len(keys) <= 10 else "viridis"]
    colour = {k: cmap(i if len(keys) <= 10 else i / max(1, len(keys) - 1))
              for i, k in enumerate(keys)}
    ranks = {r.src for r in records} | {r.dst for r in records}
    for r in records:  # Step 2
        ax.annotate("", xy=(r.end / US, r.dst), xytext=(r.start / US, r.src),
                    arrowprops=dict(arrowstyle="->", color=colour[_key(r)], lw=1.2))
    if ranks:
        ax.set_ylim(max(ranks) + 0.5, min(ranks) - 0.5)
        ax.set_yticks(sorted(ranks))
        t_end = max(r.end for r in records) / US
        ax.set_xlim(min(r.start for r in records) / US, t_end * 1.02 or 1.0)
    for k in keys:  # Step 3
        ax.plot([], [], color=colour[k], label=k if isinstance(k, str) else f"chunk {k}")
    if keys and len(keys) <= 16:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    ax.set(xlabel="time (us)", ylabel="rank", title=title or f"{len(records)} messages")
    ax.grid(axis="y", alpha=0.3)
    return ax


def _key(record):
    return record.chunk if record.chunk >= 0 else record.op
