-- BM25 statistics and term blocks: readable by their tenant, written only by the
-- triggers and kb.refresh_term_blocks (owned by kb_stats).
alter table kb.term_stats enable row level security;
alter table kb.term_stats force row level security;
alter table kb.corpus_stats enable row level security;
alter table kb.corpus_stats force row level security;
alter table kb.term_language_stats enable row level security;
alter table kb.term_language_stats force row level security;
alter table kb.corpus_language_stats enable row level security;
alter table kb.corpus_language_stats force row level security;
alter table kb.term_blocks enable row level security;
alter table kb.term_blocks force row level security;

drop policy if exists "Term statistics are visible to their tenant" on kb.term_stats;
create policy "Term statistics are visible to their tenant" on kb.term_stats
  for select using (tenant_id = (select kb.current_tenant()));
drop policy if exists "Corpus statistics are visible to their tenant" on kb.corpus_stats;
create policy "Corpus statistics are visible to their tenant" on kb.corpus_stats
  for select using (tenant_id = (select kb.current_tenant()));

drop policy if exists "Term statistics per language are visible to their tenant" on kb.term_language_stats;
create policy "Term statistics per language are visible to their tenant" on kb.term_language_stats
  for select using (tenant_id = (select kb.current_tenant()));
drop policy if exists "Corpus statistics per language are visible to their tenant" on kb.corpus_language_stats;
create policy "Corpus statistics per language are visible to their tenant" on kb.corpus_language_stats
  for select using (tenant_id = (select kb.current_tenant()));

drop policy if exists "Term blocks are visible to their tenant" on kb.term_blocks;
create policy "Term blocks are visible to their tenant" on kb.term_blocks
  for select using (tenant_id = (select kb.current_tenant()));

grant select on kb.term_stats, kb.corpus_stats, kb.term_language_stats, kb.corpus_language_stats, kb.term_blocks to {{app_role}};
-- kb_search (search functions) reads them; kb_stats (statistics triggers and
-- kb.refresh_term_blocks) writes them, and reads the chunks they are derived from.
revoke all on kb.term_stats, kb.corpus_stats, kb.term_language_stats, kb.corpus_language_stats, kb.term_blocks from kb_search;
grant select on kb.term_stats, kb.corpus_stats, kb.term_language_stats, kb.corpus_language_stats, kb.term_blocks to kb_search;
grant select, insert, update, delete on kb.term_stats, kb.corpus_stats, kb.term_language_stats, kb.corpus_language_stats, kb.term_blocks to kb_stats;
grant select on kb.chunks to kb_stats;
