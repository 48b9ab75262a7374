"""One retry policy for every HTTP client of ascendkit: the package indexes (lock), the registries
(ship) and the registries' description APIs (describe).

A call is tried again on a dropped, refused or timed-out connection and on 408, 429 and 5xx; the
wait is what the server's ``Retry-After`` asks (seconds or an HTTP date), capped, else an
exponential backoff with jitter. The number of tries is bounded per call; what each client does
when they run out (Unavailable, IndexUnreachable) is its own, in one line naming the server."""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import requests

RETRIED_STATUS = frozenset({408, 429, 500, 502, 503, 504})
MAX_WAIT = 30.0  # seconds: the longest wait between two tries, whatever Retry-After asks
# What a lost connection raises through requests (a body cut off mid-read included).
TRANSIENT = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError)


def retry_after(response: requests.Response) -> float | None:
    """Seconds the server asked to wait (``Retry-After``: seconds or an HTTP date), None if it did not say."""
    value = response.headers.get("Retry-After", "").strip()
    if not value:
        return None
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


@dataclass(frozen=True)
class RetryPolicy:
    """``retries``: tries after the first; ``backoff``: the first pause when the server names none;
    ``max_wait``: the longest pause, whatever Retry-After says; ``sleep``: injected by tests."""

    retries: int
    backoff: float = 0.5
    max_wait: float = MAX_WAIT
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False)

    @staticmethod
    def retried(status: int) -> bool:
        return status in RETRIED_STATUS

    def delay(self, attempt: int, response: requests.Response | None) -> float:
        """The pause before try ``attempt + 1`` (``attempt`` counts from 0)."""
        asked = retry_after(response) if response is not None else None
        delay = asked if asked is not None else self.backoff * 2**attempt * (1 + random.random() / 2)
        return min(delay, self.max_wait)

    def wait(self, attempt: int, response: requests.Response | None) -> None:
        self.sleep(self.delay(attempt, response))

    def call(self, send: Callable[[], requests.Response], failure: Callable[[BaseException | requests.Response], str]) -> Attempts:
        """``send`` until an answer the policy does not retry, or the tries run out."""
        last = ""
        for attempt in range(self.retries + 1):
            response = None
            try:
                response = send()
            except TRANSIENT as exc:
                last = failure(exc)
            else:
                if not self.retried(response.status_code):
                    return Attempts(response, attempt + 1, "")
                last = failure(response)
            if attempt < self.retries:
                self.wait(attempt, response)
        return Attempts(None, self.retries + 1, last)


@dataclass(frozen=True)
class Attempts:
    """What :meth:`RetryPolicy.call` ended with: the answer, or None and the last failure, in ``tries`` tries."""

    response: requests.Response | None
    tries: int
    last: str
