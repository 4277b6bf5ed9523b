-- Access: many tokens per project, each with a label, an optional expiry and a scope (a path
-- prefix and a set of rights), kept only as the sha256 of the token. A project's first token
-- (projects.token_hash, from before tokens had their own table) becomes its "initial" token;
-- projects.token_hash is no longer read.
create table tokens (
  id           text primary key,
  project_id   text not null references projects (id) on delete cascade,
  label        text not null,
  token_hash   text not null unique,
  prefix       text not null default '',   -- a stream path prefix by segments; '': every path
  rights       text not null default '',   -- comma-separated rights; '': every right
  created_at   integer not null,
  last_used_at integer not null default 0,
  expires_at   integer not null default 0  -- epoch ms; 0: never
);
create index tokens_by_project on tokens (project_id);
insert into tokens (id, project_id, label, token_hash, created_at)
  select 'tok_' || id, id, 'initial', token_hash, created_at from projects;

-- Webhook signing secrets, kept out of the streams' logs: a subscription's configured event
-- records only the reference (an HMAC of the secret under the server's key, see settings).
create table secrets (
  project_id text not null references projects (id) on delete cascade,
  ref        text not null,
  secret     text not null,
  created_at integer not null,
  primary key (project_id, ref)
);

-- Server-wide settings: the key secret references are computed with.
create table settings (
  key   text primary key,
  value blob not null
);
