-- Downgrade of 0021_language_analysis: the stemmed field in English only again (Snowball
-- English for English, Vietnamese and unknown documents, words kept as they are otherwise),
-- no n-grams, no language lexemes. The idempotent files are not re-applied by a downgrade,
-- so the functions are put back as they were at 0020 (frozen copies below) and the new
-- ones dropped.

-- ---- frozen copies of sql/functions/01_text_analysis.sql as of 0020 ----
-- Text analysis shared by documents and queries, so that both sides tokenise alike.
--
-- kb.code_tokens: runs of letters/digits joined by _ - . / : # (ERR_402, SKU-1234,
-- v2.3.1, api/v2), lower-cased and accent-folded, distinct and sorted; kb.code_token_counts
-- gives each with its number of occurrences. The default parser splits ERR_402 into `err`
-- and `402`; these tokens are kept whole as extra lexemes.
create or replace function kb.code_token_counts(content text)
returns table (token text, n integer)
language sql
immutable
strict
parallel safe
rows 4
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select m[1], count(*)::integer
  from regexp_matches(lower(public.unaccent('public.unaccent'::regdictionary, content)),
                      '([[:alnum:]]+(?:[_./:#-][[:alnum:]]+)+)', 'g') as m
  group by m[1]
$$;

-- The stemmed field (migration 0011), what an English query is searched in, as the
-- `text.english` sub-field of a search engine's multi-field: the document's plain words
-- (letters and digits only: no code tokens, compounds, hosts or emails, which the exact
-- field keeps whole) of two characters or more, without stop words, each stemmed, written
-- with the prefix '~ ' (tilde, space: no parser token holds a space, so it never meets an
-- exact lexeme). Positions are kept (BM25 counts them); the field's own length
-- (kb.chunks.stem_len: its number of positions) normalises it. Stop words are those of
-- PostgreSQL's Snowball English dictionary (english_stem: the Snowball project's list, 179
-- words) and of kb.stop_words_en(); they and single characters are left out as standard
-- English analysers leave them out: they are never searched in this field, and counting
-- them would only make every document look longer. Chosen on the shared collections
-- (docs/quality.md): with Lucene's 33 stop words instead, a bm25s simulation of this
-- analysis gave 0.007-0.024 less nDCG@10 on the three English ones.
--
-- kb.stem_config(language): the dictionary that stems a document's words:
-- pg_catalog.english_stem (Snowball English) for English, for Vietnamese and for an
-- unknown language (NULL; ingestion always guesses one, 'en' unless the text is
-- Vietnamese: kb_rerank.ingest.readers.guess_language); NULL (words kept as they are) for any
-- other language. Vietnamese has no Snowball stemmer, and its syllables typed without
-- diacritics are fixed points of the English one (hoa, nhieu, khong, nguoi, ngay stay;
-- tested), while the English words its pages carry (emails, iPhones) are stemmed like an
-- English query's, so an English query finds them as it finds an English page. A
-- Vietnamese query never reads this field (kb.search_term_counts): Vietnamese search is
-- unchanged.
create or replace function kb.stem_config(language text)
returns regdictionary
language sql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select case when language is null
                or lower(language) ~ '^(en|eng|english|vi|vie|vietnamese)([-_].*)?$'
              then 'pg_catalog.english_stem'::regdictionary end
$$;

