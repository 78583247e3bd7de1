-- The values of a search filter as kb.search_filter writes them, each raising 22023 naming
-- `field` when refused. The limits and patterns are kb_rerank/filters/grammar.py's
-- constants, filled in when the layer is rendered (kb_rerank.db.layer.render).

-- kb.search_filter_number(value, field): a JSON number read as a double: finite, at most
-- {{filter_max_number}} in magnitude (compared as numeric, before any text is made of it),
-- an integer written with at most {{filter_max_digits}} significant digits; a decimal under
-- 1e-330 in magnitude reads as 0, as a JSON decoder reads it.
create or replace function kb.search_filter_number(value jsonb, field text)
returns jsonb
language plpgsql
immutable
parallel safe
security invoker
set search_path = pg_catalog, kb, pg_temp
as $fn$
declare
  v_n numeric := value::numeric;
begin
  if abs(v_n) > {{filter_max_number}} then
    raise exception '%: a number is finite and at most {{filter_max_number}} in magnitude', field
      using errcode = '22023', column = field;
  end if;
  if scale(v_n) = 0 and length(trim(both '0' from abs(v_n)::text)) > {{filter_max_digits}} then
    raise exception '%: a number has at most {{filter_max_digits}} significant digits', field
      using errcode = '22023', column = field;
  end if;
  return to_jsonb(round(v_n, 330)::float8);
end
$fn$;
comment on function kb.search_filter_number(jsonb, text) is
  'A search filter''s number as a bounded double; 22023 naming the field otherwise';

-- kb.search_filter_language(value, field): a language as kb.documents.language holds it,
-- normalised as ingestion normalises a front-matter language (kb_rerank/core/language.py:
-- 'JA', 'ja-JP', 'jpn', 'Japanese' -> 'ja', its table rendered here); a well-formed tag not
-- in it by its primary subtag, lower-cased; anything else raises 22023.
create or replace function kb.search_filter_language(value text, field text)
returns text
language plpgsql
immutable
parallel safe
security invoker
set search_path = pg_catalog, kb, pg_temp
as $fn$
declare
  v_aliases constant jsonb := {{filter_language_aliases}};
  v_low text := lower(regexp_replace(value, '^\s+|\s+$', '', 'g'));
  v_tag text := replace(v_low, '_', '-');
begin
  if length(v_low) <= 35 then
    if v_aliases ? v_low then
      return v_aliases ->> v_low;
    end if;
    if v_tag ~ {{filter_language_tag}} then
      return coalesce(v_aliases ->> split_part(v_tag, '-', 1), split_part(v_tag, '-', 1));
    end if;
  end if;
  raise exception '%: not a language code: % (%)', field, left(value, 64), {{filter_language_accepted}}
    using errcode = '22023', column = field;
end
$fn$;
comment on function kb.search_filter_language(text, text) is
  'A search filter''s language code normalised as ingestion normalises it; 22023 naming the field otherwise';
