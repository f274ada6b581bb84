"""What a door does when a delivery's claim fails before its body ran: the core decides
whether the delivery goes back to its queue (``IdempotentJobError.sends_back``, from the
core's ``Error::sends_back``), how soon (``unreachable_delay``) and when the cause is
logged as an error (``claim_error_report``: once per ``CLAIM_ERROR_LOG_INTERVAL``
seconds per cause and process, the other deliveries at debug level). Shared by the
Celery and SQS doors; each only says how its queue sends a delivery back."""

from __future__ import annotations

import logging
from typing import Any

from ._native import CLAIM_ERROR_LOG_INTERVAL, claim_error_report, unreachable_delay

__all__ = ["claim_failed"]


def claim_failed(
    logger: logging.Logger,
    error: Any,
    failures: int,
    what: str,
    back_in: str,
) -> float:
    """Logs a claim that failed with ``error`` before the body ran and returns the seconds
    (float) until the delivery comes back: the core's ``unreachable_delay(failures)``
    (``failures``: how often this delivery's claim failed before). ``what`` names the
    delivery (task, id, operation key), ``back_in`` says how it comes back ("the task is
    sent back"). The first failure of a cause (the error's class and SQLSTATE), and then
    one per interval, is an ERROR line naming the cause and how many were not logged;
    the others are DEBUG lines. Reads and writes nothing else."""
    delay = unreachable_delay(failures)
    cause = f"{type(error).__name__}:{getattr(error, 'sqlstate', None) or ''}"
    skipped = claim_error_report(cause)
    line = "%s could not be claimed (%s: %s); the body did not run; %s in %.1f s (claim failure %d)"
    args = (what, type(error).__name__, error, back_in, delay, failures + 1)
    if skipped is None:
        logger.debug(line, *args)
    else:
        logger.error(
            line + "; deliveries failing this way are sent back until it is fixed "
            "(one line per %.0f s per cause; %d not logged since the last)",
            *args,
            CLAIM_ERROR_LOG_INTERVAL,
            skipped,
        )
    return delay
