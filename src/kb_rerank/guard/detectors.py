"""Ingestion-time detectors for chunks that will end up in a language model's prompt.

Long on purpose: most of it is the pattern tables and their anchored regexes (each one
beside the attack family it covers, so a review sees rule and reason together); the code is
the small inspector at the end.

Pure Python, no database, deterministic. Three public entry points:

* :func:`detect_injection` -> :class:`InjectionVerdict`: does the text try to instruct a
  language model (prompt injection), possibly hidden (zero-width / bidi / tag characters,
  homoglyphs, HTML comments, CSS-hidden spans)?
* :func:`detect_stuffing` -> :class:`SpamVerdict`: is the text keyword-stuffed / spam-like
  in a way that inflates lexical (BM25) scores?
* :func:`sanitize_for_prompt`: strip invisible characters and neutralise fake chat-role
  markers before a chunk is pasted into a prompt.

Injection scoring is a weighted sum of independent signals (each counted once, capped at
1.0) compared to :data:`INJECTION_THRESHOLD`. Single keywords ("instructions", "system",
"assistant", "ignore", "act as", "developer mode") carry small weights on their own; a
verdict needs an imperative that overrides earlier instructions, addresses a model, asks
it to leak / exfiltrate, or an explicit hiding trick.

Matching runs on a normalised copy of the text: hidden characters recorded then removed
(zero-width, bidi controls and marks, soft hyphens), Unicode tag characters decoded (their
ASCII payload is appended and scanned), short base64 blobs decoded and appended, NFKC,
casefold, common Cyrillic/Greek/Armenian confusables folded to their Latin skeleton,
accents stripped (đ -> d), and the rot13 reading appended when it holds injection words.
Languages with dedicated patterns: English, Vietnamese, French, Spanish, German, Chinese.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import math
import re
import threading
import time
import unicodedata
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Sequence

__all__ = [
    "INJECTION_THRESHOLD",
    "SPAM_THRESHOLD",
    "InjectionVerdict",
    "SpamVerdict",
    "detect_injection",
    "detect_stuffing",
    "inspect_documents",
    "sanitize_for_prompt",
]

INJECTION_THRESHOLD = 0.5
SPAM_THRESHOLD = 0.5


@dataclass(frozen=True)
class InjectionVerdict:
    flagged: bool
    score: float  # 0..1
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class SpamVerdict:
    flagged: bool
    score: float  # 0..1
    reasons: tuple[str, ...]


# --------------------------------------------------------------------------- characters

_ZERO_WIDTH = "\u200b\u200c\u200d\u2060\ufeff"
_BIDI_OVERRIDE = "\u202a\u202b\u202d\u202e"  # embeddings / overrides
_BIDI_OTHER = "\u202c\u2066\u2067\u2068\u2069"  # pop / isolates
# Removed before matching but not counted as a hiding trick: directional marks (LRM, RLM,
# ALM are ordinary in Arabic / Hebrew text), the soft hyphen, the Mongolian vowel
# separator and the invisible math operators -- each can split a keyword ("ig\u00adnore")
# without changing what a reader sees.
_INVISIBLE_OTHER = "\u00ad\u061c\u180e\u200e\u200f\u2061\u2062\u2063\u2064"
_HIDDEN_RE = re.compile(
    "[" + _ZERO_WIDTH + _BIDI_OVERRIDE + _BIDI_OTHER + _INVISIBLE_OTHER + "\U000e0000-\U000e007f]"
)
_TAG_RUN_RE = re.compile("(\U0001f3f4?)([\U000e0000-\U000e007f]+)")

# Cyrillic / Greek / Armenian letters that look like Latin ones (after casefold), folded
# to their Latin skeleton. Hand-written rather than Unicode's confusables.txt (UTS #39,
# ~6,000 entries, not in the standard library): only lower-case letters that can stand in
# a Latin keyword of the patterns matter here, and NFKC already folds the full-width and
# mathematical-alphanumeric look-alikes.
_CONFUSABLES = {
    "а": "a", "в": "b", "е": "e", "ё": "e", "к": "k", "м": "m", "н": "h", "о": "o",
    "р": "p", "с": "c", "т": "t", "у": "y", "х": "x", "і": "i", "ї": "i", "ј": "j",
    "ѕ": "s", "ԁ": "d", "ɡ": "g", "һ": "h", "ӏ": "l", "ԛ": "q", "ԝ": "w",
    "α": "a", "β": "b", "ε": "e", "ι": "i", "κ": "k", "ν": "v", "ο": "o", "ρ": "p",
    "τ": "t", "υ": "u", "χ": "x", "γ": "y", "η": "n",
    "ɑ": "a", "ь": "b", "ԍ": "g", "ѵ": "v",  # not the Turkish dotless ı: ordinary beside Latin letters
    "օ": "o", "ս": "u", "հ": "h", "ց": "g", "ո": "n", "ք": "f",
}
_CONFUSABLE_TABLE = str.maketrans(_CONFUSABLES)
_LATIN = "a-z"
_CONF_CHARS = "".join(sorted(_CONFUSABLES))
_MIXED_WORD_RE = re.compile(
    rf"\b(?=\w*[{_LATIN}])(?=\w*[{_CONF_CHARS}])\w+\b"
)
_CONF_PRESENT_RE = re.compile(f"[{_CONF_CHARS}]")
_ACCENT_EXTRA = str.maketrans({"đ": "d", "ø": "o", "ł": "l", "ß": "ss", "æ": "ae", "œ": "oe"})


_COMBINING_RE = re.compile("[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]+")


def _strip_accents(s: str) -> str:
    if s.isascii():
        return s
    s = _COMBINING_RE.sub("", unicodedata.normalize("NFKD", s))
    return s.translate(_ACCENT_EXTRA)


# --------------------------------------------------------------------------- patterns
# All patterns run on normalised text (casefolded, accents stripped, confusables mapped),
# except the few marked "raw" which run on the NFKC text with case kept.

_F = re.DOTALL  # text is casefolded already; IGNORECASE would defeat prefix scans
# A word: \w runs joined by ' ’ - (a dash or apostrophe at either end belongs to the
# separator). With the separators possessive (\W++, see _c) no run of dashes or
# apostrophes can be split between words and separators in every possible way -- the
# former "[\w'’-]+" with "\W+" on both sides was exponential on "ignore" + "-" * n.
# The number of words a gap needs is unchanged: one per chain of \w runs (a bare run of
# dashes still counts as a word where no separator precedes it: "you are now --> ...").
# One difference: a word glued by a dash to the literal after it ("ignore x-instructions")
# no longer splits at that dash.
_W = r"(?:\w++(?:['’-]++\w++)*+|['’-]++)"

_OVERRIDE_VERB = (
    r"(?:ignore|disregard|forget|skip|bypass|override|overwrite|discard|drop|abandon|"
    r"set aside|stop following|do not follow|don'?t follow|never mind|pay no attention to|"
    # fr
    r"ignorez?|ignorer|oubliez?|oublier|ne tenez pas compte d\w*|ne tiens pas compte d\w*|"
    r"fais abstraction d\w*|faites abstraction d\w*|"
    # es
    r"ignora|ignore|olvida|olvidate de|olvide|no hagas caso (?:a|de)|haz caso omiso (?:a|de)|"
    r"omite|descarta|"
    # de
    r"ignoriere|ignorieren sie|vergiss|vergessen sie|missachte|missachten sie|"
    r"verwirf|uberschreibe|"
    # vi
    r"bo qua|phot lo|lo di|quen di|quen|khong (?:can )?tuan theo|dung tuan theo|"
    r"khong (?:can )?lam theo|dung lam theo|bat chap|gat bo|huy bo)"
)
_INSTR_NOUN = (
    r"(?:instructions?|directions?|directives?|rules?|guidelines?|guidance|prompts?|"
    r"commands?|orders?|constraints?|polic(?:y|ies)|programming|training|restrictions?|"
    r"system message|context|"
    r"consignes?|regles?|indications?|instrucciones|indicaciones|reglas|normas|"
    r"anweisungen|instruktionen|regeln|vorgaben|richtlinien|befehle|"
    r"huong dan|chi dan|chi thi|quy tac|lenh|menh lenh|yeu cau|rang buoc|nguyen tac)"
)
_PRIOR_MOD = (
    r"(?:all|any|every|your|previous|prior|preceding|earlier|original|initial|system|"
    r"above|former|old|existing|default|safety|content|"
    r"toutes?|tous|les|vos|tes|precedentes?|anterieures?|ci-dessus|initiales?|"
    r"todas?|las|tus|sus|anteriores|previas|de arriba|originales|"
    r"alle|die|deine|ihre|vorherigen|obigen|bisherigen|fruheren|ursprunglichen|"
    r"moi|tat ca|toan bo|cac|nhung|truoc|truoc do|truoc day|o tren|phia tren|tren|ban dau|cu|"
    r"he thong)"
)

_RX: dict[str, re.Pattern[str]] = {}
# Cheap literal pre-filters: a pattern runs only when one of its trigger substrings occurs
# in the normalised text (keeps a 1,000-character chunk well under a millisecond).
_OVERRIDE_TRIGGERS = (
    "ignor", "disregard", "forget", "skip", "bypass", "overrid", "overwrit", "discard", "drop",
    "abandon", "aside", "follow", "never mind", "no attention", "oubli", "compte", "abstraction",
    "olvid", "caso", "omite", "descarta", "vergiss", "vergessen", "missacht", "verwirf",
    "uberschreib", "bo qua", "phot lo", "lo di", "quen", "theo", "bat chap", "gat bo", "huy bo",
    "忽略", "无视", "忘记", "忘掉", "不要理", "别管", "遵守",
)
_TRIGGERS: dict[str, tuple[str, ...]] = {
    "override_strong": _OVERRIDE_TRIGGERS,
    "override_weak": _OVERRIDE_TRIGGERS,
    "forget_everything": ("forget", "ignore", "disregard", "quen", "bo qua", "phot lo", "oubli", "olvida", "vergiss"),
    "no_longer_applies": ("no longer", "obsolete", "void", "revoked", "cancelled", "invalid", "suspended", "lifted", "disabled"),
    "set_aside": ("aside", "throw out", "discard", "abandon", "drop"),
    "new_task": ("your ", "nhiem vu", "ta ", "tu ", "deine"),
    "new_instructions_header": (":",),
    "you_are_now_ai": (" now", "bay gio", "gio day", "tu gio", "tu nay", "maintenant", "desormais", "present", "ahora", "jetzt", "nun", "sofort", "你现在", "从现在", "你将"),
    "you_are_now_plain": ("now a",),
    "from_now_on": ("now on", "this point", "henceforth", "rest of this", "tu gio", "bay gio", "maintenant", "desormais", "ahora", "ab jetzt", "从现在"),
    "roleplay_imperative": ("act", "pretend", "play", "imagine", "going to", "simulate", "respond as", "behave", "dong vai", "gia vo", "gia lam", "nhap vai", "semblant", "role", "comme", "cuenta", "finge", "actua", "so als", "rolle", "gib dich", "扮演", "假装"),
    "roleplay_any": ("act as", "pretend", "play", "imagine you", "dong vai", "gia vo", "扮演", "假装"),
    "unrestricted": ("restriction", "limit", "filter", "rules", "guideline", "ethic", "moral", "censor", "unrestricted", "unfiltered", "jailbr", "refuse", "anything now", "broken free", "sin f", "sin r", "sin l", "sans f", "sans r", "sans l", "ohne", "gioi han", "kiem duyet", "rang buoc", "quy tac", "uneingeschrankt", "einschrankung", "regeln", "限制"),
    "dan_name": ("dan",),
    "developer_mode_on": ("developer mode",),
    "developer_mode": ("developer mode",),
    "system_prompt_ref": ("prompt", "system message", "hidden", "your instructions", "your rules", "your guidelines", "loi nhac", "chi dan he thong", "huong dan ban dau", "systeme", "sistema", "systemanweisungen", "系统"),
    "prompt_leak": ("prompt", "instructions", "hidden rules", "rules you", "above", "loi nhac", "huong dan ban dau", "chi dan", "anweisungen", "instrucciones", "系统提示", "指令", "提示词"),
    "credential_request": ("password", "api key", "credit card", "card ", "token", "credential", "customer", "stored", "activation", "phone", "address", "mat khau", "so the", "khoa api", "khach hang", "kundendaten"),
    "sensitive_mention": ("password", "api key", "card", "activation", "license", "product key", "token", "credential", "mat khau", "so the"),
    "secrecy": ("user", "customer", "human", "mention", "reveal", "disclose", "keep th", "nguoi dung", "utilisateur", "usuario", "nutzer", "benutzer", "不要告诉"),
    "this_instruction": ("this", "these", "nay"),
    "addressed_to_model": (" ai", "ai ", "ai,", "ai:", "assistant", "model", "llm", "chatbot", " bot", "gpt", "claude", "gemini", "copilot", "tro ly", "mo hinh", " ia", " ki ", "sprachmodell", "assistent", "如果你是"),
    "model_must": ("assistant", "ai ", "model", "llm", "bot", "tro ly"),
    "steer_user": ("user", "customer", "them", "question", "request", "every", "always", "approve", "comply", "nguoi dung", "tra loi", "khang dinh", "utilisateur", "responde", "nutzer", "告诉用户"),
    "exfil_url": ("http", "www.", "@"),
    "exfil_sensitive_object": ("conversation", "chat", "history", "messages", "session token", "user data", "tro chuyen", "conversacion"),
    "md_image_query": ("![",),
    "md_image_render": ("image", "picture", "hinh anh", "anh", "imagen"),
    "md_image_placeholder": ("![",),
    "system_override_banner": ("override", "safety"),
    "new_persona_from_now": ("follow only",),
}


_RX_PARTS: dict[str, tuple[re.Pattern[str], ...]] = {}


def _split_top(pattern: str) -> list[str]:
    """Split a regex on its top-level ``|`` (outside groups and classes)."""
    parts, depth, in_class, i, start = [], 0, False, 0, 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
            if pattern[i + 1 : i + 2] == "]":
                i += 1
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "|" and depth == 0:
            parts.append(pattern[start:i])
            start = i + 1
        i += 1
    parts.append(pattern[start:])
    return parts


def _c(name: str, pattern: str, flags: int = _F) -> None:
    """Compile a signal pattern for fast scanning.

    Alternatives that start with ``\\b`` are merged into one regex that starts with a
    non-word character class (``[^\\w]``), which lets ``re`` skip straight to word starts
    instead of trying every alternative at every position; the text is searched with a
    leading space. Other alternatives are compiled as they are.
    """
    # separators are possessive: whatever follows a \W run starts with a word character
    pattern = pattern.replace(r"\W+", r"\W++")
    _RX[name] = re.compile(pattern, flags)
    bounded, other = [], []
    for alt in _split_top(pattern):
        (bounded if alt.startswith("\\b") else other).append(alt)
    compiled = []
    if bounded:
        compiled.append(re.compile("[^\\w](?:" + "|".join(a[2:] for a in bounded) + ")", flags))
    compiled.extend(re.compile(a, flags) for a in other)
    _RX_PARTS[name] = tuple(compiled)


# "ignore all previous instructions" and friends (strong form needs a prior/all modifier)
_c(
    "override_strong",
    rf"\b{_OVERRIDE_VERB}\W+(?:(?:the|of|de|d'|des|di|von|den|der|het|nhung|moi thu)\W+)?"
    rf"(?:{_PRIOR_MOD}\W+){{1,3}}(?:{_W}\W+)?{_INSTR_NOUN}\b"
    rf"|\b{_OVERRIDE_VERB}\W+(?:{_W}\W+){{0,2}}{_INSTR_NOUN}\W+(?:{_W}\W+){{0,2}}?"
    r"(?:above|before|earlier|previously|so far|you (?:were|have been) given|"
    r"precedentes?|anterieures?|ci-dessus|anteriores|previas|de arriba|"
    r"vorherigen|obigen|truoc|truoc do|truoc day|o tren|phia tren|ban dau)\b"
    r"|(?:忽略|无视|忘记|忘掉|不要理会|别管|不要遵守|不再遵守|不要理睬)[^。！？\n]{0,8}(?:指令|指示|说明|规则|提示|命令|设定)",
)
_c("override_weak", rf"\b{_OVERRIDE_VERB}\W+(?:{_W}\W+){{0,3}}{_INSTR_NOUN}\b")
_c(
    "forget_everything",
    r"\b(?:forget|ignore|disregard) (?:everything|all(?: of)? (?:that|this|the above)|"
    r"what(?:ever)? (?:you were|i) told)"
    r"|\b(?:quen|bo qua|phot lo) (?:het|tat ca|moi thu|moi dieu|toan bo)(?: nhung gi| moi thu)?"
    r" (?:o tren|phia tren|truoc do|truoc day|ban duoc dan)"
    r"|\boublie(?:z)? tout\b|\bolvida todo\b|\bvergiss alles\b",
)
_c(
    "no_longer_applies",
    r"\b(?:instructions?|guidance|rules|guidelines|training|programming)\b[^.!?\n]{0,60}"
    r"\b(?:no longer appl\w*|(?:are|is) (?:now )?(?:obsolete|void|revoked|cancelled|invalid|suspended))"
    r"|\b(?:rules|instructions|guidelines) (?:are|have been) (?:revoked|lifted|disabled)",
)
_c(
    "set_aside",
    r"\b(?:set aside|put aside|throw out|discard|abandon|drop) (?:whatever|any|all) (?:rules|"
    r"instructions|guidelines|constraints)",
)
_c(
    "new_task",
    r"\byour (?:real|new|true|actual|only|updated) (?:task|objective|goal|purpose|mission|"
    r"instructions?|job|role)\b"
    r"|\bnhiem vu (?:thuc su|that su|moi|duy nhat) cua ban"
    r"|\bta (?:vraie|nouvelle) (?:tache|mission)|\btu (?:verdadera|nueva) (?:tarea|mision)"
    r"|\bdeine (?:wahre|neue|eigentliche) aufgabe",
)
_c(
    "new_instructions_header",
    r"(?:^\s*+|[\n.!][^\S\n]*+)(?:new|updated|revised) (?:instructions?|directives?|rules|orders|task)\s*:"
    r"|\b(?:huong dan|chi dan|chi thi|quy tac) moi\s*:"
    r"|\bnouvelles? (?:instructions|consignes)\s*:|\bnuevas instrucciones\s*:"
    r"|\bneue anweisungen\s*:",
)
_c(
    "you_are_now_ai",
    r"\b(?:you are|you're) now (?:(?:a|an|the|in|my|called|named)\W+)?(?:{w}\W+){{0,3}}?"
    r"(?:ai|assistant|bot|chatbot|model|llm|gpt|persona|character|dan|jailbroken|unrestricted|"
    r"unfiltered|uncensored|free|(?:developer|god|admin|maintenance|debug|unrestricted|jailbreak) mode)\b"
    r"|\bban (?:bay gio|gio day|tu gio|tu nay|ke tu bay gio)(?: da)? (?:la|se la|tro thanh|dong vai)\b"
    r"|\btu es (?:maintenant|desormais|a present)\b|\bvous etes (?:maintenant|desormais)\b"
    r"|\b(?:ahora|a partir de ahora) eres\b|\beres ahora\b"
    r"|\bdu bist (?:jetzt|nun|ab jetzt|ab sofort)\b|\bab (?:jetzt|sofort) bist du\b"
    r"|你现在是|从现在(?:开始|起)你是|你将扮演".replace("{w}", _W).replace("{{", "{").replace("}}", "}"),
)
_c("you_are_now_plain", r"\b(?:you are|you're) now (?:a|an)\b")
_c(
    "from_now_on",
    r"\b(?:from now on|from this point (?:forward|on)|henceforth|for the rest of this "
    r"(?:conversation|chat|session))\b[^.!?\n]{0,40}\b(?:you|respond|reply|answer|act|always|only|never)\b"
    r"|\b(?:tu gio (?:tro di|tro ve sau)|ke tu bay gio|tu bay gio)\b[^.!?\n]{0,30}\bban\b"
    r"|\ba partir de maintenant\b|\bdesormais,? tu\b|\ba partir de ahora\b|\bab jetzt\b[^.!?\n]{0,20}\bdu\b"
    r"|从现在开始|从现在起",
)
# "[\n.!?:;][^\S\n]*+" not "[\n.!?:;]\s*": the same starts (when the run holds a newline,
# the last newline is in the class), but a run of n newlines is not rescanned n times.
_IMPERATIVE_START = r"(?:^\s*+|[\n.!?:;][^\S\n]*+|\b(?:please|now|hay|ahora|jetzt|maintenant|then)\s++)"
_c(
    "roleplay_imperative",
    _IMPERATIVE_START + r"(?:act as|pretend (?:to be|you are|you're)|role-?play as|roleplay as|"
    r"play the role of|imagine (?:that )?you are|you are going to (?:pretend|act|play)|"
    r"simulate (?:being|a|an)|respond as|behave as|"
    r"(?:hay )?(?:dong vai|gia vo (?:la|lam)|gia lam|nhap vai)(?! tro)|"
    r"fais semblant d'etre|joue le role d|agis comme|haz de cuenta que eres|finge ser|actua como|"
    r"tu so,? als|spiele die rolle|gib dich als|"
    r"扮演|假装你是|假装是)",
)
_c(
    "roleplay_any",
    r"\b(?:act as|pretend to be|role-?play as|roleplay as|play the role of|imagine you are|"
    r"dong vai(?! tro)|gia vo la)\b|扮演|假装",
)
_c(
    "unrestricted",
    r"\b(?:no|without(?: any)?) (?:restrictions?|limits|limitations|filters?|rules|guidelines|"
    r"ethics|morals|censorship)\b|\b(?:unrestricted|unfiltered|uncensored|jailbroken|jailbreak)\b"
    r"|\bnever refuses?\b|\bdo anything now\b|\bbroken free\b|\bwithout ethics\b"
    r"|\bkhong (?:bi )?(?:gioi han|kiem duyet|rang buoc)\b|\bkhong tuan theo quy tac\b"
    r"|\bsans (?:restrictions?|limites|filtres?)\b|\bsin (?:restricciones|filtros|limites)\b"
    r"|\buneingeschrankt\w*\b|\bohne (?:einschrankungen|filter|regeln)\b"
    r"|没有任何限制|无限制|不受限制|没有限制",
)
_c("dan_name", r"\bdan\b[^.!?\n]{0,40}(?:do anything|stands for|mode|persona)|\bas dan\b|\bla dan\b|\bis dan\b|\bnow dan\b")
_c("developer_mode_on", r"\b(?:enable|enter|activate|switch to|turn on)\W+(?:the\W+)?developer mode\b|\bdeveloper mode (?:enabled|activated|on)\b")
_c("developer_mode", r"\bdeveloper mode\b")
_c(
    "system_prompt_ref",
    r"\b(?:system prompt|system message|initial prompt|original prompt|hidden (?:rules|instructions|prompt)|"
    r"your (?:instructions|prompt|rules|guidelines)|pre-?prompt|"
    r"loi nhac he thong|chi dan he thong|huong dan ban dau|loi nhac (?:cua ban|ban dau)|"
    r"prompt systeme|invite systeme|prompt del sistema|instrucciones del sistema|"
    r"systemprompt|system-prompt|systemanweisungen)\b|系统提示|系统指令|系统消息",
)
_c(
    "prompt_leak",
    r"\b(?:print|reveal|repeat|show|output|display|tell me|disclose|leak|dump|recite|write out|"
    r"share|list|paste|translate)\W+(?:{w}\W+){{0,4}}?(?:system prompt|initial prompt|original prompt|"
    r"instructions|prompt|hidden rules|rules you were given|the text above|everything above|"
    r"words above)\b"
    r"|\b(?:tiet lo|in ra|in nguyen van|hien thi|cho biet|lap lai|xuat ra|chia se)\W+(?:{w}\W+){{0,5}}?"
    r"(?:loi nhac|huong dan ban dau|chi dan|system prompt)"
    r"|\b(?:revele[rz]?|affiche[rz]?|repete[rz]?|montre[rz]?|revela|muestra|repite|verrate|"
    r"zeige|gib)\W+(?:{w}\W+){{0,3}}?(?:prompt|instructions|instrucciones|systemprompt|anweisungen)"
    r"|(?:输出|显示|告诉我|泄露|打印|重复|透露).{{0,8}}(?:系统提示|指令|提示词)".replace("{w}", _W).replace("{{", "{").replace("}}", "}"),
)
_c(
    "sensitive_mention",
    r"\b(?:passwords?|api keys?|credit card|card numbers?|activation keys|license keys|product keys|"
    r"session tokens?|credentials|mat khau|so the)\b",
)
_c("verbatim", r"\b(?:verbatim|word for word|nguyen van|mot cach chinh xac tung chu)\b|逐字")
_c(
    "credential_request",
    r"\b(?:give|tell|send|reveal|print|output|share|read out|list|provide|ask (?:the user|them) for|"
    r"collect|cung cap|hoi|gib|verrate)\W+(?:{w}\W+){{0,5}}?(?:admin password|passwords?|api keys?|"
    r"credit card|card (?:number|details)|session tokens?|credentials|customer (?:emails|data)|"
    r"stored (?:credit|customer)|activation keys|phone number|home address|"
    r"mat khau|so the|khoa api|email cua moi khach hang|kundendaten)".replace("{w}", _W).replace("{{", "{").replace("}}", "}"),
)
_c(
    "secrecy",
    r"\b(?:do not|don'?t|never) (?:tell|inform|mention (?:this|that|it) to|let|reveal (?:this|that) to) "
    r"(?:the )?(?:user|customer|human)s?\b"
    r"|\b(?:do not|don'?t|never) (?:mention|reveal|disclose) (?:this|these|that you were told|"
    r"that you (?:were|have been) (?:told|instructed))\b(?: (?:note|instruction|message|rule))?"
    r"|\bkeep (?:this|these) (?:instructions?|notes?|rules?) (?:secret|hidden|confidential)"
    r"|\b(?:dung|khong duoc|dung bao gio|khong bao gio) (?:noi|ke|tiet lo|de lo)(?: cho)? nguoi dung"
    r"|\bne (?:dis|dites) (?:rien|pas) a l'utilisateur|\bno (?:le )?(?:digas|menciones) al usuario"
    r"|\bsag(?:e)? dem (?:nutzer|benutzer) nicht|不要告诉用户",
)
_c("this_instruction", r"\b(?:this|these) (?:instructions?|notes?|rules?|chi dan|huong dan)\b|\bchi dan nay\b|\bhuong dan nay\b")
_c(
    "addressed_to_model",
    r"\b(?:note|message|attention|attn|instructions?|reminder) (?:to|for) (?:the |any |all )?"
    r"(?:ai|assistant|model|llm|chatbot|bot|language model|gpt|chatgpt|claude|gemini|copilot)s?\b"
    r"|(?:^\s*+|[\n.!?][^\S\n]*+)(?:dear|hey|hi|hello|attention|attn|to the|note to)\W+(?:the\W+)?(?:ai|assistant|model|llm|"
    r"chatbot|chatgpt|gpt|language model|bot)s?\b"
    r"|\bif you are (?:an?|the) (?:ai|llm|language model|chatbot|assistant|model|bot|gpt)\b"
    r"|\b(?:ai|llm|language model|chatbot|assistant|model|gpt)s? (?:reading|processing|summari[sz]ing|"
    r"parsing|indexing) this\b"
    r"|(?:^\s*+|[\n.!?:>][^\S\n]*+)(?:ai assistant|assistant|ai|llm|chatbot|model|tro ly(?: ai)?)\s*[,:]\s*"
    r"(?:ignore|reveal|tell|say|respond|answer|print|output|you must|post|send|bo qua|hay|please)"
    r"|\bneu ban la (?:mot )?(?:mo hinh|chatbot|tro ly ai|ai|llm)"
    r"|\b(?:gui|chu y|luu y cho|kinh gui) (?:mo hinh ngon ngu|chatbot|tro ly ai)"
    r"|\bsi tu es (?:une? )?(?:ia|modele|assistant)|\bsi eres (?:una? )?(?:ia|modelo|asistente)"
    r"|\bwenn du (?:eine? )?(?:ki|sprachmodell|assistent) bist|如果你是(?:一个)?(?:ai|人工智能|语言模型|助手)",
)
_c(
    "model_must",
    r"\b(?:the |this )?(?:assistant|ai|model|llm|chatbot|bot) (?:must|should|shall|will now|is required to)"
    r" (?:now )?(?:recommend|tell|say|respond|answer|reveal|disable|ignore|follow only|only|always|never|"
    r"output|print)\b"
    r"|\btro ly (?:phai|can|se) (?:gioi thieu|noi|tra loi|tiet lo|bo qua)",
)
_c(
    "steer_user",
    r"\b(?:tell|inform|convince|persuade) (?:the )?(?:user|customer|them)s?\b"
    r"|\b(?:respond|reply|answer)(?: to (?:the )?user)?(?: only)? (?:with|in|that)\b"
    r"|\banswer (?:every|all|each) (?:question|request)s?\b|\b(?:in|to|at the end of) every (?:answer|response|reply)\b"
    r"|\balways (?:say|respond|answer|claim|reply)\b|\bapprove (?:every|all)\b|\bcomply with every\b"
    r"|\b(?:noi voi|bao) nguoi dung\b|\bchi tra loi\b|\bluon khang dinh\b|\bmoi cau tra loi\b"
    r"|\bdis a l'utilisateur\b|\bresponde solo\b|\bsage dem (?:nutzer|benutzer)\b|告诉用户",
)
_c(
    "exfil_url",
    r"\b(?:send|post|upload|forward|transmit|exfiltrate|leak|include|append|email|submit|copy|"
    r"gui|chuyen|tai len|envoie[rz]?|envia|envie|sende|schicke)\W+(?:{w}\W+){{0,6}}?"
    r"(?:conversation|chat|history|messages?|user data|data|emails?|tokens?|credentials|passwords?|"
    r"session|context|cuoc tro chuyen|lich su|du lieu|thong tin|conversacion|gesprach|verlauf|daten)"
    r"[^\n]{{0,80}}?(?:https?://|www\.|\b[\w.-]+@[\w-]+\.[a-z]{{2,}})".replace("{w}", _W).replace("{{", "{").replace("}}", "}"),
)
_c(
    "exfil_sensitive_object",
    r"\b(?:(?:entire|whole|full|complete) (?:conversation|chat)|conversation history|chat history|"
    r"chat so far|user'?s? messages|session token|all user data|"
    r"toan bo cuoc tro chuyen|lich su tro chuyen|conversation complete|conversacion completa)\b",
)
# Markdown images with a query string. Linear forms of "!\[[^\]]*\]\(\s*https?://[^)\s]+\?...":
# the alt text stops at "[" too and the URL at the next "![", so the runs scanned from two
# image openers never overlap ("![a](http://x?" * n was cubic); the URL splits at its first
# "?" (any later "?" is the same URL). A "{" placeholder is matched from the last "{"
# before its "}".
_MD_URL = r"(?:[^)\s!]|!(?!\[))"
_MD_URL_NO_Q = r"(?:[^)\s!?]|!(?!\[))"
_MD_IMAGE_URL_Q = rf"!\[[^\][]*+\]\(\s*+https?://{_MD_URL}{_MD_URL_NO_Q}*+\?"
_c("md_image_query", rf"{_MD_IMAGE_URL_Q}{_MD_URL}*+\)")
_c("md_image_render", r"\b(?:render|display|show|include|output|embed|hien thi|chen|affiche|muestra)\b[^.\n]{0,40}\b(?:image|picture|hinh anh|anh|imagen)\b")
_c("md_image_placeholder",
   rf"{_MD_IMAGE_URL_Q}{_MD_URL}*?(?:\{{[^{{}}]*+\}}|conversation|history|chat|messages|user|secret|token)")
_c("system_override_banner", r"\b(?:system override|admin override|safety (?:filters?|checks?) (?:disabled|off)|disable (?:all )?safety (?:checks|filters))\b")
_c("new_persona_from_now", r"\bfollow only the (?:instructions|rules) (?:in|of) this\b")

# raw patterns (case kept, NFKC text)
_RAW_ROLE_TOKEN = re.compile(
    r"<\|(?:im_start|im_end|system|user|assistant|endoftext|start_header_id|end_header_id|eot_id)\|>"
    r"|\[/?INST\]|<<\s*/?SYS\s*>>|</?(?:system|sys|instructions?)\s*>|<start_of_turn>|<end_of_turn>",
    re.IGNORECASE,
)
# Linear-time rules for every pattern below (one 20,000-character document must not take
# seconds): a line start is followed by horizontal whitespace only ([^\S\n]*+)
# -- "^\s*" rescans a run of n newlines from each of its n line starts --, and every
# quantifier whose run the next element cannot continue is possessive (*+, ++), so a
# failed match gives nothing back. "^\s*X" and "^[^\S\n]*X" find the same lines: when
# "\s*" crosses a newline, X's own line also starts a match.
_RAW_HASH_ROLE = re.compile(
    r"(?m)^[^\S\n]*+#{2,}+\s*+(?:system|instructions?|assistant|user)[^\S\n]*+:?[^\S\n]*+$"
    r"|^[^\S\n]*+#{2,}+\s*+(?:system|instruction)s?\s*+:",
    re.IGNORECASE,
)
_RAW_SYSTEM_LINE = re.compile(r"(?m)(?:^|(?<=>))[^\S\n]*+(?:system|sys)\s*+:\s*+\S", re.IGNORECASE)
# "a user turn, later an assistant turn" as two searches (the second from the end of the
# first): one lazy ".*?" across the text from every "user:" line was quadratic.
_RAW_USER_TURN = re.compile(r"(?m)^[^\S\n]*+(?:user|human)\s*+:", re.IGNORECASE)
_RAW_ASSISTANT_TURN = re.compile(r"(?m)^[^\S\n]*+(?:assistant|ai|gpt)\s*+:", re.IGNORECASE)
_RAW_DAN = re.compile(r"\bDAN\b")
# Hidden HTML (comments, CSS-hidden elements) is found by a scanner built from small
# patterns (see _hidden_chunks): the one-regex form (`<!--(.*?)-->`, `<span\b[^>]*...(.*?)
# </\1\s*>`) rescanned the rest of the text from every opener that had no closer.
_HTML_OPEN = re.compile(r"<(span|div|p|font|small|section)\b", re.IGNORECASE)
_HTML_CLOSE = re.compile(r"</(span|div|p|font|small|section)\s*+>", re.IGNORECASE)
_HTML_STYLE_ATTR = re.compile(r"\bstyle\s*+=\s*+[\"']", re.IGNORECASE)
_HTML_HIDDEN_STYLE = re.compile(
    r"display\s*+:\s*+none|visibility\s*+:\s*+hidden|font-size\s*+:\s*+0|"
    r"opacity\s*+:\s*+0(?:\.0++)?\s*+(?=;|[\"'])|color\s*+:\s*+(?:white|#fff\b|#ffffff|transparent)|"
    r"height\s*+:\s*+0|width\s*+:\s*+0",
    re.IGNORECASE,
)
_HTML_HIDDEN_ATTR = re.compile(r"\bhidden\b", re.IGNORECASE)
_QUOTE = re.compile(r"[\"']")
_HIDDEN_CONTENT_HINT = re.compile(
    r"\b(?:ai|assistant|model|llm|chatbot|you must|you are|ignore|tell the user|system|"
    r"instructions?|tro ly|bo qua|huong dan)\b",
)

_WEIGHTS: dict[str, float] = {
    "override_strong": 0.7,
    "override_weak": 0.35,
    "forget_everything": 0.6,
    "no_longer_applies": 0.3,
    "set_aside": 0.5,
    "new_task": 0.5,
    "new_instructions_header": 0.3,
    "you_are_now_ai": 0.45,
    "you_are_now_plain": 0.15,
    "from_now_on": 0.3,
    "roleplay_imperative": 0.4,
    "roleplay_any": 0.15,
    "unrestricted": 0.3,
    "dan_name": 0.35,
    "developer_mode_on": 0.2,
    "developer_mode": 0.1,
    "system_prompt_ref": 0.25,
    "prompt_leak": 0.35,
    "verbatim": 0.1,
    "sensitive_mention": 0.1,
    "credential_request": 0.25,
    "secrecy": 0.4,
    "this_instruction": 0.1,
    "addressed_to_model": 0.45,
    "model_must": 0.35,
    "steer_user": 0.15,
    "exfil_url": 0.45,
    "exfil_sensitive_object": 0.2,
    "md_image_query": 0.1,
    "md_image_render": 0.15,
    "md_image_placeholder": 0.3,
    "system_override_banner": 0.45,
    "new_persona_from_now": 0.3,
    # raw / structural
    "chat_role_token": 0.55,
    "markdown_role_header": 0.45,
    "system_line": 0.3,
    "user_assistant_turns": 0.2,
    "dan_jailbreak": 0.25,
    "hidden_html_instruction": 0.4,
    "hidden_html": 0.1,
    "zero_width_chars": 0.2,
    "zero_width_many": 0.45,
    "bidi_override": 0.5,
    "bidi_isolate": 0.25,
    "unicode_tags": 0.6,
    "homoglyph_words": 0.3,
    "homoglyph_many": 0.5,
}


@dataclass
class _Normalised:
    text: str  # normalised, for matching
    nfkc: str  # NFKC with hidden characters removed, case kept (+ decoded tag payload)
    zero_width: int
    bidi_override: int
    bidi_other: int
    tags: int
    mixed_words: int


def _decode_tags(text: str) -> tuple[str, int]:
    payload: list[str] = []
    count = 0
    for m in _TAG_RUN_RE.finditer(text):
        if m.group(1):  # U+1F3F4 waving black flag + tags = subdivision flag emoji
            continue
        run = m.group(2)
        count += len(run)
        payload.append("".join(chr(ord(c) - 0xE0000) for c in run if 0xE0020 <= ord(c) <= 0xE007E))
    return " ".join(p for p in payload if p), count


# Short base64 blobs (16..512 characters, standard or URL-safe alphabet) are decoded and
# their text scanned with the rest. Possessive runs bounded on both sides: a start is
# tried only where the previous character is not in the alphabet, and scans at most 512
# characters, so the search is linear. At most _B64_MAX_BLOBS blobs per text are decoded.
_B64_RE = re.compile(r"(?<![A-Za-z0-9+/_-])[A-Za-z0-9+/_-]{16,512}+={0,2}+(?![A-Za-z0-9+/=_-])")
_B64_MAX_BLOBS = 20
_B64_URLSAFE = str.maketrans("-_", "+/")
_PRINTABLE_RE = re.compile(r"[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# A text that rot13 turns into injection vocabulary (whole words) is scanned decoded as
# well: "vtaber nyy cerivbhf vafgehpgvbaf". Benign prose almost never has these words in
# rot13 form ("vtaber", "vafgehpgvbaf"), so ordinary text pays one str.translate.
_ROT13 = str.maketrans("abcdefghijklmnopqrstuvwxyz", "nopqrstuvwxyzabcdefghijklm")
_ROT13_MARKERS = re.compile(
    r"\b(?:ignore|disregard|instructions|system prompt|previous|assistant|password|reveal)\b"
)


def _decode_base64_blobs(text: str) -> str:
    """The decoded text of the short base64 blobs in ``text`` that decode to printable
    UTF-8 with at least one space (prose, not a hash or a binary key)."""
    if len(text) < 16:
        return ""
    out: list[str] = []
    for k, m in enumerate(_B64_RE.finditer(text)):
        if k >= _B64_MAX_BLOBS:
            break
        blob = m.group(0).rstrip("=").translate(_B64_URLSAFE)
        if len(blob) % 4 == 1 or blob.isalpha() and (blob.islower() or blob.isupper()):
            continue  # not a base64 length / a plain long word
        try:
            decoded = base64.b64decode(blob + "=" * (-len(blob) % 4), validate=True).decode("utf-8")
        except (ValueError, UnicodeDecodeError):
            continue
        if " " in decoded and len(_PRINTABLE_RE.findall(decoded)) == len(decoded):
            out.append(decoded)
    return "\n".join(out)


def _normalise(text: str) -> _Normalised:
    body = text[1:] if text.startswith("\ufeff") else text  # a leading BOM is harmless
    zero_width = sum(body.count(c) for c in _ZERO_WIDTH)
    # ZWJ between two emoji/pictographs is legitimate (emoji sequences)
    zero_width -= len(re.findall(r"[\U0001f000-\U0001faff\u2600-\u27bf]\u200d[\U0001f000-\U0001faff\u2600-\u27bf]", body))
    bidi_override = sum(body.count(c) for c in _BIDI_OVERRIDE)
    bidi_other = sum(body.count(c) for c in _BIDI_OTHER)
    payload, tags = _decode_tags(body)
    cleaned = _HIDDEN_RE.sub("", body)
    decoded = _decode_base64_blobs(cleaned)
    if payload or decoded:
        cleaned = "\n".join(p for p in (cleaned, payload, decoded) if p)
    nfkc = unicodedata.normalize("NFKC", cleaned)
    folded = nfkc.casefold()
    mixed = len(_MIXED_WORD_RE.findall(folded)) if _CONF_PRESENT_RE.search(folded) else 0
    folded = folded.translate(_CONFUSABLE_TABLE)
    norm = _strip_accents(folded).replace("’", "'")
    rot = norm.translate(_ROT13)
    if _ROT13_MARKERS.search(rot):
        norm = norm + "\n" + rot
    return _Normalised(norm, nfkc, max(zero_width, 0), bidi_override, bidi_other, tags, mixed)


def normalised(text: str) -> str:
    """``text`` as the patterns read it: hidden characters removed, tag-character, base64 and
    rot13 payloads decoded and appended, NFKC, case folded, homoglyphs folded, accents stripped
    (the lexical detector's input, :mod:`kb_rerank.guard.lexical`). Linear in the text."""
    return _normalise(text).text if text else ""


# Letters spelled out one by one ("i g n o r e  a l l"): at least five single letters, one
# space apart (possessive, and a matched run is consumed whole: linear)
_SPACED_LETTERS_RE = re.compile(r"(?<!\w)\w(?= )(?: \w(?!\w)){4,}+")


def deobfuscated(text: str) -> str | None:
    """``text`` with its hiding undone, for the learned classifier to read (the patterns read
    the normalised text, the classifier otherwise only the raw chunk's embedding): hidden
    characters removed, tag-character and short base64 payloads decoded (:func:`_normalise`),
    homoglyphs folded to their Latin skeleton when a word mixes them with Latin letters,
    letters spelled out one by one joined, and a rot13 text decoded;
    case folded. None when that changes nothing beyond NFKC and case (an ordinary text).
    Linear in the text."""
    if not text:
        return None
    n = _normalise(text)
    view = n.nfkc.casefold()
    if n.mixed_words:
        view = view.translate(_CONFUSABLE_TABLE)
    view = _SPACED_LETTERS_RE.sub(lambda m: m.group(0).replace(" ", ""), view)
    rot = _strip_accents(view).replace("\u2019", "'").translate(_ROT13)
    if _ROT13_MARKERS.search(rot):
        view = view + "\n" + rot
    base = unicodedata.normalize("NFKC", text[1:] if text.startswith("\ufeff") else text).casefold()
    return None if " ".join(view.split()) == " ".join(base.split()) else view


def _text_signals(norm: str) -> set[str]:
    found: set[str] = set()
    spaced = " " + norm
    for name in _RX:
        trig = _TRIGGERS.get(name)
        if trig is not None and not any(t in norm for t in trig):
            continue
        if any(part.search(spaced) for part in _RX_PARTS[name]):
            found.add(name)
    return found


def _html_comments(text: str) -> list[str]:
    """The bodies of ``<!-- ... -->`` comments, as ``re.finditer("<!--(.*?)-->", DOTALL)``
    finds them, in linear time: an opener without a closer after it ends the scan (no
    later opener has one either)."""
    out, i = [], text.find("<!--")
    while i >= 0:
        j = text.find("-->", i + 4)
        if j < 0:
            break
        out.append(text[i + 4 : j])
        i = text.find("<!--", j + 3)
    return out


def _hidden_elements(text: str) -> list[str]:
    """The contents of CSS-hidden / ``hidden`` elements, as the former one-regex form
    found them (non-overlapping, leftmost first)::

        <(span|div|p|font|small|section)\\b[^>]*\\bstyle\\s*=\\s*["'][^"']*HIDDEN_STYLE[^"']*["'][^>]*>(.*?)</\\1\\s*>
        | <(span|div|p)\\b[^>]*\\bhidden\\b[^>]*>(.*?)</\\3\\s*>

    in linear time. The closers of each tag are listed once (the content ends at the
    first closer after the opening tag), and an opener that fails is remembered by (tag,
    end of its attribute region): a later opener of the same tag in the same region
    sees a subset of the same attributes and fails too -- without that, ``"<span " * n``
    rescanned the region from each of its n openers.
    """
    if "<" not in text:
        return []
    closers: dict[str, list[tuple[int, int]]] = {}
    for m in _HTML_CLOSE.finditer(text):
        closers.setdefault(m.group(1).lower(), []).append((m.start(), m.end()))
    if not closers:
        return []
    close_starts = {t: [c[0] for c in cs] for t, cs in closers.items()}

    def close_after(tag: str, i: int) -> tuple[int, int] | None:
        starts = close_starts.get(tag)
        if not starts:
            return None
        k = bisect.bisect_left(starts, i)
        return closers[tag][k] if k < len(starts) else None

    out: list[str] = []
    failed: set[tuple[str, int]] = set()
    pos, n = 0, len(text)
    gt0 = -2  # the first ">" at or after the current opener (-1: none), kept across openers
    while True:
        m = _HTML_OPEN.search(text, pos)
        if m is None:
            return out
        tag = m.group(1).lower()
        a = m.end()
        if gt0 == -2 or (0 <= gt0 < a):
            gt0 = text.find(">", a)
        region_end = gt0 if gt0 >= 0 else n
        if (tag, region_end) in failed or tag not in closers:
            pos = m.start() + 1
            continue
        hit: tuple[int, tuple[int, int]] | None = None  # (content start, closer span)
        # alternative 1: a style attribute that hides; regex order = the last one first
        for st in reversed(list(_HTML_STYLE_ATTR.finditer(text, a, region_end))):
            q = _QUOTE.search(text, st.end())
            if q is None or not _HTML_HIDDEN_STYLE.search(text, st.end(), q.end()):
                continue
            gt = text.find(">", q.end())
            c = close_after(tag, gt + 1) if gt >= 0 else None
            if c is not None:
                hit = (gt + 1, c)
                break
        # alternative 2: a bare `hidden` attribute (span / div / p)
        if hit is None and gt0 >= 0 and tag in ("span", "div", "p") and _HTML_HIDDEN_ATTR.search(text, a, gt0):
            c = close_after(tag, gt0 + 1)
            if c is not None:
                hit = (gt0 + 1, c)
        if hit is None:
            failed.add((tag, region_end))
            pos = m.start() + 1
            continue
        start, (c0, c1) = hit
        out.append(text[start:c0])
        pos = c1


def _hidden_html_signals(nfkc: str) -> set[str]:
    found: set[str] = set()
    chunks = _html_comments(nfkc) + _hidden_elements(nfkc)
    for chunk in chunks:
        if not chunk.strip():
            continue
        found.add("hidden_html")
        inner = _strip_accents(chunk.casefold().translate(_CONFUSABLE_TABLE))
        inner_signals = _text_signals(inner)
        inner_score = sum(_WEIGHTS[s] for s in inner_signals)
        if inner_score >= 0.15 or (_HIDDEN_CONTENT_HINT.search(inner) and len(inner.split()) >= 5):
            found.add("hidden_html_instruction")
    return found


def detect_injection(text: str) -> InjectionVerdict:
    """Score ``text`` for prompt-injection content; see the module docstring.

    ``reasons`` lists the signal names that fired (sorted); ``score`` is the capped sum of
    their weights; ``flagged`` is ``score >= INJECTION_THRESHOLD``.
    """
    if not text:
        return InjectionVerdict(False, 0.0, ())
    n = _normalise(text)
    signals = _text_signals(n.text)
    # the strong form of a family implies the weak one: count only the strong
    if "override_strong" in signals:
        signals.discard("override_weak")
    if "you_are_now_ai" in signals:
        signals.discard("you_are_now_plain")
    if "roleplay_imperative" in signals:
        signals.discard("roleplay_any")
    if "developer_mode_on" in signals:
        signals.discard("developer_mode")
    if "prompt_leak" in signals and "system_prompt_ref" not in signals:
        # "reveal your API key" is not a leak of instructions
        if not re.search(r"\b(?:instructions|prompt|rules|text above|everything above|words above|"
                         r"loi nhac|chi dan|huong dan|anweisungen|instrucciones)\b|系统提示|指令|提示词", n.text):
            signals.discard("prompt_leak")
    raw = n.nfkc
    if _RAW_ROLE_TOKEN.search(raw):
        signals.add("chat_role_token")
    if _RAW_HASH_ROLE.search(raw):
        signals.add("markdown_role_header")
    if _RAW_SYSTEM_LINE.search(raw):
        signals.add("system_line")
    turn = _RAW_USER_TURN.search(raw)
    if turn and _RAW_ASSISTANT_TURN.search(raw, turn.end()):
        signals.add("user_assistant_turns")
    if _RAW_DAN.search(raw) and ({"roleplay_imperative", "roleplay_any", "unrestricted", "dan_name",
                                 "you_are_now_ai", "from_now_on"} & signals):
        signals.add("dan_jailbreak")
    signals |= _hidden_html_signals(raw)
    if n.zero_width >= 3:
        signals.add("zero_width_many")
    elif n.zero_width:
        signals.add("zero_width_chars")
    if n.bidi_override:
        signals.add("bidi_override")
    elif n.bidi_other >= 2:
        signals.add("bidi_isolate")
    if n.tags >= 2:
        signals.add("unicode_tags")
    if n.mixed_words >= 3:
        signals.add("homoglyph_many")
    elif n.mixed_words >= 1:
        signals.add("homoglyph_words")
    score = min(1.0, sum(_WEIGHTS[s] for s in signals))
    score = round(score, 4)
    return InjectionVerdict(score >= INJECTION_THRESHOLD, score, tuple(sorted(signals)))


# --------------------------------------------------------------------------- sanitising

_FAKE_ROLE_TOKEN_RE = re.compile(
    r"<\|([A-Za-z_]+)\|>|\[(/?INST)\]|<<\s*(/?SYS)\s*>>|<(/?(?:system|sys|instructions?|start_of_turn|end_of_turn))\s*>",
    re.IGNORECASE,
)
_LINE_ROLE_RE = re.compile(
    r"(?m)^([ \t]*)(#{1,6}[ \t]*)?(system|assistant|user|human|ai|developer|tool)([ \t]*):",
    re.IGNORECASE,
)
_FENCE_RE = re.compile(r"(?m)^([ \t]*)(`{3,}|~{3,})")


def sanitize_for_prompt(text: str) -> str:
    """Make a chunk safe to paste inside a delimited context block of a prompt.

    * removes zero-width characters (U+200B..U+200D, U+2060, U+FEFF), bidi embeddings,
      overrides and isolates (U+202A..U+202E, U+2066..U+2069) and Unicode tag characters
      (U+E0000..U+E007F), then applies NFKC;
    * neutralises chat-template tokens (``<|im_start|>`` -> ``‹im_start›``, ``[INST]`` ->
      ``(INST)``, ``<<SYS>>`` -> ``«SYS»``, ``<system>`` -> ``‹system›``) so the chunk
      cannot open or close a role turn;
    * defuses role labels at line start (``System:``, ``### Assistant:``, ``User:``) by
      replacing the colon with a modifier colon (U+A789 ``꞉``), so a model does not read
      them as turn boundaries;
    * breaks code-fence runs at line start (three or more backticks / tildes) with a
      zero-width-free variant (``ʼʼʼ``-style: the backticks become U+02CB), so a chunk
      cannot close the fence the prompt wraps it in.

    Visible wording is otherwise unchanged; the function is idempotent.
    """
    if not text:
        return ""
    out = _HIDDEN_RE.sub("", text)
    out = unicodedata.normalize("NFKC", out)

    def _tok(m: re.Match[str]) -> str:
        if m.group(1):
            return f"‹{m.group(1)}›"
        if m.group(2):
            return f"({m.group(2)})"
        if m.group(3):
            return f"«{m.group(3)}»"
        return f"‹{m.group(4)}›"

    out = _FAKE_ROLE_TOKEN_RE.sub(_tok, out)
    out = _LINE_ROLE_RE.sub(lambda m: f"{m.group(1)}{m.group(2) or ''}{m.group(3)}{m.group(4)}\ua789", out)
    out = _FENCE_RE.sub(lambda m: m.group(1) + ("ˋ" if m.group(2)[0] == "`" else "˜") * len(m.group(2)), out)
    return out


# --------------------------------------------------------------------------- stuffing

_TOKEN_RE = re.compile(r"\w+", re.UNICODE)
_CODE_FENCE_BLOCK_RE = re.compile(r"```.*?(?:```|$)|~~~.*?(?:~~~|$)", re.DOTALL)
# One separator row per line, horizontal whitespace only, possessive runs: the former
# "(?m)^\s*\|?\s*:?-{2,}:?\s*(...)*\|?\s*$" let "\s*" cross newlines, so a run of n blank
# lines was cubic (3.7 s for n = 1,000). A row split over two lines ("|" then "---") now
# leaves its "|" line in place; rows with words in them were never matched.
_TABLE_SEP_RE = re.compile(
    r"(?m)^[^\S\n]*+\|?[^\S\n]*+:?-{2,}+:?[^\S\n]*+(?:\|[^\S\n]*+:?-{2,}+:?[^\S\n]*+)*+\|?[^\S\n]*+$"
)
_STOPWORDS = frozenset(
    """
    a an the and or of to in on at for from by with as is are was were be been being it its this
    that these those you your yours we our us they their them he she his her i me my not no yes
    can will may must should would could do does did have has had if then than so but when which
    who what where how all any each per into out up down over under about also only more most
    true false null none n y
    va la cua cho cac mot nhung duoc trong khi de co khong voi thi se da nay do tu den ban
    hay neu theo ve tai ra vao len
    le la les de des du un une et en est pour dans sur par que qui au aux ou pas
    el los las del y con por para es se lo al una
    der die das und ist zu den dem im mit von fur auf ein eine nicht sie es
    """.split()
)
_LIST_SEP_RE = re.compile(r"[,;|/•·]")


def _spam_tokens(text: str) -> list[str]:
    body = _CODE_FENCE_BLOCK_RE.sub(" ", text)
    body = _TABLE_SEP_RE.sub(" ", body)
    body = _strip_accents(unicodedata.normalize("NFKC", _HIDDEN_RE.sub("", body)).casefold())
    lines = [ln for ln in body.splitlines() if ln.strip()]
    if len(lines) >= 3:
        # structured text (lists, steps, event names): the first word of each line is
        # layout ("Step", "invoice.created", "- Owner"), not vocabulary
        toks: list[str] = []
        for ln in lines:
            toks.extend(_TOKEN_RE.findall(ln)[1:])
    else:
        toks = _TOKEN_RE.findall(body)
    return [t for t in toks if not t.isdigit()]


def detect_stuffing(text: str) -> SpamVerdict:
    """Score ``text`` for keyword stuffing (lexical-score inflation).

    Features (on word tokens, code fences and table separator rows removed, numbers ignored):
    share of the most frequent content term, share of the top-3 content terms, type/token
    ratio (length-corrected), repeated word trigrams, the longest run of one token, and
    comma/pipe-separated keyword lists whose items repeat the same word. Short texts
    (< 12 tokens) are only flagged for long runs of one token.
    """
    toks = _spam_tokens(text)
    n = len(toks)
    reasons: list[str] = []
    score = 0.0
    if n == 0:
        return SpamVerdict(False, 0.0, ())

    # longest run of the same token
    longest, run = 1, 1
    for a, b in zip(toks, toks[1:]):
        run = run + 1 if a == b else 1
        longest = max(longest, run)
    if longest >= 5:
        score += 0.6
        reasons.append(f"same_token_run={longest}")
    elif longest >= 3:
        score += 0.25
        reasons.append(f"same_token_run={longest}")

    if n >= 12:
        content = [t for t in toks if t not in _STOPWORDS and len(t) > 1]
        if content:
            counts = Counter(content)
            top = counts.most_common(3)
            m = len(content)
            top1 = top[0][1] / m
            top3 = sum(c for _, c in top) / m
            if top[0][1] >= 4 and top1 >= 0.25:
                w = min(0.5, 0.25 + (top1 - 0.25) * 2.0)
                score += w
                reasons.append(f"top_term_share={top1:.2f}({top[0][0]})")
            if m >= 15 and top3 >= 0.5:
                w = min(0.4, 0.15 + (top3 - 0.5) * 1.5)
                score += w
                reasons.append(f"top3_share={top3:.2f}")
        # type/token ratio, corrected for length (Guiraud's root TTR)
        rttr = len(set(toks)) / math.sqrt(n)
        if n >= 30 and rttr < 3.0:
            score += min(0.4, 0.15 + (3.0 - rttr) * 0.25)
            reasons.append(f"root_ttr={rttr:.2f}")
        # repeated trigrams
        tri = list(zip(toks, toks[1:], toks[2:]))
        if len(tri) >= 10:
            tc = Counter(tri)
            repeated = sum(c - 1 for c in tc.values() if c > 1) / len(tri)
            if repeated >= 0.2:
                score += min(0.45, 0.2 + (repeated - 0.2) * 1.0)
                reasons.append(f"repeated_trigrams={repeated:.2f}")

    # keyword lists: many short separated items sharing a word
    body = _CODE_FENCE_BLOCK_RE.sub(" ", text)
    for line in body.splitlines() or [body]:
        if line.lstrip().startswith("|"):
            continue  # Markdown table row
        items = [s.strip() for s in _LIST_SEP_RE.split(line) if s.strip()]
        if len(items) < 6:
            continue
        words = [[w for w in _TOKEN_RE.findall(_strip_accents(it.casefold()))] for it in items]
        short = [ws for ws in words if 1 <= len(ws) <= 5]
        if len(short) < 6 or len(short) / len(items) < 0.8:
            continue
        shared = Counter(w for ws in short for w in set(ws) if w not in _STOPWORDS)
        if not shared:
            continue
        word, c = shared.most_common(1)[0]
        if c / len(short) >= 0.5:
            score += 0.45
            reasons.append(f"keyword_list(items={len(items)},shared={word!r}x{c})")
            break

    score = round(min(1.0, score), 4)
    return SpamVerdict(score >= SPAM_THRESHOLD, score, tuple(reasons))


# --------------------------------------------------------------------------- request path

# Detectors called from an async handler run here, not on the event loop. Two threads:
# the detectors hold the GIL, so more would not run faster; what keeps the loop
# responsive is that every pattern above is linear (the loop gets the GIL back between
# regex calls), and the budget below bounds how long a request waits.
_EXECUTOR = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kb-guard")


async def inspect_documents(texts: Sequence[str], budget_s: float) -> list[tuple[InjectionVerdict, SpamVerdict] | None]:
    """``(detect_injection, detect_stuffing)`` of each text, computed in a worker thread;
    ``None`` for a text not inspected within ``budget_s`` seconds.

    The budget starts now, so time spent queued behind other requests counts: under a
    flood a request gets "not inspected" answers quickly instead of waiting in line. The
    worker checks the deadline before each text and a stop flag set when the caller stops
    waiting, so it overruns by at most one text (about 45 ms for 20,000 characters).
    """
    results: list[tuple[InjectionVerdict, SpamVerdict] | None] = [None] * len(texts)
    if not texts:
        return results
    deadline = time.monotonic() + budget_s
    stop = threading.Event()

    def work() -> None:
        for i, text in enumerate(texts):
            if stop.is_set() or time.monotonic() >= deadline:
                return
            results[i] = (detect_injection(text), detect_stuffing(text))

    fut = asyncio.get_running_loop().run_in_executor(_EXECUTOR, work)
    try:
        await asyncio.wait_for(asyncio.shield(fut), timeout=max(0.0, budget_s))
    except asyncio.TimeoutError:
        stop.set()
    return list(results)
