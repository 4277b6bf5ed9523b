# The itx capability graph: projects -> streams -> subscriptions -> processors.
#
# Conventions (Cap'n Proto evolution rules): fields and methods are only ever added, with the next
# ordinal; nothing is renumbered, renamed on the wire or removed. A zero value means "not set"
# wherever the comment says so, so an old client that never sets a new field gets the default.
#
# Compiling this file: it imports /go.capnp (annotations for the Go code generator only, ignored
# by every other language), shipped in schema/include. From the repository root:
#   mkdir -p out && capnp compile -I schema/include -oc++:out --src-prefix=schema schema/itx.capnp
#
# Errors. Every method fails with a Cap'n Proto exception whose reason contains
#   "itx.<code>: <message>"
# where <code> is the name of an ErrorCode enumerant exactly as written below (for example
# "itx.invalidArgument: event 0: type must not be empty"). RPC libraries prepend their own text
# to the reason ("remote exception: ", "CAPNP-TS116 RPC method failed at ...: ", method names of
# pipelined calls), so find the code as the first "itx.<code>: " anywhere in the reason, never by
# a prefix match. Clients in any language match on the code, never on the message. Every
# exception the server raises follows this, including methods this server does not serve yet
# (exception type "unimplemented", code unavailable). Overload (rateLimited) is sent with the
# exception type "overloaded", the rest as "failed"; a lost session surfaces as "disconnected"
# from the RPC layer itself, with no itx code.
@0xdc5dd5d2e729011e;

using Go = import "/go.capnp";
$Go.package("schema");
$Go.import("github.com/itx-dev/itx/schema");

enum ErrorCode {
  unknown @0;
  invalidArgument @1;      # bad input: nothing of the call was written
  notFound @2;             # no such subscription, reader, capability...
  idempotencyConflict @3;  # the idempotency key is taken by an event with a different body
  offsetConflict @4;       # a conditional append whose expected head offset is not the head
  rateLimited @5;          # the stream's circuit breaker refused a runaway producer
  tooLarge @6;             # an event or a batch over its size limit
  unauthenticated @7;      # unknown token
  deadlineExceeded @8;     # a barrier (waitForEvent, waitUntilProcessed) timed out
  unavailable @9;          # the server is shutting down or the stream cannot be opened
  limitExceeded @10;       # a count cap: subscriptions per stream, inbound copies...
  internal @11;            # a bug or an I/O failure on the server; the call may be retried
  capabilityOffline @12;   # itx-call: no Receiver is mounted under that name
  failedPrecondition @13;  # the target is in the wrong state (e.g. resume of an active subscription)
  cancelled @14;           # the caller went away or closed the connection
  resourceExhausted @15;   # the server's disk is full: nothing of the call was written; retry once space returns
  permissionDenied @16;    # the token's scope (path prefix, rights) or an attenuated capability does not allow it
}

# An error as data (a subscription's last error, a connection's close reason).
struct Error {
  code @0 :ErrorCode;
  message @1 :Text;
}

# One hop of a copied event's provenance: where the copy came from.
struct Hop {
  streamId @0 :Text;
  path @1 :Text;
  offset @2 :UInt64;
  subscription @3 :Text;   # the copy-to-stream subscription's name on the source stream
  cursorChangedAtOffset @4 :UInt64;  # the subscription's seek epoch when it copied
  type @5 :Text;           # the source event's type, before any transform
}

# A committed event as readers, connections and receivers see it.
struct Event {
  offset @0 :UInt64;          # consecutive from 1, shared by durable and ephemeral events
  type @1 :Text;
  payload @2 :Text;           # JSON object text
  createdAt @3 :Int64;        # epoch milliseconds, server clock
  idempotencyKey @4 :Text;    # empty: none
  metadata @5 :Text;          # JSON object text; empty: none
  ephemeral @6 :Bool;
  provenance @7 :List(Hop);   # set on copies, oldest hop first
}

# An event to append.
struct EventInput {
  type @0 :Text;
  payload @1 :Text;           # JSON object text; empty means {}
  idempotencyKey @2 :Text;    # empty: none; not allowed on ephemeral events
  metadata @3 :Text;          # JSON object text; empty: none
  ephemeral @4 :Bool;
}

struct AppendOptions {
  # Conditional append: refused with offsetConflict unless the stream's head offset is
  # expectedHeadOffset when the batch commits (0 = an empty stream).
  conditional @0 :Bool;
  expectedHeadOffset @1 :UInt64;
}

struct AppendResult {
  offsets @0 :List(UInt64);   # one per input event, in input order
  duplicate @1 :List(Bool);   # true where the idempotency key matched an earlier event
  headOffset @2 :UInt64;      # the stream's head offset after the commit
  streamId @3 :Text;
}

