-- AFTER trigger (per statement) on kb.guard_reviews: a review written, changed or removed is
-- applied to every chunk of the tenant with that text (kb.chunks.injection_review, which
-- kb.chunks_take_review recomputes from kb.guard_reviews on the update). Only chunks whose
-- review changes are updated, so that their update bumps the tenant's knowledge-base
-- generation (kb.bump_generation) exactly when an answer could change: no cached answer or
-- pair score built before the review is served after it commits.
-- SECURITY INVOKER: the writer's RLS applies (the rows in the transition tables are the
-- writer's tenant's; the update reaches that tenant's chunks only).
create or replace function kb.guard_reviews_apply()
returns trigger
language plpgsql
security invoker
set search_path = pg_catalog, kb, pg_temp
as $$
begin
  if tg_op = 'INSERT' then
    update kb.chunks c set injection_review = n.decision
    from new_rows n
    where c.tenant_id = n.tenant_id and c.content_hash = n.content_hash
      and c.injection_review is distinct from n.decision;
  elsif tg_op = 'UPDATE' then
    -- (the key may change in an update: the old hash loses its review, the new one gains it)
    update kb.chunks c set injection_review = null
    from (select o.tenant_id, o.content_hash from old_rows o
          union select n.tenant_id, n.content_hash from new_rows n) k
    where c.tenant_id = k.tenant_id and c.content_hash = k.content_hash
      and c.injection_review is distinct from (select r.decision from kb.guard_reviews r
                                               where r.tenant_id = c.tenant_id and r.content_hash = c.content_hash);
  else
    update kb.chunks c set injection_review = null
    from old_rows o
    where c.tenant_id = o.tenant_id and c.content_hash = o.content_hash and c.injection_review is not null;
  end if;
  return null;
end
$$;
revoke all on function kb.guard_reviews_apply() from public;

drop trigger if exists guard_reviews_apply_insert on kb.guard_reviews;
drop trigger if exists guard_reviews_apply_update on kb.guard_reviews;
drop trigger if exists guard_reviews_apply_delete on kb.guard_reviews;
create trigger guard_reviews_apply_insert after insert on kb.guard_reviews
  referencing new table as new_rows
  for each statement execute function kb.guard_reviews_apply();
create trigger guard_reviews_apply_update after update on kb.guard_reviews
  referencing old table as old_rows new table as new_rows
  for each statement execute function kb.guard_reviews_apply();
create trigger guard_reviews_apply_delete after delete on kb.guard_reviews
  referencing old table as old_rows
  for each statement execute function kb.guard_reviews_apply();
