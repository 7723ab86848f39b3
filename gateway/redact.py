"""Secrets never reach a log line: a logging filter that redacts them from every record.

What is redacted, whatever the input and wherever it appears (the message, its arguments, an
exception's traceback, a stack):
- the value of an `Authorization`, `Proxy-Authorization`, `api-key` or `x-api-key` header, in
  any of the shapes a log line may hold it (`Authorization: Bearer ...`, a dict's repr, JSON);
- any `Bearer` token;
- the password of a URL (`redis://:password@host`);
- every secret the configuration holds, literally: the API keys of `auth.keys`, the backends'
  own API keys, the Redis password in `cache.redis_url`, the values of `telemetry.otlp_headers`.

The filter sits on the handlers (the diagnostics on stderr and the access log on stdout), so it
sees every record they write, from whichever logger it came.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from urllib.parse import urlsplit

from gateway.config import Settings

REDACTED = "[redacted]"
MIN_SECRET_LEN = 4  # shorter "secrets" would redact ordinary words

_HEADER = re.compile(
    r"""(?i)\b((?:proxy-)?authorization|x-api-key|api[-_]key)(["']?\s*[:=]\s*["']?)"""
    r"""(?:(?:bearer|basic|token)\s+)?[^\s"',}\]]+""")
_BEARER = re.compile(r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]+")
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*:)[^@/\s]+@")


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every secret in it replaced by `[redacted]`."""
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    text = _HEADER.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
    text = _BEARER.sub(f"Bearer {REDACTED}", text)
    return _URL_PASSWORD.sub(rf"\g<1>{REDACTED}@", text)


class RedactingFilter(logging.Filter):
    """Rewrites each record it sees into its redacted text (message, traceback, stack)."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        # Longest first: a secret containing another is redacted whole.
        self._secrets = tuple(sorted({s for s in secrets if len(s) >= MIN_SECRET_LEN},
                                     key=len, reverse=True))

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format: show its parts, redacted, rather than lose it
            message = f"{record.msg!r} {record.args!r}"
        record.msg = redact(message, self._secrets)
        record.args = None
        if record.exc_info:
            text = logging.Formatter().formatException(record.exc_info)
            record.exc_text = redact(text, self._secrets)
            record.exc_info = None
        elif record.exc_text:
            record.exc_text = redact(record.exc_text, self._secrets)
        if record.stack_info:
            record.stack_info = redact(record.stack_info, self._secrets)
        return True


def secrets_of(settings: Settings) -> list[str]:
    """Every secret the configuration holds."""
    found = [key.key for key in settings.auth.keys if key.key]
    for backend in settings.backends:
        api_key = getattr(backend, "api_key", None)
        if isinstance(api_key, str) and api_key:
            found.append(api_key)
    if settings.cache.redis_url:
        password = urlsplit(settings.cache.redis_url).password
        if password:
            found.append(password)
    found.extend(value for value in settings.telemetry.otlp_headers.values() if value)
    return found


def install(secrets: Iterable[str], loggers: Iterable[logging.Logger]) -> RedactingFilter:
    """Adds one redacting filter to every handler of `loggers` (the root and the access log)."""
    redacting = RedactingFilter(secrets)
    for logger in loggers:
        for handler in logger.handlers:
            if not any(isinstance(f, RedactingFilter) for f in handler.filters):
                handler.addFilter(redacting)
    return redacting