struct EventQuery {
  after @0 :UInt64;           # events with offset > after; 0 = from the start
  limit @1 :UInt32;           # 0 = the default page (500); capped at 500. A page also ends
                              # after the event that brings it to 4 MiB (the first always
                              # goes): one shorter than limit is not the end, nextAfter says
                              # where to continue
  types @2 :List(Text);       # empty (or containing "*") = every type
  includeEphemeral @3 :Bool;  # ephemeral events are skipped unless set
  before @4 :UInt64;          # events with offset < before; 0 = no upper bound
  subscription @5 :Text;      # read as this subscription of the stream is delivered: its
                              # filter (types and condition) applies too, and no ephemeral
                              # event; nextAfter passes what it drops (a remote processor host
                              # pages its frames so). Empty: no subscription's filter;
                              # notFound for no such subscription; blank (spaces only):
                              # invalidArgument
}

# The reader's envelope.
struct EventPage {
  events @0 :List(Event);
  streamId @1 :Text;          # empty until the stream's first commit (an append, or a reader's
                              # registration)
  streamMaxOffset @2 :UInt64; # the head offset when the page was read
  nextAfter @3 :UInt64;       # pass as `after` to continue; past filtered-out events too
}

# waitForEvent's one-shot predicate. Every set part must hold.
struct EventPredicate {
  types @0 :List(Text);       # empty = any type
  payloadContains @1 :Text;   # JSON: the payload must contain this value (objects by subset)
  where @2 :Text;             # JSONata over the event; must evaluate to exactly true
  includeEphemeral @3 :Bool;  # ephemeral events appended while waiting always match; this adds
                              # the ones buffered before the call
}

struct StreamInfo {
  path @0 :Text;
  streamId @1 :Text;          # empty: the stream has no commit yet (no append, no reader)
  headOffset @2 :UInt64;
  createdAt @3 :Int64;        # epoch ms of the first commit; 0 if none
  lastAppendAt @4 :Int64;
  subscriptionCount @5 :UInt32;
  loaded @6 :Bool;            # an actor currently holds the stream's database open
  haltedSubscriptions @7 :UInt32;  # subscriptions the retry ladder halted
  maxLag @8 :UInt64;          # the largest head - confirmed of a subscription or registered reader
                              # (both as of the last unload when the stream is not loaded)
  readerCount @9 :UInt32;     # registered readers (Stream.readers), as maxLag
  parkedSubscriptions @10 :UInt32;  # subscriptions parked: their receiver is absent (a remote
                              # processor's host, a mounted capability), as maxLag
  trimmedThrough @11 :UInt64; # Stream.trim deleted the events through here (stream/* records
                              # kept); 0: nothing trimmed. Set by describe, not by list.
  retentionMaxAgeMs @12 :Int64;   # Stream.setRetention's policy (0: none). Set by describe.
  retentionMaxEvents @13 :UInt64;
  retentionMaxBytes @14 :UInt64;  # Stream.setRetention's size bound (0: none). Set by describe.
  # Why the stream cannot be served from its database ("": it can): its file lost, damaged or
  # one itxd may not open, as the last load or read since itxd started met it (its calls answer
  # unavailable naming the file), until it loads again (README, Damaged storage). Set by list.
  unavailable @15 :Text;
}

# Where the disk goes: one stream's files (Streams.diskUsage).
struct StreamDiskUsage {
  path @0 :Text;
  streamId @1 :Text;
  diskBytes @2 :UInt64;       # its database, write-ahead log and shared-memory file, read now
  headOffset @3 :UInt64;
}

struct ProjectInfo {
  id @0 :Text;
  name @1 :Text;
  deployment @2 :Bool;        # the deployment root: its streams are global
}

# --- subscriptions ---------------------------------------------------------------------------

# Where a new subscription's delivery starts. The default, beginning, delivers the whole log from
# offset 1, and that includes the stream's own stream/* records (the subscription-configured
# event that created this very subscription among them): filter with filterTypes, or skip types
# starting with "stream/", if the receiver wants only application events. now starts after the
# birth event.
enum StartPosition {
  beginning @0;               # the default: deliver from offset 1, stream/* records included
  now @1;                     # deliver events appended after the birth event
}

enum FailingEventPolicy {
  halt @0;                    # retry the ladder, then halt (copy-to-stream always halts)
  skip @1;                    # skip an event after repeated failures on it alone
}

