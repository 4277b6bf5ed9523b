-- Whether a reader's checkpoint holds back trims and the retention policy: 1 for one registered
-- through a capability without the subscribe right (a read-only token, a readOnly()
-- attenuation), which may read and show its lag but not keep the stream's events from the
-- administrator's trims for good. 0 (every reader registered before this): it holds them.
alter table readers add column no_hold integer not null default 0;
