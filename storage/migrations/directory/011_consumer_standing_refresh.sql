-- Migration 007 added the consumer standing (halted_subscriptions, max_lag) with 0 for every
-- stream already listed and marked none stale, so a directory from before it listed each
-- unloaded stream as having no halted subscription and no lag until that stream was next
-- loaded and unloaded (some never are). Mark stale every stream whose standing may be that
-- default, so the next start refreshes it from the stream's own database (once: the refresh
-- clears the mark; a stream truly at 0 and 0 costs one open).
update streams set summary_stale = 1 where halted_subscriptions = 0 and max_lag = 0;
