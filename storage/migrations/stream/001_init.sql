-- One stream's log. Offsets are consecutive from 1 and shared by durable and ephemeral rows;
-- head_offset in stream_meta is the last offset ever issued, so an offset is never reissued even
-- after a retention sweep deletes the ephemeral rows at the top of the log.
create table stream_meta (
  id             integer primary key check (id = 1),
  stream_id      text not null,
  project_id     text not null,
  path           text not null,
  created_at     integer not null,
  head_offset    integer not null,
  last_append_at integer not null
);

create table events (
  offset          integer primary key,
  type            text not null,
  payload         text not null,
  metadata        text,
  idempotency_key text,
  created_at      integer not null,
  ephemeral       integer not null default 0,
  provenance      text
);
create unique index events_idempotency_key on events(idempotency_key) where idempotency_key is not null;
create index events_ephemeral on events(offset) where ephemeral = 1;

-- Exactly as seed 000 gives it: one row per subscription, one confirmed offset whose meaning
-- never varies by receiver kind.
create table subscription_cursors (
  name                                    text primary key,
  configured_at_offset                    integer not null,  -- birth epoch
  cursor_changed_at_offset                integer not null,  -- seek epoch
  confirmed_offset                        integer not null,  -- far side durably claims through here
  status                                  text not null default 'active',
                                          -- 'active' | 'halted'
  -- retry block, verbatim from today (already kind-independent):
  attempt                                 integer not null default 0,
  next_attempt_at                         integer,
  failing_event_offset                    integer,
  failing_event_attempt                   integer not null default 0,
  failing_event_skips_since_last_success  integer not null default 0,
  last_error                              text,
  -- in-flight block, verbatim from today:
  in_flight_deadline_at                   integer,
  in_flight_connection_generation         integer,
  updated_at                              text not null
);

-- Below the reduction: keepalive records, crash-loop counters, core state snapshots.
create table kv (
  key   text primary key,
  value blob not null
);
