"""The near-miss guard vetoes a cached answer when the two questions differ in what decides the
answer, and lets through questions that differ only in wording."""

from __future__ import annotations

import pytest

from gateway.cache import guard, guard_roles

VETOED = [
    # (kind, new question, cached question)
    ("code", "Is `rm -rf ./build` safe?", "Is `rm -rf /build` safe?"),
    ("code", "What does git stash pop do?", "What does git stash apply do? `apply`"),
    ("code", "How do I read a file with os.open?", "How do I read a file with io.open?"),
    ("code", "What does the -x flag of bash do?", "What does the -e flag of bash do?"),
    ("code", "Where is ~/.ssh/config?", "Where is /etc/ssh/sshd_config?"),
    ("quoted", "What does \"carpe diem\" mean?", "What does \"carpe noctem\" mean?"),
    ("quoted", "Rhyme with 'moon'.", "Rhyme with 'spoon'."),
    ("quoted", "Translate “bonjour”.", "Translate “bonsoir”."),
    ("number", "What is 12 squared?", "What is 13 squared?"),
    ("number", "Give me three tips.", "Give me 4 tips."),
    ("number", "Explain chapter 2.", "Explain chapter two and chapter 3."),
    ("number", "Is 1,001 prime?", "Is 1,000 prime?"),
    ("date", "What happened in May 1945?", "What happened in June 1945?"),
    ("date", "Is the shop open on Sundays?", "Is the shop open on Saturdays?"),
    ("date", "What is the forecast for tomorrow?", "What is the forecast for tonight?"),
    ("date", "Plan my next week.", "Plan my last week."),
    ("unit", "Convert 5 kg to pounds.", "Convert 5 stone to pounds."),
    ("unit", "Is 40 mph fast?", "Is 40 km/h fast?"),
    ("unit", "Is $30 a fair price?", "Is £30 a fair price?"),
    ("unit", "What is 20 degrees Celsius in Fahrenheit?",
     "What is 20 degrees Fahrenheit in Celsius?"),
    ("unit", "Is 10 Mbps enough?", "Is 10 MBps enough?"),
    ("negation", "foods that contain gluten", "foods that do not contain gluten"),
    ("negation", "Why does it work?", "Why doesn't it work?"),
    ("negation", "Can I travel with a passport?", "Can I travel without a passport?"),
    ("negation", "Is this code safe?", "Is this code unsafe?"),
    ("negation", "Which claims are accurate?", "Which claims are inaccurate?"),
    ("negation", "How do I encode the data?", "How do I decode the data?"),
    ("negation", "What is the best route?", "What is the worst route?"),
    ("negation", "Write an email accepting the invitation.",
     "Write an email declining the invitation."),
    ("negation", "What are the side effects of melatonin?", "What are the benefits of melatonin?"),
    ("direction", "convert JSON to YAML", "convert YAML to JSON"),
    ("direction", "Boston->NY trains", "NY->Boston trains"),
    ("direction", "Driving from Lyon to Nice", "Driving from Nice to Lyon"),
    ("direction", "Is a lion stronger than a tiger?", "Is a tiger stronger than a lion?"),
    ("direction", "Translate this into Welsh from Irish.", "Translate this into Irish from Welsh."),
    ("direction", "Upgrade Postgres 15 to Postgres 16", "Upgrade Postgres 16 to Postgres 15"),
    ("entity", "What is the capital of France?", "What is the capital of Spain?"),
    ("entity", "How old is Serena Williams?", "How old is Venus Williams?"),
    ("entity", "Install Redis on Fedora", "Install Redis on Arch"),
    ("entity", "Can dogs eat raw carrots?", "Can dogs eat raw onions?"),
    ("entity", "What is the difference between hawks and eagles?",
     "What is the difference between moths and butterflies?"),
    ("entity", "Which laptop is best for music production?", "Which laptop is best for gaming?"),
    ("language", "¿Qué hora es en Madrid?", "What time is it in Madrid?"),
    ("language", "Describe Kyoto in German.", "Describe Kyoto in Italian."),
    ("language", "Summarize the news.", "Summarize the news in Hindi."),
    ("language", "Что такое Python?", "What is Python?"),
    ("audience", "Explain entropy like I'm five.", "Explain entropy."),
    ("audience", "Explain entropy to a chemist.", "Explain entropy to a child."),
    ("audience", "Explain entropy briefly.", "Explain entropy in detail."),
    ("audience", "Explain entropy in simple terms.", "Explain entropy rigorously."),
    # a noun counted as one in one question and as many in the other
    ("number", "How do I move a folder with rsync?", "How do I move several folders with rsync?"),
    ("number", "How do I revert a migration?", "How do I revert all migrations?"),
    ("number", "How do I drop a column in SQL?", "How do I drop multiple columns in SQL?"),
    ("number", "How do I stop a background job?", "How do I stop every background job?"),
    ("number", "How do I delete a branch?", "How do I delete many branches?"),
    # two of the same words exchanged: who does what to whom
    ("direction", "Can my neighbour sue me over a fallen tree?",
     "Can I sue my neighbour over a fallen tree?"),
    ("direction", "Why does the kernel signal the process?",
     "Why does the process signal the kernel?"),
    ("direction", "Does the teacher grade the student?", "Does the student grade the teacher?"),
    ("direction", "My cousin lent money to me; what now?", "I lent money to my cousin; what now?"),
    # two named as alternatives in one, one related to the other in the other
    ("direction", "Should the buyer or the seller pay the agent?",
     "Should the buyer pay the seller?"),
    # one word put in another's place, the two sharing only their opening letters
    ("entity", "When is a prosecutor required?", "When is a prosecution required?"),
]

