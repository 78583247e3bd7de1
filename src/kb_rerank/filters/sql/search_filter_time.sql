-- kb.search_filter_time(value, field): a filter's date or time (ISO 8601:
-- yyyy-mm-dd[Thh:mm[:ss[.ffffff]][Z|+hh:mm]], a space for the T allowed) written as UTC,
-- 'yyyy-mm-ddThh:mm:ss.ffffff+00:00' (the form jsonpath's .datetime() reads, and one text
-- for one instant, so that the canonical filter is one key); no offset means UTC. Anything
-- else (PostgreSQL's other date inputs too: 'now', 'Jan 1', a 13th month) raises 22023
-- naming `field`, and so does an instant outside years 1 to 9999 in UTC. The pattern is
-- kb_rerank/filters/grammar.py's ISO_DATE.
create or replace function kb.search_filter_time(value text, field text)
returns text
language plpgsql
stable
parallel safe
security invoker
set search_path = pg_catalog, kb, pg_temp
as $fn$
declare
  v_ts timestamptz;
begin
  if value !~ {{filter_iso_date}} then
    raise exception '%: not an ISO 8601 date or time: %', field, left(value, 64) using errcode = '22023', column = field;
  end if;
  begin
    if value ~ '(Z|[+-]\d{2}:?\d{2})$' then
      v_ts := value::timestamptz;
    else
      v_ts := value::timestamp at time zone 'UTC';
    end if;
  exception when others then
    v_ts := null;
  end;
  if v_ts is null or v_ts < '0001-01-01T00:00:00Z' or v_ts >= '10000-01-01T00:00:00Z' then
    raise exception '%: not a valid date or time between years 1 and 9999 in UTC: %', field, left(value, 64)
      using errcode = '22023', column = field;
  end if;
  return to_char(v_ts at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US') || '+00:00';
end
$fn$;
comment on function kb.search_filter_time(text, text) is
  'A search filter''s ISO 8601 date or time as UTC text (yyyy-mm-ddThh:mm:ss.ffffff+00:00); 22023 naming the field otherwise';