struct SubscriptionConfig {
  name @0 :Text;              # empty: generated as "subscription:<birth offset>"
  receiver :union {
    webhookPost :group {
      url @1 :Text;
      headers @2 :List(Header);   # recorded in the configured event as given: the stream's readers see them
      secret @3 :Text;        # Standard Webhooks signing secret ("whsec_..."); empty: unsigned
    }
    copyToStream :group {
      path @4 :Text;          # the receiving stream in the same project
    }
    itxCall :group {
      capability @5 :Text;    # the name a Receiver is mounted under in the project
    }
    processorWake :group {
      placement @6 :Text;     # "in-process" (default; the seed's "facet" means it too) or "remote"
      processor @15 :Text;    # the registered contract this instance runs; empty: the
                              # subscription's name (two names may run one contract)
    }
  }
  filterTypes @7 :List(Text);         # empty: every type
  filterCondition @8 :Text;           # JSONata; must evaluate to exactly true
  transform @9 :Text;                 # JSONata over the event; not allowed on processorWake
  start @10 :StartPosition;           # default beginning: stream/* records included
  onFailingEvent @11 :FailingEventPolicy;
  description @12 :Text;
  # Per-subscription delivery controls (0: the kind's default). maxDeliveryEvents: events per
  # delivery, 1..1000 (default 1,000; webhook-post 1, and above 1 a webhook's body carries an
  # "events" array). maxDeliveryBytes: bytes per delivery, 1..1 MiB (default 1 MiB); the first
  # event of a delivery always goes.
  maxDeliveryEvents @13 :UInt32;
  maxDeliveryBytes @14 :UInt32;
  # onFailingEvent skip only: a stream of the same project (created if absent) where each skipped
  # event lands, once, as an "itx.dead-letter" event carrying it whole with its error; the skip
  # waits until it has landed. Empty: skipped events leave only a stream/error-occurred record.
  deadLetterPath @16 :Text;
  # Offset-acking (itx-call and webhook-post only; 0: off). A receiver's answer then says what it
  # took, not what it made durable: the batch counts as delivered, its confirmedOffset (0: none
  # yet) confirms through an offset, and so does Subscription.confirm later. Delivery goes on
  # while at most confirmWindow events (1..10,000) are delivered and not confirmed; the
  # unconfirmed ones are delivered again after a failure, a new mount of the receiver's name, or
  # a restart. Without it, an answer confirms the batch (or through its confirmedOffset).
  confirmWindow @17 :UInt32;
}

struct Header {
  name @0 :Text;
  value @1 :Text;
}

enum SubscriptionStatus {
  active @0;
  halted @1;   # the retry ladder ended, or a failure that can never succeed; resume un-halts
  parked @2;   # the receiver is absent (nothing mounted under its name): no attempts are burnt,
               # and the receiver's next mount resumes delivery at once
}

# A row of subscriptions.list(): the catalog joined with the cursor row.
struct SubscriptionSummary {
  name @0 :Text;
  kind @1 :Text;              # webhook-post | copy-to-stream | itx-call | processor-wake, or
                              # reader: a registered reader (checkpoint in confirmedOffset)
  status @2 :SubscriptionStatus;
  confirmedOffset @3 :UInt64;
  lag @4 :UInt64;             # head - confirmed
  lastError @5 :Text;
  configuredAtOffset @6 :UInt64; # see SubscriptionDescription.configuredAtOffset
  attempt @7 :UInt32;         # failed attempts in a row (the retry ladder's rung; 0: none)
  nextAttemptAt @8 :Int64;    # epoch ms of the next retry; 0: none due
  deliveredOffset @9 :UInt64; # delivered through here (offset-acking: ahead of confirmedOffset
                              # by what the receiver took and has not confirmed)
}

# describe(): the config and the whole cursor row.
struct SubscriptionDescription {
  config @0 :SubscriptionConfig;
  kind @1 :Text;
  status @2 :SubscriptionStatus;
  # The epoch that fences a former occupant's late answers: the offset of the
  # stream/subscription-configured event that set the config in force. Its birth, moved to the
  # new event by each changed config (a new occupant of the name, as in iterate/iterate), not by
  # a configure with the same config.
  configuredAtOffset @3 :UInt64;
  cursorChangedAtOffset @4 :UInt64; # seek epoch
  confirmedOffset @5 :UInt64;       # the far side durably claims through here
  headOffset @6 :UInt64;
  attempt @7 :UInt32;
  nextAttemptAt @8 :Int64;          # epoch ms; 0: none due
  failingEventOffset @9 :UInt64;
  failingEventAttempt @10 :UInt32;
  failingEventSkipsSinceLastSuccess @11 :UInt32;
  lastError @12 :Text;
  inFlightDeadlineAt @13 :Int64;
  inFlightConnectionGeneration @14 :UInt64;
  updatedAt @15 :Text;
  # A webhook's signing secret is kept apart from the log: config.receiver.secret holds only its
  # reference ("itxsecret:<fingerprint>"), never the secret. secretSet says whether one is set.
  secretSet @16 :Bool;
  deliveredOffset @17 :UInt64;      # see SubscriptionSummary.deliveredOffset
}

interface Subscriptions {
  list @0 () -> (subscriptions :List(SubscriptionSummary));
  get @1 (name :Text) -> (subscription :Subscription);
  # Appends stream/subscription-configured; returns the name and the offset of the configured
  # event that set the config. Idempotent: the same name with the same config appends nothing
  # and returns the original offset (the cursor, and a halt, stay as they are); a changed config
  # appends and keeps the cursor unless it changes the receiver kind or the start position. A
  # config without a name needs idempotencyKey, and a retry with it returns the original event
  # and generated name.
  configure @2 (config :SubscriptionConfig, idempotencyKey :Text) -> (name :Text, offset :UInt64);
  # Appends stream/subscription-removed.
  remove @3 (name :Text) -> (offset :UInt64);
}

