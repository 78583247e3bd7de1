-- Downgrade of 0007_tsv_inline (run by its Alembic revision).
-- Rows keep their in-line tsvector until they are next written; that is harmless.
alter table kb.chunks alter column tsv set storage extended;
