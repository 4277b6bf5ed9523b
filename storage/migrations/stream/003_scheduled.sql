-- Scheduled appends (durable timers): an event the stream appends once its time comes, named by
-- its idempotency key (so landing is exactly once: the row is deleted in the commit that
-- appends it, and the key dedupes a retry). event is the EventInput as JSON.
create table scheduled_events (
  key    text primary key,
  due_at integer not null,
  event  text not null
);
create index scheduled_events_due on scheduled_events(due_at, key);