interface Subscription {
  describe @0 () -> (description :SubscriptionDescription);
  # Resolves once the subscription has processed through offset (its confirmed cursor, a filter
  # watermark included) and that cursor is on disk; deadlineExceeded after timeoutMs (0: 20 s).
  waitUntilProcessed @1 (offset :UInt64, timeoutMs :UInt32) -> (confirmedOffset :UInt64);
  # Present only for processor-wake subscriptions (failedPrecondition for another kind).
  processor @2 () -> (processor :Processor);
  # Offset-acking subscriptions (confirmWindow): confirm what the receiver made durable, through
  # offset (at most what was delivered: invalidArgument past it); returns the confirmed cursor
  # once it is written. An offset at or below it changes nothing. failedPrecondition on a
  # subscription without confirmWindow.
  confirm @3 (offset :UInt64) -> (confirmedOffset :UInt64);
}

# --- connections, receivers, readers, live state ---------------------------------------------

struct ConnectionOptions {
  after @0 :UInt64;             # deliver events with offset > after (beyond the head: invalidArgument)
  maxDeliveryEvents @1 :UInt32; # 0: 1,000; at most 10,000 (more: invalidArgument)
  maxDeliveryBytes @2 :UInt32;  # 0: 1 MiB; at most 8 MiB (more: invalidArgument); the first
                                # event of a batch always goes
  noState @3 :Bool;             # state: false - no live-state frames on this connection
  openedBy @4 :Text;            # who opened it, shown in the stream's live state
  types @5 :List(Text);         # empty: every type
  key @6 :Text;                 # shares the subscription name space; opening an open key
                                # replaces that connection (closed: replaced) when it was opened
                                # with the same token, else permissionDenied; empty: generated;
                                # blank (spaces only): invalidArgument
  includeEphemeral @7 :Bool;    # catch-up includes buffered ephemeral events from before the
                                # open (those appended while open are always delivered)
  expectedStreamId @8 :Text;    # set: after is an offset of this stream (a DeliveryBatch's
                                # streamId); the path holding another stream, or none (the one
                                # meant was deleted, perhaps made anew, its offsets starting
                                # over), refuses the open, notFound, delivering nothing
}

# Why a connection closed: a closed set to switch on.
enum CloseReason {
  closedByClient @0;
  replaced @1;
  serverShuttingDown @2;
  streamRemoved @3;
  slowConsumer @4;              # a batch was not accepted within the delivery timeout (20 s)
  deliveryFailed @5;            # the sink answered a batch with an exception
  connectionLost @6;            # the client's RPC session ended
  accessEnded @7;               # the token that opened it was revoked or expired (another login
                                # may keep the RPC session)
  subscriptionRemoved @8;       # a processor's live view: its subscription was removed
}

struct DeliveryBatch {
  streamId @0 :Text;
  path @1 :Text;
  events @2 :List(Event);
  headOffset @3 :UInt64;
  subscription @4 :Text;        # set for subscription deliveries
  cursorChangedAtOffset @5 :UInt64; # the subscription's seek epoch
  configuredAtOffset @6 :UInt64;    # the subscription's config epoch (its birth, moved by a
                                    # changed config: SubscriptionDescription.configuredAtOffset)
  deliveryId @7 :Text;          # stable across redeliveries of the same range
  attempt @8 :UInt32;           # 1 on the first try
}

# Implemented by the client; the server pushes a connection's events into it, in order. Up to 4
# batches are in flight; returning from deliver accepts one.
interface EventSink {
  deliver @0 (batch :DeliveryBatch) -> ();
  # The last call: the connection closed. why is the reason to switch on.
  closed @1 (reason :Error, why :CloseReason) -> ();
  # The stream's live state (unless noState): a snapshot, then RFC 6902 patches, one revision
  # each; a patch whose revision is not the last plus one means frames were missed.
  state @2 (revision :UInt64, snapshot :Bool, json :Text) -> ();
}

interface Connection {
  close @0 (reason :Text) -> ();
  # The stream's head and the offset this connection delivered through (the sink answered every
  # batch up to it, or the filter passed over the events). It first waits, at most a second, for
  # the answers to the batches already sent, so a client whose sink holds the events through n
  # pings back at least n.
  ping @1 () -> (headOffset :UInt64, deliveredOffset :UInt64);
  key @2 () -> (key :Text);
}

# Implemented by a client and mounted under a name (Project.capabilities); itx-call subscriptions
# deliver to it. Returning acknowledges the batch (confirmedOffset 0) or through confirmedOffset.
interface Receiver {
  receive @0 (batch :DeliveryBatch) -> (confirmedOffset :UInt64);
}

# A registration handle: cancel() (or releasing the last reference) ends what it stands for.
interface Handle {
  cancel @0 () -> ();
}

