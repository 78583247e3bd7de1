-- 0011: a stemmed field beside the exact one.
--
-- Each chunk's tsvector keeps its exact lexemes (folded words, accented words as typed,
-- code tokens) and gains the stemmed field: its plain words of two characters or more,
-- without stop words, stemmed by PostgreSQL's Snowball English dictionary (english_stem)
-- for English and Vietnamese documents, each written with the
-- prefix '~ ' (tilde, space). The prefix is the field's name: no parser token holds a
-- space, so no exact lexeme starts with it, and the per-tenant statistics (kb.term_stats),
-- the champion lists (kb.term_tops) and the pruned search treat '~ connect' as one more
-- term. The field has its own length (kb.chunks.stem_len; per tenant
-- kb.corpus_stats.stem_total_len), which BM25 normalises its terms by. An English query is
-- searched in the stemmed field, identifiers and any other query in the exact one
-- (retrieval/sql/text_analysis.sql, kb.search_term_counts).
--
-- The functions the data step needs are frozen copies below (the live files replace them
-- when the upgrade reaches head); the data step re-derives every chunk (an UPDATE of every
-- row: on a large table, run it in a maintenance window).

alter table kb.chunks add column stem_len integer not null default 0;  -- set by kb.chunks_derive
alter table kb.corpus_stats add column stem_total_len bigint not null default 0;

-- ---- frozen copies of retrieval/sql/text_analysis.sql (part) and retrieval/sql/chunks_derive.sql ----
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

create or replace function kb.stem_length(tsv tsvector)
returns integer
language sql
immutable
strict
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select coalesce(sum(coalesce(array_length(u.positions, 1), 1)), 0)::integer
  from unnest(tsv) as u
  where u.lexeme like '~ %'
$$;

-- BEFORE trigger: derive the lexical columns of a chunk from its content and its document's
-- language (kb.documents.language; ingestion rewrites a document's chunks when it changes).
create or replace function kb.chunks_derive()
returns trigger
language plpgsql
security invoker
set search_path = pg_catalog, kb, pg_temp
as $$
begin
  -- exact lexemes, then the stemmed field in the document's language (kb.stem_tsv)
  new.tsv := kb.to_tsv(new.content)
          || kb.stem_tsv(new.content, (select d.language from kb.documents d
                                       where d.tenant_id = new.tenant_id and d.doc_id = new.doc_id));
  new.doc_len := kb.doc_length(new.content);
  new.stem_len := kb.stem_length(new.tsv);
  return new;
end
$$;

drop trigger if exists chunks_derive on kb.chunks;
create trigger chunks_derive
  before insert or update of content on kb.chunks
  for each row execute function kb.chunks_derive();

-- ---- data step ----
-- The update trigger re-derives tsv and stem_len; the statistics trigger of the revision
-- before adds the stemmed terms' df (kb.term_stats) but knows no stem_total_len: summed here.
update kb.chunks set content = content;
update kb.corpus_stats cs
   set stem_total_len = (select coalesce(sum(c.stem_len), 0) from kb.chunks c where c.tenant_id = cs.tenant_id);
