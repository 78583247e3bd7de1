-- BM25 statistics and term blocks: their row-level security and the app role's read are the
-- tenant rule (db/sql/tenant_tables.sql). Written only by the triggers and
-- kb.refresh_term_blocks (owned by kb_stats); kb_search (the search functions) reads them.
revoke all on kb.term_stats, kb.corpus_stats, kb.term_language_stats, kb.corpus_language_stats, kb.term_blocks from kb_search;
grant select on kb.term_stats, kb.corpus_stats, kb.term_language_stats, kb.corpus_language_stats, kb.term_blocks to kb_search;
-- kb_stats writes them, and reads the chunks they are derived from.
grant select, insert, update, delete on kb.term_stats, kb.corpus_stats, kb.term_language_stats, kb.corpus_language_stats, kb.term_blocks to kb_stats;
grant select on kb.chunks to kb_stats;