struct MountInfo {
  name @0 :Text;
  mountedAt @1 :Int64;
  contracts @2 :List(ProcessorContract);  # ProcessorHosts.list: the contracts the host announced
  # The stream prefix of the session that mounted it ("": a whole-project session). Mounts are
  # namespaced by it: a subscription configured by a token limited to a prefix reaches only the
  # mounts made under that prefix, and a whole-project one only the whole project's.
  scope @3 :Text;
}

# Receivers mounted under names, namespaced by the mounting token's path prefix (MountInfo.scope):
# an itx-call subscription reaches only the mounts of the scope it was configured under; a scoped
# token mounts, unmounts and lists its own scope's, a whole-project token lists every scope's.
# A mount is its token's: mounting or unmounting a name another token's mount holds is
# permissionDenied (the admin right unmounts it); the same token's mount is replaced.
interface Capabilities {
  mount @0 (name :Text, receiver :Receiver) -> (handle :Handle);
  unmount @1 (name :Text) -> ();
  list @2 () -> (mounts :List(MountInfo));
}

struct ReaderInfo {
  name @0 :Text;
  checkpoint @1 :UInt64;
  lag @2 :UInt64;
  updatedAt @3 :Int64;
}

interface Readers {
  # Registers or moves a named reader's checkpoint (at most the head, invalidArgument past it;
  # its lag becomes visible). Stored with the stream; no delivery obligation. On a path with no
  # append yet the head is 0: registering there creates the stream (limitExceeded past
  # --max-streams-per-project, writing nothing; notFound for a caller without the subscribe
  # right, which may not create streams). failedPrecondition for the name of one of its
  # subscriptions; permissionDenied for a reader another token registered (only a login with
  # that token, or the admin right, moves or removes it).
  register @0 (name :Text, checkpoint :UInt64) -> ();
  list @1 () -> (readers :List(ReaderInfo));
  # notFound for a name that is not registered.
  remove @2 (name :Text) -> ();
}

# Implemented by the client: a live-state projection, snapshot then RFC 6902 patches.
interface LiveSubscriber {
  snapshot @0 (revision :UInt64, state :Text) -> ();
  patch @1 (revision :UInt64, ops :Text) -> ();
  # The last call when the server ends the view (not after the client's own cancel): why is the
  # reason to switch on (serverShuttingDown, streamRemoved, accessEnded, subscriptionRemoved).
  closed @2 (reason :Error, why :CloseReason) -> ();
}

# --- processors ------------------------------------------------------------------------------

struct WakeRequest {
  streamId @0 :Text;
  path @1 :Text;
  name @2 :Text;                # the subscription name: the processor instance
  events @3 :List(Event);       # unused: the host pages the stream itself
  headOffset @4 :UInt64;
  generation @5 :UInt64;        # the mount generation: ports of an earlier one refuse writes
  stream @6 :Stream;            # the home stream: the host reads pages and appends through it
  ports @7 :ProcessorPorts;     # the processor's progress, KV and alarm, kept on the stream
  alarm @8 :Bool;               # an alarm fire: run the keepalive (revival), not a catch-up
  reprocessFrom @9 :UInt64;     # an operator's rewind (a cursor-set): reprocess from this offset
                                # first (0: none); the ports' commits then honor it
  processor @10 :Text;          # the contract the instance `name` runs (empty: name itself)
  progressGeneration @11 :UInt64; # the generation of the instance's progress record when itxd
                                # woke the host: a runner holding an older one was fenced since
                                # (claimed elsewhere) and must not run effects
}

struct WakeReport {
  processedOffset @0 :UInt64;
  reducedOffset @1 :UInt64;
  # Set when the catch-up failed on an event (a hook returned an error or panicked on it): the
  # wake failed, failure says why (as an exception's reason would), and failingEventOffset is
  # the event, shown as the subscription's failingEventOffset. A failure that names no event
  # comes back as an exception.
  failingEventOffset @2 :UInt64;
  failure @3 :Text;
}

# A contract a processor host announces when it mounts.
struct ProcessorContract {
  name @0 :Text;
  reducerVersion @1 :Text;
  consumedTypes @2 :List(Text);
  initialState @3 :Text;        # the contract's initial state (JSON; empty: not announced): what
                                # snapshot() answers for an instance with no committed record yet
}

# Implemented by a remote process running the processor SDK.
interface ProcessorHost {
  # Catch the named processor up to headOffset (or, with alarm, service its keepalive) and
  # report its committed cursors.
  wake @0 (request :WakeRequest) -> (report :WakeReport);
  # The processor's runtime state on this host (JSON), as getRuntimeState shows it.
  getRuntimeState @1 (streamId :Text, path :Text, name :Text) -> (state :Text);
  # The processor-wake subscription `name` on the stream was removed (or placed elsewhere):
  # end the host's session of it. Best effort: a host that does not implement it keeps the
  # session until its connection ends.
  stop @2 (streamId :Text, name :Text) -> ();
}

