-- kb.search_filter(filter): a search filter checked against the grammar and written in its
-- canonical form, or NULL for no filter (NULL, JSON null or {}). docs/filters.md is the
-- grammar; kb_rerank/filters/grammar.py checks the same grammar for the REST API (a 422
-- naming the field), and its constants are the limits and patterns here (its
-- placeholders, filled when the layer is rendered); tests/filters/test_filter_parity.py runs one table of filters
-- through both.
--
-- A filter is a JSON object of at most {{filter_max_fields}} fields, all of which must match (AND):
--   "f": v                       equality (v a string of at most {{filter_max_string}} characters,
--                                a number (kb.search_filter_number) or a boolean); a list
--                                value of the document matches when it holds v
--   "f": {"$eq": v}              the same
--   "f": {"$in": [v, ...]}       any of 1..{{filter_max_in}} such values
--   "f": {"$gte"|"$gt": a, "$lte"|"$lt": b}   a range, one or two bounds, both numbers or
--                                both ISO 8601 dates / times (yyyy-mm-dd[Thh:mm[:ss[.ffffff]][Z|+hh:mm]],
--                                no offset: UTC)
-- Fields: a front-matter key (kb.documents.metadata) or one of the document's columns:
-- source_path (source_uri), language (normalised: kb.search_filter_language), title
-- (strings: equality and $in), updated_at (the document's own date) and ingested_at (dates:
-- a range, equality or $in). Field names match {{filter_field_name}}.
--
-- Canonical form: {"f": {"$in": [v, ...]}} for equality and $in, {"f": {"$gte": a, "$lt": b}}
-- for a range (one lower and one upper bound at most), every date written as UTC
-- ('2024-05-01T00:00:00.000000+00:00'), so that kb.search_filter_docs builds its predicates
-- from checked values only. A bad filter raises SQLSTATE 22023 (invalid_parameter_value)
-- with the offending field's path ('filter.product', 'filter.updated_at.$gte') as the
-- message's first word and as the error's COLUMN field.
--
-- IMMUTABLE in effect (the result depends on the argument only: dates are read with their
-- own offset or as UTC), declared STABLE because it casts text to timestamptz.
create or replace function kb.search_filter(filter jsonb)
returns jsonb
language plpgsql
stable
parallel safe
security invoker
set search_path = pg_catalog, kb, pg_temp
as $fn$
declare
  v_out jsonb := '{}';
  v_field text;
  v_cond jsonb;
  v_path text;
  v_op text;
  v_vals jsonb;
  v_val jsonb;
  v_canon jsonb;
  v_kind text;
  v_this text;
