-- kb.search_lexical(query, k, k1, b, filter): BM25 over the caller's tenant, best chunk per document.
--
-- Two functions: kb.search_lexical_ids(query, k, k1, b, filter), the search itself, returns each
-- document's best chunk as ids, score and rank; kb.search_lexical (at the end of this file)
-- adds the title, snippet and content by key. kb.hybrid_fusion fuses the ids, and kb.search_hybrid and
-- kb.retrieve_hybrid read the texts of the rows they return (retrieval/sql/hybrid_fusion.sql).
--
-- Why SECURITY DEFINER (owned by kb_search, which has BYPASSRLS): under RLS the planner may
-- not evaluate `tsv @@ tsquery` before the policy's tenant check, because @@ is not
-- leakproof, so a ranked full-text query run by the app role ignores the GIN index
-- (measured on PostgreSQL 18: 26.7 ms through RLS against 0.4 ms here at 50k rows per
-- tenant). This function applies the same isolation itself: every table it reads is
-- filtered on kb.current_tenant(), the tenant of the caller's transaction, and with no
-- tenant set it returns no rows (tenant_id = NULL is never true). search_path is pinned.
--
-- Scoring (Robertson/Lucene BM25):
--   idf(t)   = ln(1 + (N - df + 0.5) / (df + 0.5))
--   score(d) = sum over distinct query terms t in d of
--              qtf(t) * idf(t) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(d) / avglen))
-- with N, df and avglen taken from the caller's tenant only (kb.corpus_stats, kb.term_stats),
-- or, for a query in a language the tenant holds, from that language's chunks in it
-- (kb.corpus_language_stats, kb.term_language_stats; see the statistics language below),
-- and qtf(t) the number of times t occurs in the query (kb.search_term_counts), as in Lucene,
-- where a repeated query word is a repeated clause. An English query's words are stemmed
-- terms ('~ connect', its identifiers exact), another query's are exact (kb.search_term_counts);
-- both fields live in kb.chunks.tsv, and len(d) and avglen are those of the term's field:
-- doc_len for an exact term, stem_len for a stemmed one (migration 0011).
-- Documents are deduplicated by doc_id: each document contributes its best chunk.
-- the signatures before the filter (one overload each: positional calls stay unambiguous)
drop function if exists kb.search_lexical(text, integer, double precision, double precision);
drop function if exists kb.search_lexical_ids(text, integer, double precision, double precision);
-- and before the query's language
drop function if exists kb.search_lexical(text, integer, double precision, double precision, jsonb);
drop function if exists kb.search_lexical_ids(text, integer, double precision, double precision, jsonb);
-- Its parameters and returned columns are written out again in kb.search_lexical and the
-- semantic searches: a signature is its callers' contract (named and positional calls, \df),
-- and SQL has no shared one.
create or replace function kb.search_lexical_ids(
  query text,
  k integer default {{default:candidates}},
  k1 double precision default {{default:bm25_k1}},
  b double precision default {{default:bm25_b}},
  filter jsonb default null,
  language text default null
)
returns table (
  chunk_id uuid,
  doc_id uuid,
  score double precision,
  rank integer
)
language plpgsql
stable
parallel safe
security definer
set search_path = pg_catalog, kb, pg_temp
-- (the planner's estimate of its rows: k, 60 by default; with the default 1000, kb.search_lexical
-- could read the texts by hashing every chunk of a large tenant, 0.4 s at 100k chunks)
rows 100
as $fn$
-- Top-k retrieval, exact: a threshold algorithm over the term blocks (block-max
-- MaxScore). A term with blocks (kb.term_blocks, built with this k1 and b) has its chunks in
-- levels by descending tf_part; after reading its levels 0..L, any chunk not read through
-- them weighs at most U = w * tail(L) * max(1, avglen now / avglen at build) for it (before
-- any level: w * (k1 + 1), which bounds every BM25 term when k1 >= 0 and 0 <= b <= 1;
-- after reading all its postings through the GIN index: 0). Every chunk read is scored
-- exactly, with all query terms, and merged into the top k. A chunk never read scores at
-- most the sum of the terms' U, so the search stops when the k-th score is above that sum.
-- Otherwise, with terms sorted by U, those whose U add up to less than the k-th score are
-- non-essential (MaxScore): a chunk never read can only enter the top k if it holds an
-- essential term. When the essential terms' unread postings are few against the next
-- levels to read, they are all scored through the (tenant_id, tsv) GIN index and the search
-- ends; else the next level of each term whose U is at least half the largest is read (a
-- level is 4 times its predecessor, so rounds stay few). Round 0 reads level 0 of every
-- term with blocks and, through the GIN index, all chunks of the terms without (rare ones:
-- below the blocks' min_df). A round scores only chunks no earlier round read, and merges
-- them with the previous top k: a document outside that top k cannot enter it through a
-- chunk already scored, since adding candidates only raises the k-th score.
-- A filter (kb.search_filter's grammar, docs/filters.md) keeps only the chunks of its
-- documents (kb.search_filter_docs, read once): every scoring statement has a condition on
-- c.doc_id, so the list is the top k within the filter, before any fusion. The condition is
-- `(c.doc_id in (select unnest($17))) is true`, a hashed subplan (one lookup a chunk; not
-- pulled up into a join, as it is not a bare IN): `c.doc_id = any ($17)` compares each chunk
-- with every document of the array in turn (not hashed here), a cost that grows with the
-- filter's documents; it is kept for the few-chunks form below, where it is the
-- (tenant_id, doc_id) index's condition.
-- The bounds above still hold (a chunk outside the filter is never scored, a chunk inside
-- is bounded as before), so the search stays exact; N, df and avglen stay the tenant's (a
-- filter narrows the documents, not the statistics, as a filter clause does in Lucene).
-- When the filter's documents hold at most 4000 chunks, the blocks are not read: one
-- round scores every chunk of them holding a query term (through the (tenant_id, doc_id)
-- index when that is cheaper than the terms' postings), the exhaustive form.
declare
  v_tenant uuid := kb.current_tenant();
  v_k integer := greatest(least(k, 1000), 0);
  v_n float8;
  v_avglen float8;
  v_stem_avglen float8;
  v_langs text[];        -- the languages analysing the query (kb.query_languages)
  v_lang text;           -- the language whose statistics weigh its terms, if any
  v_field text;          -- the query's own language (named or detected) when the tenant holds it and another
  v_others text[];       -- then the tenant's other languages
  v_lang_n float8;
  v_lang_avglen float8;
  v_lang_stem_avglen float8;
  v_avg float8[];        -- the average length of each term's field, in its statistics
  v_gterm text[];        -- the query's terms by group (a term may be in more than one)
  v_gqtf integer[];      -- the group's qtf
  v_ggrp integer[];      -- the group
  v_terms text[];
  v_df bigint[];
  v_ldf bigint[];        -- the term's chunks in the statistics language (0 when none)
  v_lq tsquery[];        -- v_lq[i]: the languages whose chunks term i must not count in (else null)
  v_restricted boolean := false;  -- some term has one
  v_w float8[];
  v_idf float8[];
  v_nt integer;
  v_exact boolean := k1 >= 0 and b >= 0 and b <= 1;
  v_docs uuid[] := case when filter is not null then kb.search_filter_docs(filter) end;  -- (NULL: no filter)
  v_few boolean := false;
  -- levels, flattened: term i's level L (0-based) is entry v_off[i] + L + 1 of v_lb (its
  -- bound: w * tail * widening) and of v_ln (its number of chunks, all parts)
  v_off integer[];
  v_nlev integer[];
  v_lb float8[] := '{}';
  v_ln bigint[] := '{}';
  v_read integer[];      -- levels read per term
  v_readn bigint[];      -- chunks listed in them
  v_gin boolean[];       -- all postings scored through the GIN index
  v_u float8[];
  v_e boolean[];         -- the terms read through the GIN index this round
  v_ids uuid[];          -- chunk ids read from levels this round
  v_seen uuid[] := '{}'; -- chunk ids read from levels so far
  v_gin_q tsquery;
  v_done_q tsquery;      -- terms read through the GIN index by earlier rounds
  v_sum float8;
  v_cum float8;
  v_umax float8;
  v_finish bigint;
  v_step bigint;
  v_cnt integer;
  v_j integer;
  v_last boolean := false;
  v_sub text;
  v_nsub integer;
  v_subest float8;
  v_round integer := 0;
  r_chunk uuid[];
  r_doc uuid[];
  r_score float8[];
  v_min float8;
  v_tq tsquery[];  -- v_tq[i]: the query of term i alone
  v_tf real[] := kb.ts_rank_tf();
  v_score text;
begin
  if v_tenant is null or v_k = 0 or cardinality(v_docs) = 0 then
    return;
  end if;
  if v_docs is not null and (select count(*) from (select 1 from kb.chunks c
                                                   where c.tenant_id = v_tenant and c.doc_id = any (v_docs)
                                                   limit 4001) as x) <= 4000 then
    v_few := true;
    v_exact := false;  -- few chunks: no blocks, every term through one exhaustive round
  elsif kb.lexical_engine_serves(k1, b) then
    -- the optional engine (retrieval/sql/lexical_engine.sql), where `kb-rerank migrate` turned
    -- it on and its index was built with this k1 and b; a filter of few chunks stays here
    return query select * from kb.search_lexical_ids_bm25(query, k, k1, b, filter, language);
    return;
  end if;
  select cs.n_chunks::float8, cs.total_len::float8 / greatest(cs.n_chunks, 1),
         cs.stem_total_len::float8 / greatest(cs.n_chunks, 1)
    into v_n, v_avglen, v_stem_avglen
  from kb.corpus_stats cs where cs.tenant_id = v_tenant;
  if v_n is null then
    return;
  end if;
  -- The statistics language: the query's own (named or detected) when the tenant holds
  -- chunks in it, else the one language its words are analysed in, if one. A term found in
  -- that language's chunks is weighed with their statistics alone (N, df, avglen of that
  -- language: kb.corpus_language_stats, kb.term_language_stats), as in a tenant of that
  -- language only; a term found only in other languages' chunks (an identifier, a word of
  -- another script), and every term of a query of no such language, with the tenant's.
  v_langs := kb.query_languages(query, v_tenant, language);
  v_lang := case kb.language_subtag(language) when 'nb' then 'no' when 'nn' then 'no'
                 else kb.language_subtag(language) end;
  if v_lang is null or not exists (select from kb.corpus_language_stats cl
                                   where cl.tenant_id = v_tenant and cl.language = v_lang and cl.n_chunks > 0) then
    v_lang := case when cardinality(v_langs) = 1 then v_langs[1] end;
  else
    -- (a tenant of that language alone has no chunk to keep out: v_others stays null)
    select array_agg(cl.language order by cl.language) into v_others
    from kb.corpus_language_stats cl
    where cl.tenant_id = v_tenant and cl.language <> v_lang and cl.n_chunks > 0;
    v_field := case when v_others is not null then v_lang end;
  end if;
  select cl.n_chunks::float8, cl.total_len::float8 / greatest(cl.n_chunks, 1),
         cl.stem_total_len::float8 / greatest(cl.n_chunks, 1)
    into v_lang_n, v_lang_avglen, v_lang_stem_avglen
  from kb.corpus_language_stats cl
  where cl.tenant_id = v_tenant and cl.language = v_lang and cl.n_chunks > 0;
  -- the query's terms in groups (kb.search_term_groups: the forms of one word), those the
  -- tenant holds; weight of a term = its count in the query (qtf, over its groups) * idf
  select array_agg(g.term order by g.grp, g.term), array_agg(g.qtf order by g.grp, g.term),
         array_agg(g.grp order by g.grp, g.term)
    into v_gterm, v_gqtf, v_ggrp
  from kb.search_term_groups(query, v_langs) as g
  where exists (select from kb.term_stats ts where ts.tenant_id = v_tenant and ts.term = g.term and ts.df > 0);
  -- (v_df: the term's chunks in the tenant, all languages: the postings a search reads)
  select array_agg(ts.term order by ts.df, ts.term),
         array_agg(ts.df order by ts.df, ts.term),
         array_agg(q.qtf * st.idf order by ts.df, ts.term),
         array_agg(st.idf order by ts.df, ts.term),
         array_agg(greatest(st.avglen, 1e-9) order by ts.df, ts.term),
         array_agg(coalesce(tl.df, 0) order by ts.df, ts.term)
    into v_terms, v_df, v_w, v_idf, v_avg, v_ldf
  from (select g.term, sum(g.qtf) as qtf from unnest(v_gterm, v_gqtf) as g(term, qtf) group by g.term) as q
  join kb.term_stats ts on ts.tenant_id = v_tenant and ts.term = q.term
  left join kb.term_language_stats tl
    on tl.tenant_id = v_tenant and tl.language = v_lang and tl.term = q.term and tl.df > 0
       and v_lang_n is not null
  cross join lateral (
    select ln(1 + (x.n - x.df + 0.5) / (x.df + 0.5)) as idf, x.avglen
    from (select case when tl.df is null then v_n else v_lang_n end as n,
                 coalesce(tl.df, ts.df)::float8 as df,
                 case when tl.df is null and q.term like '~ %' then v_stem_avglen
                      when tl.df is null then v_avglen
                      when q.term like '~ %' then v_lang_stem_avglen
                      else v_lang_avglen end as avglen) as x
  ) as st
  where ts.df > 0;
  v_nt := coalesce(array_length(v_terms, 1), 0);
  if v_nt = 0 then
    return;
  end if;
  -- A chunk's score, one expression over its tsvector: term i contributes
  -- v_w[i] * kb.bm25_tf_part(tf), tf read by ts_rank (see kb.ts_rank_tf; a lexeme stored
  -- without positions, as code tokens may be, counts once), guarded by tsv @@ term (and,
  -- for a term of the query's own language, by the chunk's language: below): the
  -- check costs half a ts_rank call, and a chunk holds few of a long query's terms (on
  -- CISI's long queries the unguarded form was 6% slower on average than unnesting, the
  -- guarded one 3% faster). Two entries of the constant are checked against this server's
  -- ts_rank; it is computed afresh if they differ.
  if ts_rank('{1,1,1,1}', 'x:1'::tsvector, 'x'::tsquery, 0) is distinct from v_tf[1]
     or ts_rank('{1,1,1,1}', 'x:1,2,3'::tsvector, 'x'::tsquery, 0) is distinct from v_tf[3] then
    v_tf := kb.ts_rank_tf_compute();
  end if;
  -- A stemmed term ('~ ...') is normalised by its field's length (c.stem_len), any other by
  -- the exact field's (c.doc_len), each against its average in the term's statistics ($7[i]).
  -- A group of one term that is in no other group adds that term's part, weight $2[i] (a
  -- query of one language: every group); any other group adds its qtf times the best of its
  -- terms' parts, each weighed by its idf alone ($18[i]). The bounds below weigh a term by
  -- its qtf over all its groups: they stay above any chunk's score (a group's best part is
  -- at most the sum of its parts).
  select array_agg(kb.terms_tsquery(array[t.term]) order by t.i)
    into v_tq
  from unnest(v_terms) with ordinality as t(term, i);
  -- A field per language, as in Lucene: when the query's own language L (named, or detected
  -- by the caller) is one the tenant holds beside others (v_field; not when L is only the
  -- one language the tenant's analysis chose for an undetected query, which may be wrong),
  -- a stem of the query counts only in chunks of L, of no known language, and of the
  -- languages that analysed it (v_langs: for a word of L's script, L alone; for a Latin word
  -- of a Greek question, the tenant's Latin languages, English say), and a number only in
  -- chunks of L or of no known language. So another language's chunk sharing a stem
  -- ('~ super' in a Turkish question and an English abstract) or a name (a Greek question's
  -- 'Super Bowl' in a Turkish page) does not match it. Exact terms (identifiers ERR_402,
  -- E-117, v2.3.1, kept whole) count in every chunk.
  -- A restricted term's guard is `c.tsv @@ term and not (c.tsv @@ $19[i])`, $19[i] the
  -- '@language' lexemes of the languages it must not count in whose chunks hold it
  -- (kb.term_language_stats, by key; a chunk holds at most one such lexeme): the second test
  -- runs only on chunks holding the term, and a term no such chunk holds (most of them) has
  -- no test at all. The candidates are unchanged (the terms' postings in every language); a
  -- chunk that then scores 0 (only restricted terms of another language) is not returned.
  -- The search stays exact: a restricted term's part is at most the unrestricted one, so
  -- every bound below (levels, U, the sets of the last round, all built over the term's
  -- postings in every language) stays an upper bound of what is scored, and every chunk a
  -- round reads is scored with the restricted form.
  if v_field is not null then
    select array_agg((select kb.terms_tsquery(array_agg('@language ' || tl.language order by tl.language))
                      from kb.term_language_stats tl
                      where v_terms[i] like '~ %' and v_df[i] > v_ldf[i]
                        and tl.tenant_id = v_tenant and tl.language = any (v_others)
                        and (substr(v_terms[i], 3) ~ '^[0-9]+$'
                             or not (tl.language = any (v_langs)
                                     and kb.language_script(tl.language) = kb.text_script(substr(v_terms[i], 3))))
                        and tl.term = v_terms[i] and tl.df > 0) order by i)
      into v_lq
    from generate_series(1, v_nt) as i;
    v_restricted := exists (select from unnest(v_lq) as q where q is not null);
  end if;
  with part as (
    select t.i, t.term,
           format('case when c.tsv @@ $8[%s]%s then %%s * kb.bm25_tf_part(width_bucket(ts_rank('
                  '''{1,1,1,1}'', c.tsv, $8[%s], 0), $9), %s) else 0 end',
                  t.i,
                  case when v_lq[t.i] is not null then format(' and not (c.tsv @@ $19[%s])', t.i) else '' end,
                  t.i,
                  format(case when t.term like '~ %' then 'c.stem_len, $5, $6, $7[%s]' else 'c.doc_len, $5, $6, $7[%s]' end,
                         t.i)) as expr
    from unnest(v_terms) with ordinality as t(term, i)
  ),
  member as (
    select g.grp, g.qtf, p.i, p.expr,
           count(*) over (partition by g.grp) as forms,
           count(*) over (partition by p.i) as groups
    from unnest(v_gterm, v_gqtf, v_ggrp) as g(term, qtf, grp) join part p on p.term = g.term
  ),
  grouped as (
    select m.grp, min(m.i) as first,
           case when max(m.forms) = 1 and max(m.groups) = 1
                then format(max(m.expr), format('$2[%s]', max(m.i)))
                else format('%s * greatest(%s)', max(m.qtf),
                            string_agg(format(m.expr, format('$18[%s]', m.i)), ', ' order by m.i)) end as expr
    from member m
    group by m.grp
  )
  select string_agg(x.expr, ' + ' order by x.first, x.grp) into v_score from grouped x;

  -- The levels of the query's terms built with this k1 and b (none when the bounds do not
  -- hold: then every term is read through the GIN index, plain exhaustive scoring).
  v_nlev := array_fill(0, array[v_nt]);
  v_off := array_fill(0, array[v_nt]);
  if v_exact then
    for i in 1 .. v_nt loop
      v_off[i] := cardinality(v_lb);
      select v_lb || coalesce(array_agg(l.bound order by l.level), '{}'),
             v_ln || coalesce(array_agg(l.n order by l.level), '{}'),
             count(*)
        into v_lb, v_ln, v_cnt
      from (select tt.level,
                   v_w[i] * max(tt.tail) * greatest(1, v_avg[i] / max(tt.avglen)) as bound,
                   sum(tt.n) as n
            from kb.term_blocks tt
            where tt.tenant_id = v_tenant and tt.term = v_terms[i]
              and tt.k1 = search_lexical_ids.k1 and tt.b = search_lexical_ids.b
            group by tt.level) as l;
      v_nlev[i] := v_cnt;
    end loop;
  end if;
  v_read := array_fill(0, array[v_nt]);
  v_readn := array_fill(0::bigint, array[v_nt]);
  v_gin := array_fill(false, array[v_nt]);
  v_u := array_fill(0::float8, array[v_nt]);
  -- round 0: level 0 of the terms with levels, the others through the GIN index
  v_e := array(select v_nlev[i] = 0 from generate_series(1, v_nt) as i);
  for i in 1 .. v_nt loop
    if v_nlev[i] > 0 then
      v_read[i] := 1;
      v_readn[i] := v_ln[v_off[i] + 1];
    end if;
  end loop;
  select coalesce(array_agg(distinct x.id), '{}') into v_ids
  from kb.term_blocks tt cross join lateral unnest(tt.chunk_ids) as x(id)
  where tt.tenant_id = v_tenant and tt.term = any (v_terms) and tt.level = 0
    and tt.k1 = search_lexical_ids.k1 and tt.b = search_lexical_ids.b and v_exact;

  loop
    if not v_last then
      select kb.terms_tsquery(array_agg(v_terms[i] order by i)) into v_gin_q
      from generate_series(1, v_nt) as i where v_e[i];
    end if;

    -- score this round's chunks (v_score), best chunk per document, top k, merged with the
    -- previous top k. EXECUTE plans with the actual tenant and query (a custom plan): a
    -- generic plan estimates every tenant alike and may scan a large tenant through a btree
    -- on tenant_id instead of the (tenant_id, tsv) GIN index. Scores are rounded to 1e-9 so
    -- that ties do not depend on summation order. A chunk read by an earlier round (through
    -- the GIN index: $11; from a level: $13) is not scored again (v_ids excludes the latter).
    if v_gin_q is not null or cardinality(v_ids) > 0 then
      execute format($q$
        with scored as materialized (
          -- (tenant_id, tsv) GIN index and (tenant_id, chunk_id) key: index conditions
          -- (materialized: planned alone, so that no index in doc_id order replaces it)
          -- (with 8 terms or more, as a Thai or Chinese query's n-grams are, the tsvector
          -- is read once per row: a large one is stored compressed, and each operator and
          -- function call on the column itself decompresses it again; a copy costs more than
          -- the few decompressions of a short query)
          select c.chunk_id, c.doc_id, round((%s) * 1e9) / 1e9 as score
          from (select c.chunk_id, c.doc_id, c.doc_len, c.stem_len, %s as tsv
                from kb.chunks c
                where c.tenant_id = $1
                  and (%s)%s%s%s
                offset 0) as c%s
        ),
        top as (
          select x.chunk_id, x.doc_id, x.score
          from (select distinct on (s.doc_id) s.chunk_id, s.doc_id, s.score
                from scored s%s
                order by s.doc_id, s.score desc, s.chunk_id) as x
          order by x.score desc, x.chunk_id
          limit $4
        )
        select array_agg(chunk_id order by score desc, chunk_id),
               array_agg(doc_id order by score desc, chunk_id),
               array_agg(score order by score desc, chunk_id),
               min(score)
        from top
      $q$,
        v_score,
        case when v_nt >= 8 then 'c.tsv || ''''::tsvector' else 'c.tsv' end,
        concat_ws(' or ', case when v_gin_q is not null then 'c.tsv @@ $3' end,
                          case when cardinality(v_ids) > 0 then 'c.chunk_id = any ($12)' end),
        case when v_done_q is not null then ' and not (c.tsv @@ $11)' else '' end,
        case when v_gin_q is not null and cardinality(v_seen) > 0
             then ' and c.chunk_id not in (select unnest($13::uuid[]))' else '' end,
        case when v_docs is null then ''
             when v_few then ' and c.doc_id = any ($17)'
             else ' and (c.doc_id in (select unnest($17::uuid[]))) is true' end,
        case when r_chunk is not null then $p$
          union all
          select p.chunk_id, p.doc_id, p.score
          from unnest($14::uuid[], $15::uuid[], $16::float8[]) as p(chunk_id, doc_id, score)$p$ else '' end,
        case when v_restricted then ' where s.score > 0' else '' end)
      into r_chunk, r_doc, r_score, v_min
      -- ($10 is not read)
      using v_tenant, v_w, v_gin_q, v_k, k1, b, v_avg, v_tq, v_tf,
            null::float8, v_done_q, v_ids, v_seen, r_chunk, r_doc, r_score, v_docs, v_idf, v_lq;
    end if;
    v_seen := v_seen || v_ids;
    if v_gin_q is not null then
      v_done_q := case when v_done_q is null then v_gin_q else v_done_q || v_gin_q end;
    end if;
    v_round := v_round + 1;
    exit when v_last;

    -- U per term, and the bound of a chunk not read yet: their sum
    v_sum := 0;
    for i in 1 .. v_nt loop
      v_gin[i] := v_gin[i] or v_e[i];
      v_u[i] := case when v_gin[i] then 0
                     when v_read[i] = 0 then v_w[i] * (k1 + 1)
                     else v_lb[v_off[i] + v_read[i]] end;
      v_sum := v_sum + v_u[i];
    end loop;
    -- (the margin covers the rounding of scores to 1e-9 and a tail equal to a score)
    exit when v_sum = 0
           or (coalesce(cardinality(r_chunk), 0) = v_k and v_min > v_sum + 1e-8);
    -- The last round's candidates (coverage): a chunk not read yet scores at most the sum
    -- of U over the terms it holds (it holds none read through the GIN index), so it can
    -- only enter the top k if it holds a set of terms whose U add up to the k-th score
    -- (with fewer than k documents: any term). Those sets are enumerated by adding terms in
    -- descending U until the sum reaches it (each such set holds one that is listed), a
    -- branch dropped once even all the remaining terms cannot reach it; the GIN index then
    -- finds the chunks holding all terms of a listed set (the expected number, as if the
    -- terms were independent, is v_finish). When there are more than 64 sets, the MaxScore
    -- cover instead: the essential terms, all but those (smallest U first) whose U add up
    -- to less than the k-th score.
    v_cum := case when coalesce(cardinality(r_chunk), 0) = v_k then v_min - 1e-8 else 0 end;
    with recursive t as (
      select row_number() over (order by v_u[x.i] desc, x.i) as r, x.i, v_u[x.i] as u,
             greatest(v_df[x.i] - v_readn[x.i], 1)::float8 / v_n as p
      from generate_series(1, v_nt) as x(i)
      where v_u[x.i] > 0
    ),
    suffix as (
      select t.*, sum(t.u) over (order by t.r desc) as rest from t
    ),
    sets(last, terms, su, p) as (
      select f.r, array[f.i], f.u, f.p from suffix f where f.rest >= v_cum
      union all
      select f.r, s2.terms || f.i, s2.su + f.u, s2.p * f.p
      from sets s2 join suffix f on f.r > s2.last
      where s2.su < v_cum and s2.su + f.rest >= v_cum and cardinality(s2.terms) < 16
    )
    select string_agg('(' || (select string_agg(v_tq[x]::text, ' & ') from unnest(s3.terms) as x) || ')', ' | '),
           count(*), sum(s3.p) * v_n
      into v_sub, v_nsub, v_subest
    from (select * from sets where sets.su >= v_cum limit 65) as s3;
    v_e := array(select v_u[i] > 0 from generate_series(1, v_nt) as i);
    v_cum := 0;
    for v_j in select t.i from generate_series(1, v_nt) as t(i) order by v_u[t.i], t.i loop
      exit when coalesce(cardinality(r_chunk), 0) < v_k or v_cum + v_u[v_j] + 1e-8 >= v_min;
      v_cum := v_cum + v_u[v_j];
      v_e[v_j] := false;
    end loop;
    v_finish := 0;
    v_umax := 0;
    for i in 1 .. v_nt loop
      if v_e[i] then
        v_finish := v_finish + greatest(v_df[i] - v_readn[i], 0);
      end if;
      if v_read[i] < v_nlev[i] and v_u[i] > 0 then
        v_umax := greatest(v_umax, v_u[i]);
      end if;
    end loop;
    if v_nsub between 1 and 64 then
      v_finish := least(v_finish, v_subest);
    else
      v_sub := null;
    end if;
    -- a step: the next level of each term whose U is at least half the largest
    v_step := 0;
    for i in 1 .. v_nt loop
      if v_read[i] < v_nlev[i] and v_u[i] > 0 and v_u[i] >= v_umax / 2 then
        v_step := v_step + v_ln[v_off[i] + v_read[i] + 1];
      end if;
    end loop;
    v_ids := '{}';
    if v_step > 0 and v_finish > 2 * v_step then
      select coalesce(array_agg(x.id), '{}') into v_ids
      from (select u.id
            from generate_series(1, v_nt) as t(i)
            join kb.term_blocks tt
              on tt.tenant_id = v_tenant and tt.term = v_terms[t.i] and tt.level = v_read[t.i]
             and tt.k1 = search_lexical_ids.k1 and tt.b = search_lexical_ids.b
            cross join lateral unnest(tt.chunk_ids) as u(id)
            where v_read[t.i] < v_nlev[t.i] and v_u[t.i] > 0 and v_u[t.i] >= v_umax / 2
            except
            select unnest(v_seen)) as x;
      for i in 1 .. v_nt loop
        if v_read[i] < v_nlev[i] and v_u[i] > 0 and v_u[i] >= v_umax / 2 then
          v_readn[i] := v_readn[i] + v_ln[v_off[i] + v_read[i] + 1];
          v_read[i] := v_read[i] + 1;
        end if;
      end loop;
      v_e := array_fill(false, array[v_nt]);
    else
      -- finish: the listed sets' chunks (or the essential terms') through the GIN index
      v_last := true;
      v_gin_q := coalesce(v_sub::tsquery, (select kb.terms_tsquery(array_agg(v_terms[i] order by i))
                                           from generate_series(1, v_nt) as i where v_e[i]));
    end if;
  end loop;

  return query
    select t.chunk_id, t.doc_id, t.score, t.rank::integer
    from unnest(r_chunk, r_doc, r_score) with ordinality as t(chunk_id, doc_id, score, rank)
    order by t.rank;
end
$fn$;
alter function kb.search_lexical_ids(text, integer, double precision, double precision, jsonb, text) owner to kb_search;
comment on function kb.search_lexical_ids(text, integer, double precision, double precision, jsonb, text) is
  'BM25 top-k chunks (best chunk per document) as ids, score and rank, for the tenant in auth.tenant_id, within a search filter''s documents when given; empty when unset';

-- kb.search_lexical: kb.search_lexical_ids' rows with the chunk's title, snippet and content,
-- in rank order (kb.chunk_texts). SECURITY DEFINER, owned by kb_search like the search it calls
-- (so that a caller needs EXECUTE on this function only): the texts' lookups name
-- kb.current_tenant(), and with no tenant set the search returns no rows. search_path pinned, pg_temp last.
create or replace function kb.search_lexical(
  query text,
  k integer default {{default:candidates}},
  k1 double precision default {{default:bm25_k1}},
  b double precision default {{default:bm25_b}},
  filter jsonb default null,
  language text default null
)
returns table (
  chunk_id uuid,
  doc_id uuid,
  doc_title text,
  snippet text,
  content text,
  score double precision,
  rank integer
)
language sql
stable
parallel safe
security definer
set search_path = pg_catalog, kb, pg_temp
as $$
  select t.chunk_id, t.doc_id, x.doc_title, x.snippet, x.content, t.score, t.rank
  from kb.search_lexical_ids(query, k, k1, b, filter, language) as t
  cross join lateral kb.chunk_texts(t.chunk_id, t.doc_id) x
  order by t.rank
$$;
alter function kb.search_lexical(text, integer, double precision, double precision, jsonb, text) owner to kb_search;
comment on function kb.search_lexical(text, integer, double precision, double precision, jsonb, text) is
  'BM25 top-k chunks (best chunk per document) for the tenant in auth.tenant_id, within a search filter''s documents when given; empty when unset';
