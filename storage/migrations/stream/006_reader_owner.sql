-- The token that registered each reader: a reader's checkpoint holds back trims and its lag is
-- its own, so only a login with that token (or the admin right) moves or removes it. '': a
-- reader registered before this, or by the server itself: anyone who may register moves it,
-- and the first token that does owns it.
alter table readers add column owner text not null default '';
