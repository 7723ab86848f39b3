"""No log line shows a secret: header values, bearer tokens, URL passwords and every configured
secret are redacted from the message, its arguments and its traceback."""

from __future__ import annotations

import io
import logging

import pytest

from gateway.config import Settings
from gateway.redact import REDACTED, RedactingFilter, redact, secrets_of

KEY = "sk-live-0123456789abcdef"


@pytest.mark.parametrize(
    ("text", "hidden"),
    [
        pytest.param(f"Authorization: Bearer {KEY}", KEY, id="an Authorization header"),
        pytest.param(f"b'api-key: {KEY}'", KEY, id="an api-key header's raw bytes"),
        pytest.param(f"{{'X-Api-Key': '{KEY}'}}", KEY, id="a dict's repr"),
        pytest.param(f'{{"authorization":"Basic {KEY}"}}', KEY, id="JSON"),
        pytest.param(f"sent bearer {KEY} upstream", KEY, id="a bare bearer token"),
        pytest.param("redis://:hunter22@cache:6379/0", "hunter22", id="a URL's password"),
    ],
)
def test_secrets_in_any_shape_are_redacted(text: str, hidden: str) -> None:
    out = redact(text)
    assert hidden not in out and REDACTED in out


def test_ordinary_text_is_left_alone() -> None:
    text = "backend b0 answered 503 after 1.2 s; retrying on b1"
    assert redact(text, ["unrelated-secret"]) == text


def test_configured_secrets_are_found() -> None:
    settings = Settings.model_validate({
        "backends": [{"url": "http://127.0.0.1:1"}],
        "auth": {"keys": [{"name": "ops", "key": KEY}]},
        "cache": {"enabled": True, "store": "redis", "redis_url": "redis://:pw-in-url@h:1/0"},
        "telemetry": {"otlp_headers": {"x-token": "otlp-secret"}},
    })
    assert set(secrets_of(settings)) >= {KEY, "pw-in-url", "otlp-secret"}


def test_the_filter_redacts_message_arguments_and_traceback() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter(["plain-configured-secret"]))
    logger = logging.getLogger("test.redaction")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("header %s and %s", f"Authorization: Bearer {KEY}",
                       "plain-configured-secret")
        try:
            raise ValueError(f"bad header b'api-key: {KEY}'")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    logged = stream.getvalue()
    assert "failed" in logged and "ValueError" in logged
    assert KEY not in logged and "plain-configured-secret" not in logged
