"""API keys: who may call the gateway, as which tenant, and who may read its admin views.

Off until `auth.keys` lists a key. Then every request but `GET /health` and `GET /ready` (and
`GET /metrics`, unless `auth.protect_metrics`) must carry one, as `Authorization: Bearer KEY`
(OpenAI's clients) or `api-key: KEY` (Azure's):

- no key, or one not listed: 401 `invalid_api_key`, with `WWW-Authenticate: Bearer`;
- `/admin/*` with a key that is not `admin: true`: 403 `permission_denied`;
- a completion request beyond its key's `rpm`: 429 `rate_limit_exceeded` with Retry-After
  (gateway/ratelimit.py).

Keys are kept as SHA-256 digests (configure `sha256:` to keep the key itself out of the config),
and a presented key is hashed before the lookup, so the lookup's timing says nothing about how
much of a key matched. A request's tenant (the fair-share queue's key, gateway/admission.py) is
its key's `tenant`, or its name: with keys on, the tenant header is not trusted.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Middleware

from gateway.errors import PermissionDenied, RateLimited, Unauthorized
from gateway.ratelimit import TokenBucket

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OPEN_PATHS = frozenset({"/health", "/ready"})
ADMIN_PREFIX = "/admin/"
LIMITED_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})  # what `rpm` counts


@dataclass(frozen=True, slots=True)
class KeyInfo:
    name: str
    tenant: str  # the fair-share tenant of every request made with this key
    admin: bool = False
    rpm: int | None = None  # completion requests a minute; None: no limit
    tpm: int | None = None  # model tokens (prompt + output) a minute; None: no limit


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class KeyRing:
    """The configured keys, by the SHA-256 digest of each, and the rate limit of each."""

    def __init__(self, keys: Iterable[tuple[str, KeyInfo]]) -> None:
        self._by_digest = {sha: info for sha, info in keys}
        self._requests: dict[str, TokenBucket] = {}  # by key name, for `rpm`
        self._tokens: dict[str, TokenBucket] = {}  # by key name, for `tpm`

    def admit(self, info: KeyInfo, now: float) -> float:
        """0.0 when a completion request of `info` may go now, else seconds until one may."""
        if info.rpm is None:
            return 0.0
        return _bucket(self._requests, info.name, info.rpm, now).take(now)

    def charge(self, info: KeyInfo, tokens: int, now: float) -> float:
        """0.0 when `tokens` (a request's estimate) may be computed for `info` now, and are
        charged; else the seconds until they may."""
        if info.tpm is None:
            return 0.0
        return _bucket(self._tokens, info.name, info.tpm, now).take(now, tokens)

    def settle(self, info: KeyInfo, charged: int, used: int, now: float) -> None:
        """A request charged `charged` tokens ended having used `used`."""
        if info.tpm is not None:
            _bucket(self._tokens, info.name, info.tpm, now).settle(now, charged - used)

    @property
    def enabled(self) -> bool:
        return bool(self._by_digest)

    def check(self, key: str) -> KeyInfo | None:
        return self._by_digest.get(digest(key))


def _bucket(buckets: dict[str, TokenBucket], name: str, per_minute: int,
            now: float) -> TokenBucket:
    bucket = buckets.get(name)
    if bucket is None:
        bucket = buckets[name] = TokenBucket(per_minute, now)
    return bucket


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key a request carries: `Authorization: Bearer KEY`, else `api-key: KEY`."""
    scheme, _, token = headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    given = headers.get("api-key", "").strip()
    return given or None


def authorize(ring: KeyRing, path: str, headers: Mapping[str, str], now: float) -> KeyInfo:
    """The key a request to `path` is let in with; Unauthorized, PermissionDenied or (a
    completion request beyond its key's `rpm`) RateLimited otherwise."""
    key = presented_key(headers)
    if key is None:
        raise Unauthorized("no API key: send it as 'Authorization: Bearer KEY'")
    info = ring.check(key)
    if info is None:
        raise Unauthorized("the API key is not valid")
    if path.startswith(ADMIN_PREFIX) and not info.admin:
        raise PermissionDenied(f"the key {info.name!r} is not an admin key")
    if path in LIMITED_PATHS:
        wait = ring.admit(info, now)
        if wait > 0.0:
            raise RateLimited(f"the key {info.name!r} is over its {info.rpm} requests a"
                              " minute", retry_after_s=max(1, math.ceil(wait)))
    return info


def auth_middleware(ring: KeyRing, *, protect_metrics: bool,
                    clock: Callable[[], float]) -> Middleware:
    """Every endpoint but the open ones and the completions, which authorize as the first step
    of their path (gateway/complete.py) so that a refusal is recorded with the request."""
    open_paths = OPEN_PATHS if protect_metrics else OPEN_PATHS | {"/metrics"}

    @web.middleware
    async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        completion = request.method == "POST" and path in LIMITED_PATHS
        if not completion and path not in open_paths:
            authorize(ring, path, request.headers, clock())
        return await handler(request)

    return authenticate
