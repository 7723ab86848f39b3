"""The word lists the guard (gateway/cache/guard.py) reads: plain data, casefolded.

Each list names a class of words that decides an answer when two otherwise similar questions
differ in it. They are lists of a language's closed classes (numbers, months, units, negations,
language names), not of examples: a word missing here costs a veto the other checks may still
make, never a wrong veto elsewhere.
"""

from __future__ import annotations

NUMBER_WORDS: dict[str, int] = {
    "zero": 0, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
    "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14,
    "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20,
    "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80,
    "ninety": 90, "hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9,
    "dozen": 12, "first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6,
    "seventh": 7, "eighth": 8, "ninth": 9, "tenth": 10, "eleventh": 11, "twelfth": 12,
    "twentieth": 20, "hundredth": 100, "thousandth": 1000, "twice": 2, "thrice": 3,
    "double": 2, "triple": 3,
}  # "one" is left out: it is a pronoun far more often than a count ("which one")
TENS = frozenset({"twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"})

MONTHS: dict[str, str] = {
    "january": "jan", "jan": "jan", "february": "feb", "feb": "feb", "march": "mar",
    "mar": "mar", "april": "apr", "apr": "apr", "may": "may", "june": "jun", "jun": "jun",
    "july": "jul", "jul": "jul", "august": "aug", "aug": "aug", "september": "sep",
    "sept": "sep", "sep": "sep", "october": "oct", "oct": "oct", "november": "nov",
    "nov": "nov", "december": "dec", "dec": "dec",
}
AMBIGUOUS_MONTHS = frozenset({"may", "mar", "jan", "jun", "jul", "aug", "sep", "oct", "nov",
                              "dec", "sept", "feb", "apr"})  # a month only beside a number
WEEKDAYS: dict[str, str] = {
    day + suffix: day[:3] for day in ("monday", "tuesday", "wednesday", "thursday", "friday",
                                      "saturday", "sunday") for suffix in ("", "s")
}
TIME_WORDS = frozenset({
    "today", "tonight", "tomorrow", "yesterday", "weekend", "weekday", "weekdays",
    "morning", "afternoon", "evening", "night", "noon", "midnight", "dawn", "dusk",
    "spring", "summer", "autumn", "winter", "decade", "century", "millennium",
    "bc", "bce",
})
SEASON_ALIASES = {"fall": "autumn"}  # after "the", "this", "last", "next", "in"
RELATIVE = frozenset({"this", "next", "last", "past", "coming", "previous", "current"})
PERIODS = frozenset({"week", "month", "year", "quarter", "weekend", "season", "semester"})

