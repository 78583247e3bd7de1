-- 0026: the search filter's dates and numbers in typed, indexed rows, and a document's own
-- date apart from its ingestion time.
--
-- kb.documents.ingested_at: when ingestion last wrote the document (what updated_at was so
-- far); updated_at becomes the document's own date (front matter `updated_at` or `date`,
-- else the ingestion time), written by ingestion. Existing rows: ingested_at = updated_at.
alter table kb.documents add column ingested_at timestamptz;
update kb.documents set ingested_at = updated_at;
alter table kb.documents alter column ingested_at set default now();
alter table kb.documents alter column ingested_at set not null;

-- kb.document_values: one row per number or date in a document's metadata (a list gives
-- one row per element), so that a range in the filter is a btree range scan on
-- (tenant_id, key, value) instead of a jsonpath over every document of the tenant. Written
-- by the trigger on kb.documents (kb.documents_typed_values, in the idempotent layer with
-- kb.metadata_values, which say what counts as a number or a date); RLS as kb.documents.
create table kb.document_values (
  tenant_id uuid not null,
  doc_id    uuid not null,
  key       text not null,
  num       double precision,
  ts        timestamptz,
  value_id  bigint generated always as identity,
  primary key (tenant_id, doc_id, value_id),
  constraint document_values_one_value check ((num is null) <> (ts is null)),
  foreign key (tenant_id, doc_id) references kb.documents (tenant_id, doc_id) on delete cascade
);
create index document_values_ts_idx on kb.document_values (tenant_id, key, ts) include (doc_id) where ts is not null;
create index document_values_num_idx on kb.document_values (tenant_id, key, num) include (doc_id) where num is not null;
alter table kb.document_values enable row level security;
alter table kb.document_values force row level security;

-- A first copy of the layer's kb.metadata_values (sql/functions/09_document_values.sql,
-- which replaces it at the end of the upgrade), for the data step below.
create or replace function kb.metadata_values(metadata jsonb)
returns table (key text, num double precision, ts timestamptz)
language plpgsql
immutable
parallel safe
security invoker
set search_path = pg_catalog, kb, pg_temp
set timezone = 'UTC'
as $fn$
declare
  v_key text;
  v_val jsonb;
begin
  for v_key, v_val in
    select e.key, x.value from jsonb_each(metadata) as e
    cross join lateral jsonb_array_elements(case when jsonb_typeof(e.value) = 'array' then e.value
                                                 else jsonb_build_array(e.value) end) as x
  loop
    key := v_key;
    if jsonb_typeof(v_val) = 'number' then
      begin
        num := v_val::numeric::float8;
        ts := null;
        return next;
      exception when others then
        null;
      end;
    elsif jsonb_typeof(v_val) = 'string'
          and v_val #>> '{}' ~ '^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:?\d{2})?)?$' then
      begin
        num := null;
        if v_val #>> '{}' ~ '(Z|[+-]\d{2}:?\d{2})$' then
          ts := (v_val #>> '{}')::timestamptz;
        else
          ts := (v_val #>> '{}')::timestamp at time zone 'UTC';
        end if;
        return next;
      exception when others then
        null;
      end;
    end if;
  end loop;
end
$fn$;

insert into kb.document_values (tenant_id, doc_id, key, num, ts)
select d.tenant_id, d.doc_id, v.key, v.num, v.ts
from kb.documents d cross join lateral kb.metadata_values(d.metadata) as v
where d.metadata <> '{}'::jsonb;