# Served by itxd to a remote host, per wake: one processor's durable records on its stream,
# written through the stream's single writer. Fenced: after another host mounts the contract,
# every call fails failedPrecondition.
interface ProcessorPorts {
  # Claim the progress record (bumping its generation); progress is its JSON, empty if none.
  claim @0 (name :Text) -> (progress :Text, generation :UInt64);
  # Replace the record if generation is still current.
  commit @1 (name :Text, generation :UInt64, progress :Text) -> ();
  kvGet @2 (key :Text) -> (value :Data, found :Bool);
  kvPut @3 (key :Text, value :Data) -> ();
  # The processor's alarm slice (epoch ms; 0 disarms). itxd wakes the host with alarm set then.
  setAlarm @4 (at :Int64) -> ();
  # Fail failedPrecondition, as commit would, if generation is no longer the record's current
  # one: the runner asks before a frame's effects.
  check @5 (name :Text, generation :UInt64) -> ();
  # Delete a key (absent: no error).
  kvDelete @6 (key :Text) -> ();
  # Append to another stream of the project, under the subscription's scope (a processor's
  # forward: Args.AppendTo); stream/* control events are refused. Fenced like the others. With
  # the home stream's path it is the processor's own Append, taken as Stream.append takes it
  # but refused once another host took the processor over, and held to the processor: a
  # stream/processor-revived naming another processor is permissionDenied. sourceOffset (0: not said) is the
  # home event the forward comes from and processedThrough the processor's committed cursor then
  # (itx.EffectOrigin): to another stream, a forward from an event above that cursor keeps its
  # key in the receiving stream past a trim, so made again after a crash it is still a
  # duplicate. A host that does not say gets the key's dedup alone.
  appendTo @7 (path :Text, events :List(EventInput), sourceOffset :UInt64, processedThrough :UInt64) -> (result :AppendResult);
  # The processor's ScheduleAppend on its home stream, as Stream.schedule takes it, but refused
  # once another host took the processor over.
  schedule @8 (event :EventInput, dueAt :Int64) -> (dueAt :Int64, appendedOffset :UInt64);
}

interface ProcessorHosts {
  # Mount a host under a name, announcing its contracts; a processor-wake subscription placed
  # remote is woken on the host that announced its name. Mounts are namespaced by the mounting
  # token's path prefix (MountInfo.scope): a subscription reaches only the hosts of the scope it
  # was configured under. A later mount announcing the same contract in the same scope takes it
  # over (fencing the earlier host) when made with the same token; another token's mount of a
  # contract or a name held is permissionDenied. Keep the handle: releasing it, or disconnecting, unmounts.
  mount @0 (name :Text, host :ProcessorHost, contracts :List(ProcessorContract)) -> (handle :Handle);
  list @1 () -> (mounts :List(MountInfo));
}

interface Processor {
  # The committed record: the reduced state (JSON; before any commit the contract's initial
  # state), the offset it is reduced through and the processing cursor (every effect at or
  # below it done). reducedOffset may lag processedOffset (a refold in progress), never lead it.
  snapshot @0 () -> (state :Text, reducedOffset :UInt64, processedOffset :UInt64);
  # Runtime state, not durable truth (JSON object): name, placement ("in-process" or "remote",
  # with host and mountGeneration), reducerVersion, reducedThrough and processedThrough (the
  # cursors), cursorRevision (rewinds taken), observedHead (the highest offset this incarnation
  # saw), generation (its claim on the progress record) and fenced (why it may no longer
  # commit; absent while it may).
  getRuntimeState @1 () -> (state :Text);
  liveState @2 (subscriber :LiveSubscriber) -> (handle :Handle);
}

# --- the graph -------------------------------------------------------------------------------

