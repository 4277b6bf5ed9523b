-- A stream exists from its first commit: an append, or a reader's registration, which leaves a
-- stream at head 0 (seed 000's browser mirror registers its position before anything is
-- written). born records that the first commit landed, so Streams.list shows such a stream
-- while it is unloaded, where head_offset > 0 was the test before. Until this migration only an
-- append created a stream: every stream with an event is born. One at head 0 was never
-- committed to: a creation in flight or cut short (stale, so the next start reads its database
-- and drops it, or marks it born), or one whose first commit failed, which stays unlisted.
alter table streams add column born integer not null default 0;
update streams set born = 1 where head_offset > 0;
