-- The streams deleted from the directory whose files may still be on disk. A project's delete
-- records its streams here in the transaction that deletes their entries; their files are
-- removed after that commit, and only then is the record deleted. A crash in between leaves
-- the record, and the next start removes the files it names: no file of a deleted stream
-- outlives it.
--
-- A stream ID is in streams or here, never in both: the delete moves it in one transaction, and
-- the trigger refuses a stream an ID recorded here (IDs are random UUIDs, so only a bug could
-- reuse one). Removing the files this table names never touches a live stream's data.
create table deleted_streams (
  stream_id text primary key
);
create trigger deleted_streams_not_reused before insert on streams
  when exists (select 1 from deleted_streams where stream_id = new.stream_id)
begin
  select raise(abort, 'the stream id is a deleted stream''s, whose files are being removed');
end;
