-- Where a stream's consumers stand, kept with the head summary (refreshed when the stream unloads
-- and after an unclean stop), so Streams.list shows halted subscriptions and the slowest consumer
-- of every stream without loading it.
alter table streams add column halted_subscriptions integer not null default 0;
alter table streams add column max_lag integer not null default 0;