interface Stream {
  append @0 (events :List(EventInput), options :AppendOptions) -> (result :AppendResult);
  # One page's events alone: at most 500 (a larger limit is capped, as the TypeScript's
  # getEvents caps it, not refused) or 4 MiB. Without the envelope it cannot say whether more
  # follow, and a page shorter than the limit is not the end (cut at 4 MiB, or by a
  # subscription's condition): a reader that pages uses getEventPage, whose nextAfter and
  # streamMaxOffset say where to go on and where the stream ends.
  getEvents @1 (query :EventQuery) -> (events :List(Event));
  getEventPage @2 (query :EventQuery) -> (page :EventPage);
  # One-shot log barrier: the first event after `after` matching the predicate;
  # deadlineExceeded after timeoutMs (0: 20 s). An `after` beyond the head is invalidArgument.
  waitForEvent @3 (predicate :EventPredicate, after :UInt64, timeoutMs :UInt32) -> (event :Event);
  describe @4 () -> (info :StreamInfo);
  subscriptions @5 () -> (subscriptions :Subscriptions);
  setSubscriptionCursor @6 (name :Text, afterOffset :UInt64) -> (offset :UInt64);
  resumeSubscription @7 (name :Text) -> (offset :UInt64);
  openConnection @8 (options :ConnectionOptions, sink :EventSink) -> (connection :Connection);
  readers @9 () -> (readers :Readers);
  liveState @10 (subscriber :LiveSubscriber) -> (handle :Handle);
  # Attenuation: a narrower capability to this stream, to hand to someone else over RPC without a
  # new token. readOnly serves only reads (getEvents, getEventPage, waitForEvent, describe,
  # openConnection, liveState, listings) and readers (a reader's checkpoint is a reader's own
  # bookkeeping: a read-only holder registers readers, moves and removes those of its own
  # token, and a registered checkpoint holds back trims); appendOnly only append. Both keep the holder's own
  # limits (never more than this capability), and die with the session that minted them or when
  # released. Calls they do not allow fail with permissionDenied.
  readOnly @11 () -> (stream :Stream);
  appendOnly @12 () -> (stream :Stream);
  # Durable timers: append event at dueAt (epoch ms; a time past means at once), exactly once,
  # surviving unloads, crashes and restarts. Its idempotencyKey (required) names it: scheduling
  # the key again moves it; a key already in the log schedules nothing and returns its offset in
  # appendedOffset (idempotencyConflict if the log holds it with another body, as for an append).
  # The stream must exist (notFound before its first commit: an append or a reader's
  # registration). Needs the append right;
  # listScheduled needs read.
  schedule @13 (event :EventInput, dueAt :Int64) -> (dueAt :Int64, appendedOffset :UInt64);
  cancelScheduled @14 (key :Text) -> (cancelled :Bool);
  listScheduled @15 () -> (scheduled :List(ScheduledEvent));
  # Retention: deletes the stream's events through throughOffset and/or created before
  # createdBefore (epoch ms) for good (0: no such bound; at least one is needed), except its
  # stream/* records (the subscription catalog is reduced from them), never past what every
  # consumer holds: the lowest confirmed offset of its subscriptions, checkpoint of its
  # registered readers and delivered offset of its open connections. trimmedThrough is how far
  # the stream is trimmed now, deleted how many events this call deleted. Offsets are never
  # reissued; reads pass the gap. The idempotency keys of deleted events are forgotten. Needs
  # the admin right.
  trim @16 (throughOffset :UInt64, createdBefore :Int64) -> (trimmedThrough :UInt64, deleted :UInt64);
  # A retention policy the stream keeps and applies itself, as trim does (the same floor, the
  # stream/* records kept): the events created more than maxAgeMs ago (0: no age bound; at least
  # a minute), those more than maxEvents offsets below the head (0: no count bound) and the
  # oldest ones while the events a trim could delete come to more than maxBytes (type, payload,
  # metadata and idempotency key; 0: no size bound) go, when it loads and at most once a minute
  # while it is appended to. All 0 clears it. Stored with the stream. Needs the admin right.
  setRetention @17 (maxAgeMs :Int64, maxEvents :UInt64, maxBytes :UInt64) -> ();
}

# A pending scheduled append (Stream.schedule).
struct ScheduledEvent {
  event @0 :EventInput;   # named by its idempotencyKey
  dueAt @1 :Int64;        # epoch ms
}

interface Streams {
  # Pipelinable: the path is validated here, and a bad one fails every call made on the result.
  get @0 (path :Text) -> (stream :Stream);
  # A page of the project's streams whose path begins with prefix as a string (unlike a token's
  # scope: "/a" lists "/ab" too, "/a/" only the streams below "/a"; empty or "/": every stream), in
  # path order, after the path `after` (exclusive; empty: from the first). limit 0 means 1,000;
  # above 10,000 is invalidArgument (not capped). nextAfter is the last path of the page when more
  # follow, empty on the last page.
  list @1 (prefix :Text, after :Text, limit :UInt32) -> (streams :List(StreamInfo), nextAfter :Text);
  # Deletes the stream at path: its events, subscriptions, readers, scheduled appends and
  # processors' records, at once and for good (the admin right; the deployment's /audit never).
  # Its connections close (streamRemoved), its live views end, barriers waiting on it fail
  # notFound. Refused (failedPrecondition, nothing deleted) while it has subscriptions,
  # registered readers or open connections, unless force. The next append to the path creates
  # a new stream, from offset 1, under a new streamId. headOffset: the deleted stream's head.
  # A stream whose database cannot be opened or read (lost or damaged) is refused
  # (failedPrecondition) unless force, and deleted unread with it: unread is then true and
  # headOffset the head its directory entry last recorded.
  remove @2 (path :Text, force :Bool) -> (headOffset :UInt64, streamId :Text, unread :Bool);
  # list's page, with the size of each stream's files on disk read now (a few stats per stream):
  # where a project's disk goes (itx du). Apart from list, whose answers follow the log alone.
  diskUsage @3 (prefix :Text, after :Text, limit :UInt32) -> (streams :List(StreamDiskUsage), nextAfter :Text);
}