LET_THROUGH = [
    ("case and punctuation", "What is the capital of France?", "what is the capital of france"),
    ("contractions", "What's the capital of France?", "What is the capital of France?"),
    ("contractions without the apostrophe", "Why doesn't it work?", "why doesnt it work"),
    ("reordered clauses", "In Python, how do I sort a list?", "How do I sort a list in Python?"),
    ("a paraphrase", "How do I reset my password?", "What's the way to change my password?"),
    ("number words and digits", "Give me five tips.", "Give me 5 tips."),
    ("ordinal words and digits", "Explain the tenth amendment.", "Explain the 10th amendment."),
    ("thousands separators", "Is 1,000 a lot?", "Is 1000 a lot?"),
    ("unit spellings", "How far is 10 km?", "How far is 10 kilometres?"),
    ("a currency symbol and its name", "Is $30 a fair price?", "Is 30 dollars a fair price?"),
    ("the same quoted string", 'What does "carpe diem" mean?', 'Meaning of "Carpe  Diem"?'),
    ("the same code span", "What does `ls -la` do?", "Explain what `ls -la` does."),
    ("the same direction in other words", "How do I convert JSON into YAML?",
     "What's the way to turn JSON to YAML?"),
    ("from X to Y as to Y from X", "Flights from Oslo to Rome?", "Flights to Rome from Oslo?"),
    ("a name in lower case", "Where is Lisbon?", "where is lisbon"),
    ("an abbreviation with dots", "How does a bill become law in the US?",
     "How does a bill become law in the U.S.?"),
    ("a hyphenated word", "How do I fix my Wi-Fi?", "how do i fix my wi-fi"),
    ("a one-letter spelling variant", "What colour is a robin's egg?",
     "What color is a robin's egg?"),
    ("an inflection", "How long do I cook an egg?", "How long do I cook eggs?"),
    ("a hyphenated age and a spaced one", "What should I feed a 6 month old?",
     "What should I feed a 6-month-old?"),
    ("a short stem after a short prefix is no opposite", "I can't fall back asleep, any advice?",
     "Any advice? I can't get back to sleep."),
    ("the opening reworded", "What is the plot of Dune?", "Summarize the story of Dune."),
    ("words of one root", "Summarize the history of jazz.", "Give a summary of jazz history."),
    ("'simplest' outside an explanation is no audience",
     "What's the simplest way to add login to a Flask app?",
     "How do I add login to a Flask app the easiest way?"),
    ("the same negation in other words", "Why can't I sleep?", "Why can not I sleep?"),
    ("the same audience in other words", "Explain DNS for beginners.",
     "Explain DNS to a beginner."),
    ("a plural that counts nothing", "What is a monad?", "What are monads?"),
    ("'all' over a plural the other has too", "How do I list all open ports?",
     "Which command shows the open ports?"),
    ("one of each", "How do I add a key to a dict?", "How can I add one key to a dict?"),
    ("a hyphenated compound and its words", "Is dark-roast coffee stronger?",
     "Is dark roast coffee stronger?"),
    ("alternatives in either order", "Should I lease or buy a car?",
     "Is it better to buy or lease a car?"),
    ("a distance holds both ways", "How far is Leeds from York?", "How far is York from Leeds?"),
    ("two compared, as alternatives or related", "What is the difference between a mule and a "
     "hinny?", "How does a mule differ from a hinny?"),
    ("words of one root", "How do I configure nginx?", "What is the configuration of nginx?"),
]


