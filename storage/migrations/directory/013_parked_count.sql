-- The parked subscriptions of each stream (receiver absent: a remote processor's host gone, a
-- capability no longer mounted), kept with its consumer standing, so Streams.list shows them as
-- it shows halted ones. No stream listed before this migration has its count: mark every one
-- stale, so the next start reads it from the stream's own database (once; the refresh clears the
-- mark).
alter table streams add column parked_subscriptions integer not null default 0;
update streams set summary_stale = 1;
