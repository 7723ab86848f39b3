"""Cue patterns: what kind of work a prompt asks for, as whole words and patterns, never
substrings.

Each cue (`CUE_NAMES`, in that order) counts the matches of one family in the lower-cased text:
a classifier feature (log1p of the count), not a rule. A cue says where the hard prompts tend to
be (a proof, a drug interaction, a tax question, "write a compiler"); the classifier weighs it
against everything else, so one cue alone does not send a prompt large, and its absence does
not send one small. `improve`, `waterproof` and `illegal` match nothing here: every pattern is
bounded by word boundaries on both sides.
"""

from __future__ import annotations

import re


def _words(*alternatives: str) -> str:
    return r"\b(?:" + "|".join(alternatives) + r")\b"


_MATH = _words(
    r"primes?", r"prime factori[sz]ation", r"mod(?:ulo|ular)?", r"congruen\w*", r"divisib\w+",
    r"gcd", r"lcm", r"integers?", r"integra(?:l|ls|te|tion)", r"derivatives?", r"differentiate",
    r"eigen\w*", r"matri(?:x|ces)", r"determinant", r"polynomials?", r"roots?", r"equations?",
    r"inequalit(?:y|ies)", r"subgroups?", r"groups? of order", r"cyclic", r"abelian",
    r"isomorph\w*", r"homomorph\w*", r"irrational", r"factorial", r"probabilit(?:y|ies)",
    r"expected value", r"variance", r"converge\w*", r"diverge\w*", r"series", r"limits?",
    r"permutations?", r"combinations?", r"combinatori\w*", r"recurrence", r"asymptotic\w*",
    r"vectors?", r"topolog\w*", r"manifolds?", r"lemma", r"corollary", r"axioms?",
    r"carmichael", r"fibonacci", r"digits? of", r"trailing zeros", r"solutions?",
)
_PROOF = (_words(r"prove", r"proofs?", r"show that", r"demonstrate that", r"derive",
                 r"is it true that", r"for all", r"for every", r"if and only if", r"iff",
                 r"beweise", r"démontrer", r"demuestra", r"up to isomorphism")
          + r"|\bevery\s+\w+(?:\s+\w+){0,4}\s+(?:is|are|has|have)\b")
_LEGAL = _words(
    r"enforceable", r"non-?competes?", r"contracts?", r"clauses?", r"liab(?:le|ility)",
    r"lawsuits?", r"sue", r"suing", r"sued", r"landlords?", r"tenants?", r"leases?",
    r"evict\w*", r"custody", r"divorce", r"alimony", r"copyright\w*", r"trademarks?",
    r"patents?", r"licen[cs]e[sd]?", r"gpl", r"agpl", r"gdpr", r"hipaa", r"employers?",
    r"fired", r"dismiss\w*", r"severance", r"negligen\w*", r"jurisdictions?", r"statutes?",
    r"binding", r"indemnif\w*", r"warrant(?:y|ies)", r"lawyer", r"attorney", r"court",
    r"probate", r"wills?", r"inherit\w*", r"visa", r"immigration", r"insurer", r"settlement",
)
_MEDICAL = (_words(
    r"mg", r"mcg", r"doses?", r"dosage", r"dosing", r"medications?", r"medicines?", r"drugs?",
    r"interactions?", r"interact", r"symptoms?", r"diagnos\w+", r"prescri\w+", r"side effects?",
    r"pregnan\w+", r"breastfeeding", r"overdose", r"swallowed", r"allerg\w+", r"antibiotics?",
    r"blood pressure", r"chest", r"pains?", r"rash", r"fever", r"infection", r"kidney",
    r"liver", r"heart", r"stroke", r"seizures?", r"insulin", r"diabet\w+", r"cancer",
    r"tumou?r", r"chemo\w*", r"vaccin\w+", r"contraindicat\w+", r"while (?:on|taking)",
    r"safe to (?:take|combine|mix|drink)", r"alcohol",
) + r"|\b\w{2,}(?:azole|arin|pril|sartan|statin|mycin|cillin|olol|dipine|prazole|tidine|oxetine"
    r"|traline|adol|profen|cycline|floxacin|zepam|azepam|codone|triptan|gliptin|formin"
    r"|thiazide|semide|parin|xaban|gatran|lukast|sone|olone)\b")
