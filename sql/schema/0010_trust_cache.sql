-- 0010 trust (cache): versioned, run once by Alembic revision 0010_trust.
select 1;
