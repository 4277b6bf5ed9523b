-- The capabilities an unloaded stream's parked subscriptions wait for: a mount under one of these
-- names in the stream's project loads the stream, which resumes them. Written when a stream
-- unloads; a stream loaded meanwhile knows its parked subscriptions itself.
create table parked (
  stream_id  text not null references streams (stream_id) on delete cascade,
  capability text not null,
  primary key (stream_id, capability)
);
create index parked_by_capability on parked (capability);
