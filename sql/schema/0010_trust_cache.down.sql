-- Downgrade of 0010_trust_cache.sql.
select 1;