# Units and currencies, each surface form to its canonical name. NEEDS_NUMBER: a form that is
# a unit only right after a number ("5 m", "2 bar", "100 won"), being a word too.
UNITS: dict[str, str] = {
    "mm": "mm", "millimeter": "mm", "millimetre": "mm", "cm": "cm", "centimeter": "cm",
    "centimetre": "cm", "m": "m", "meter": "m", "metre": "m", "km": "km", "kilometer": "km",
    "kilometre": "km", "mile": "mi", "mi": "mi", "ft": "ft", "foot": "ft", "feet": "ft",
    "inch": "in", "inches": "in", "yard": "yd", "yd": "yd", "nautical": "nautical",
    "mg": "mg", "milligram": "mg", "g": "g", "gram": "g", "gramme": "g", "kg": "kg",
    "kilogram": "kg", "kilo": "kg", "lb": "lb", "lbs": "lb", "pound": "lb", "oz": "oz",
    "ounce": "oz", "ton": "t", "tonne": "t", "stone": "st",
    "ml": "ml", "milliliter": "ml", "millilitre": "ml", "l": "l", "liter": "l", "litre": "l",
    "gallon": "gal", "gal": "gal", "cup": "cup", "tablespoon": "tbsp", "tbsp": "tbsp",
    "teaspoon": "tsp", "tsp": "tsp", "pint": "pint", "quart": "quart", "fluid": "fluid",
    "fl": "fluid", "cubic": "cubic",
    "celsius": "c", "centigrade": "c", "fahrenheit": "f", "kelvin": "k", "°c": "c", "°f": "f",
    "second": "s", "sec": "s", "minute": "min", "min": "min", "hour": "h", "hr": "h",
    "day": "day", "week": "week", "month": "month", "year": "year", "ms": "ms",
    "millisecond": "ms", "microsecond": "us", "nanosecond": "ns",
    "w": "w", "watt": "w", "kw": "kw", "kilowatt": "kw", "kwh": "kwh", "mw": "mw",
    "joule": "j", "calorie": "cal", "kcal": "kcal", "cal": "cal", "volt": "v", "v": "v",
    "amp": "a", "ampere": "a", "mah": "mah", "hz": "hz", "khz": "khz", "mhz": "mhz",
    "ghz": "ghz", "bar": "bar", "psi": "psi", "atm": "atm", "pascal": "pa", "pa": "pa",
    "kpa": "kpa", "mph": "mph", "kph": "km/h", "km/h": "km/h", "m/s": "m/s", "knot": "knot",
    "percent": "%", "%": "%", "degree": "deg", "acre": "acre", "hectare": "ha", "ha": "ha",
    "$": "usd", "usd": "usd", "dollar": "usd", "buck": "usd", "€": "eur", "eur": "eur",
    "euro": "eur", "£": "gbp", "gbp": "gbp", "sterling": "gbp", "¥": "jpy", "jpy": "jpy",
    "yen": "jpy", "yuan": "cny", "cny": "cny", "rmb": "cny", "renminbi": "cny", "₹": "inr",
    "inr": "inr", "rupee": "inr", "₩": "krw", "krw": "krw", "won": "krw", "₽": "rub",
    "rub": "rub", "ruble": "rub", "rouble": "rub", "chf": "chf", "franc": "chf", "cad": "cad",
    "aud": "aud", "peso": "peso", "mxn": "mxn", "krona": "sek", "kronor": "sek", "sek": "sek",
    "nok": "nok", "krone": "krone", "btc": "btc", "bitcoin": "btc", "eth": "eth",
    "ether": "eth", "cent": "cent", "penny": "penny", "pence": "penny",
}
NEEDS_NUMBER = frozenset({"m", "g", "l", "w", "v", "a", "s", "t", "min", "sec", "bar", "won",
                          "pa", "ha", "cal", "cup", "st", "stone", "mi", "ms", "eth",
                          "second", "minute", "hour", "day", "week", "month", "year", "degree",
                          "ton", "in", "cent"})
COUNT_WORDS = frozenset({"many", "per", "a", "an", "each", "every"})  # "how many hours"

