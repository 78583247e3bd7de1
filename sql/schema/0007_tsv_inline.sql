-- 0007: keep kb.chunks.tsv inside the heap row (storage main) instead of in the TOAST table.
--
-- BM25 reads the tsvector of every candidate chunk (term frequencies live only there). A
-- chunk's tsvector is ~1.9 kB and does not compress, so with the default storage
-- (extended) it went out of line, and each candidate cost a TOAST index lookup and fetch:
-- on 10k chunks, `count(*) where tsv @@ 'pressure'` (2,587 matches) took 50.4 ms before
-- and 2.8 ms after this change (bench DB kb_bench_10000_1, best of 5). The text and the
-- embedding, read only for the final rows, go out of line instead.
--
-- Existing rows are rewritten so that their tsvector moves in line (`tsv || ''` is the same
-- tsvector, as a fresh value the toaster stores by the new rule). The statistics trigger is
-- disabled for that statement only: the lexemes do not change, so the BM25 statistics do
-- not either, and replaying them would cost minutes on a large table.
alter table kb.chunks alter column tsv set storage main;
do $$
begin
  -- the trigger exists once the functions have been applied (a database that was at head
  -- before); a database built from scratch gets it after this file, and has no rows yet
  if exists (select 1 from pg_trigger
             where tgrelid = 'kb.chunks'::regclass and tgname = 'chunks_stats_update') then
    alter table kb.chunks disable trigger chunks_stats_update;
    update kb.chunks set tsv = tsv || ''::tsvector;
    alter table kb.chunks enable trigger chunks_stats_update;
  else
    update kb.chunks set tsv = tsv || ''::tsvector;
  end if;
end
$$;
