"""An ordinary-text corpus: benign passages of the kinds knowledge bases hold, in many languages,
grouped by source, to measure and bound the injection detector's false-positive rate with
grouped cross-validation (a source is never on both sides of a fold).

    python bench/ordinary_corpus.py build --out DIR [--shared DIR] [--written DIR] [--per-source N]
    python bench/ordinary_corpus.py stats DIR

``build`` extracts passages from installed Debian packages (man pages, HTML manuals, the Python
documentation, LibreOffice help, /usr/share/doc, /etc, tables, licences, gettext catalogues),
the shared retrieval collections (BEIR ``corpus.jsonl``) and the project's written ordinary sets,
and writes ``DIR/<source>.jsonl`` plus ``DIR/MANIFEST.json`` (the sources built and those skipped,
with the reason). A row::

    {"text", "source", "lang", "kind", "licence", "version", "origin"}

``origin`` is the file the passage came from (or ``collection:_id``). Documents are chunked with
the product's own chunker at the product's settings and each chunk prefixed with the document's
title as ingestion indexes it; chunks under :data:`MIN_CHARS` characters are dropped; at most
``per_source`` passages are kept per source (a sample seeded by ``seed`` and the source's name);
a passage that an earlier source already holds is not repeated.

Kinds (:data:`KINDS`; the written sets use the same names):

- ``manual``: user manuals and tutorials (man pages, the Debian Reference, Python tutorials/HOWTOs)
- ``help_page``: application help pages (LibreOffice help, UI message catalogues)
- ``faq``: questions and their answers (the Python FAQ)
- ``technical_reference``: API and language references (Python library and language reference)
- ``readme``: README files of packages
- ``changelog``: changelogs, NEWS files, release notes ("What's New")
- ``config``: configuration files and their samples (comments and settings)
- ``table``: tabular data as text (zone tables, service tables, tables of HTML manuals)
- ``policy``: licences, constitutions, social contracts, copyright statements
- ``minutes``: meeting minutes
- ``email``: e-mails and support-ticket messages
- ``scientific_abstract``: abstracts of scientific papers (CACM, CISI, Cranfield)
- ``medical_abstract``: abstracts of biomedical papers
- ``news``: news articles
- ``encyclopaedia``: encyclopaedia paragraphs (XQuAD's Wikipedia paragraphs)
- ``recipe``: cooking recipes
- ``travel``: travel guides

Languages with no installable prose source here (Debian 12): Arabic and Thai have neither man
pages, nor a translated manual, nor LibreOffice help; their Debian passages are built from the
gettext catalogues of the installed packages (UI and --help strings joined into passages, kind
``help_page``), next to the XQuAD paragraphs of the shared collections.

Importable (``load``, ``by_group``, ``source_folds``) for the training code; nothing in the
product or in ``make test`` needs the built corpus.
"""

from __future__ import annotations

import argparse
import fnmatch
import gettext
import gzip
import hashlib
import html
import io
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Callable, Iterable, Iterator

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

KINDS = ("manual", "help_page", "faq", "technical_reference", "readme", "changelog", "config", "table",
         "policy", "minutes", "email", "scientific_abstract", "medical_abstract", "news", "encyclopaedia",
         "recipe", "travel")
# the languages the service reads (ja: man pages exist and are kept, marked as such)
LANGS = ("en", "vi", "fr", "es", "de", "zh", "ru", "tr", "ar", "el", "ro", "hi", "th", "ja")
MIN_CHARS = 80
PER_SOURCE = 130
POOL_FACTOR = 3        # candidates gathered per source before sampling: POOL_FACTOR * per_source
MAX_FILE_BYTES = 2_000_000
MANIFEST = "MANIFEST.json"
FIELDS = ("text", "source", "lang", "kind", "licence", "version", "origin")

# man page directory -> language (zh_CN and zh_TW are one language, as manpages-zh ships both)
MAN_LANGS = {"": "en", "de": "de", "fr": "fr", "es": "es", "ru": "ru", "ro": "ro", "tr": "tr",
             "el": "el", "vi": "vi", "zh_CN": "zh", "zh_TW": "zh", "ja": "ja"}
# the Debian package of each language's man pages
MAN_PACKAGES = {"en": "manpages", "de": "manpages-de", "fr": "manpages-fr", "es": "manpages-es",
                "ru": "manpages-ru", "ro": "manpages-ro", "tr": "manpages-tr", "el": "manpages-el",
                "vi": "manpages-vi", "zh": "manpages-zh", "ja": "manpages-ja"}
DEBREF_LANGS = {"en": "en", "de": "de", "fr": "fr", "es": "es", "zh-cn": "zh"}
LIBREOFFICE_LANGS = {"en-US": "en", "de": "de", "fr": "fr", "es": "es", "ru": "ru", "tr": "tr",
                     "el": "el", "vi": "vi", "zh-CN": "zh", "hi": "hi"}
GETTEXT_LANGS = ("ar", "th")
# Python documentation folders -> (source suffix, kind)
PYDOC_PARTS = {"library": ("library", "technical_reference"),
               "reference": ("reference", "technical_reference"),
               "c-api": ("reference", "technical_reference"),
               "extending": ("reference", "technical_reference"),
               "tutorial": ("tutorial_howto", "manual"), "howto": ("tutorial_howto", "manual"),
               "using": ("tutorial_howto", "manual"), "installing": ("tutorial_howto", "manual"),
               "distributing": ("tutorial_howto", "manual"), "install": ("tutorial_howto", "manual"),
               "faq": ("faq", "faq"), "whatsnew": ("whatsnew", "changelog")}
SHARED_KINDS = {"cacm": ("en", "scientific_abstract"), "cisi": ("en", "scientific_abstract"),
                "cranfield": ("en", "scientific_abstract")}
MAN_PER_PACKAGE = 2    # English man pages of other packages: at most this many per package
SPLIT = 3              # the /usr/share/doc and /etc families are split in SPLIT sources by package hash


