-- The records of administrative changes (project and token creation, renaming, revocation,
-- deletion) on their way to the deployment's /audit stream. Each is inserted in the transaction
-- that makes its change and deleted once its event is in /audit, so a crash between the two
-- leaves it here and the next start appends it (its id keys the event: a repeat is a duplicate).
create table audit_outbox (
  id      text primary key,
  type    text not null,
  payload blob not null
);
