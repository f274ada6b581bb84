"""What the Celery and SQS doors share below their queue's vocabulary: a job type's
protocol (:class:`JobProtocol`), a key declaration's parse and the operation key its
parts read from a delivery (:func:`parse_key`, :func:`key_of`: both the core's; over a
function's arguments: :func:`parameters`, :func:`call_key_parts`, :func:`call_start`),
one delivery through the
native core inside its span (:func:`deliver`), and what a door does when a delivery's
claim fails before its body ran (:func:`claim_failed`): the core decides whether the
delivery goes back to its queue (``IdempotentJobError.sends_back``, from the core's
``Error::sends_back``), how soon (``unreachable_delay``) and when the cause is logged as
an error (``claim_error_report``: once per ``CLAIM_ERROR_LOG_INTERVAL`` seconds per cause
and process, the other deliveries at debug level). Each door only says how its queue
sends a delivery back."""

from __future__ import annotations

import inspect
import logging
from typing import Any, Callable, Optional

from . import _current, _tracing
from ._native import (
    CLAIM_ERROR_LOG_INTERVAL,
    claim_error_report,
    declared_key,
    key_declaration,
    unreachable_delay,
)
from .errors import IdempotentJobError

__all__ = [
    "JobProtocol",
    "KeyPart",
    "parse_key",
    "parameters",
    "call_key_parts",
    "call_start",
    "key_of",
    "deliver",
    "claim_failed",
]

#: One part of a key declaration: its label, the argument's index (None: by keyword
#: only), its parameter name (None: by index only) and the dotted segments below it.
#: (Optional, not ``int | None``: this line runs at import, where ``X | None`` needs
#: Python 3.10, and the package supports 3.9.)
KeyPart = tuple[str, Optional[int], Optional[str], list[str]]


class JobProtocol:
    """A job type's native protocol: ``options`` (the core's option names → values; None
    is unset) over ``configure``'s defaults, told in the door's ``words`` (its ``WORDS``:
    ``id_label``, ``defer_text``, ``crash_text``) with option names shown after
    ``prefix``. Built at once (a bad value raises ``ConfigurationError`` naming
    ``job_type`` and the option when the door is declared) and again when ``configure``
    was called since. Reads the current store only."""

    def __init__(
        self, job_type: str, options: dict[str, Any], words: dict[str, str], prefix: str = ""
    ) -> None:
        self.job_type, self.options, self.words, self.prefix = job_type, options, words, prefix
        self._cached: tuple[Any, Any] | None = None
        self.get()

    def get(self) -> Any:
        """The protocol (``_native.JobProtocol``) of the current store's defaults."""
        store = _current()
        if self._cached is None or self._cached[0] is not store:
            self._cached = (store, store.protocol(self.job_type, self.options, self.words, self.prefix))
        return self._cached[1]


def parse_key(
    declaration: Any, refuse: Callable[[str], Exception]
) -> list[tuple[str, int | None, str | None, list[str]]]:
    """The core's parse of a key declaration (one part, or a list or tuple of parts: a
    composite key): ``(label, index or None, name or None, segments)`` per part. Raises
    ``refuse(problem)`` (the door's ``OperationKeyError``) for a malformed declaration."""
    parts = list(declaration) if isinstance(declaration, (list, tuple)) else [declaration]
    parsed, problem = key_declaration(parts)
    if problem is not None:
        raise refuse(problem)
    return parsed


def parameters(function: Any) -> list[inspect.Parameter] | None:
    """The parameters a caller passes to ``function`` (a function defined in a class: its
    first parameter, ``self``, left out unless it is a ``staticmethod``), or None when
    it is missing or its signature cannot be read."""
    if function is None:
        return None
    bound = not isinstance(function, staticmethod)
    if isinstance(function, staticmethod):
        function = function.__func__
    try:
        params = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return None
    return params[1:] if bound and params else params


