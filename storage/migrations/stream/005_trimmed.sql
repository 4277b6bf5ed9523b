-- Retention (Stream.trim): the offset through which the stream's events were deleted, its
-- stream/* records kept. Reads pass the gap, as they pass swept ephemeral rows.
alter table stream_meta add column trimmed_through integer not null default 0;
