-- How many streams each project holds, for the --max-streams-per-project bound. Counting the
-- streams table on every creation scans the project's entries under the write lock (about 9 ms
-- at 100,000), which a client retrying refused creations could hold for everyone; this row is
-- one read. Triggers keep it in the same transaction as every insert and delete of a stream, so
-- it cannot drift from the table, and the backfill makes it true for a directory from before.
create table stream_counts (
  project_id text primary key references projects (id) on delete cascade,
  streams    integer not null
);
insert into stream_counts (project_id, streams)
  select project_id, count(*) from streams group by project_id;
create trigger stream_counts_insert after insert on streams begin
  insert into stream_counts (project_id, streams) values (new.project_id, 1)
    on conflict (project_id) do update set streams = streams + 1;
end;
create trigger stream_counts_delete after delete on streams begin
  update stream_counts set streams = streams - 1 where project_id = old.project_id;
end;
