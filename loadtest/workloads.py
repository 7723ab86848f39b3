"""Request workloads shared by the offline fleet simulation and the locust load test.

A workload is a mix of session kinds. A session is what one user does in one go: a single chat
request, a conversation that grows turn by turn, an agent's burst of calls. `SessionSource`
produces sessions one after another (the locust users draw from it); `schedule` places sessions
on a timeline with Poisson or bursty arrivals and returns every request, sorted by arrival (the
simulation replays it, identically for every policy); `loadtest.fleetsim.trace` reads a recorded
JSONL trace into the same kind of requests.

Kinds (token figures are message contents, before the chat template):
- chat: ShareGPT-like log-normal prompts (median 220) and replies (median 200, max_tokens 1024);
  half of them open with one of four short system prompts, so prefix sharing is little.
- shared-prefix: groups of users sharing a long system document (6,000 tokens) with 1,200-token
  questions and short answers.
- multi-turn: conversations of 2 to 8 turns whose prompt is the whole history so far; the next
  turn comes 4 s plus an exponential think time (mean 20 s) after the previous one.
- rag-long: ~7k-token retrieved context (8k with the question and template), short answers.
- agents: bursts of 4 to 12 calls, 0.25 s apart on average, each re-reading the agent's long
  context (3,000 to 6,000 tokens) plus a fresh tool result, with tiny outputs.
- mixed: requests 40% chat, 20% shared-prefix, 20% multi-turn, 10% rag-long, 10% agents.
- ignore-eos: chat prompts whose replies run to their max_tokens (log-normal, median 300,
  16 to 2048), sent with vLLM's `ignore_eos`: benchmarks and load generators do this.
- heavy-tail: chat prompts with heavy-tailed natural replies (log-normal, median 120, sigma 1.5,
  so one in ten runs past 800 tokens and one in a hundred past 3,900), capped at max_tokens 4096.

Text is synthetic but exact, and cheap to make: a message is a few unique "tag" words followed by
a window of a fixed filler text made of one-token words, so its token ids (under the simulator's
tokenizer, `loadtest.sim.tokens`) are known without tokenizing, and its character length is what
the gateway's cost model estimates from. Messages that must be shared (a group's document, a
conversation's history) have the same tag and window everywhere; every other message gets a tag
no other message has, so its blocks hash differently both for the gateway's prefix chains and for
the engine's prefix cache (both chain hashes over everything before them). Replies in a
conversation's history are written the same way, with the reply's length.

Everything is seeded: the same arguments give the same requests, byte for byte.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

from loadtest.sim.tokens import tokenize

SYSTEM, USER, ASSISTANT = "system", "user", "assistant"
DEFAULT_MAX_CONTEXT = 8192  # the default preset's max_model_len
_MIN_MAX_TOKENS = 16  # a turn that leaves less room than this for the reply is not sent

# The filler: lower-case words of at most five letters; with their leading space each is one
# token for the simulator's tokenizer (pieces of up to six characters).
_VOCABULARY: tuple[str, ...] = tuple(
    " " + w for w in (
        "the a of to and in is it for on that with as by this be are from or can each when "
        "one more than its cache block token model batch queue load route fleet gpu kv page "
        "input reply speed time step fast small large free used first next last long short "
        "rate cost limit which these then so we you what how many about into over under "
        "after while where there their other some most such only also very just like "
        "need make take give find keep show call read write list table file data value key "
        "user agent tool plan task query doc text word line point part case rule order group "
        "state event price sales team month year week today note paper chart score test "
        "code build error fix run check api path node edge graph tree set map sort merge"
    ).split()
)
FILLER_WORDS = 32768


@functools.cache
def _filler() -> tuple[str, tuple[int, ...], tuple[int, ...]]:
    """(text, token ids, character offset of each word) of the filler, stored twice so that any
    window of up to FILLER_WORDS words starting in the first copy is contiguous. Built on first
    use (a tenth of a second), not at import: every `kvgate` command imports this module."""
    rng = random.Random(0x6B7667)  # a fixed text, the same in every process
    ids: dict[str, int] = {}
    for w in _VOCABULARY:
        (ids[w],) = tokenize(w)  # exactly one token, or this unpacking fails at import
    words = [rng.choice(_VOCABULARY) for _ in range(FILLER_WORDS)] * 2
    offsets: list[int] = []
    at = 0
    for w in words:
        offsets.append(at)
        at += len(w)
    offsets.append(at)
    return "".join(words), tuple(ids[w] for w in words), tuple(offsets)


_TEMPLATE_IDS: Mapping[str, tuple[int, ...]] = MappingProxyType(
    {role: tuple(tokenize(f"<|{role}|>\n")) for role in (SYSTEM, USER, ASSISTANT)})
_NEWLINE_IDS = tuple(tokenize("\n"))
_REPLY_OPEN_IDS = _TEMPLATE_IDS[ASSISTANT]


@dataclass(frozen=True, slots=True)
class Segment:
    """One message's content: `tag` words (one token each, with a leading space) that make it
    unique or mark what it shares, then filler words from `offset`; `tokens` in all."""

    role: str
    tag: str
    offset: int
    tokens: int

    def text(self) -> str:
        n = self.tokens - _tag_tokens(self.tag)
        text, _, at = _filler()
        return self.tag + text[at[self.offset]:at[self.offset + n]]

    def token_ids(self) -> tuple[int, ...]:
        n = self.tokens - _tag_tokens(self.tag)
        return _tag_ids(self.tag) + _filler()[1][self.offset:self.offset + n]


def _tag_tokens(tag: str) -> int:
    return tag.count(" ")


@functools.lru_cache(maxsize=8192)
def _tag_ids(tag: str) -> tuple[int, ...]:
    """`tokenize(tag)`, memoised: shared tags and conversation histories repeat them."""
    return tuple(tokenize(tag))


def segment(role: str, tag: str, offset: int, tokens: int) -> Segment:
    """A message of `tokens` tokens (at least its tag and one filler word, at most the filler's
    length) from filler word `offset` on."""
    tokens = min(max(tokens, _tag_tokens(tag) + 1), FILLER_WORDS)
    return Segment(role, tag, offset % FILLER_WORDS, tokens)


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One request. `arrival_s` is seconds from the start of the run (from the start of its
    session inside a `SessionSource` session)."""

    arrival_s: float
    kind: str
    segments: tuple[Segment, ...]
    output_tokens: int  # the reply's natural length: the model stops here by itself
    max_tokens: int  # the client's cap, sent with the request (>= output_tokens)
    prefix_group: str | None  # requests that share a long prefix: a group, conversation, agent
    conversation: str | None = None  # the session key of a conversation's or agent's requests
    session: int = 0  # the session's number in its stream
    ignore_eos: bool = False  # sent with vLLM's ignore_eos: the reply runs to max_tokens

    def messages(self) -> list[tuple[str, str]]:
        """(role, content) pairs, as a client sends them."""
        return [(s.role, s.text()) for s in self.segments]

    def prompt_ids(self) -> tuple[int, ...]:
        """The token ids the simulator's chat template (`loadtest.sim.api.render_chat`) gives."""
        filler = _filler()[1]
        ids: list[int] = []
        for s in self.segments:
            tag = s.tag
            ids += _TEMPLATE_IDS[s.role]
            ids += _tag_ids(tag)
            ids += filler[s.offset:s.offset + s.tokens - _tag_tokens(tag)]
            ids += _NEWLINE_IDS
        ids += _REPLY_OPEN_IDS
        return tuple(ids)

    @property
    def prompt_tokens(self) -> int:
        return prompt_tokens(self.segments)


