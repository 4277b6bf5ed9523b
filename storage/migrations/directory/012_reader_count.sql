-- The registered readers of each stream, kept with its consumer standing, so Streams.list (and
-- `itx consumers`) shows a stream's readers even when every one is caught up. No stream listed
-- before this migration has its count: mark every one stale, so the next start reads it from the
-- stream's own database (once; the refresh clears the mark).
alter table streams add column reader_count integer not null default 0;
update streams set summary_stale = 1;
