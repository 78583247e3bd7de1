-- A search filter as a predicate on one document, in one place for the two ways the
-- filter is applied: kb.search_filter_docs lists the tenant's matching documents, and
-- kb.search_semantic_ids' graph walk checks the document of each chunk it visits (a filter
-- too broad to list first). Both run kb.search_filter_docs_where()'s text with
-- kb.search_filter_docs_args' values as its parameters; no filter text enters SQL.

-- kb.search_filter_docs_is_number(cond), kb.search_filter_docs_num_in(num, cond),
-- kb.search_filter_docs_ts_in(ts, cond): a canonical range {"$gte"|"$gt": a, "$lte"|"$lt": b}
-- is on numbers (else dates), and a kb.document_values number or date lies within it (an
-- absent bound: no limit). SQL functions, inlined: with `cond` a parameter the comparisons
-- stay btree range conditions on (tenant_id, key, num | ts).
create or replace function kb.search_filter_docs_is_number(cond jsonb)
returns boolean
language sql
immutable
parallel safe
security invoker
return jsonb_typeof(coalesce(cond -> '$gte', cond -> '$gt', cond -> '$lte', cond -> '$lt')) = 'number';

create or replace function kb.search_filter_docs_num_in(num double precision, cond jsonb)
returns boolean
language sql
immutable
parallel safe
security invoker
return num >= coalesce((cond ->> '$gte')::float8, '-infinity') and num > coalesce((cond ->> '$gt')::float8, '-infinity')
   and num <= coalesce((cond ->> '$lte')::float8, 'infinity') and num < coalesce((cond ->> '$lt')::float8, 'infinity');

-- STABLE: a text to timestamptz cast; the canonical filter's dates carry their offset (+00:00)
create or replace function kb.search_filter_docs_ts_in(ts timestamptz, cond jsonb)
returns boolean
language sql
stable
parallel safe
security invoker
return ts >= coalesce((cond ->> '$gte')::timestamptz, '-infinity') and ts > coalesce((cond ->> '$gt')::timestamptz, '-infinity')
   and ts <= coalesce((cond ->> '$lte')::timestamptz, 'infinity') and ts < coalesce((cond ->> '$lt')::timestamptz, 'infinity');