-- kb.stem_tsv(content, language): the stemmed field of a text (see above). It is
-- concatenated to kb.to_tsv's lexemes in one tsvector (kb.chunks_derive): the statistics
-- (kb.term_stats), the term blocks (kb.term_blocks) and the pruned search treat
-- '~ connect' as one more term, per tenant. Words with one stem merge their positions (a
-- lexeme keeps at most 256, as to_tsvector does).
create or replace function kb.stem_tsv(content text, language text)
returns tsvector
language sql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select coalesce(string_agg(format('''~ %s'':%s',
                                    replace(replace(s.stem, '\', '\\'), '''', ''''''),
                                    array_to_string(s.pos[1:256], ',')), ' ')::tsvector,
                  ''::tsvector)
  from (select x.stem, array_agg(x.pos order by x.pos) as pos
        from (select case when dict.d is null then u.lexeme
                          else (ts_lexize(dict.d, u.lexeme))[1] end as stem,  -- a stop word: '{}'[1], NULL
                     p.pos
              from (select kb.stem_config(language) as d) as dict
              cross join lateral unnest(to_tsvector('kb.kb_text'::regconfig, coalesce(content, ''))) as u
              cross join lateral unnest(u.positions) as p(pos)
              where u.lexeme ~ '^[[:alnum:]]{2,}$' and u.lexeme <> all (kb.stop_words_en())) as x
        where x.stem is not null
        group by x.stem) as s
$$;

-- The terms kb.search_lexical scores a query with, each with its qtf. For a query that
-- kb.query_stems accepts, the stemmed field: each plain word of kb.query_term_counts of two
-- characters or more that is not a stop word (see kb.stem_config), as its stem (`connections` -> '~ connect';
-- words with one stem add their counts, as repeated clauses do in Lucene), and every term
-- that is not a plain word (code tokens ERR_402, SKU-1234, v2.3.1, hosts, emails) as typed,
-- in the exact field, so identifiers stay exact. Otherwise, or when that leaves nothing
-- ("to be or not to be"): kb.query_term_counts, the exact field, as before 0011.
create or replace function kb.search_term_counts(query text)
returns table (term text, qtf integer)
language sql
immutable
parallel safe
rows 8
security invoker
set search_path = pg_catalog, pg_temp
as $$
  with t as (
    select q.term, q.qtf from kb.query_term_counts(query) as q
  ),
  stemmed as (
    select x.term, sum(x.qtf)::integer as qtf
    from (select case when t.term ~ '^[[:alnum:]]+$'
                      then '~ ' || (ts_lexize('pg_catalog.english_stem'::regdictionary, t.term))[1]
                      else t.term end as term,  -- NULL for a stop word
                 t.qtf
          from t
          where kb.query_stems(query)
            and (t.term !~ '^[[:alnum:]]+$' or (length(t.term) >= 2 and t.term <> all (kb.stop_words_en())))) as x
    where x.term is not null
    group by x.term
  )
  select s.term, s.qtf from stemmed s
  union all
  select t.term, t.qtf from t where not exists (select from stemmed)
$$;

-- ---- frozen copy of kb.chunks_derive (sql/functions/02_chunks_derive.sql) as of 0020 ----
-- BEFORE trigger: derive the lexical columns of a chunk from its document's title, its
-- content and its document's language (kb.documents.title and .language; the trigger on
-- kb.documents below re-derives a document's chunks when either changes).
--
-- The title field (migration 0017): the document's title is analysed with each of its
-- chunks, both fields (exact and stemmed), as a search engine indexes a `title` field
-- beside the body and sums both: a chunk deep in a page rarely names its topic, and the
-- title is the best summary of what the page is about. A chunk that already begins with
-- the title (a page's first chunk, whose heading is the title) so counts its words twice,
-- the usual title boost. The embedding already had the title (ingestion prefixes it to
-- the embedded text); the lexical index had it only where the body repeats it. Measured
-- on the shared collections: docs/quality.md ("Title field").
create or replace function kb.chunks_derive()
returns trigger
language plpgsql
security invoker
set search_path = pg_catalog, kb, pg_temp
as $$
declare
  v_title text;
  v_language text;
  v_text text;
begin
  select d.title, d.language into v_title, v_language
  from kb.documents d
  where d.tenant_id = new.tenant_id and d.doc_id = new.doc_id;
  v_text := case when coalesce(btrim(v_title), '') = '' then new.content
                 else v_title || E'\n' || new.content end;
  -- exact lexemes, then the stemmed field in the document's language (kb.stem_tsv)
  new.tsv := kb.to_tsv(v_text) || kb.stem_tsv(v_text, v_language);
  new.doc_len := kb.doc_length(v_text);
  new.stem_len := kb.stem_length(new.tsv);
  return new;
end
$$;

drop function if exists kb.search_term_counts(text, text[]);
drop function if exists kb.query_languages(text, uuid);
drop function if exists kb.nospace_grams(text);
drop function if exists kb.has_nospace(text);
drop function if exists kb.nospace_class();
drop function if exists kb.language_lexeme(text);
drop function if exists kb.stem_languages();
drop function if exists kb.script_language(text);
drop function if exists kb.language_script(text);
drop function if exists kb.text_script(text);
drop function if exists kb.language_subtag(text);

-- ---- data step ----
-- Every chunk is re-derived by the 0020 analysis. Only chunks whose lexical columns the new analysis changes are
-- rewritten (a chunk of a document with no language, in English words only, stays as it
-- is). The BM25 blocks (kb.term_blocks) of the tenants concerned are dropped first and
-- rebuilt after, with the parameters they were built with (list length, k1 and b as stored;
-- min_df the smallest document frequency among their terms), by a frozen copy of
-- kb.refresh_term_blocks's algorithm inline (the installed function is the layer of the
-- revision the database comes from), as 0017 did; the lengths' totals are summed from the
-- chunks. On a large table this rewrites most chunks and their index entries (HNSW
-- included): see docs/quality.md ("Every language analysed") for its time at 100k chunks;
-- plan a maintenance window.
do $$
declare
  saved jsonb;
  p record;
  v_list integer;
  v_min_df integer;
  v_avglen float8;
  v_stem_avglen float8;
  v_changed uuid[];
  v_tenants uuid[];
begin
  select coalesce(array_agg(c.chunk_id), '{}') into v_changed
  from kb.chunks c
  join kb.documents d on d.tenant_id = c.tenant_id and d.doc_id = c.doc_id
  cross join lateral (select case when coalesce(btrim(d.title), '') = '' then c.content
                                  else d.title || E'\n' || c.content end as t) as x
  where c.tsv is distinct from (kb.to_tsv(x.t) || kb.stem_tsv(x.t, d.language));
  select coalesce(array_agg(distinct c.tenant_id), '{}') into v_tenants
  from kb.chunks c where c.chunk_id = any (v_changed);

  select coalesce(jsonb_agg(x), '[]'::jsonb) into saved
  from (select tt.tenant_id, max(tt.k1) as k1, max(tt.b) as b,
               max(tt.n) filter (where tt.level = 0 and tt.part = 0) as list_length,
               (select min(ts.df) from kb.term_stats ts
                where ts.tenant_id = tt.tenant_id
                  and exists (select from kb.term_blocks t2 where t2.tenant_id = ts.tenant_id and t2.term = ts.term)) as min_df
        from kb.term_blocks tt
        where tt.tenant_id = any (v_tenants)
        group by tt.tenant_id) as x;
  delete from kb.term_blocks tt
  where tt.tenant_id in (select (e ->> 'tenant_id')::uuid from jsonb_array_elements(saved) as e);

  update kb.chunks c set content = c.content where c.chunk_id = any (v_changed);
  update kb.corpus_stats cs
     set n_chunks = s.n, total_len = s.total_len, stem_total_len = s.stem_total_len
    from (select c.tenant_id, count(*) as n, coalesce(sum(c.doc_len), 0) as total_len,
                 coalesce(sum(c.stem_len), 0) as stem_total_len
          from kb.chunks c group by c.tenant_id) as s
   where s.tenant_id = cs.tenant_id and cs.tenant_id = any (v_tenants);

  for p in select * from jsonb_to_recordset(saved)
                   as r(tenant_id uuid, k1 double precision, b double precision, list_length integer, min_df integer)
  loop
    v_list := greatest(coalesce(p.list_length, 1), 1);
    v_min_df := greatest(coalesce(p.min_df, 1), 1);
    select cs.total_len::float8 / nullif(cs.n_chunks, 0), cs.stem_total_len::float8 / nullif(cs.n_chunks, 0)
      into v_avglen, v_stem_avglen
    from kb.corpus_stats cs where cs.tenant_id = p.tenant_id;
    continue when v_avglen is null or not v_avglen > 0;
    with pp as (
      select u.lexeme as term, c.chunk_id, ts.df,
             -- kb.bm25_tf_part(tf, len, k1, b, avglen), its expression in its order of operations
             coalesce((p.k1 + 1) / (1 + p.k1 * (1 - p.b + p.b
                        * (case when u.lexeme like '~ %' then c.stem_len else c.doc_len end)::float8
                        / (case when u.lexeme like '~ %' then greatest(v_stem_avglen, 1e-9) else v_avglen end))
                        / nullif(coalesce(array_length(u.positions, 1), 1)::float8, 0)), 0) as w
      from kb.chunks c
      cross join lateral unnest(c.tsv) as u
      join kb.term_stats ts on ts.tenant_id = p.tenant_id and ts.term = u.lexeme and ts.df >= v_min_df
      where c.tenant_id = p.tenant_id and u.lexeme not like '@language %'
    ),
    ranked as (
      select pp.term, pp.chunk_id, pp.w, pp.df,
             row_number() over (partition by pp.term order by pp.w desc, pp.chunk_id) as rn
      from pp
    ),
    agg as (
      select r.term, greatest(v_list, min(r.df) / 2) as stored,
             array_agg(r.chunk_id order by r.w desc, r.chunk_id) as ids,
             array_agg(r.w order by r.w desc, r.chunk_id) as ws
      from ranked r
      where r.rn <= greatest(v_list, r.df / 2) + 1
      group by r.term
    )
    insert into kb.term_blocks (tenant_id, term, level, part, chunk_ids, n, tail, avglen, k1, b)
    select p.tenant_id, a.term, l.level, 0, a.ids[l.s:l.e], l.e - l.s + 1, coalesce(a.ws[l.e + 1], 0),
           case when a.term like '~ %' then greatest(v_stem_avglen, 1e-9) else v_avglen end, p.k1, p.b
    from agg a
    cross join lateral (
      select g.level, v_list * (power(4, g.level)::bigint - 1) / 3 + 1 as s,
             least(v_list * (power(4, g.level + 1)::bigint - 1) / 3, a.stored, cardinality(a.ids)) as e
      from generate_series(0, 20) as g(level)
    ) as l
    where l.s <= least(a.stored, cardinality(a.ids));
  end loop;
end
$$;
