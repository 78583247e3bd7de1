-- Downgrade of 0018_guard_review: the reviews and the evidence column go. The idempotent
-- layer is not re-applied by a downgrade, so the trigger and the functions it installed for
-- these columns are dropped here (kb.chunks keeps accepting writes at 0017); the view
-- kb.guard_flagged_share (a string-bodied function under it) errors when queried until the
-- next upgrade to head re-applies it.
drop trigger if exists chunks_take_review on kb.chunks;
drop function if exists kb.chunks_take_review();
drop table if exists kb.guard_reviews;
drop function if exists kb.guard_reviews_apply();
alter table kb.chunks
  drop column if exists injection_review,
  drop column if exists injection_strong;
