-- The server directory: who may log in, which streams exist, and which stream alarms are due.
create table projects (
  id          text primary key,
  name        text not null unique,
  token_hash  text not null unique,   -- sha256 of the token, hex
  deployment  integer not null default 0,
  created_at  integer not null
);

-- A stream exists from its first append. head_offset and last_append_at are a summary refreshed
-- when an actor unloads; the stream's own database is authoritative.
create table streams (
  stream_id      text primary key,
  project_id     text not null references projects(id),
  path           text not null,
  created_at     integer not null,
  head_offset    integer not null default 0,
  last_append_at integer not null default 0,
  unique (project_id, path)
);

-- A persisted per-stream alarm, mirrored here so a restarted server wakes the streams whose
-- alarms are due without opening every stream.
create table alarms (
  stream_id text primary key references streams(stream_id),
  due_at    integer not null
);
create index alarms_due on alarms(due_at);
