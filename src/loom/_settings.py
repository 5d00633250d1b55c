"""Checks shared by every constructor and call that takes a number of seconds.

``nan`` and ``inf`` pass a plain ``x <= 0`` test, and then make a deadline that is never
reached or a lease that never expires: each setting is refused here, by name, instead.
"""

from __future__ import annotations

import math

from loom.errors import ConfigurationError

__all__ = ["seconds_setting"]


def seconds_setting(
    value: float,
    what: str,
    *,
    zero_ok: bool = False,
    execution_id: str | None = None,
) -> float:
    """``value`` as float seconds if it is finite and positive (or zero, with ``zero_ok``).

    Raises :class:`ConfigurationError` naming ``what`` otherwise; nothing is changed or
    recorded by the call that was refused.
    """
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ConfigurationError(
            f"{what} must be a number of seconds, not {value!r}",
            execution_id=execution_id,
            hint="Pass an int or a float",
        ) from None
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not zero_ok):
        bound = ">= 0" if zero_ok else "> 0"
        raise ConfigurationError(
            f"{what} must be a finite number of seconds {bound}, not {value!r}",
            execution_id=execution_id,
            hint="Pass a finite number of seconds; nothing was changed",
        )
    return seconds