def call_key_parts(
    name: str, declaration: Any, params: list[inspect.Parameter] | None, refuse: Callable[[str], Exception]
) -> list[KeyPart]:
    """A key declaration read over a call's arguments: the core's parse (:func:`parse_key`),
    each part's parameter name mapped to its position in ``params`` (:func:`parameters`;
    None: not known, the part is read by keyword only) when every parameter up to it can
    be given by position; a positional-only parameter's part is read by position only
    (a keyword argument of its name is another value: ``**kwargs``'). Raises
    ``refuse(problem)`` for a malformed declaration, a name ``params`` lacks or a name of
    the ``*args`` or ``**kwargs`` parameter (no one argument: the key could never be
    read) (``name``: the callable's name in that problem)."""
    parts = []
    for label, index, head, segments in parse_key(declaration, refuse):
        if head is not None and params is not None:
            names = [p.name for p in params]
            if head not in names:
                raise refuse(f"names parameter {head!r}, which {name} does not have (it has {names})")
            found = names.index(head)
            kind = params[found].kind
            if kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                stars = "*" if kind == inspect.Parameter.VAR_POSITIONAL else "**"
                raise refuse(
                    f"names {stars}{head}, the variable arguments of {name}, not one parameter: "
                    "a key reads a named parameter or an argument index (e.g. 0), or a path below one"
                )
            positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
            if all(p.kind in positional for p in params[: found + 1]):
                index = found
            if kind == inspect.Parameter.POSITIONAL_ONLY:
                head = None  # never by keyword: a keyword of its name is another argument
        parts.append((label, index, head, segments))
    return parts


def call_start(
    part: KeyPart, args: tuple[Any, ...], kwargs: dict[str, Any], caller: str
) -> tuple[Any, list[str], str | None]:
    """A part's start over one call (see :func:`key_of`): its keyword argument, else its
    positional one, its segments, and why it has none (``caller``: who got the arguments,
    "the task"), else None."""
    _label, index, name, segments = part
    if name is not None and name in kwargs:
        return kwargs[name], segments, None
    if index is not None and index < len(args):
        return args[index], segments, None
    given = f"{len(args)} positional argument{'' if len(args) == 1 else 's'} and " + (
        f"keyword arguments {', '.join(sorted(kwargs))}" if kwargs else "no keyword arguments"
    )
    missing = f"the argument is missing ({caller} got {given})"
    return None, segments, missing


def key_of(
    job_type: str,
    declaration: Any,
    starts: list[tuple[Any, list[str], str | None]],
    fail: Callable[[int, str], Exception],
) -> str:
    """The operation key (str) of a parsed declaration over one delivery, by the core's
    resolve (crates/core/src/declaration.rs): each of ``starts`` is a part's ``(first
    value, segments, missing)`` (``missing``: the door's words for why the part has no
    first value, else None); the core walks the segments (a dict's by key: a str key,
    else an int key of that decimal text; a list's or tuple's by a decimal index),
    refuses None and makes the key's text, of the one value
    or of the composite when the declaration is a list or tuple. Raises ``fail(part,
    problem)`` (the door's ``OperationKeyError``, ``part`` the part's position) when a
    part reaches no value: its argument is missing, a dict lacks the key, a list segment
    is not a number or past the end, a segment reaches into a value that is neither a
    dict nor a list, the value is None; raises ``OperationKeyError`` naming ``job_type``
    for a value the core refuses (a float, a bool, an empty value, a key too long)."""
    composite = isinstance(declaration, (list, tuple))
    text, part, problem = declared_key(job_type, starts, composite)
    if text is None:
        raise fail(part, problem)
    return text


def deliver(
    door: str,
    protocol: Any,
    job_type: str,
    key: str,
    body: Callable[[Any], Any],
    payload: Any,
    delivery_id: str | None,
    deferrals: int,
    job_class: str | None,
    queue: str | None,
    facts: dict[str, Any],
    lookup: Callable[[str], Any] | None,
) -> tuple[Any, IdempotentJobError | None]:
    """One delivery through the native ``perform_once`` (arguments as its own) inside its
    span (``door``: "celery" or "sqs"). Returns ``(outcome, None)``, or ``(None, error)``
    when the claim failed before ``body(claim)`` started with an error the core sends
    back (``error.sends_back``: the door sends the delivery back, see
    :func:`claim_failed`). Raises every other error: the body's own, a completion's, one
    the core does not send back (a bad key or option)."""
    started = False

    def run(claim: Any) -> Any:
        nonlocal started
        started = True
        return body(claim)

    try:
        return _tracing.perform(
            door,
            job_type,
            key,
            lambda: _current().perform_once(
                protocol, job_type, key, run, payload, delivery_id, deferrals, job_class, queue, facts, lookup
            ),
        ), None
    except IdempotentJobError as error:
        if started or not error.sends_back:
            raise
        return None, error


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