@dataclass
class Roots:
    """Where the builder reads; tests point these at a fixture tree."""

    man: Path = Path("/usr/share/man")
    doc: Path = Path("/usr/share/doc")
    etc: Path = Path("/etc")
    debian_reference: Path = Path("/usr/share/debian-reference")
    python_doc: Path = Path("/usr/share/doc/python3.11/html")
    libreoffice_help: Path = Path("/usr/share/libreoffice/help")
    locale: Path = Path("/usr/share/locale")
    libreoffice_locale: Path = Path("/usr/lib/libreoffice/program/resource")
    licenses: Path = Path("/usr/share/common-licenses")
    tables: tuple[Path, ...] = (Path("/usr/share/zoneinfo/iso3166.tab"), Path("/usr/share/zoneinfo/zone.tab"),
                                Path("/usr/share/zoneinfo/zone1970.tab"), Path("/etc/services"),
                                Path("/etc/protocols"), Path("/etc/ethertypes"), Path("/etc/mime.types"),
                                Path("/usr/share/i18n/SUPPORTED"), Path("/usr/share/misc/magic"))
    dpkg_info: Path = Path("/var/lib/dpkg/info")
    dpkg_status: Path = Path("/var/lib/dpkg/status")
    use_man: bool = field(default_factory=lambda: shutil.which("man") is not None)


@dataclass
class Doc:
    title: str
    text: str
    origin: str
    package: str | None = None   # the Debian package whose licence/version the row carries
    lang: str | None = None      # overrides the source's language (multilingual sources)