-- kb.search_filter_docs_args(canonical): the parameters of kb.search_filter_docs_where() for a
-- canonical filter (kb.search_filter's output, already checked):
--   jp                              a jsonpath on kb.documents.metadata for the metadata
--                                   fields' equality and $in, each key and value written as a
--                                   JSON literal (to_jsonb()::text, a jsonpath string literal;
--                                   a number as its double's text): `$."f" == v || ...` (lax
--                                   mode: a list matches when it holds v)
--   source_uri, language, title     the columns' values (source_path is source_uri)
--   updated_*, ingested_*           the date columns' values ($in) and bounds
--   ranges                          the metadata fields' ranges, {"f": {"$gte": a, ...}, ...}
create or replace function kb.search_filter_docs_args(canonical jsonb,
  out jp jsonpath, out source_uri text[], out language text[], out title text[],
  out updated_in timestamptz[], out updated_gte timestamptz, out updated_gt timestamptz,
  out updated_lte timestamptz, out updated_lt timestamptz,
  out ingested_in timestamptz[], out ingested_gte timestamptz, out ingested_gt timestamptz,
  out ingested_lte timestamptz, out ingested_lt timestamptz,
  out ranges jsonb)
language plpgsql
stable
parallel safe
security invoker
set search_path = pg_catalog, kb, pg_temp
set timezone = 'UTC'
as $fn$
declare
  v_field text;
  v_cond jsonb;
  v_eq text[] := '{}';
  v_key text;
begin
  for v_field, v_cond in select e.key, e.value from jsonb_each(canonical) as e order by e.key loop
    continue when v_field in ('source_path', 'language', 'title', 'updated_at', 'ingested_at');
    if v_cond ? '$in' then
      v_key := '$.' || to_jsonb(v_field)::text;
      v_eq := v_eq || ('(' || (select string_agg(v_key || ' == ' || case when jsonb_typeof(x) = 'number' then x::numeric::float8::text
                                                                   else x::text end, ' || ')
                               from jsonb_array_elements(v_cond -> '$in') as x) || ')');
    else
      ranges := coalesce(ranges, '{}') || jsonb_build_object(v_field, v_cond);
    end if;
  end loop;
  jp := (case when cardinality(v_eq) > 0 then array_to_string(v_eq, ' && ') end)::jsonpath;
  source_uri := (select array_agg(x) from jsonb_array_elements_text(canonical -> 'source_path' -> '$in') as x);
  language := (select array_agg(x) from jsonb_array_elements_text(canonical -> 'language' -> '$in') as x);
  title := (select array_agg(x) from jsonb_array_elements_text(canonical -> 'title' -> '$in') as x);
  updated_in := (select array_agg(x::timestamptz) from jsonb_array_elements_text(canonical -> 'updated_at' -> '$in') as x);
  updated_gte := (canonical -> 'updated_at' ->> '$gte')::timestamptz;
  updated_gt := (canonical -> 'updated_at' ->> '$gt')::timestamptz;
  updated_lte := (canonical -> 'updated_at' ->> '$lte')::timestamptz;
  updated_lt := (canonical -> 'updated_at' ->> '$lt')::timestamptz;
  ingested_in := (select array_agg(x::timestamptz) from jsonb_array_elements_text(canonical -> 'ingested_at' -> '$in') as x);
  ingested_gte := (canonical -> 'ingested_at' ->> '$gte')::timestamptz;
  ingested_gt := (canonical -> 'ingested_at' ->> '$gt')::timestamptz;
  ingested_lte := (canonical -> 'ingested_at' ->> '$lte')::timestamptz;
  ingested_lt := (canonical -> 'ingested_at' ->> '$lt')::timestamptz;
end
$fn$;
comment on function kb.search_filter_docs_args(jsonb) is
  'The parameters of kb.search_filter_docs_where() for a canonical search filter';

-- kb.search_filter_docs_where(): the filter's predicate on one document row `d`
-- (kb.documents), a constant text with its parameters at fixed places (a statement running
-- it puts its own after $17):
--   $1 jsonp, $3 source_uri, $4 language, $5 title, $6-$10 updated_at ($in, bounds),
--   $11-$15 ingested_at, from kb.search_filter_docs_args; $16 the tenant (a value: see
--   kb.search_filter_docs);
--   $2 uuid[]: the documents of the metadata ranges, listed beforehand (by the btree range
--   scans of kb.search_filter_docs), or NULL;
--   $17 jsonb: the metadata ranges (kb.search_filter_docs_args' ranges) checked on this
--   document's kb.document_values rows (its primary key: (tenant_id, doc_id)), or NULL.
-- A parameter that is NULL folds away when the statement is planned with its values.
create or replace function kb.search_filter_docs_where()
returns text
language sql
immutable
parallel safe
security invoker
return $w$
      ($1::jsonpath is null or d.metadata @@ $1::jsonpath)
      and ($2::uuid[] is null or d.doc_id = any ($2::uuid[]))
      and ($3::text[] is null or d.source_uri = any ($3::text[]))
      and ($4::text[] is null or d.language = any ($4::text[]))
      and ($5::text[] is null or d.title = any ($5::text[]))
      and ($6::timestamptz[] is null or d.updated_at = any ($6::timestamptz[]))
      and d.updated_at >= coalesce($7::timestamptz, '-infinity') and d.updated_at > coalesce($8::timestamptz, '-infinity')
      and d.updated_at <= coalesce($9::timestamptz, 'infinity') and d.updated_at < coalesce($10::timestamptz, 'infinity')
      and ($11::timestamptz[] is null or d.ingested_at = any ($11::timestamptz[]))
      and d.ingested_at >= coalesce($12::timestamptz, '-infinity') and d.ingested_at > coalesce($13::timestamptz, '-infinity')
      and d.ingested_at <= coalesce($14::timestamptz, 'infinity') and d.ingested_at < coalesce($15::timestamptz, 'infinity')
      and ($17::jsonb is null or not exists (
        select 1 from jsonb_each($17::jsonb) as r (key, cond)
        where not exists (
          select 1 from kb.document_values v
          where v.tenant_id = $16 and v.doc_id = d.doc_id and v.key = r.key
            and case when kb.search_filter_docs_is_number(r.cond) then kb.search_filter_docs_num_in(v.num, r.cond)
                     else kb.search_filter_docs_ts_in(v.ts, r.cond) end)))
$w$;
comment on function kb.search_filter_docs_where() is
  'A search filter''s predicate on a document row d, parameters from kb.search_filter_docs_args';

-- kb.search_filter_docs(filter): the documents of the caller's tenant that match `filter`
-- (kb.search_filter's grammar), as doc ids; NULL when there is no filter. The list
-- functions (kb.search_lexical_ids, kb.search_semantic_ids) read it once per call and keep
-- only chunks of these documents, inside their candidate lists, before any fusion.
--
-- Tenant: every row read is the tenant's (tenant_id = kb.current_tenant(), read once, and RLS when the
-- caller is the app role; the definer searches that call it read as kb_search, which the
-- explicit tenant condition confines). No filter value can name another tenant's rows: the
-- fields are the document's own columns and metadata, compared with values.
--
-- The predicates are built from the canonical filter only (checked by kb.search_filter), by
-- kb.search_filter_docs_args and kb.search_filter_docs_where (above):
--   source_path, language, title   = any (text[])
--   updated_at, ingested_at        = any (timestamptz[]) or a range on the column
--   a metadata field, equality     a jsonpath predicate on kb.documents.metadata, with each
--   and $in                        key and value written as a JSON literal (to_jsonb()::text,
--                                  a jsonpath string literal; a number as its double's text): `$."f" == v || ...`
--                                  (lax mode: a list matches when it holds v), served by the
--                                  (tenant_id, metadata jsonb_path_ops) GIN index through @@
--   a metadata field, a range      the documents with one value of the key within both
--                                  bounds in kb.document_values (a btree range scan on
--                                  (tenant_id, key, num | ts): kb.metadata_values says which
--                                  values are numbers and dates); the ranges' documents are
--                                  intersected, then kept as `doc_id = any (...)`
-- The statement is a constant text (the predicate kb.search_filter_docs_where()) run with
-- EXECUTE ... USING, so each call is planned with
-- its values (a predicate whose parameter is NULL folds away and the GIN index is chosen
-- when it is selective); no filter text enters SQL. The tenant is read once, into v_tenant,
-- and passed as a value: kb.current_tenant() written in a condition is inlined (a CASE on
-- pg_has_role) and evaluated again for each row a recheck or filter visits, which cost
-- about 10 ms at 20,000 documents.
create or replace function kb.search_filter_docs(filter jsonb)
returns uuid[]
language plpgsql
stable
parallel safe
security invoker
set search_path = pg_catalog, kb, pg_temp
set timezone = 'UTC'
as $fn$
declare
  v_f jsonb := kb.search_filter(filter);
  v_tenant uuid := kb.current_tenant();
  v_a record;
  v_field text;
  v_cond jsonb;
  v_these uuid[];
  v_ranged uuid[];
  v_docs uuid[];
begin
  if v_f is null then
    return null;
  end if;
  select * into v_a from kb.search_filter_docs_args(v_f);
  for v_field, v_cond in select e.key, e.value from jsonb_each(v_a.ranges) as e order by e.key loop
    if kb.search_filter_docs_is_number(v_cond) then
      select coalesce(array_agg(distinct v.doc_id), '{}') into v_these
      from kb.document_values v
      where v.tenant_id = v_tenant and v.key = v_field and v.num is not null
        and kb.search_filter_docs_num_in(v.num, v_cond);
    else
      select coalesce(array_agg(distinct v.doc_id), '{}') into v_these
      from kb.document_values v
      where v.tenant_id = v_tenant and v.key = v_field and v.ts is not null
        and kb.search_filter_docs_ts_in(v.ts, v_cond);
    end if;
    v_ranged := case when v_ranged is null then v_these
                     else array(select unnest(v_ranged) intersect select unnest(v_these)) end;
    if v_ranged = '{}' then
      return '{}';  -- a range no document meets: nothing else to read
    end if;
  end loop;
  execute format($q$
    select coalesce(array_agg(d.doc_id order by d.doc_id), '{}')
    from kb.documents d
    where d.tenant_id = $16 and %s
  $q$, kb.search_filter_docs_where())
  into v_docs
  using v_a.jp, v_ranged, v_a.source_uri, v_a.language, v_a.title,
        v_a.updated_in, v_a.updated_gte, v_a.updated_gt, v_a.updated_lte, v_a.updated_lt,
        v_a.ingested_in, v_a.ingested_gte, v_a.ingested_gt, v_a.ingested_lte, v_a.ingested_lt,
        v_tenant, null::jsonb;
  return v_docs;
end
$fn$;
comment on function kb.search_filter_docs(jsonb) is
  'The caller tenant''s documents matching a search filter (kb.search_filter), as doc ids; NULL for no filter';
