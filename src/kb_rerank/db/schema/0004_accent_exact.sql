-- 0004: accented words are also indexed as typed (besides their folded form), so a query
-- typed with diacritics is precise while one typed without them still finds everything.
-- The functions (kb.to_tsv, kb.query_terms, kb.doc_length, kb.chunks_derive) are applied by
-- the revision before this file's data step; the chunks are then re-analysed.
create text search configuration kb.kb_text_exact (copy = pg_catalog.simple);
