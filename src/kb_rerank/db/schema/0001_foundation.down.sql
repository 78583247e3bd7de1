-- Downgrade of 0001_foundation (run by its Alembic revision).
-- Roles are cluster-wide and may serve other databases: they are left in place.
drop schema if exists kb cascade;
