-- BM25 statistics: readable by their tenant, written only by the stats trigger
-- (kb.apply_stats_delta, owned by kb_search).
alter table kb.term_stats enable row level security;
alter table kb.term_stats force row level security;
alter table kb.corpus_stats enable row level security;
alter table kb.corpus_stats force row level security;

drop policy if exists "Term statistics are visible to their tenant" on kb.term_stats;
create policy "Term statistics are visible to their tenant" on kb.term_stats
  for select using (tenant_id = (select kb.current_tenant()));
drop policy if exists "Corpus statistics are visible to their tenant" on kb.corpus_stats;
create policy "Corpus statistics are visible to their tenant" on kb.corpus_stats
  for select using (tenant_id = (select kb.current_tenant()));

grant select on kb.term_stats, kb.corpus_stats to cyberos_app;
grant select, insert, update, delete on kb.term_stats, kb.corpus_stats to kb_search;