@pytest.mark.parametrize(("kind", "new", "cached"), VETOED,
                         ids=[f"{kind}: {new} / {cached}" for kind, new, cached in VETOED])
def test_a_decisive_difference_is_vetoed(kind: str, new: str, cached: str) -> None:
    found = guard.veto(new, cached)
    assert found is not None
    assert found.kind == kind
    assert guard.veto(cached, new) is not None  # whichever of the two was cached


@pytest.mark.parametrize(("new", "cached"), [(new, cached) for _, new, cached in LET_THROUGH],
                         ids=[rule for rule, _, _ in LET_THROUGH])
def test_a_difference_in_wording_only_passes(new: str, cached: str) -> None:
    assert guard.veto(new, cached) is None
    assert guard.veto(cached, new) is None


def test_features_computed_once_compare_as_the_texts_do() -> None:
    cached = guard.features("Convert 10 miles to kilometres.")
    assert guard.compare(guard.features("convert 10 miles to kilometers"), cached) is None
    found = guard.compare(guard.features("Convert 10 kilometres to miles."), cached)
    assert found is not None and found.kind == "unit"


def test_identical_texts_and_empty_texts_pass() -> None:
    assert guard.allows("anything at all", "anything at all")
    assert guard.allows("", "")
    assert guard.allows("?!", "...")


@pytest.mark.parametrize("text", ["", "`", "\"", "'", "->", "1,2,3", "¿", "```x", "a'b'c",
                                  "日本語", "--", "$", "°C", "5 mb", "x" * 5000])
def test_any_text_is_read_without_error(text: str) -> None:
    guard.features(text)
    guard.veto(text, "What is the capital of France?")


@pytest.mark.parametrize(("plural", "singular"), [
    ("processes", "process"), ("files", "file"), ("queries", "query"), ("boxes", "box"),
    ("branches", "branch"), ("process", "process"), ("status", "status"), ("analysis", "analysis"),
])
def test_a_plural_is_read_by_its_singular(plural: str, singular: str) -> None:
    assert guard_roles.singular(plural) == singular


def test_the_count_reads_the_noun_a_determiner_or_quantifier_opens() -> None:
    one, many = guard_roles.counted("kill a child process and all zombie threads".split())
    assert one == {"process"} and many == {"thread"}
    assert guard_roles.counted("read a users guide".split()) == (frozenset({"guide"}), frozenset())


def test_exchanged_actors_are_named_and_anything_else_is_not() -> None:
    assert guard_roles.exchanged(("dog", "chase", "cat"), ("cat", "chase", "dog")) == (
        "dog", "cat")
    assert guard_roles.exchanged(("rent", "&", "buy"), ("buy", "&", "rent")) is None
    assert guard_roles.exchanged(("dog", "chase", "cat"), ("dog", "chase", "cat")) is None
    assert guard_roles.exchanged(("a", "b", "c"), ("c", "a", "b")) is None  # moved, not swapped
