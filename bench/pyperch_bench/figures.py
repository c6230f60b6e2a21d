"""How numbers are written in the report: `fmt`, `pct`, `median`."""
import statistics


def fmt(x, nd=1):
    if x is None:
        return "n/a"
    if isinstance(x, float) and (x != x):
        return "n/a"
    return ("%%.%df" % nd) % x


def pct(x):
    return None if x is None else 100.0 * x


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None