NEGATIONS = frozenset({
    "not", "no", "never", "without", "none", "nothing", "nobody", "nowhere", "neither", "nor",
    "avoid", "avoiding", "except", "excluding", "exclude", "lack", "lacking", "lacks",
    "stop", "prevent", "free", "omit", "against", "hardly", "barely",
})
CONTRACTIONS: dict[str, tuple[str, ...]] = {
    "can't": ("can", "not"), "cannot": ("can", "not"), "won't": ("will", "not"),
    "shan't": ("shall", "not"), "ain't": ("is", "not"), "dont": ("do", "not"),
    "doesnt": ("does", "not"), "didnt": ("did", "not"), "isnt": ("is", "not"),
    "arent": ("are", "not"), "wasnt": ("was", "not"), "werent": ("were", "not"),
    "couldnt": ("could", "not"), "shouldnt": ("should", "not"), "wouldnt": ("would", "not"),
    "havent": ("have", "not"), "hasnt": ("has", "not"), "hadnt": ("had", "not"),
    "whats": ("what", "is"), "thats": ("that", "is"),
}
# Prefixes that turn a stem into its opposite, each with the shortest stem it is read before:
# the shorter the prefix, the longer the stem, so "asleep" is not "a-" + "sleep", nor "income"
# "in-" + "come", while "atypical", "illegal" and "unsafe" are read as opposites.
POLAR_PREFIXES: dict[str, int] = {
    "un": 4, "dis": 4, "non": 4, "anti": 4, "mis": 4, "ex": 4, "up": 4, "down": 4, "over": 4,
    "under": 4, "out": 4, "pre": 4, "post": 4, "counter": 4,
    "in": 5, "im": 5, "il": 5, "ir": 5, "de": 5, "en": 5, "a": 6,
}
SUFFIX_OPPOSITES = (("ful", "less"),)
ANTONYMS: frozenset[frozenset[str]] = frozenset(frozenset(pair) for pair in (
    ("good", "bad"), ("better", "worse"), ("best", "worst"), ("safe", "dangerous"),
    ("more", "less"), ("more", "fewer"), ("most", "least"), ("max", "min"),
    ("maximum", "minimum"), ("largest", "smallest"), ("biggest", "smallest"),
    ("bigger", "smaller"), ("larger", "smaller"), ("big", "small"), ("large", "small"),
    ("highest", "lowest"), ("higher", "lower"), ("high", "low"), ("cheap", "expensive"),
    ("cheapest", "most"), ("hot", "cold"), ("warm", "cold"), ("fast", "slow"),
    ("faster", "slower"), ("fastest", "slowest"), ("long", "short"), ("longest", "shortest"),
    ("pros", "cons"), ("benefits", "drawbacks"), ("benefits", "risks"), ("win", "lose"),
    ("wins", "loses"), ("won", "lost"), ("like", "hate"), ("love", "hate"), ("buy", "sell"),
    ("push", "pull"), ("accept", "reject"), ("allow", "deny"), ("allow", "block"),
    ("include", "omit"), ("add", "remove"), ("add", "delete"), ("add", "subtract"),
    ("plus", "minus"), ("true", "false"), ("always", "never"), ("before", "after"),
    ("above", "below"), ("first", "last"), ("early", "late"), ("earliest", "latest"),
    ("easy", "hard"), ("easiest", "hardest"), ("easy", "difficult"), ("strong", "weak"),
    ("rich", "poor"), ("positive", "negative"), ("success", "failure"), ("pass", "fail"),
    ("open", "close"), ("open", "closed"), ("start", "stop"), ("start", "end"),
    ("begin", "end"), ("enter", "exit"), ("input", "output"), ("north", "south"),
    ("east", "west"), ("left", "right"), ("up", "down"), ("inside", "outside"),
    ("young", "old"), ("new", "old"), ("heavy", "light"), ("wet", "dry"), ("full", "empty"),
    ("alive", "dead"), ("male", "female"), ("men", "women"), ("buying", "selling"),
    ("eat", "avoid"), ("increase", "reduce"), ("raise", "lower"), ("gain", "lose"),
    ("profit", "loss"), ("attack", "defend"), ("mean", "median"), ("encode", "decode"),
    ("serialize", "deserialize"), ("compress", "decompress"), ("lock", "unlock"),
    ("sync", "async"), ("synchronous", "asynchronous"), ("client", "server"),
    ("send", "receive"), ("read", "write"), ("get", "set"), ("import", "export"),
    ("upload", "download"), ("login", "logout"), ("install", "uninstall"),
    ("increase", "lower"), ("accept", "decline"), ("accept", "refuse"), ("approve", "reject"),
    ("even", "odd"), ("raise", "reduce"), ("maximize", "minimize"), ("forward", "backward"),
    ("public", "private"), ("online", "offline"), ("visible", "hidden"), ("show", "hide"),
    ("horizontal", "vertical"), ("horizontally", "vertically"), ("row", "column"),
    ("inner", "outer"), ("front", "back"), ("frontend", "backend"), ("permanent", "temporary"),
    ("asc", "desc"), ("ascending", "descending"), ("join", "leave"), ("hire", "fire"),
    ("borrow", "lend"), ("import", "export"), ("arrive", "depart"), ("arrival", "departure"),
    ("rise", "fall"), ("win", "loss"), ("gain", "loss"), ("over", "under"),
    ("overestimate", "underestimate"), ("sunrise", "sunset"), ("cause", "effect"),
    ("sweet", "sour"), ("sweet", "bitter"), ("soft", "hard"), ("thick", "thin"),
    ("wide", "narrow"), ("deep", "shallow"), ("loud", "quiet"), ("wrong", "right"),
    ("correct", "incorrect"), ("valid", "invalid"), ("legal", "illegal"), ("same", "different"),
    ("similar", "different"), ("similarities", "differences"), ("agree", "disagree"),
    ("yes", "no"), ("all", "none"), ("everything", "nothing"), ("everyone", "nobody"),
    ("mandatory", "optional"), ("required", "optional"), ("explicit", "implicit"),
    ("static", "dynamic"), ("mutable", "immutable"), ("lazy", "eager"), ("strict", "lenient"),
))
LINKS = frozenset({"in", "to", "into", "as", "per", "from"})  # "ounces in a pound", "m to ft"
PHRASES: dict[str, str] = {  # rewritten before the words are read
    "leave out": "omit", "left out": "omit", "rather than": "instead", "instead of": "instead",
    "side effects": "risks", "side effect": "risks", "downsides": "drawbacks",
    "as opposed to": "vs", "compared to": "vs", "compared with": "vs",
}

DIRECTIONAL = frozenset({"to", "into", "onto", "towards", "toward", "vs", "versus", "than",
                         "over", "instead", "->", "→", "=>", "⇒", "-->", "⟶", "↦"})
REVERSED_DIRECTIONAL = frozenset({"from", "<-", "←"})  # "X from Y": Y is the source

