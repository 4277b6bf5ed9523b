-- Which streams' subscription catalogs reference which webhook secrets, so a secret nothing
-- references any more (a configure refused, a subscription removed or reconfigured without it,
-- a crash between storing it and the configure's commit) is deleted. A stream's rows are a
-- superset of its committed catalog's references: added before the commit that references a
-- secret, removed after the commit that drops it, and rewritten exactly when the stream unloads
-- and, for streams marked stale, when itxd starts.
create table secret_uses (
  stream_id  text not null,
  project_id text not null,
  ref        text not null,
  primary key (stream_id, ref)
);
create index secret_uses_by_ref on secret_uses (project_id, ref);
-- Secrets stored before this table have no rows yet: mark the streams of projects holding any
-- stale, so the next start reads their catalogs (once) before it deletes anything.
update streams set summary_stale = 1 where project_id in (select project_id from secrets);