begin
  if filter is null or filter = 'null'::jsonb or filter = '{}'::jsonb then
    return null;
  end if;
  if jsonb_typeof(filter) <> 'object' then
    raise exception 'filter: a filter is a JSON object of fields, got %', jsonb_typeof(filter)
      using errcode = '22023', column = 'filter';
  end if;
  if (select count(*) from jsonb_object_keys(filter)) > {{filter_max_fields}} then
    raise exception 'filter: at most {{filter_max_fields}} fields' using errcode = '22023', column = 'filter';
  end if;
  for v_field, v_cond in select e.key, e.value from jsonb_each(filter) as e order by e.key collate "C" loop
    if left(v_field, 1) = '$' then
      raise exception '%: % is not supported: a filter is fields that all must match; for alternatives of one field use {"field": {"$in": [...]}}',
        'filter.' || left(v_field, 40), left(v_field, 40) using errcode = '22023', column = 'filter.' || left(v_field, 40);
    end if;
    if v_field !~ {{filter_field_name}} then
      raise exception 'filter: %, got %', {{filter_field_rule}}, left(v_field, 80)
        using errcode = '22023', column = 'filter';
    end if;
    v_path := 'filter.' || v_field;
    -- bare value = {"$eq": value}
    if jsonb_typeof(v_cond) <> 'object' then
      v_cond := jsonb_build_object('$eq', v_cond);
    end if;
    if v_cond = '{}'::jsonb then
      raise exception '%: an empty condition', v_path using errcode = '22023', column = v_path;
    end if;
    for v_op in select k from jsonb_object_keys(v_cond) as k order by k collate "C" loop
      if left(v_op, 1) <> '$' then
        raise exception '%: a condition is a value or an object of operators (%); nested fields are not supported',
          v_path || '.' || left(v_op, 40), {{filter_operators}} using errcode = '22023', column = v_path || '.' || left(v_op, 40);
      end if;
      if v_op not in ('$eq', '$in', '$gte', '$gt', '$lte', '$lt') then
        raise exception '%: unknown operator %; allowed: %', v_path || '.' || left(v_op, 40),
          left(v_op, 40), {{filter_operators}} using errcode = '22023', column = v_path || '.' || left(v_op, 40);
      end if;
    end loop;
    if v_cond ? '$eq' or v_cond ? '$in' then
      if (select count(*) from jsonb_object_keys(v_cond)) > 1 then
        raise exception '%: $eq and $in stand alone', v_path using errcode = '22023', column = v_path;
      end if;
      if v_cond ? '$in' then
        v_path := v_path || '.$in';
        v_vals := v_cond -> '$in';
        if jsonb_typeof(v_vals) <> 'array' or jsonb_array_length(v_vals) not between 1 and {{filter_max_in}} then
          raise exception '%: a list of 1 to {{filter_max_in}} values', v_path using errcode = '22023', column = v_path;
        end if;
      else
        v_vals := jsonb_build_array(v_cond -> '$eq');
      end if;
      v_canon := '[]';
      for v_val in select x from jsonb_array_elements(v_vals) as x loop
        if jsonb_typeof(v_val) not in ('string', 'number', 'boolean') then
          raise exception '%: a value is a string, a number or a boolean, got %', v_path, jsonb_typeof(v_val)
            using errcode = '22023', column = v_path;
        end if;
        if jsonb_typeof(v_val) = 'string' and length(v_val #>> '{}') > {{filter_max_string}} then
          raise exception '%: a string of at most {{filter_max_string}} characters', v_path using errcode = '22023', column = v_path;
        end if;
        if v_field in ('source_path', 'language', 'title', 'updated_at', 'ingested_at') and jsonb_typeof(v_val) <> 'string' then
          raise exception '%: % takes strings', v_path, v_field using errcode = '22023', column = v_path;
        end if;
        if v_field in ('updated_at', 'ingested_at') then
          v_val := to_jsonb(kb.search_filter_time(v_val #>> '{}', v_path));
        elsif v_field = 'language' then
          v_val := to_jsonb(kb.search_filter_language(v_val #>> '{}', v_path));
        elsif jsonb_typeof(v_val) = 'number' then
          v_val := kb.search_filter_number(v_val, v_path);
        end if;
        v_canon := v_canon || jsonb_build_array(v_val);
      end loop;
      v_out := v_out || jsonb_build_object(v_field, jsonb_build_object('$in', v_canon));
      continue;
    end if;
    -- a range
    if v_field in ('source_path', 'language', 'title') then
      raise exception '%: % takes equality or $in, not a range', v_path, v_field using errcode = '22023', column = v_path;
    end if;
    if v_cond ? '$gte' and v_cond ? '$gt' or v_cond ? '$lte' and v_cond ? '$lt' then
      raise exception '%: one lower bound ($gte or $gt) and one upper bound ($lte or $lt) at most', v_path
        using errcode = '22023', column = v_path;
    end if;
    v_kind := null;
    v_canon := '{}';
    for v_op, v_val in select e.key, e.value from jsonb_each(v_cond) as e order by e.key collate "C" loop
      if jsonb_typeof(v_val) = 'number' and v_field not in ('updated_at', 'ingested_at') then
        v_this := 'number';
        v_val := kb.search_filter_number(v_val, v_path || '.' || v_op);
      elsif jsonb_typeof(v_val) = 'string' and length(v_val #>> '{}') <= {{filter_max_string}} then
        v_this := 'time';
        v_val := to_jsonb(kb.search_filter_time(v_val #>> '{}', v_path || '.' || v_op));
      else
        raise exception '%: a bound is %', v_path || '.' || v_op,
          case when v_field in ('updated_at', 'ingested_at') then 'an ISO 8601 date or time' else 'a number or an ISO 8601 date or time' end
          using errcode = '22023', column = v_path || '.' || v_op;
      end if;
      if v_kind is not null and v_kind <> v_this then
        raise exception '%: both bounds are numbers or both are dates', v_path using errcode = '22023', column = v_path;
      end if;
      v_kind := v_this;
      v_canon := v_canon || jsonb_build_object(v_op, v_val);
    end loop;
    v_out := v_out || jsonb_build_object(v_field, v_canon);
  end loop;
  return v_out;
end
$fn$;
comment on function kb.search_filter(jsonb) is
  'A search filter checked against its grammar (docs/filters.md) in canonical form; NULL for none; 22023 naming the field';
