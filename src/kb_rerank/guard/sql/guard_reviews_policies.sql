-- kb.guard_reviews: a person's allow / block of a chunk's text (migration 0018_guard_review),
-- RLS enabled and forced (the owner is subject to it too). Policies compare with
-- (select kb.current_tenant()), evaluated once per statement; with no tenant set it is NULL
-- and nothing matches (fail closed). The app (`kb-rerank guard allow` / `block`) may read,
-- record and change its own tenant's reviews; it never deletes one (no DELETE grant or
-- policy): a review outlives the document it was made on, so that the same text ingested
-- again is still reviewed.
alter table kb.guard_reviews enable row level security;
alter table kb.guard_reviews force row level security;

drop policy if exists "Guard reviews are visible to their tenant" on kb.guard_reviews;
drop policy if exists "Guard reviews are recorded by their tenant" on kb.guard_reviews;
drop policy if exists "Guard reviews are changed by their tenant" on kb.guard_reviews;
create policy "Guard reviews are visible to their tenant" on kb.guard_reviews
  for select using (tenant_id = (select kb.current_tenant()));
create policy "Guard reviews are recorded by their tenant" on kb.guard_reviews
  for insert with check (tenant_id = (select kb.current_tenant()));
create policy "Guard reviews are changed by their tenant" on kb.guard_reviews
  for update using (tenant_id = (select kb.current_tenant()))
  with check (tenant_id = (select kb.current_tenant()));

revoke all on kb.guard_reviews from public, {{app_role}};
grant select, insert, update on kb.guard_reviews to {{app_role}};
