-- kb.search_filter_docs(filter): the documents of the caller's tenant that match `filter`
-- (kb.search_filter's grammar), as doc ids; NULL when there is no filter. The list
-- functions (kb.search_lexical_ids, kb.search_semantic_ids) read it once per call and keep
-- only chunks of these documents, inside their candidate lists, before any fusion.
--
-- Tenant: every row read is the tenant's (tenant_id = kb.current_tenant(), and RLS when the
-- caller is the app role; the definer searches that call it read as kb_search, which the
-- explicit tenant condition confines). No filter value can name another tenant's rows: the
-- fields are the document's own columns and metadata, compared with values.
--
-- The predicates are built from the canonical filter only (checked by kb.search_filter):
--   source_path, language, title   = any (text[])
--   updated_at                     = any (timestamptz[]) or a range on the column
--   a metadata field               a jsonpath predicate on kb.documents.metadata, with each
--                                  key and value written as a JSON literal (to_jsonb()::text,
--                                  a jsonpath string or number literal): equality and $in
--                                  as `$."f" == v || ...` (lax mode: a list matches when it
--                                  holds v), served by the (tenant_id, metadata
--                                  jsonb_path_ops) GIN index through @@; a range as
--                                  `exists($."f"[*] ? (@ >= a && @ < b))`, one element within
--                                  both bounds (a date compared by .datetime(), which needs
--                                  jsonb_path_match_tz for a date against a time: hence
--                                  timezone = UTC here; a value that is no date never matches)
-- The statement is a constant text run with EXECUTE ... USING, so each call is planned with
-- its values (a predicate whose parameter is NULL folds away and the GIN index is chosen
-- when it is selective); no filter text enters SQL.
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
  v_field text;
  v_cond jsonb;
  v_eq text[] := '{}';
  v_range text[] := '{}';
  v_key text;
  v_docs uuid[];
begin
  if v_f is null then
    return null;
  end if;
  for v_field, v_cond in select e.key, e.value from jsonb_each(v_f) as e order by e.key loop
    continue when v_field in ('source_path', 'language', 'title', 'updated_at');
    v_key := '$.' || to_jsonb(v_field)::text;
    if v_cond ? '$in' then
      v_eq := v_eq || ('(' || (select string_agg(v_key || ' == ' || x::text, ' || ')
                               from jsonb_array_elements(v_cond -> '$in') as x) || ')');
    else
      v_range := v_range || ('exists(' || v_key || '[*] ? (' ||
        (select string_agg(case when jsonb_typeof(b.value) = 'number' then '@ ' || o.sym || ' ' || b.value::text
                                else '@.datetime() ' || o.sym || ' ' || b.value::text || '.datetime()' end, ' && ')
         from jsonb_each(v_cond) as b
         join (values ('$gte', '>='), ('$gt', '>'), ('$lte', '<='), ('$lt', '<')) as o(op, sym) on o.op = b.key)
        || '))');
    end if;
  end loop;
  execute $q$
    select coalesce(array_agg(d.doc_id order by d.doc_id), '{}')
    from kb.documents d
    where d.tenant_id = kb.current_tenant()
      and ($1::jsonpath is null or d.metadata @@ $1::jsonpath)
      and ($2::jsonpath is null or jsonb_path_match_tz(d.metadata, $2::jsonpath, '{}', true))
      and ($3::text[] is null or d.source_uri = any ($3::text[]))
      and ($4::text[] is null or d.language = any ($4::text[]))
      and ($5::text[] is null or d.title = any ($5::text[]))
      and ($6::timestamptz[] is null or d.updated_at = any ($6::timestamptz[]))
      and ($7::timestamptz is null or d.updated_at >= $7::timestamptz)
      and ($8::timestamptz is null or d.updated_at > $8::timestamptz)
      and ($9::timestamptz is null or d.updated_at <= $9::timestamptz)
      and ($10::timestamptz is null or d.updated_at < $10::timestamptz)
  $q$
  into v_docs
  using (case when cardinality(v_eq) > 0 then array_to_string(v_eq, ' && ') end)::jsonpath,
        (case when cardinality(v_range) > 0 then array_to_string(v_range, ' && ') end)::jsonpath,
        (select array_agg(x) from jsonb_array_elements_text(v_f -> 'source_path' -> '$in') as x),
        (select array_agg(x) from jsonb_array_elements_text(v_f -> 'language' -> '$in') as x),
        (select array_agg(x) from jsonb_array_elements_text(v_f -> 'title' -> '$in') as x),
        (select array_agg(x::timestamptz) from jsonb_array_elements_text(v_f -> 'updated_at' -> '$in') as x),
        (v_f -> 'updated_at' ->> '$gte')::timestamptz, (v_f -> 'updated_at' ->> '$gt')::timestamptz,
        (v_f -> 'updated_at' ->> '$lte')::timestamptz, (v_f -> 'updated_at' ->> '$lt')::timestamptz;
  return v_docs;
end
$fn$;
comment on function kb.search_filter_docs(jsonb) is
  'The caller tenant''s documents matching a search filter (kb.search_filter), as doc ids; NULL for no filter';
