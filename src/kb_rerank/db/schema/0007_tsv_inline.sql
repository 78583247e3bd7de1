-- 0007: keep kb.chunks.tsv inside the heap row (storage main) instead of in the TOAST table.
--
-- BM25 reads the tsvector of every candidate chunk (term frequencies live only there). A
-- chunk's tsvector is ~1.9 kB and does not compress, so with the default storage
-- (extended) it went out of line, and each candidate cost a TOAST index lookup and fetch:
-- on 10k chunks, `count(*) where tsv @@ 'pressure'` (2,587 matches) took 50.4 ms before
-- and 2.8 ms after this change (bench DB kb_bench_10000_1, best of 5). The text and the
-- embedding, read only for the final rows, go out of line instead.
--
-- Existing rows must be rewritten for their tsvector to move in line. One ALTER TABLE does
-- it: the no-op type change with a USING expression forces a table rewrite, done after the
-- storage change of the same statement, and every index is rebuilt from scratch (an
-- UPDATE of every row would instead insert a second entry per row into every index,
-- HNSW included, and fire the statistics triggers; the lexemes do not change, so neither
-- do the BM25 statistics). It holds an ACCESS EXCLUSIVE lock on kb.chunks for the rewrite:
-- 42-47 s per 100k chunks here with maintenance_work_mem = 2GB, most of it the HNSW build
-- (raise maintenance_work_mem for the migration on a large table).
alter table kb.chunks
  alter column tsv type tsvector using tsv || ''::tsvector,
  alter column tsv set storage main;
