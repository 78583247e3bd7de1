"""`kb-rerank` commands: searches from the command line and their BM25 term blocks (term-blocks, search, embed)."""

from __future__ import annotations

import sys
import time
from uuid import UUID

from kb_rerank.cli.common import TENANT_HELP, app_conn, command, fit, language_code, uuid_arg
from kb_rerank.core import session
from kb_rerank.core.dev import DEMO_TENANT
from kb_rerank.core.settings import Settings


class _Ticker:
    """A tqdm line showing the elapsed time of one long statement (``kb-rerank term-blocks``: the
    rebuild is one SQL function call, so there is no fraction done to show)."""

    def __init__(self, desc: str, enabled: bool) -> None:
        self.desc, self.enabled = desc, enabled

    def __enter__(self):
        if self.enabled:
            import threading

            from tqdm import tqdm

            self._bar = tqdm(total=None, desc=self.desc, bar_format="{desc}: {elapsed}", file=sys.stderr)
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self._bar.refresh()

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self._stop.set()
            self._thread.join()
            self._bar.close()


def cmd_term_blocks(args, settings: Settings) -> int:
    """Rebuild a tenant's BM25 term blocks (kb.term_blocks)."""
    from kb_rerank.retrieval import term_blocks

    with app_conn(settings) as conn:
        t0 = time.perf_counter()
        with session.tenant_transaction(conn, args.tenant):
            n_chunks, _ = session.run(conn, term_blocks.state)
            with _Ticker(f"term-blocks: rebuilding over {n_chunks} chunks", not args.quiet):
                n = session.run(conn, term_blocks.refresh, settings)
        dt = time.perf_counter() - t0
    print(f"term blocks of {n} words rebuilt for tenant {args.tenant} in {dt:.1f}s")
    return 0


def cmd_lists(args, settings: Settings) -> int:
    """``kb-rerank lists``: the old name of ``kb-rerank term-blocks`` (deprecated)."""
    print("kb-rerank: `lists` is deprecated, use `kb-rerank term-blocks`", file=sys.stderr)
    return cmd_term_blocks(args, settings)


def print_results(rows) -> None:
    if not rows:
        print("  (no results)")
    for i, r in enumerate(rows, 1):
        ranks = f"lex={r.lexical_rank or '-'} sem={r.semantic_rank or '-'}"
        snippet = " ".join(r.snippet.split())[:90]
        print(f"  {i:2d}. {r.score:8.4f}  {ranks:16s} {fit(r.doc_title, 40)} | {snippet}")


def run_search(conn, settings: Settings, embedder, tenant: UUID, query: str, mode: str, k: int,
               language: str | None = None):
    """The service's retrieval (:class:`~kb_rerank.retrieval.spec.RetrievalSpec`) with
    ``k`` as KB_CANDIDATES: ``k`` lexical or semantic rows, or the best 2 x ``k`` fused.
    ``language``: the query's language as the request's ``language`` names it (None: detected)."""
    from kb_rerank.core.query import normalize_query
    from kb_rerank.retrieval.spec import HYBRID, LEXICAL, SEMANTIC, RetrievalSpec

    spec = RetrievalSpec.of(settings, {"lexical": LEXICAL, "semantic": SEMANTIC, "hybrid": HYBRID}[mode],
                            candidates=k, language=language)
    query = normalize_query(query)
    embedding = embedder.embed_query(query) if spec.needs_embedding else None
    with session.tenant_transaction(conn, tenant):
        return session.run(conn, spec.fetch, query, embedding)


def cmd_search(args, settings: Settings) -> int:
    from kb_rerank.models.embedders import get_embedder

    embedder = None if args.mode == "lexical" else get_embedder(settings)
    with app_conn(settings) as conn:
        rows = run_search(conn, settings, embedder, args.tenant, args.query, args.mode, args.k, args.language)
    print(f"{args.mode} search for {args.query!r}: {len(rows)} results")
    print_results(rows[: args.limit])
    return 0


def cmd_embed(args, settings: Settings) -> int:
    """Print the query embedding as a pgvector literal, e.g. for psql:
    \\set qvec `kb-rerank embed 'how do I emit hóa đơn'`"""
    from kb_rerank.models.embedders import get_embedder

    vec = get_embedder(settings).embed_query(args.text)
    print("[" + ",".join(f"{x:.7g}" for x in vec) + "]")
    return 0


def register(sub) -> None:
    for name, func, text in (
            ("term-blocks", cmd_term_blocks, "rebuild a tenant's BM25 term blocks (kb.term_blocks; ingest does it "
                                             "after large loads; searches are exact either way, faster with fresh "
                                             "blocks)"),
            ("lists", cmd_lists, "deprecated name of term-blocks")):
        li = command(sub, name, help=text)
        li.add_argument("--tenant", type=uuid_arg, required=True, help=TENANT_HELP)
        li.add_argument("--quiet", action="store_true", help="no progress line")
        li.set_defaults(func=func)

    s = command(sub, "search", help="run a search from the command line")
    s.add_argument("query", help="the question or keywords, e.g. 'ERR_402 at checkout'")
    s.add_argument("--tenant", type=uuid_arg, default=DEMO_TENANT, help=f"the tenant's UUID (default the demo tenant, "
                   f"{DEMO_TENANT})")
    s.add_argument("--mode", choices=["hybrid", "lexical", "semantic"], default="hybrid",
                   help="hybrid (default): BM25 and embeddings fused; lexical: BM25 only; semantic: embeddings only")
    s.add_argument("-k", type=int, default=20, help="top-k of each list")
    s.add_argument("--limit", type=int, default=10, help="rows to print")
    s.add_argument("--language", type=language_code, default=None,
                   help="the query's language (ISO code such as 'de', or a name such as 'German'), as the "
                        "request's 'language' field; default: detected from the query")
    s.set_defaults(func=cmd_search)

    em = command(sub, "embed", help="print a query's embedding as a pgvector literal (for psql)")
    em.add_argument("text", help="the query text to embed")
    em.set_defaults(func=cmd_embed)
