-- 0010 trust (privileges): versioned, run once by Alembic revision 0010_trust.
select 1;