def prompt_tokens(segments: Sequence[Segment]) -> int:
    """Tokens of the rendered chat prompt: each message's template and content, then the reply's
    opening."""
    return sum(len(_TEMPLATE_IDS[s.role]) + s.tokens + len(_NEWLINE_IDS) for s in segments) + len(
        _REPLY_OPEN_IDS)


class UniqueTags:
    """Unique tags of one stream: " s<stream> n<high> n<low>" (three one-token words), numbered
    in the order `unique` hands them out."""

    def __init__(self, stream: int) -> None:
        if not 0 <= stream < 10_000:
            raise ValueError("stream must be in 0..9999")
        self._stream = stream
        self._next = 0

    def unique(self) -> str:
        n = self._next
        self._next += 1
        return f" s{self._stream:04d} n{n // 10_000 % 10_000:04d} n{n % 10_000:04d}"


def shared_tag(letter: str, k: int) -> str:
    """The tag of shared text number `k` of one kind: the same in every stream and seed."""
    return f" {letter}{k % 10_000:04d}"


def shared_offset(letter: str, k: int) -> int:
    """Where shared text number `k` of one kind starts in the filler: fixed, like its tag."""
    return (ord(letter) * 7919 + k * 104_729) % FILLER_WORDS


def _lognormal(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return min(hi, max(lo, round(median * math.exp(sigma * rng.gauss(0.0, 1.0)))))


@dataclass(frozen=True, slots=True)
class Limits:
    max_context: int = DEFAULT_MAX_CONTEXT  # prompt + max_tokens must fit in it


class _Ctx:
    """What a kind draws from while it builds one session."""

    def __init__(self, rng: random.Random, tags: UniqueTags, limits: Limits,
                 session: int = 0) -> None:
        self.rng = rng
        self.tags = tags
        self.limits = limits
        self.session = session  # the session's number in its stream, stamped on its requests

    def unique(self, role: str, tokens: int) -> Segment:
        return segment(role, self.tags.unique(), self.rng.randrange(FILLER_WORDS), tokens)

    def item(self, at: float, kind: str, segments: Sequence[Segment], natural: int, cap: int,
             group: str | None, conversation: str | None = None, *,
             ignore_eos: bool = False) -> WorkItem | None:
        """A request, its cap cut to the context left; None when too little is left."""
        room = self.limits.max_context - prompt_tokens(segments)
        max_tokens = min(cap, room)
        if max_tokens < _MIN_MAX_TOKENS:
            return None
        output = max_tokens if ignore_eos else max(1, min(natural, max_tokens))
        return WorkItem(at, kind, tuple(segments), output, max_tokens, group, conversation,
                        self.session, ignore_eos)


SessionFn = Callable[[_Ctx], list[WorkItem]]


def _chat(ctx: _Ctx) -> list[WorkItem]:
    segments = _chat_prompt(ctx)
    item = ctx.item(0.0, "chat", segments, _lognormal(ctx.rng, 200, 0.9, 1, 4096), 1024, None)
    return [item] if item is not None else []


def _chat_prompt(ctx: _Ctx) -> list[Segment]:
    rng = ctx.rng
    segments: list[Segment] = []
    if rng.random() < 0.5:
        k = rng.randrange(4)
        segments.append(segment(SYSTEM, shared_tag("c", k), shared_offset("c", k), 60))
    segments.append(ctx.unique(USER, _lognormal(rng, 220, 1.0, 8, 4000)))
    return segments


def _ignore_eos(ctx: _Ctx) -> list[WorkItem]:
    segments = _chat_prompt(ctx)
    cap = _lognormal(ctx.rng, 300, 0.8, _MIN_MAX_TOKENS, 2048)
    item = ctx.item(0.0, "ignore-eos", segments, cap, cap, None, ignore_eos=True)
    return [item] if item is not None else []


def _heavy_tail(ctx: _Ctx) -> list[WorkItem]:
    segments = _chat_prompt(ctx)
    item = ctx.item(0.0, "heavy-tail", segments, _lognormal(ctx.rng, 120, 1.5, 1, 65_536), 4096,
                    None)
    return [item] if item is not None else []


@dataclass(frozen=True, slots=True)
class SharedPrefix:
    groups: int = 16
    prefix_tokens: int = 6000
    question_tokens: int = 1200

    def __call__(self, ctx: _Ctx) -> list[WorkItem]:
        rng = ctx.rng
        k = rng.randrange(self.groups)
        doc = segment(SYSTEM, shared_tag("g", k), shared_offset("g", k), self.prefix_tokens)
        question = ctx.unique(USER, _lognormal(rng, self.question_tokens, 0.25, 1, 8 * 1024))
        item = ctx.item(0.0, "shared-prefix", [doc, question], _lognormal(rng, 150, 0.8, 1, 2048),
                        512, f"g{k}")
        return [item] if item is not None else []


def _multi_turn(ctx: _Ctx) -> list[WorkItem]:
    rng = ctx.rng
    k = rng.randrange(4)
    history = [segment(SYSTEM, shared_tag("m", k), shared_offset("m", k), 150)]
    group = ctx.tags.unique().strip().replace(" ", "-")
    items: list[WorkItem] = []
    at = 0.0
    for _ in range(rng.randint(2, 8)):
        history.append(ctx.unique(USER, _lognormal(rng, 120, 0.8, 4, 2000)))
        item = ctx.item(at, "multi-turn", history, _lognormal(rng, 220, 0.8, 1, 2048), 1024, group,
                        group)
        if item is None:
            break
        items.append(item)
        history.append(ctx.unique(ASSISTANT, item.output_tokens))
        at += 4.0 + rng.expovariate(1.0 / 20.0)
    return items


def _rag_long(ctx: _Ctx) -> list[WorkItem]:
    rng = ctx.rng
    segments = [
        segment(SYSTEM, shared_tag("r", 0), shared_offset("r", 0), 80),
        ctx.unique(USER, rng.randint(6200, 7600)),
    ]
    item = ctx.item(0.0, "rag-long", segments, _lognormal(rng, 80, 0.6, 1, 1024), 256, None)
    return [item] if item is not None else []


def _agents(ctx: _Ctx) -> list[WorkItem]:
    rng = ctx.rng
    context = ctx.unique(SYSTEM, rng.randint(3000, 6000))
    group = context.tag.strip().replace(" ", "-")
    items: list[WorkItem] = []
    at = 0.0
    for _ in range(rng.randint(4, 12)):
        tool = ctx.unique(USER, rng.randint(200, 600))
        item = ctx.item(at, "agents", [context, tool], _lognormal(rng, 30, 0.5, 1, 512), 128,
                        group, group)
        if item is not None:
            items.append(item)
        at += rng.expovariate(1.0 / 0.25)
    return items


@dataclass(frozen=True, slots=True)
class Workload:
    """A named mix of session kinds, weighted by their share of REQUESTS."""

    name: str
    kinds: tuple[tuple[str, SessionFn, float], ...]
    limits: Limits = Limits()


def workload(name: str, *, limits: Limits | None = None,
             shared_prefix: SharedPrefix | None = None) -> Workload:
    """The named workload; ValueError naming the known ones otherwise."""
    limits = limits or Limits()
    kinds: dict[str, SessionFn] = {
        "chat": _chat, "shared-prefix": shared_prefix or SharedPrefix(), "multi-turn": _multi_turn,
        "rag-long": _rag_long, "agents": _agents, "ignore-eos": _ignore_eos,
        "heavy-tail": _heavy_tail,
    }
    if name == "mixed":
        shares = {"chat": 0.4, "shared-prefix": 0.2, "multi-turn": 0.2, "rag-long": 0.1,
                  "agents": 0.1}
        return Workload(name, tuple((k, kinds[k], w) for k, w in shares.items()), limits)
    if name == "easy-hard":  # labelled prompts for a small-model routing alias (its module)
        from loadtest.easy_hard import easy_hard_session

        kinds[name] = easy_hard_session
    if name not in kinds:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    return Workload(name, ((name, kinds[name], 1.0),), limits)


WORKLOADS: tuple[str, ...] = ("chat", "shared-prefix", "multi-turn", "rag-long", "agents", "mixed",
                              "ignore-eos", "heavy-tail", "easy-hard")


class SessionSource:
    """Sessions of a workload, one after another, from one seeded stream.

    Streams with different `stream` numbers never share unique text (the locust users each have
    one); shared text (documents, system prompts) is the same in all of them. A kind is picked for
    each session with probability proportional to its request share over its mean session length,
    so that requests, not sessions, follow the shares.
    """

    def __init__(self, spec: Workload, *, seed: int, stream: int = 0) -> None:
        self.spec = spec
        self._rng = random.Random(f"kvgate-workload:{spec.name}:{seed}:{stream}")
        self._tags = UniqueTags(stream)
        lengths, self.max_session_span_s = _session_stats(spec)
        lengths = dict(lengths)
        weights = [share / lengths[name] for name, _, share in spec.kinds]
        total = sum(weights)
        self._cum = [sum(weights[: i + 1]) / total for i in range(len(weights))]
        self.mean_requests_per_session = sum(
            w / total * lengths[name] for w, (name, _, _) in zip(weights, spec.kinds, strict=True))
        self.sessions = 0

    def next_session(self) -> list[WorkItem]:
        """The next session's requests, `arrival_s` relative to its start, in order."""
        rng = self._rng
        u = rng.random()
        index = next((i for i, c in enumerate(self._cum) if u < c), len(self._cum) - 1)
        fn = self.spec.kinds[index][1]
        session = self.sessions
        self.sessions += 1
        items = fn(_Ctx(rng, self._tags, self.spec.limits, session))
        # `_Ctx.item` stamps the session number; a kind that builds its requests otherwise
        # gets it here.
        return [i if i.session == session else replace(i, session=session) for i in items]


@functools.lru_cache(maxsize=32)
def _session_stats(spec: Workload) -> tuple[dict[str, float], float]:
    """Requests per session of each kind, and the longest session seen, on a fixed sample
    (context limits cut some conversations short, so nominal turn counts would overstate them).
    A pure function of the workload, memoised: every schedule of it needs the same figures."""
    lengths: dict[str, float] = {}
    span = 0.0
    for name, fn, _ in spec.kinds:
        rng = random.Random(f"kvgate-session-length:{name}")
        tags = UniqueTags(0)
        sample = [fn(_Ctx(rng, tags, spec.limits)) for _ in range(400)]
        lengths[name] = max(1.0, sum(len(items) for items in sample) / len(sample))
        span = max([span, *(items[-1].arrival_s for items in sample if items)])
    return lengths, span


ARRIVALS: tuple[str, ...] = ("poisson", "bursty")


def _gaps(rng: random.Random, rate: float, arrival: str, burstiness: float) -> Iterator[float]:
    """Gaps between session starts: exponential (Poisson), or gamma with coefficient of
    variation `burstiness` (> 1 clumps arrivals into bursts separated by lulls)."""
    if arrival == "poisson":
        while True:
            yield rng.expovariate(rate)
    shape = 1.0 / (burstiness * burstiness)
    while True:
        yield rng.gammavariate(shape, 1.0 / (rate * shape))


def schedule(spec: Workload, *, rate: float, duration_s: float, seed: int,
             arrival: str = "poisson", burstiness: float = 2.0) -> tuple[WorkItem, ...]:
    """Every request arriving in [0, duration_s) at a mean of `rate` requests per second,
    sorted by arrival time (ties keep session order). Sessions start from before 0 (as long
    before as the longest session lasts), so the run begins in the steady state: conversations
    already under way, not all starting together."""
    if not rate > 0 or not duration_s > 0:
        raise ValueError("rate and duration must be > 0")
    if arrival not in ARRIVALS:
        raise ValueError(f"unknown arrival process {arrival!r}; known: {', '.join(ARRIVALS)}")
    if arrival == "bursty" and not burstiness > 0:
        raise ValueError("burstiness must be > 0")
    source = SessionSource(spec, seed=seed)
    rng = random.Random(f"kvgate-arrivals:{seed}")
    gaps = _gaps(rng, rate / source.mean_requests_per_session, arrival, burstiness)
    items: list[WorkItem] = []
    start = next(gaps) - source.max_session_span_s
    while start < duration_s:
        for item in source.next_session():
            at = start + item.arrival_s
            if 0.0 <= at < duration_s:
                items.append(WorkItem(at, item.kind, item.segments, item.output_tokens,
                                      item.max_tokens, item.prefix_group, item.conversation,
                                      item.session, item.ignore_eos))
        start += next(gaps)
    items.sort(key=lambda item: item.arrival_s)  # stable: ties keep generation order
    return tuple(items)
