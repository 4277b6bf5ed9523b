-- The directory summary also carries how many subscriptions a stream has, so Streams.list can
-- show it without loading every stream.
alter table streams add column subscription_count integer not null default 0;