LANGUAGE_NAMES: dict[str, str] = {name: name for name in (
    "english", "spanish", "french", "german", "italian", "portuguese", "dutch", "russian",
    "ukrainian", "polish", "czech", "slovak", "hungarian", "romanian", "bulgarian", "serbian",
    "croatian", "greek", "turkish", "arabic", "hebrew", "persian", "farsi", "urdu", "hindi",
    "bengali", "punjabi", "tamil", "telugu", "marathi", "chinese", "mandarin", "cantonese",
    "japanese", "korean", "vietnamese", "thai", "indonesian", "malay", "tagalog", "filipino",
    "swahili", "swedish", "norwegian", "danish", "finnish", "icelandic", "estonian", "latvian",
    "lithuanian", "irish", "welsh", "catalan", "basque", "galician", "latin", "esperanto",
    "afrikaans", "amharic", "yoruba", "zulu",
)} | {"español": "spanish", "castellano": "spanish", "français": "french",
      "deutsch": "german", "italiano": "italian", "português": "portuguese",
      "nederlands": "dutch", "русский": "russian", "中文": "chinese", "日本語": "japanese",
      "한국어": "korean"}

# Function words that tell a question's language (Latin script), each list its own.
LANGUAGE_WORDS: dict[str, frozenset[str]] = {code: frozenset(words.split()) for code, words in {
    "en": "the is are what how why which who whom of and do does did my you your with for this "
          "that can could should would it be on at from an to there me we i explain write give "
          "tell describe make get find list show convert translate summarize about when where",
    "es": "el los las es qué cuál cuáles cómo cuántos cuántas por para del una y hay con mi "
          "mis sus está son dónde cuándo porque lo se al muy también pero más",
    "fr": "le les est quelle quel quels comment pourquoi des du et une ce qu sont pour avec où "
          "quand dans je mon ma mes vous il elle c d l qui est-ce meilleure façon n'est",
    "de": "der die das ist wie was warum welche welcher welches ein eine und ich mein nicht mit "
          "für von zu hat sind es wo wann spät gibt kann man den dem",
    "it": "il lo gli è come cosa perché quale quali che di si fa sono per con della mio "
          "questo quella dove quando anche ma più",
    "pt": "o os é qual quais um uma e não do da dos das em com para meu minha são você "
          "porque onde quando também mas mais",
    "nl": "het een waarom wat hoe welke van niet met voor zijn ik mijn de is er",
}.items()}

NOVICE = frozenset({
    "eli5", "child", "children", "kid", "kids", "toddler", "toddlers", "grandmother",
    "grandma", "grandfather", "grandpa", "beginner", "beginners", "novice", "novices",
    "layman", "laymen", "layperson", "laypeople", "dummies", "dummy", "newbie", "newbies",
    "nontechnical", "non-technical", "elementary", "introductory", "intro", "five-year-old",
    "child-friendly",
    "beginner-friendly", "kindergarten", "teenager", "teen", "teens", "lay",
})
EXPERT = frozenset({
    "expert", "experts", "professional", "professionals", "advanced", "technical",
    "technically", "rigorous", "rigorously", "formal", "formally", "graduate", "phd",
    "postgraduate", "researcher", "researchers", "academic", "academics", "senior",
    "specialist", "specialists", "in-depth", "depth", "mathematically", "scientist",
    "scientists", "engineering", "university", "doctoral", "practitioner", "practitioners",
})
BRIEF = frozenset({"short", "brief", "briefly", "concise", "concisely", "tl;dr", "tldr",
                   "succinct", "one-line", "one-liner"})
DETAILED = frozenset({"detailed", "detail", "details", "thorough", "thoroughly",
                      "comprehensive", "lengthy", "elaborate", "exhaustive", "long-form",
                      "step-by-step", "extensive", "extensively"})
# Novice words only where something is being explained: "explain it simply", not "the
# simplest way to ..." or "basic authentication".
PLAIN = frozenset({"simple", "simply", "simplest", "simpler", "plain", "basic", "basics",
                   "plainly"})
# Words after which an audience is named: "explain it to a ...", "as a ...", "like I'm ...".
AUDIENCE_VERBS = frozenset({"explain", "describe", "teach", "walk", "tell", "introduce",
                            "present", "summarize", "summarise", "overview", "explanation",
                            "introduction", "guide", "tutorial"})
STOPWORDS = frozenset("""
a an the this that these those my your our their his her its some any of in on at for with by
and or but is are was were be been being do does did how what why when where who whom which
whose i me you we it he she they them us can could should would will shall may might must
please just also very so if then there here as about it's i'm let many much have has had ok
""".split())