@dataclass
class Spec:
    """One source: its name, language, kind, the package it comes from (None: per document),
    and a function listing its candidate documents (lazily: callables yielding a Doc)."""

    name: str
    lang: str | None
    kind: str
    package: str | None
    candidates: Callable[[], list[Callable[[], Iterable[Doc]]]]
    licence: str | None = None
    version: str | None = None
    per_doc: Callable[[int], int] = field(default=lambda n: max(3, n // 8))
    dropped_language: int = 0    # chunks left out for not being in the source's language
    check_language: bool = True  # False for curated collections (labelled by their authors)
    label: str | None = None     # what the source is, where it is no package


# ---------------------------------------------------------------------------------------------
# package metadata


class Packages:
    """Versions (the dpkg status database), licences (/usr/share/doc/PKG/copyright) and file
    owners (/var/lib/dpkg/info/*.list) of the installed packages."""

    def __init__(self, roots: Roots):
        self.roots = roots
        self._versions: dict[str, str] | None = None
        self._owners: dict[str, str] | None = None
        self._licences: dict[str, str] = {}

    def version(self, pkg: str) -> str:
        if self._versions is None:
            self._versions = {}
            try:
                text = self.roots.dpkg_status.read_text(encoding="utf-8", errors="replace")
            except OSError:
                text = ""
            for para in text.split("\n\n"):
                name = re.search(r"^Package:\s*(\S+)", para, re.M)
                ver = re.search(r"^Version:\s*(\S+)", para, re.M)
                status = re.search(r"^Status:.*\binstalled\b", para, re.M)
                if name and ver and status:
                    self._versions[name.group(1).split(":")[0]] = ver.group(1)
        return self._versions.get(pkg.split(":")[0], "unknown")

    def installed(self, pkg: str) -> bool:
        return self.version(pkg) != "unknown"

    def licence(self, pkg: str) -> str:
        if pkg not in self._licences:
            path = self.roots.doc / pkg / "copyright"
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                text = ""
            self._licences[pkg] = summarise_licence(text) if text else "unknown (no copyright file)"
        return self._licences[pkg]

    def files(self, pkg: str) -> list[str]:
        try:
            return (self.roots.dpkg_info / f"{pkg}.list").read_text(encoding="utf-8").split("\n")
        except OSError:
            try:
                return next(iter(sorted(self.roots.dpkg_info.glob(f"{pkg}:*.list")))).read_text(
                    encoding="utf-8").split("\n")
            except (StopIteration, OSError):
                return []

    def owner(self, path: str) -> str | None:
        if self._owners is None:
            self._owners = {}
            for lst in sorted(self.roots.dpkg_info.glob("*.list")) if self.roots.dpkg_info.is_dir() else []:
                pkg = lst.name[:-5].split(":")[0]
                try:
                    for line in lst.read_text(encoding="utf-8", errors="replace").split("\n"):
                        self._owners.setdefault(line, pkg)
                except OSError:
                    continue
        return self._owners.get(path)


_LICENCE_PATTERNS = (
    (r"PSF LICENSE AGREEMENT|Python Software Foundation License", "PSF-2.0"),
    (r"GNU Free Documentation License", "GFDL"),
    (r"GNU (Library|Lesser) General Public License", "LGPL"),
    (r"GNU Affero General Public License", "AGPL"),
    (r"GNU General Public License", "GPL"),
    (r"Apache License", "Apache-2.0"),
    (r"Artistic License", "Artistic"),
    (r"Mozilla Public License", "MPL"),
    (r"Permission is hereby granted, free of charge", "Expat"),
    (r"Redistribution and use in source and binary forms", "BSD"),
    (r"public domain", "public-domain"),
    (r"Open Publication License", "OPL-1.0"),
    (r"under varieties of licenses", "various per page (DFSG-free)"),
)


def summarise_licence(text: str) -> str:
    """A short licence name from a copyright file: the ``License:`` of DEP-5's ``Files: *``
    paragraph (else its first ``License:``), else the first known licence text it quotes,
    with its version for the GNU ones (``GPL-2+``)."""
    first = None
    for para in re.split(r"\n[ \t]*\n", text):
        lic = re.search(r"^License:[ \t]*(\S[^\n]*)$", para, re.M)
        # a short name (DEP-5), not the first line of prose after "License:"
        if not lic or len(lic.group(1)) > 40 or len(lic.group(1).split()) > 4 or lic.group(1).endswith(","):
            continue
        files = re.search(r"^Files:[ \t]*(\S[^\n]*)$", para, re.M)
        if files and files.group(1).split()[0] == "*":
            return lic.group(1).strip()
        first = first or lic.group(1).strip()
    if first:
        return first
    found: list[tuple[int, str]] = []   # (position, name): the first two licences the text names
    for pattern, name in _LICENCE_PATTERNS:
        m = re.search(pattern, text, re.I)
        if not m:
            continue
        if name in ("GPL", "LGPL", "GFDL", "AGPL"):
            after = text[m.end():m.end() + 400]
            ver = re.search(r"[Vv]ersion\s+(\d(?:\.\d)?)", after)
            if ver:
                later = re.search(r"any later version|or later", after) is not None
                name = f"{name}-{ver.group(1)}{'+' if later else ''}"
        found.append((m.start(), name))
    if any(n == "PSF-2.0" for _, n in found):  # the Python licence quotes the BSD and others after it
        return "PSF-2.0"
    names = [n for _, n in sorted(found)][:2]
    return " / ".join(names) if names else "see copyright file"


# ---------------------------------------------------------------------------------------------
# readers


def read_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    return data


def read_text(path: Path) -> str | None:
    """The file's text (gunzipped), or None for a binary or too large file."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            return None
        data = read_bytes(path)
    except (OSError, EOFError, gzip.BadGzipFile):
        return None
    if len(data) > 4 * MAX_FILE_BYTES or b"\x00" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("latin-1")
        ctrl = sum(1 for c in text[:4096] if ord(c) < 32 and c not in "\n\r\t\f")
        return None if ctrl > 8 else text


_ROFF_ESCAPES = [
    (re.compile(r"\\f(\[[^\]]*\]|\(..|.)"), ""),          # font changes
    (re.compile(r"\\s[+-]?\d+"), ""),                      # size changes
    (re.compile(r"\\\*(\[[^\]]*\]|\(..|.)"), ""),          # strings
    (re.compile(r"\\\((em|en)"), "—"),
    (re.compile(r"\\\((bu|bullet)"), "•"),
    (re.compile(r"\\\(lq|\\\(rq|\\\(dq"), '"'),
    (re.compile(r"\\\(oq|\\\(cq|\\\(aq"), "'"),
    (re.compile(r"\\\([a-zA-Z]{2}"), ""),
    (re.compile(r"\\\[[^\]]*\]"), ""),
    (re.compile(r"\\[&|^%:)]"), ""),
    (re.compile(r"\\e"), "\\\\"),
    (re.compile(r"\\-"), "-"),
    (re.compile(r"\\ "), " "),
    (re.compile(r"\\c"), ""),
]


def deroff(src: str) -> str:
    """Plain text of a roff man page without groff: requests dropped (their arguments kept for
    headings and tagged paragraphs), escapes removed. Used where ``man`` is not installed."""
    out: list[str] = []
    for line in src.split("\n"):
        if line.startswith(('.\\"', "'\\\"", '.\\\\"')) or line.strip() in (".", "'"):
            continue
        if line.startswith((".", "'")):
            m = re.match(r"[.']\s*(\S+)\s*(.*)", line)
            if not m:
                continue
            req, arg = m.group(1), m.group(2)
            if req in ("SH", "SS"):
                out.extend(["", arg.strip('"').upper() if req == "SH" else arg.strip('"')])
            elif req in ("TH",):
                parts = re.findall(r'"[^"]*"|\S+', arg)
                if len(parts) >= 2:
                    out.append(f"{parts[0].strip(chr(34))}({parts[1].strip(chr(34))})")
            elif req in ("B", "I", "SM", "SB", "BI", "BR", "IB", "IR", "RB", "RI", "IP", "TP", "UR", "MT", "Nm", "Nd"):
                words = re.findall(r'"[^"]*"|\S+', arg)
                joiner = "" if req in ("BI", "BR", "IB", "IR", "RB", "RI") else " "
                text = joiner.join(w.strip('"') for w in words)
                if req == "IP":
                    out.append("")
                if text:
                    out.append(text)
            elif req in ("PP", "LP", "P", "sp", "br", "Pp"):
                out.append("")
            continue
        out.append(line)
    text = "\n".join(out)
    for pattern, repl in _ROFF_ESCAPES:
        text = pattern.sub(repl, text)
    text = text.replace("\\\\", "\\")
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def render_man(path: Path, use_man: bool) -> str | None:
    """A man page as the reader sees it: ``man -l`` (tbl, preconv, no hyphenation or
    justification, 90 columns), else :func:`deroff`."""
    if use_man:
        env = dict(os.environ, MANWIDTH="90", LC_ALL="C.UTF-8", MAN_KEEP_FORMATTING="")
        env.pop("MANPAGER", None)
        env.pop("PAGER", None)
        try:
            res = subprocess.run(["man", "-l", "-E", "UTF-8", "--nh", "--nj", str(path)], env=env,
                                 capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            res = None
        if res is not None and res.returncode == 0 and res.stdout.strip():
            text = res.stdout.decode("utf-8", errors="replace")
            return re.sub(r".\x08", "", text).strip()
    src = read_text(path)
    return deroff(src) if src else None


class _TextHTML(HTMLParser):
    """Stdlib fallback HTML → text (block elements end lines; scripts and styles dropped;
    table cells separated by ' | ')."""

    BLOCK = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "table",
             "dt", "dd", "section", "blockquote"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style", "nav", "head"):
            self.skip += 1
        elif tag in self.BLOCK:
            self.parts.append("\n\n" if tag in ("p", "h1", "h2", "h3", "table", "pre") else "\n")
            if tag in ("h1", "h2", "h3"):
                self.parts.append("#" * int(tag[1]) + " ")
        elif tag in ("td", "th"):
            self.parts.append(" | ")

    def handle_endtag(self, tag):
        if tag in ("script", "style", "nav", "head"):
            self.skip = max(0, self.skip - 1)
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)


def _title_of(soup_or_html) -> str:
    m = re.search(r"<title[^>]*>(.*?)</title>", soup_or_html, re.S | re.I)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", m.group(1))).split()) if m else ""


_MAIN_SELECTORS = ("div#DisplayArea", "div[role=main]", "div.body", "main", "article")
_DROP_SELECTORS = ("script", "style", "nav", "header", "footer", "aside", "div.navheader",
                   "div.navfooter", "div.sphinxsidebar", "div.related", "div.footer", "a.headerlink",
                   "div.toc", "div.contents-treeview", "div#Contents")


def html_main(src: str) -> tuple[str, str]:
    """(title, main-content HTML): the page's main region (LibreOffice help's display area,
    Sphinx's body, <main>) without navigation, headers and footers."""
    title = _title_of(src)
    try:
        from bs4 import BeautifulSoup
    except ImportError:
        return title, src
    soup = BeautifulSoup(src, "html.parser")
    for sel in _DROP_SELECTORS:
        for el in soup.select(sel):
            el.decompose()
    main = next((el for sel in _MAIN_SELECTORS for el in soup.select(sel)[:1]), None) or soup.body or soup
    return title, f"<html><body>{main}</body></html>"


def html_to_text(fragment: str) -> str:
    """HTML → the Markdown ingestion makes of it (markitdown's converter, as the product's HTML
    reader uses), else the stdlib fallback."""
    try:
        from markitdown import StreamInfo
        from kb_rerank.ingest.readers import _converter
        res = _converter("html").convert(io.BytesIO(fragment.encode("utf-8")),
                                         StreamInfo(extension=".html", charset="utf-8"))
        text = res.markdown or ""
    except ImportError:
        p = _TextHTML()
        p.feed(fragment)
        text = "".join(p.parts)
        text = "\n".join(" ".join(line.split()) if not line.startswith("    ") else line.rstrip()
                         for line in text.split("\n"))
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def html_tables(src: str) -> list[str]:
    """Each <table> of the page's main region as an HTML fragment."""
    try:
        from bs4 import BeautifulSoup
    except ImportError:
        return re.findall(r"<table\b.*?</table>", src, re.S | re.I)
    soup = BeautifulSoup(html_main(src)[1], "html.parser")
    return [f"<html><body>{t}</body></html>" for t in soup.find_all("table")
            if t.find_parent("table") is None]


def mo_strings(path: Path) -> list[str]:
    """The translated strings of a gettext catalogue, in msgid order: prose-like ones only
    (at least 3 words and 20 characters), printf markers left as they are."""
    try:
        with path.open("rb") as fh:
            cat = gettext.GNUTranslations(fh)._catalog  # noqa: SLF001 - the parsed msgid -> msgstr map
    except (OSError, Exception):  # noqa: BLE001 - a corrupt catalogue is skipped
        return []
    out = []
    for key in sorted(cat, key=lambda k: str(k)):
        if not key or (isinstance(key, tuple) and key[1] != 0):
            continue
        s = str(cat[key]).strip()
        if len(s) >= 20 and len(s.split()) >= 3 and "\x00" not in s:
            out.append(re.sub(r"[_~&](?=\w)", "", s) if "_" in s or "~" in s else s)
    return out


# ---------------------------------------------------------------------------------------------
# candidate documents of each family


def _stable_hash(s: str) -> int:
    return int.from_bytes(hashlib.sha256(s.encode("utf-8")).digest()[:4], "big")


def _man_doc(path: Path, roots: Roots, package: str | None) -> Iterator[Doc]:
    text = render_man(path, roots.use_man)
    if text:
        name = path.name[:-3] if path.name.endswith(".gz") else path.name
        stem, _, sec = name.rpartition(".")
        yield Doc(f"{stem}({sec})" if stem else name, text, str(path), package)


def _is_man_file(p: str, lang_dir: str, base: Path) -> bool:
    prefix = str(base / lang_dir) + "/man" if lang_dir else str(base) + "/man"
    return p.startswith(prefix) and re.search(r"\.\d\w*(\.gz)?$", p) is not None


def _man_candidates(roots: Roots, pk: Packages, lang: str, pkg: str, other: bool = False):
    def listing():
        dirs = [d for d, lg in MAN_LANGS.items() if lg == lang]
        owned = {p for p in pk.files(pkg) if any(_is_man_file(p, d, roots.man) for d in dirs)}
        if other:  # English man pages of every other installed package
            found = set()
            for sec in sorted(roots.man.glob("man[0-9]*")) if roots.man.is_dir() else []:
                found.update(str(p) for p in sec.iterdir() if p.is_file() and not p.is_symlink())
            paths = sorted(found - owned)
        else:
            paths = sorted(p for p in owned if Path(p).is_file() and not Path(p).is_symlink())
        out = []
        per_owner: Counter = Counter()
        # other packages: at most MAN_PER_PACKAGE pages of each (a hash-chosen few), so that a
        # package of thousands of pages (a cloud SDK) does not fill the source
        for p in sorted(paths, key=_stable_hash) if other else paths:
            owner = pkg if not other else pk.owner(p)
            if other:
                per_owner[owner] += 1
                if per_owner[owner] > MAN_PER_PACKAGE:
                    continue
            out.append(lambda p=p, owner=owner: _man_doc(Path(p), roots, owner))
        return out
    return listing


def _html_doc(path: Path, package: str | None, lang: str | None = None) -> Iterator[Doc]:
    src = read_text(path)
    if not src:
        return
    title, main = html_main(src)
    text = html_to_text(main)
    if text:
        yield Doc(title or path.stem, text, str(path), package, lang)


def _table_docs(path: Path, package: str | None, lang: str | None = None) -> Iterator[Doc]:
    src = read_text(path)
    if not src or "<table" not in src.lower():
        return
    title = _title_of(src) or path.stem
    for i, frag in enumerate(html_tables(src)):
        text = html_to_text(frag)
        if text and text.count("|") >= 4:
            yield Doc(title, text, f"{path}#table{i}", package, lang)


def _text_doc(path: Path, package: str | None, title: str | None = None) -> Iterator[Doc]:
    text = read_text(path)
    if text and text.strip():
        yield Doc(title or path.name, text.strip(), str(path), package)


def _doc_family(roots: Roots, pattern: str, part: int | None, exclude: Callable[[Path], bool] = lambda p: False):
    """Files matching ``/usr/share/doc/*/<pattern>`` whose package hashes to ``part``."""
    def listing():
        out = []
        if not roots.doc.is_dir():
            return out
        for d in sorted(roots.doc.iterdir()):
            if not d.is_dir() or d.is_symlink() or (part is not None and _stable_hash(d.name) % SPLIT != part):
                continue
            for p in sorted(d.glob(pattern)):
                if p.is_file() and not p.is_symlink() and not exclude(p):
                    out.append(lambda p=p, pkg=d.name: _text_doc(p, pkg, f"{pkg}: {p.name}"))
        return out
    return listing


_CONFIG_NAME = re.compile(r"(\.(conf|cfg|cnf|ini|rules|ya?ml|toml|service|timer|socket|properties|xml|json|"
                          r"desktop|list|env)|rc|conf|config|default|sample)(\.(sample|example|dist|in))?(\.gz)?$"
                          r"|^(\.?\w*rc|config|defaults?)(\.\w+)?$", re.I)
_NOT_CONFIG = re.compile(r"\.(png|jpg|gif|svg|ico|pdf|so|a|o|pyc|mo|gmo|bin|db|tar|zip|deb|sig|pem|crt|key)(\.gz)?$")


def _etc_candidates(roots: Roots, pk: Packages, part: int):
    def listing():
        out = []
        if not roots.etc.is_dir():
            return out
        for p in sorted(roots.etc.rglob("*.conf")):
            try:
                if not p.is_file() or p.is_symlink():
                    continue
            except OSError:
                continue
            owner = pk.owner(str(p))
            if _stable_hash(owner or p.name) % SPLIT != part:
                continue
            out.append(lambda p=p, owner=owner: _text_doc(p, owner, str(p)))
        return out
    return listing


def _examples_candidates(roots: Roots):
    def listing():
        out = []
        if not roots.doc.is_dir():
            return out
        for d in sorted(roots.doc.glob("*/examples")):
            pkg = d.parent.name
            for p in sorted(d.rglob("*")):
                if p.is_file() and not p.is_symlink() and _CONFIG_NAME.search(p.name) and not _NOT_CONFIG.search(p.name):
                    out.append(lambda p=p, pkg=pkg: _text_doc(p, pkg, f"{pkg} example: {p.name}"))
        return out
    return listing


def _gettext_candidates(roots: Roots, pk: Packages, lang: str):
    """One "document" per catalogue: its prose-like strings, a blank line between them, titled
    with the catalogue's name (the package's UI and --help messages)."""
    def one(path: Path, domain: str):
        strings = mo_strings(path)
        if strings:
            yield Doc(f"{domain} ({lang})", "\n\n".join(strings), str(path), pk.owner(str(path)))

    def listing():
        out = []
        for base in (roots.locale / lang / "LC_MESSAGES", roots.libreoffice_locale / lang / "LC_MESSAGES"):
            if base.is_dir():
                for p in sorted(base.glob("*.mo")):
                    out.append(lambda p=p: one(p, p.stem))
        return out
    return listing


def _shared_licence(folder: Path) -> tuple[str, str]:
    """(licence, version) of a shared collection from its SOURCE.md: the ``Licence:`` line's
    first clause, the origin's commit."""
    try:
        text = (folder / "SOURCE.md").read_text(encoding="utf-8")
    except OSError:
        return "unknown (no SOURCE.md)", "unknown"
    lic = re.search(r"Licen[cs]e:\s*(.+)", text)
    licence = "unknown"
    if lic:
        licence = re.split(r"(?<=[a-z0-9])\.\s|\s\(", lic.group(1).replace("**", ""))[0].strip().rstrip(".")
    commit = re.search(r"commit\s+`?([0-9a-f]{7,40})", text)
    return licence, (f"commit {commit.group(1)[:12]}" if commit else "unknown")


def _shared_candidates(folder: Path):
    def listing():
        out = []
        path = folder / "corpus.jsonl"
        if not path.is_file():
            return out
        with path.open(encoding="utf-8-sig") as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                r = json.loads(line)
                text = (r.get("text") or "").replace("\ufeff", "").strip()
                title = (r.get("title") or "").strip()
                if not text:  # a title-only record (CACM) is no passage
                    continue
                out.append(lambda t=title, x=text, i=r.get("_id"): [Doc(t, x, f"{folder.name}:{i}")])
        return out
    return listing


def _FEW(n: int) -> int:
    """Chunks taken of one file of a many-package family: a long changelog or README is one
    package's text, and a few of each spread the source over many packages."""
    return 3


def specs(roots: Roots, pk: Packages, shared: Path | None) -> list[Spec]:
    """Every Debian-derived and shared source, in build order (an earlier source keeps a
    passage that a later one repeats)."""
    out: list[Spec] = []
    for lang, pkg in MAN_PACKAGES.items():
        out.append(Spec(f"man_{lang}", lang, "manual", pkg, _man_candidates(roots, pk, lang, pkg), per_doc=_FEW))
    out.append(Spec("man_en_packages", "en", "manual", None,
                    _man_candidates(roots, pk, "en", "manpages", other=True), per_doc=_FEW))
    for code, lang in DEBREF_LANGS.items():
        pkg = f"debian-reference-{code}"
        files = lambda code=code: [lambda p=p: _html_doc(p, None) for p in
                                   sorted(roots.debian_reference.glob(f"*.{code}.html"))]
        out.append(Spec(f"debian_reference_{lang}", lang, "manual", pkg, files, per_doc=lambda n: max(3, n // 3)))
    for suffix, kind in dict(PYDOC_PARTS.values()).items():
        dirs = [d for d, (s, _) in PYDOC_PARTS.items() if s == suffix]
        files = lambda dirs=dirs: [lambda p=p: _html_doc(p, None) for d in dirs
                                   for p in sorted((roots.python_doc / d).rglob("*.html"))]
        out.append(Spec(f"python311_doc_{suffix}", "en", kind, "python3.11-doc", files))
    for code, lang in LIBREOFFICE_LANGS.items():
        pkg = f"libreoffice-help-{code.lower()}"
        files = lambda code=code: [lambda p=p: _html_doc(p, None) for p in
                                   sorted((roots.libreoffice_help / code / "text").rglob("*.html"))]
        out.append(Spec(f"libreoffice_help_{lang}", lang, "help_page", pkg, files))
    for lang in GETTEXT_LANGS:
        out.append(Spec(f"gettext_{lang}", lang, "help_page", None, _gettext_candidates(roots, pk, lang),
                        per_doc=lambda n: max(6, n // 4)))
    for part in range(SPLIT):
        out.append(Spec(f"usr_share_doc_readme_{part}", "en", "readme", None,
                        _doc_family(roots, "README*", part,
                                    exclude=lambda p: p.suffix in (".html", ".pdf", ".htm")), per_doc=_FEW))
    for part in range(SPLIT):
        out.append(Spec(f"usr_share_doc_changelog_{part}", "en", "changelog", None,
                        _doc_family(roots, "changelog*", part), per_doc=_FEW))
    out.append(Spec("usr_share_doc_news", "en", "changelog", None, _doc_family(roots, "NEWS*", None), per_doc=_FEW))
    for part in range(SPLIT):
        out.append(Spec(f"etc_config_{part}", "en", "config", None, _etc_candidates(roots, pk, part), per_doc=_FEW))
    out.append(Spec("usr_share_doc_examples", "en", "config", None, _examples_candidates(roots), per_doc=_FEW))
    out.append(Spec("tables_system", "en", "table", None,
                    lambda: [lambda p=p: _text_doc(p, pk.owner(str(p)), str(p))
                             for p in roots.tables if p.is_file()], per_doc=lambda n: max(3, n // 3)))
    out.append(Spec("tables_html_en", "en", "table", None,
                    lambda: [lambda p=p, pkg=pkg: _table_docs(p, pkg) for pkg, p in
                             [("python3.11-doc", p) for p in sorted(roots.python_doc.rglob("*.html"))]
                             + [("debian-reference-en", p) for p in sorted(roots.debian_reference.glob("*.en.html"))]],
                    per_doc=lambda n: 2))
    out.append(Spec("tables_html_other", None, "table", None,
                    lambda: [lambda p=p, pkg=pkg, lg=lg: _table_docs(p, pkg, lg) for pkg, p, lg in
                             [(f"debian-reference-{c}", p, lg) for c, lg in DEBREF_LANGS.items() if lg != "en"
                              for p in sorted(roots.debian_reference.glob(f"*.{c}.html"))]
                             + [(f"libreoffice-help-{c.lower()}", p, lg) for c, lg in LIBREOFFICE_LANGS.items()
                                if lg != "en" for p in sorted((roots.libreoffice_help / c / "text").rglob("*.html"))]],
                    per_doc=lambda n: 1))
    out.append(Spec("debian_policy_docs", "en", "policy", "doc-debian",
                    lambda: [lambda p=p: _text_doc(p, "doc-debian", p.name.split(".txt")[0])
                             for p in sorted((roots.doc / "debian").glob("*"))
                             if re.match(r"(constitution|social-contract|debian-manifesto)", p.name)]))
    out.append(Spec("common_licenses", "en", "policy", "base-files",
                    lambda: [lambda p=p: _text_doc(p, "base-files", f"{p.name} licence")
                             for p in sorted(roots.licenses.glob("*")) if p.is_file() and not p.is_symlink()]))
    out.append(Spec("usr_share_doc_copyright", "en", "policy", None, _doc_family(roots, "copyright", None),
                    per_doc=lambda n: 2))
    if shared is not None and shared.is_dir():
        for folder in sorted(p for p in shared.iterdir() if (p / "corpus.jsonl").is_file()):
            name = folder.name
            if name in SHARED_KINDS:
                lang, kind = SHARED_KINDS[name]
            elif name.startswith("xquad-"):
                lang, kind = name.split("-", 1)[1], "encyclopaedia"
            else:
                continue
            licence, version = _shared_licence(folder)
            out.append(Spec(f"shared_{name.replace('-', '_')}", lang, kind, None, _shared_candidates(folder),
                            licence=licence, version=version, check_language=False, label=f"shared {name}"))
    return out


# ---------------------------------------------------------------------------------------------
# language check: translated documentation falls back to English where a string is untranslated
# (LibreOffice's Hindi help is mostly English); a passage must be in its row's language

_SCRIPTS = {
    "hi": ((0x0900, 0x097F),),
    "ar": ((0x0600, 0x06FF), (0x0750, 0x077F), (0xFB50, 0xFDFF), (0xFE70, 0xFEFF)),
    "th": ((0x0E00, 0x0E7F),),
    "ru": ((0x0400, 0x04FF),),
    "el": ((0x0370, 0x03FF), (0x1F00, 0x1FFF)),
    "zh": ((0x4E00, 0x9FFF), (0x3400, 0x4DBF)),
    "ja": ((0x4E00, 0x9FFF), (0x3040, 0x30FF)),
}
_SCRIPT_MIN_SHARE = 0.15
_STOPWORDS = {
    "en": "the and of to is in that for with this are be by you it can or from not on as if an".split(),
    "de": "der die das und ist nicht mit den von zu ein eine für auf werden wird sie dem des im oder kann wenn".split(),
    "fr": "le la les et est des une un du dans pour pas que qui sur par avec au sont ce vous peut".split(),
    "es": "el la los las que y en un una es por para con se del no al su como puede".split(),
    "tr": "ve bir bu için ile olarak veya daha çok gibi olan değil ise kullanılır dosya tüm".split(),
    "ro": "și în la cu pe un o este care nu sau din pentru sunt se mai ca fi".split(),
}


def in_language(text: str, lang: str) -> bool:
    """False where ``text`` reads as English rather than ``lang``: at least three English function
    words and, for a non-Latin script, under 15% of its letters in that script; for Vietnamese,
    not Vietnamese by the product's own rule (its letters); for German, French, Spanish, Turkish
    and Romanian, fewer of their function words than of English ones. Code, tables and names
    without English prose pass (they are no language's in particular)."""
    if lang == "en":
        return True
    words = re.findall(r"\w+", text.lower())
    en = sum(1 for w in words if w in _STOP_SETS["en"])
    if en < 3:
        return True
    if lang in _SCRIPTS:
        ranges = _SCRIPTS[lang]
        letters = [ord(c) for c in text if c.isalpha()]
        ours = sum(1 for c in letters if any(a <= c <= b for a, b in ranges))
        return ours >= _SCRIPT_MIN_SHARE * len(letters)
    if lang == "vi":
        from kb_rerank.ingest.readers import guess_language
        return guess_language(text) == "vi"
    if lang in _STOP_SETS:
        return sum(1 for w in words if w in _STOP_SETS[lang]) >= en
    return True


_STOP_SETS = {k: frozenset(v) for k, v in _STOPWORDS.items()}


# ---------------------------------------------------------------------------------------------
# building


def chunk_passages(doc: Doc) -> list[str]:
    """The document's chunks as ingestion indexes them (the product's chunker and settings, the
    title before each chunk), those under MIN_CHARS dropped."""
    from kb_rerank.core.chunking import chunk_text
    from kb_rerank.ingest.loader import _passage_text
    from kb_rerank.ingest.readers import SourceDoc, _normalise
    from kb_rerank.core.settings import Settings

    st = Settings()
    text = _normalise(doc.text).strip()
    if not text:
        return []
    sd = SourceDoc(source_uri=doc.origin, title=" ".join(doc.title.split()), text=text, language=doc.lang)
    return [_passage_text(sd, piece) for piece in chunk_text(text, st.chunk_max_chars, st.chunk_overlap)
            if len(piece.strip()) >= MIN_CHARS]


def _norm_key(text: str) -> str:
    return hashlib.sha256(" ".join(text.split()).lower().encode("utf-8")).hexdigest()


def _keys(text: str) -> set[str]:
    """A passage's duplicate keys: its whitespace- and case-folded text, and that text without
    its first line (the title), so that boilerplate repeated under many titles (a translators'
    note at the end of every man page of a language) is kept once."""
    keys = {_norm_key(text)}
    if "\n" in text:
        keys.add(_norm_key(text.split("\n", 1)[1]))
    return keys


def build_source(spec: Spec, pk: Packages, seed: int, per_source: int, seen: set[str]) -> list[dict]:
    """A source's rows: candidates in a seeded order, up to ``per_doc`` chunks of each (seeded),
    until POOL_FACTOR * per_source are gathered; then a seeded sample of per_source."""
    rng = random.Random(f"{seed}:{spec.name}")
    cands = spec.candidates()
    rng.shuffle(cands)
    pool: list[dict] = []
    keys: set[str] = set()
    dropped = [0]
    for make in cands:
        if len(pool) >= POOL_FACTOR * per_source:
            break
        for doc in make():
            chunks = chunk_passages(doc)
            if not chunks:
                continue
            take = sorted(rng.sample(range(len(chunks)), min(len(chunks), spec.per_doc(len(chunks)))))
            pkg = doc.package or spec.package
            lang = doc.lang or spec.lang
            for i in take:
                k = _keys(chunks[i])
                if k & keys or k & seen:
                    continue
                body = chunks[i].split("\n", 1)[1] if "\n" in chunks[i] else chunks[i]
                if spec.check_language and lang and not in_language(body, lang):
                    dropped[0] += 1
                    continue
                keys |= k
                pool.append({
                    "text": chunks[i], "source": spec.name, "lang": lang, "kind": spec.kind,
                    "licence": spec.licence or (pk.licence(pkg) if pkg else "unknown"),
                    "version": spec.version or (pk.version(pkg) if pkg else "unknown"),
                    "origin": doc.origin if len(take) == 1 and len(chunks) == 1 else f"{doc.origin}#{i}",
                })
    if len(pool) > per_source:
        pool = rng.sample(pool, per_source)
    for r in pool:
        seen |= _keys(r["text"])
    spec.dropped_language = dropped[0]
    return sorted(pool, key=lambda r: (r["origin"], r["text"]))


def read_written(path: Path) -> list[dict]:
    """A written ordinary set's rows; a bad row raises ValueError naming the file, line, field."""
    rows = []
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not JSON ({exc.msg})") from None
            if not isinstance(r, dict):
                raise ValueError(f"{path}:{n}: a row must be an object")
            for key in ("text", "lang", "kind"):
                if not isinstance(r.get(key), str) or not r[key].strip():
                    raise ValueError(f"{path}:{n}: field {key!r} missing or empty")
            if r["kind"] not in KINDS:
                raise ValueError(f"{path}:{n}: field 'kind' is {r['kind']!r}, not one of {', '.join(KINDS)}")
            if r["lang"] not in LANGS:
                raise ValueError(f"{path}:{n}: field 'lang' is {r['lang']!r}, not one of {', '.join(LANGS)}")
            rows.append({"text": r["text"].strip(), "lang": r["lang"], "kind": r["kind"], "line": n})
    return rows


def build_written(path: Path, seed: int, per_source: int | None, seen: set[str]) -> list[dict]:
    """A written set's rows (all of them, or a seeded sample of ``per_source``)."""
    name = f"written_ordinary_{path.stem}"
    rng = random.Random(f"{seed}:{name}")
    pool = []
    for r in read_written(path):
        k = _keys(r["text"])
        if k & seen or len(r["text"]) < 12:
            continue
        seen |= k
        pool.append({"text": r["text"], "source": name, "lang": r["lang"], "kind": r["kind"],
                     "licence": "project's own", "version": "unknown", "origin": f"{path.name}:{r['line']}"})
    if per_source is not None and len(pool) > per_source:
        keep = {id(r) for r in rng.sample(pool, per_source)}
        pool = [r for r in pool if id(r) in keep]
    return pool


def build(out: Path, shared: Path | None, written: Path | None, seed: int = 28,
          per_source: int = PER_SOURCE, roots: Roots | None = None, only: Iterable[str] | None = None,
          written_per_source: int | None = None,
          log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)) -> dict:
    """Build the corpus in ``out``; returns the manifest. ``only`` (source names or shell
    patterns, ``written_ordinary_*``): rebuild those sources and keep the others (their passages
    are not repeated); else the folder's old ``*.jsonl`` are removed first. The written sets are
    kept whole unless ``written_per_source`` is given: they are few, and the only passages of the
    kinds no package holds (recipes, travel, minutes, news, medical abstracts)."""
    roots = roots or Roots()
    pk = Packages(roots)
    out.mkdir(parents=True, exist_ok=True)
    only = list(only) if only else None

    def selected(name: str) -> bool:
        return only is None or any(fnmatch.fnmatchcase(name, pat) for pat in only)
    manifest: dict = {"seed": seed, "per_source": per_source, "min_chars": MIN_CHARS, "sources": {}, "skipped": {}}
    seen: set[str] = set()
    if only:  # a partial rebuild: the other sources stay, and their passages are not repeated
        try:
            manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            pass
        for table in (manifest["sources"], manifest["skipped"]):
            for name in [n for n in table if selected(n)]:
                table.pop(name)
        for old in out.glob("*.jsonl"):
            if selected(old.stem):
                old.unlink()
        seen = {k for r in load(out) for k in _keys(r["text"])}
    else:
        for old in out.glob("*.jsonl"):
            old.unlink()

    def record(name: str, rows: list[dict], meta: dict) -> None:
        if not rows:
            manifest["skipped"][name] = meta.get("why") or "no passages (package not installed or no files)"
            log(f"skip {name}: {manifest['skipped'][name]}")
            return
        with (out / f"{name}.jsonl").open("w", encoding="utf-8") as fh:
            for r in rows:
                fh.write(json.dumps({k: r[k] for k in FIELDS}, ensure_ascii=False) + "\n")
        langs = Counter(r["lang"] for r in rows)
        licences = Counter(r["licence"] for r in rows)
        versions = Counter(r["version"] for r in rows)
        manifest["sources"][name] = {
            "package": meta.get("package") or "various", "kind": rows[0]["kind"] if len({r["kind"] for r in rows}) == 1
            else "mixed", "kinds": dict(Counter(r["kind"] for r in rows)), "langs": dict(langs),
            "licence": licences.most_common(1)[0][0] if len(licences) == 1 else f"various ({len(licences)})",
            "version": versions.most_common(1)[0][0] if len(versions) == 1 else f"various ({len(versions)})",
            "passages": len(rows), "dropped_language": meta.get("dropped_language", 0)}
        log(f"{name}: {len(rows)} passages")

    for spec in specs(roots, pk, shared):
        if not selected(spec.name):
            continue
        if spec.package and spec.licence is None and not pk.installed(spec.package):
            record(spec.name, [], {"why": f"package {spec.package} not installed"})
            continue
        rows = build_source(spec, pk, seed, per_source, seen)
        record(spec.name, rows, {"package": spec.package or spec.label, "dropped_language": spec.dropped_language,
                                 "why": f"no passages in {spec.lang}" if spec.dropped_language else None})
    if (shared is None or not shared.is_dir()) and selected("shared_"):
        manifest["skipped"]["shared_*"] = f"no shared collections folder ({shared})"
    if written is None or not written.is_dir():
        if selected("written_ordinary_"):
            manifest["skipped"]["written_ordinary_*"] = f"no written ordinary folder ({written})"
    else:
        for path in sorted(written.glob("*.jsonl")):
            name = f"written_ordinary_{path.stem}"
            if not selected(name):
                continue
            try:
                rows = build_written(path, seed, written_per_source, seen)
            except (ValueError, OSError, UnicodeDecodeError) as exc:
                record(name, [], {"why": f"unreadable: {exc}"})
                continue
            record(name, rows, {"package": f"written set {path.name}"})
    (out / MANIFEST).write_text(json.dumps(manifest, ensure_ascii=False, indent=1, sort_keys=True) + "\n",
                                encoding="utf-8")
    return manifest


# ---------------------------------------------------------------------------------------------
# loading and grouping (the training code's side)


def load(folder: Path | str) -> list[dict]:
    """Every row of every source in ``folder``, sorted by (source, origin, text)."""
    rows = []
    for path in sorted(Path(folder).glob("*.jsonl")):
        with path.open(encoding="utf-8") as fh:
            rows.extend(json.loads(line) for line in fh if line.strip())
    return sorted(rows, key=lambda r: (r["source"], r["origin"], r["text"]))


def by_group(rows: list[dict], key: str = "source") -> dict[str, list[dict]]:
    """Rows grouped by ``row[key]`` (source, lang, kind, ...), groups in sorted order."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        groups[r[key]].append(r)
    return {g: groups[g] for g in sorted(groups)}


def source_folds(rows: list[dict], k: int | None = None, key: str = "source") -> list[tuple[list[int], list[int]]]:
    """(train indices, test indices) per fold, each group (source) wholly in one fold's test
    side: one fold per group (leave-one-source-out) for ``k=None``, else ``k`` folds balanced
    by size (largest group first into the smallest fold; ties by name)."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        groups[r[key]].append(i)
    names = sorted(groups)
    if k is None:
        assign = [[g] for g in names]
    else:
        if k < 2 or k > len(names):
            raise ValueError(f"k must be between 2 and the number of groups ({len(names)}), got {k}")
        assign = [[] for _ in range(k)]
        sizes = [0] * k
        for g in sorted(names, key=lambda g: (-len(groups[g]), g)):
            j = min(range(k), key=lambda j: (sizes[j], j))
            assign[j].append(g)
            sizes[j] += len(groups[g])
    folds = []
    for gs in assign:
        test = sorted(i for g in gs for i in groups[g])
        held = set(test)
        folds.append(([i for i in range(len(rows)) if i not in held], test))
    return folds


# ---------------------------------------------------------------------------------------------
# stats


def stats(folder: Path | str) -> str:
    """Markdown tables: passages per source (package, version, licence, languages, kinds), per
    language, per kind, and the sources skipped."""
    folder = Path(folder)
    rows = load(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        manifest = {"sources": {}, "skipped": {}}
    lines = [f"{len(rows)} passages in {len(by_group(rows))} sources", "",
             "| source | package / collection | version | licence | languages | kinds | passages |",
             "|---|---|---|---|---|---|---|"]
    for name, rs in by_group(rows).items():
        meta = manifest["sources"].get(name, {})
        langs = ", ".join(f"{lg} {n}" if len(set(r['lang'] for r in rs)) > 1 else lg
                          for lg, n in sorted(Counter(r["lang"] for r in rs).items()))
        kinds = ", ".join(sorted({r["kind"] for r in rs}))
        lic = Counter(r["licence"] for r in rs)
        ver = Counter(r["version"] for r in rs)
        lic_s = lic.most_common(1)[0][0] if len(lic) == 1 else "per package (" + ", ".join(
            f"{n}" for n, _ in lic.most_common(3)) + ", …)"
        ver_s = ver.most_common(1)[0][0] if len(ver) == 1 else f"per package ({len(ver)})"
        lines.append(f"| {name} | {meta.get('package', '')} | {ver_s} | {lic_s} | {langs} | {kinds} | {len(rs)} |")
    for key in ("lang", "kind"):
        lines += ["", f"| {key} | passages | sources |", "|---|---|---|"]
        for g, rs in by_group(rows, key).items():
            lines.append(f"| {g} | {len(rs)} | {len({r['source'] for r in rs})} |")
    missing = [k for k in KINDS if k not in {r["kind"] for r in rows}]
    lang_missing = [lg for lg in LANGS if lg not in {r["lang"] for r in rows}]
    lines += ["", f"kinds without passages: {', '.join(missing) or 'none'}",
              f"languages without passages: {', '.join(lang_missing) or 'none'}"]
    skipped = manifest.get("skipped", {})
    if skipped:
        lines += ["", "| skipped source | why |", "|---|---|"]
        lines += [f"| {n} | {why} |" for n, why in sorted(skipped.items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build the corpus")
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--shared", type=Path, default=None, help="the shared datasets folder (BEIR collections)")
    b.add_argument("--written", type=Path, default=None, help="a folder of written ordinary *.jsonl sets")
    b.add_argument("--seed", type=int, default=28)
    b.add_argument("--per-source", type=int, default=PER_SOURCE)
    b.add_argument("--written-per-source", type=int, default=None,
                   help="a seeded sample of this many passages per written set (default: all)")
    b.add_argument("--only", nargs="*", default=None,
                   help="rebuild only these sources (names or shell patterns), keeping the others")
    s = sub.add_parser("stats", help="counts per source, language and kind (Markdown)")
    s.add_argument("folder", type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "build":
        if a.per_source < 1:
            ap.error("--per-source must be >= 1")
        m = build(a.out, a.shared, a.written, seed=a.seed, per_source=a.per_source, only=a.only,
                  written_per_source=a.written_per_source)
        print(f"{sum(v['passages'] for v in m['sources'].values())} passages in {len(m['sources'])} sources "
              f"({len(m['skipped'])} skipped) -> {a.out}")
    else:
        if not a.folder.is_dir():
            ap.error(f"no such folder: {a.folder}")
        print(stats(a.folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
