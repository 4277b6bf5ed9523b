-- Registered readers (seed 000 "Reader"): pull consumers that declare a checkpoint so their lag
-- is visible and a retention floor can count them. No delivery obligation.
create table readers (
  name       text primary key,
  checkpoint integer not null,
  updated_at integer not null
);