interface Project {
  streams @0 () -> (streams :Streams);
  capabilities @1 () -> (capabilities :Capabilities);
  processors @2 () -> (processors :ProcessorHosts);
  describe @3 () -> (info :ProjectInfo);
  # Administration: from the deployment root, every project; from a project token with the admin
  # right, that project's tokens. permissionDenied otherwise.
  admin @4 () -> (admin :Admin);
}

# --- access ----------------------------------------------------------------------------------

enum Right {
  read @0;       # getEvents, getEventPage, waitForEvent, describe, connections, live state, listings
  append @1;     # append
  subscribe @2;  # subscriptions: configure, remove, cursor-set, resume; mount receivers
  admin @3;      # Project.admin: the project's tokens (the deployment root: every project)
}

# What a token may do. A zero scope (no prefix, no rights) is the whole project.
struct TokenScope {
  prefix @0 :Text;          # a stream path prefix, by segments ("/a" holds "/a" and "/a/b", not "/ab"); empty: every path
  rights @1 :List(Right);   # empty: every right
}

# A token as listings show it: never its secret.
struct TokenInfo {
  id @0 :Text;
  projectId @1 :Text;
  label @2 :Text;
  createdAt @3 :Int64;      # epoch ms
  lastUsedAt @4 :Int64;     # epoch ms of its last login; 0: never
  expiresAt @5 :Int64;      # epoch ms; 0: never
  scope @6 :TokenScope;
}

struct ProjectSummary {
  info @0 :ProjectInfo;
  createdAt @1 :Int64;
  streamCount @2 :UInt32;
}

# Administration of projects and tokens. Tokens are returned once, at creation, and kept only
# hashed. Every change is recorded in the deployment's /audit stream.
interface Admin {
  createProject @0 (name :Text) -> (info :ProjectInfo, token :Text, tokenInfo :TokenInfo);
  # A page of the projects (the caller's own project only, unless it is the deployment's), in id
  # order, after the id `after` (exclusive; empty: from the first). limit 0 means 1,000; above
  # 10,000 is invalidArgument (not capped). nextAfter is the last id of the page when more follow,
  # empty on the last page.
  listProjects @1 (after :Text, limit :UInt32) -> (projects :List(ProjectSummary), nextAfter :Text);
  renameProject @2 (projectId :Text, name :Text) -> ();
  # failedPrecondition while the project has streams, unless force: then its streams and their
  # files are deleted too. Its tokens stop working at once.
  deleteProject @3 (projectId :Text, force :Bool) -> ();
  # projectId empty: the caller's own project (so for listTokens and revokeToken). expiresAt 0:
  # never; a caller whose own token expires must expire the new one no later (permissionDenied
  # otherwise). The scope must fit inside the caller's own (its prefix at or below the caller's,
  # its rights among the caller's; the same scope fits): permissionDenied otherwise.
  createToken @4 (projectId :Text, label :Text, expiresAt :Int64, scope :TokenScope) -> (token :Text, info :TokenInfo);
  listTokens @5 (projectId :Text) -> (tokens :List(TokenInfo));
  # At once: sessions logged in with it are disconnected.
  revokeToken @6 (projectId :Text, tokenId :Text) -> ();
  # The deployment root only (it copies every project). Writes a copy of the whole data
  # directory, as it stood at one instant, to path: an absolute path on the server's file system
  # that does not exist, outside the data directory, in a folder that does (invalidArgument,
  # failedPrecondition otherwise; failedPrecondition while another backup runs). Start itxd with
  # --data on it to restore. Every append acknowledged before the instant is in the copy, none
  # after it: the copy is what a kill -9 at that instant would have left. Loaded streams stand
  # still while the instant is taken (frozenMicros); the copy is written after, while they run.
  backup @7 (path :Text) -> (result :BackupResult);
  # The deployment root only, with the read right as well. The same copy, sent to the caller's sink instead of written to a
  # path on the server (itxd writes it to a scratch folder in its data directory first, and
  # deletes it after): for a server the operator has no shell on. result.path is empty.
  download @8 (sink :BackupSink) -> (result :BackupResult);
}

# A client's end of Admin.download: itxd writes the copy's files to it, one after another, each
# in parts of at most 1 MiB in order (offset 0, then each part's end). Paths are relative and
# one of directory.db, credentials.json, streams/<stream id>.db. An exception from write ends
# the download (nothing is left on the server).
interface BackupSink {
  write @0 (path :Text, offset :UInt64, data :Data) -> ();
}

struct BackupResult {
  path @0 :Text;
  streams @1 :UInt32;      # stream databases copied
  bytes @2 :UInt64;        # bytes of the database files written
  at @3 :Int64;            # the instant the copy holds, epoch ms
  frozenMicros @4 :Int64;  # how long appends to loaded streams waited for the instant
}

# The bootstrap capability.
interface Gateway {
  # A project token yields that project; the deployment token yields the deployment root,
  # whose streams are global.
  login @0 (token :Text) -> (project :Project);
  version @1 () -> (server :Text, protocol :UInt32);
}
