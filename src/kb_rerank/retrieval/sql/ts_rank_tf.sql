-- kb.ts_rank_tf(): term frequencies read from ts_rank, for BM25 without unnesting tsvectors.
--
-- BM25 needs tf, the number of positions of a query lexeme in a chunk. The only SQL access
-- to positions is unnest(tsvector), which turns every candidate into rows to join and
-- aggregate (~5 us per candidate, most of kb.search_lexical's time on common words).
-- ts_rank reads one lexeme in C: with all four weights 1 and no normalisation, the rank of
-- a one-lexeme query is sum(1 / j^2, j = 1..tf) / 1.64493406685 (calc_rank_or in
-- src/backend/utils/adt/tsrank.c; unchanged since PostgreSQL 8.3), which depends on tf
-- only and grows strictly with it. A lexeme stored without positions counts as one
-- position (tf = 1), and a lexeme keeps at most 256 positions, so tf is 0..256.
--
-- kb.ts_rank_tf_compute() returns that rank for tf = 1..256, computed by ts_rank itself on
-- lexemes with 1..256 positions, so the values are bit for bit those it returns for any
-- chunk. kb.ts_rank_tf() returns the same array as a constant, written when these files are
-- applied (every migration to head). Then
--     tf = width_bucket(ts_rank('{1,1,1,1}', tsv, lexeme query, 0), kb.ts_rank_tf())
-- (0 when the lexeme is absent: its rank 0 is below the first bound). kb.search_lexical
-- checks two entries against ts_rank on each call and computes the array (0.2 ms) when they
-- differ, e.g. after a server upgrade that changed ts_rank but did not re-run the migration.
create or replace function kb.ts_rank_tf_compute()
returns real[]
language sql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select array_agg(ts_rank('{1,1,1,1}',
                           format('x:%s', (select string_agg(p::text, ',') from generate_series(1, n) as p))::tsvector,
                           'x'::tsquery, 0)
                   order by n)
  from generate_series(1, 256) as n
$$;

do $do$
declare
  v real[] := kb.ts_rank_tf_compute();
begin
  -- width_bucket needs strictly increasing bounds
  if exists (select 1 from generate_series(2, 256) as i where not v[i] > v[i - 1]) or not v[1] > 0 then
    raise exception 'ts_rank of 1..256 positions is not strictly increasing: kb.search_lexical cannot read tf from it';
  end if;
  -- float4 text output is exact (shortest round trip) only with extra_float_digits > 0
  perform set_config('extra_float_digits', '1', true);
  execute format($f$
    create or replace function kb.ts_rank_tf()
    returns real[]
    language sql
    immutable
    parallel safe
    security invoker
    set search_path = pg_catalog, pg_temp
    as %L
  $f$, format('select %L::real[]', v::text));
  if kb.ts_rank_tf() is distinct from v then
    raise exception 'kb.ts_rank_tf() does not return the ranks it was written with';
  end if;
end
$do$;
comment on function kb.ts_rank_tf() is
  'ts_rank(''{1,1,1,1}'', lexeme with n positions, lexeme, 0) for n = 1..256: tf = width_bucket(rank, this)';
comment on function kb.ts_rank_tf_compute() is 'kb.ts_rank_tf() computed now, by ts_rank';
