-- A stream's summary (head, last append, subscription count) is refreshed when its actor unloads.
-- summary_stale is set before the first commit that moves the head after a load (and on creation)
-- and cleared by that refresh, so after a kill -9 the server knows which summaries to refresh.
alter table streams add column summary_stale integer not null default 0;