_FINANCE = _words(
    r"tax(?:es|ed|able|ation)?", r"resident", r"residency", r"irs", r"hmrc", r"deduct\w*",
    r"capital gains", r"pensions?", r"ira", r"roth", r"401\(?k\)?", r"mortgages?", r"invest\w*",
    r"portfolio", r"options?", r"dividends?", r"amorti[sz]\w+", r"npv", r"irr", r"valuation",
    r"freelanc\w*", r"self-employed", r"vat", r"withholding", r"loan", r"interest rate",
    r"annuity", r"bonds?", r"yield", r"hedge", r"volatility", r"sigma", r"black-scholes",
    r"equity", r"vesting", r"stock options?", r"payroll", r"depreciation", r"accrual",
)
_ARTIFACT = (
    r"\b(?:write|build|implement|create|code|design|develop|make|program|architect)\b"
    r"(?:\s+[\w+#.-]+){0,6}?\s+"
    r"(?:compilers?|interpreters?|apis?|servers?|clients?|databases?|parsers?|engines?|"
    r"kernels?|schedulers?|frameworks?|operators?|services?|apps?|applications?|websites?|"
    r"backends?|frontends?|protocols?|emulators?|vms?|virtual machines?|garbage collectors?|"
    r"queues?|caches?|allocators?|solvers?|simulators?|systems?|pipelines?|libraries|library|"
    r"tool|tools|bot|bots|game|games|shell|filesystem|file system|planner|optimi[sz]er|"
    r"runtime|debugger|crawler|scraper|cli|sdk|plugin|extension|blockchain|raft|paxos|"
    r"orm|dsl|language|transpiler|assembler|linker|lexer|tokenizer|router|proxy|"
    r"load balancer|rate limiter|key-value store|skip list|b-tree|red-black tree|"
    r"trie|heap|hash map|regex engine|spreadsheet|editor|ide|browser|renderer|ray tracer)\b"
)
_CODE_LANGUAGE = _words(
    r"python", r"go", r"golang", r"rust", r"c\+\+", r"java", r"kotlin", r"swift", r"typescript",
    r"javascript", r"haskell", r"scala", r"elixir", r"erlang", r"ocaml", r"sql", r"bash",
    r"react", r"django", r"flask", r"kubernetes", r"docker", r"terraform", r"redis",
    r"postgres\w*", r"mysql", r"cuda", r"wasm", r"llvm", r"goroutines?", r"threads?",
    r"async", r"mutex", r"deadlock\w*", r"race condition", r"memory leak", r"segfault",
    r"concurren\w+", r"distributed", r"lock-free", r"o\(n\w*\)",
)
_MULTI_STEP = _words(
    r"and then", r"then", r"steps?", r"plan", r"compare", r"trade-?offs?", r"pros and cons",
    r"analy[sz]e", r"analysis", r"estimate", r"design", r"explain why", r"why does", r"why do",
    r"why is", r"how does", r"what happens", r"optimal", r"minimum", r"maximum", r"fastest",
    r"at least", r"at most", r"exactly", r"justify", r"critique", r"evaluate", r"strategy",
    r"account for", r"given that", r"assuming", r"otherwise", r"each", r"every",
    r"should i", r"should we", r"what are my options", r"is it safe",
)
_PUZZLE = _words(
    r"puzzles?", r"riddle", r"boxes", r"labels?", r"labelled", r"labeled", r"mislabell?ed",
    r"coins?", r"weighings?", r"liars?", r"lies", r"truth-?tellers?", r"knights?", r"knaves?",
    r"guards?", r"prisoners?", r"hats?", r"torch", r"bridge", r"doors?", r"wolf", r"goat",
    r"cabbage", r"jugs?", r"litres?", r"gallons?", r"how do you", r"how can you", r"you may",
    r"only one", r"one question", r"wrong", r"always", r"never", r"must", r"relabel",
)
_NUMBER_OPERATOR = (
    r"\d\s*(?:\^|\*\*|[*/%×÷]|mod\b|choose\b)\s*\(?-?\d"
    r"|\d\s*[+\-=<>]\s*-?\d|\b[a-z]\s*\^\s*\d|\d\s*!|\b[a-z]\s*[=<>]\s*-?\d"
    r"|\b\d{1,3}(?:,\d{3}){2,}\b|\b\d{7,}\b"
)
_EASY = _words(
    r"hi", r"hello", r"hey", r"thanks", r"thank you", r"thx", r"bye", r"goodbye", r"lol",
    r"haha", r"good morning", r"good night", r"cheers", r"synonym", r"antonym", r"opposite",
    r"plural", r"spell", r"spelling", r"typo", r"capital of", r"capitali[sz]e", r"uppercase",
    r"lowercase", r"title case", r"alphabetical\w*", r"translate", r"how do you say",
    r"what does .{1,20} mean", r"stand for", r"one-line", r"one word", r"two-word", r"caption",
    r"rhymes? with", r"joke", r"fun fact", r"name for", r"nickname", r"emoji",
)

CUES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern)) for name, pattern in (
        ("cue_math", _MATH), ("cue_proof", _PROOF), ("cue_legal", _LEGAL),
        ("cue_medical", _MEDICAL), ("cue_finance", _FINANCE), ("cue_artifact", _ARTIFACT),
        ("cue_code_language", _CODE_LANGUAGE), ("cue_multi_step", _MULTI_STEP),
        ("cue_puzzle", _PUZZLE), ("cue_number_operator", _NUMBER_OPERATOR), ("cue_easy", _EASY),
    ))
CUE_NAMES = tuple(name for name, _ in CUES)
FIRST_PERSON = re.compile(r"\b(?:i|i'm|i've|my|me|we|we're|our|us)\b")


def counts(lowered: str) -> tuple[int, ...]:
    """Each cue's matches in `lowered` (the prompt, lower-cased), in `CUE_NAMES` order."""
    return tuple(len(pattern.findall(lowered)) for _, pattern in CUES)
