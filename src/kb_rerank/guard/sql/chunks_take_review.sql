-- BEFORE trigger: a chunk's injection_review is the review of its text (kb.guard_reviews,
-- by tenant and content hash; migration 0018_guard_review), set whenever a chunk is written
-- or its hash or review column is: a re-ingested chunk whose text did not change gets its
-- review back, a changed text (a new hash) has none and is judged afresh, and the column
-- cannot be set to anything but the review. Materialised on the chunk row so that the query
-- path (kb_rerank.retrieval.store.DETAILS_SQL) reads it with the verdict, without a join.
-- SECURITY INVOKER: the writer's RLS applies to kb.guard_reviews (the app role writes only
-- its tenant's chunks, and reads only its tenant's reviews). One primary-key probe a row.
create or replace function kb.chunks_take_review()
returns trigger
language plpgsql
security invoker
set search_path = pg_catalog, kb, pg_temp
as $$
begin
  new.injection_review := (select r.decision from kb.guard_reviews r
                           where r.tenant_id = new.tenant_id and r.content_hash = new.content_hash);
  return new;
end
$$;
revoke all on function kb.chunks_take_review() from public;

drop trigger if exists chunks_take_review on kb.chunks;
create trigger chunks_take_review
  before insert or update of content_hash, injection_review on kb.chunks
  for each row execute function kb.chunks_take_review();
