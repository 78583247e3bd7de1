-- kb.metadata_values(metadata): the numbers and dates of a document's metadata, one row per
-- value (a list: one per element), as kb.document_values holds them for the search filter's
-- ranges: a JSON number as a double; a string written as the filter's dates are
-- ({{filter_iso_date}}; no offset: UTC) as that instant; anything else (other strings,
-- booleans, a number beyond a double, an impossible date) gives no row, so it never
-- matches a range, as it did not when ranges were jsonpath.
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
          and v_val #>> '{}' ~ {{filter_iso_date}} then
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

comment on function kb.metadata_values(jsonb) is
  'The numbers and dates of a document''s metadata, one row per value, for the search filter''s ranges';

-- kb.documents_typed_values(): the trigger that keeps kb.document_values equal to
-- kb.metadata_values(metadata) for each document written. SECURITY INVOKER: the writer's
-- RLS applies, and a tenant writes only its own documents.
create or replace function kb.documents_typed_values()
returns trigger
language plpgsql
security invoker
set search_path = pg_catalog, kb, pg_temp
as $fn$
begin
  if tg_op = 'UPDATE' then
    delete from kb.document_values v where v.tenant_id = new.tenant_id and v.doc_id = new.doc_id;
  end if;
  insert into kb.document_values (tenant_id, doc_id, key, num, ts)
  select new.tenant_id, new.doc_id, m.key, m.num, m.ts from kb.metadata_values(new.metadata) as m;
  return null;
end
$fn$;

drop trigger if exists documents_typed_values on kb.documents;
create trigger documents_typed_values
  after insert or update of metadata on kb.documents
  for each row
  execute function kb.documents_typed_values();
