-- Downgrade of 0008_term_tops (run by its Alembic revision).
-- The trigger and functions that write the lists go with the table (kb.bm25_tf_part stays:
-- kb.search_lexical scores with it). kb.search_lexical (an idempotent file, not re-applied by
-- a downgrade) checks that the table exists before it reads it, so the search keeps working
-- at 0007, without the lists.
drop trigger if exists chunks_term_tops_insert on kb.chunks;
drop trigger if exists chunks_term_tops_update on kb.chunks;
drop trigger if exists chunks_term_tops_delete on kb.chunks;
drop function if exists kb.chunks_maintain_term_tops();
drop function if exists kb.refresh_term_tops(integer, integer, double precision, double precision);
drop function if exists kb.term_tops_lock_key(uuid);
drop table if exists kb.term_tops;
