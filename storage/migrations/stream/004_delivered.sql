-- Offset-acking subscriptions (confirmWindow): the highest offset delivered to the receiver, which
-- it may confirm up to (Subscription.confirm). Beside the seed's cursor table rather than in it;
-- a row only while it is above 0, written and deleted with its cursor row.
create table subscription_delivered (
  name             text primary key,
  delivered_offset integer not null
);
