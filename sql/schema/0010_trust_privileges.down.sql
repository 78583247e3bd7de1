-- Downgrade of 0010_trust_privileges.sql.
select 1;
