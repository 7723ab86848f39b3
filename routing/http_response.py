"""An HTTP/1.1 response, read incrementally from the bytes of a connection. Pure: bytes in,
status and body out; no sockets, no clock. The scrape client (routing/scrape_client.py) feeds it.

Framing, as RFC 9112 section 6.3 orders it: no body for 1xx (skipped: a final answer follows),
204 and 304; chunked transfer coding when it is the last one named in Transfer-Encoding (chunk
extensions and trailers are read and dropped); the body runs to the end of the connection when
another transfer coding is named or no Content-Length is given; else Content-Length bytes.
A body over `max_body` bytes is an error as soon as that is known (at the header when the length
is declared, while it arrives otherwise), so a broken server cannot fill the reader's memory.

Cost matters (the poller reads one answer per backend per poll interval): a Content-Length body
is kept as the chunks the connection delivered and joined once at the end, and when one chunk
holds the whole answer, the body is a single slice of it.
"""

from __future__ import annotations

_MAX_HEAD = 64 * 1024  # status line and headers
_MAX_CHUNK_LINE = 1024  # a chunk-size line with its extensions
_HEX_DIGITS = b"0123456789abcdefABCDEF"

_HEAD, _LENGTH, _CHUNKED, _UNTIL_CLOSE, _DONE = range(5)


class ScrapeError(Exception):
    """A scrape failed; the message says why. `status` is the HTTP status of an answer other
    than 200, else None."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ResponseReader:
    """One response. `feed` the connection's bytes until it returns True, then read `status`,
    `body()`, `keep_alive` (the connection may carry the next request) and `trailing` (bytes
    came after the end: the connection cannot be trusted for another exchange). A body that runs
    to the end of the connection (`ends_at_close`) is complete when `finish` is called there."""

    __slots__ = ("max_body", "status", "reason", "keep_alive", "trailing", "_state", "_head",
                 "_parts", "_skip", "_have", "_length", "_buf", "_decoded", "_body")

    def __init__(self, max_body: int) -> None:
        self.max_body = max_body
        self.status = 0
        self.reason = ""
        self.keep_alive = False
        self.trailing = False
        self._state = _HEAD
        self._head = b""  # the start of a head split across chunks
        self._parts: list[bytes] = []  # Content-Length body: chunks as delivered
        self._skip = 0  # bytes of the first part before the body
        self._have = 0  # body bytes in `_parts`
        self._length = 0
        self._buf = bytearray()  # chunked and close-delimited bodies: the undecoded rest
        self._decoded = bytearray()  # chunked body: the chunks' data so far
        self._body = b""

    @property
    def ends_at_close(self) -> bool:
        return self._state == _UNTIL_CLOSE

    def feed(self, data: bytes) -> bool:
        """Takes the next bytes; True once the response is complete. ScrapeError when the bytes
        are not an HTTP/1.x response or the body is over the limit."""
        state = self._state
        if state == _LENGTH:
            self._parts.append(data)
            self._have += len(data)
            return self._have >= self._length and self._end_length()
        if state == _HEAD:
            return self._feed_head(data)
        if state == _CHUNKED:
            self._buf += data
            return self._read_chunks()
        if state == _UNTIL_CLOSE:
            self._buf += data
            if len(self._buf) > self.max_body:
                raise ScrapeError(f"the body is over the {self.max_body} bytes limit")
            return False
        self.trailing = True
        return True

    def finish(self) -> None:
        """The connection ended: completes a body that runs to its end."""
        if self._state != _UNTIL_CLOSE:
            raise ScrapeError("the connection ended before the answer was complete")
        self._body, self._buf = bytes(self._buf), bytearray()
        self._state = _DONE

    def body(self) -> bytes:
        if self._state != _DONE:
            raise ScrapeError("the answer is not complete")
        return self._body

    def _feed_head(self, data: bytes) -> bool:
        if self._head:
            data, self._head = self._head + data, b""
        end = data.find(b"\r\n\r\n")
        if end < 0:
            if len(data) > _MAX_HEAD:
                raise ScrapeError("the answer's headers are over 64 KiB")
            self._head = data
            return False
        self._parse_head(data[:end])
        start = end + 4
        if self._state == _HEAD:  # an interim (1xx) answer: the final one follows
            return self._feed_head(data[start:]) if len(data) > start else False
        if self._state == _LENGTH:
            self._parts, self._skip, self._have = [data], start, len(data) - start
            return self._have >= self._length and self._end_length()
        return self.feed(data[start:])

    def _end_length(self) -> bool:
        parts, start, end = self._parts, self._skip, self._skip + self._length
        if len(parts) == 1:
            first = parts[0]
            self._body = first if start == 0 and end == len(first) else first[start:end]
        else:
            self._body = b"".join(parts)[start:end]
        self.trailing = self._have > self._length
        self._parts = []
        self._state = _DONE
        return True

    def _parse_head(self, head: bytes) -> None:
        line_end = head.find(b"\r\n")
        status_line = head if line_end < 0 else head[:line_end]
        version, _, rest = status_line.partition(b" ")
        code = rest[:3]
        if not version.startswith(b"HTTP/1.") or not code.isdigit() or rest[3:4] not in (b"", b" "):
            raise ScrapeError(f"not an HTTP/1.x answer: {status_line[:80]!r}")
        self.status = int(code)
        self.reason = rest[4:].decode("latin-1").strip()
        if 100 <= self.status < 200:
            return  # stays in _HEAD
        lowered = head.lower()
        tokens = _header(head, lowered, _CONNECTION).lower()
        if version == b"HTTP/1.1":
            self.keep_alive = b"close" not in tokens
        else:
            self.keep_alive = b"keep-alive" in tokens
        if self.status in (204, 304):
            self._length, self._state = 0, _LENGTH
            return
        if _TRANSFER_ENCODING in lowered:
            coding = _header(head, lowered, _TRANSFER_ENCODING).lower()
            if coding.rsplit(b",", 1)[-1].strip() == b"chunked":
                self._state = _CHUNKED
            else:
                self._state, self.keep_alive = _UNTIL_CLOSE, False
            return
        length = _header(head, lowered, _CONTENT_LENGTH)
        if not length:
            self._state, self.keep_alive = _UNTIL_CLOSE, False
            return
        if not length.isdigit() or len(length) > 18:
            raise ScrapeError(f"a bad Content-Length: {length[:40]!r}")
        self._length = int(length)
        if self._length > self.max_body:
            raise ScrapeError(f"the body is {self._length} bytes, over the {self.max_body} limit")
        self._state = _LENGTH

    def _read_chunks(self) -> bool:
        """Moves every complete chunk from the buffer into the body; True after the last one."""
        buf, body = self._buf, self._decoded
        pos = 0
        try:
            while True:
                line_end = buf.find(b"\r\n", pos)
                if line_end < 0:
                    if len(buf) - pos > _MAX_CHUNK_LINE:
                        raise ScrapeError("a chunk-size line is too long")
                    return False
                size = _chunk_size(bytes(buf[pos:line_end]))
                start = line_end + 2
                if size == 0:
                    return self._read_trailers(start)
                if len(body) + size > self.max_body:
                    raise ScrapeError(f"the body is over the {self.max_body} bytes limit")
                if len(buf) < start + size + 2:
                    return False
                if buf[start + size : start + size + 2] != b"\r\n":
                    raise ScrapeError("a chunk does not end with CRLF")
                body += buf[start : start + size]
                pos = start + size + 2
        finally:
            if self._state == _CHUNKED:
                del buf[:pos]

    def _read_trailers(self, start: int) -> bool:
        buf = self._buf
        if buf[start : start + 2] == b"\r\n":
            end = start + 2
        else:
            found = buf.find(b"\r\n\r\n", start)
            if found < 0:
                if len(buf) - start > _MAX_HEAD:
                    raise ScrapeError("the answer's trailers are over 64 KiB")
                return False
            end = found + 4
        self.trailing = len(buf) > end
        self._body, self._buf, self._decoded = bytes(self._decoded), bytearray(), bytearray()
        self._state = _DONE
        return True


def whole_ok_body(data: bytes, max_body: int) -> bytes | None:
    """The body when `data` is exactly one whole `HTTP/1.1 200` answer framed by Content-Length
    (at most `max_body` bytes), with no Transfer-Encoding and no Connection field but
    `keep-alive`, so that the connection stays usable; None for anything else, which
    `ResponseReader` then reads in full. The poller's common case, in a few steps."""
    if not data.startswith(b"HTTP/1.1 200 "):
        return None
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = data[:end].lower()
    at = head.find(_CONTENT_LENGTH)
    if at < 0 or _TRANSFER_ENCODING in head or head.find(_CONTENT_LENGTH, at + 1) >= 0:
        return None
    if _CONNECTION in head and _header(head, head, _CONNECTION) != b"keep-alive":
        return None
    length = _header(head, head, _CONTENT_LENGTH)
    start = end + 4
    if not length.isdigit() or len(length) > 18 or int(length) != len(data) - start:
        return None
    return data[start:] if len(data) - start <= max_body else None


# Header fields as they are searched for in the lower-cased head: at a line start, with the colon.
_CONNECTION = b"\r\nconnection:"
_TRANSFER_ENCODING = b"\r\ntransfer-encoding:"
_CONTENT_LENGTH = b"\r\ncontent-length:"


def _header(head: bytes, lowered: bytes, field: bytes) -> bytes:
    """The value of the first header `field` (one of the constants above), stripped; b"" if
    absent."""
    at = lowered.find(field)
    if at < 0:
        return b""
    start = at + len(field)
    end = head.find(b"\r\n", start)
    return head[start : end if end >= 0 else len(head)].strip()


def _chunk_size(line: bytes) -> int:
    digits = line.split(b";", 1)[0].strip()
    if not digits or len(digits) > 15 or digits.strip(_HEX_DIGITS):
        raise ScrapeError(f"a bad chunk-size line: {line[:40]!r}")
    return int(digits, 16)
