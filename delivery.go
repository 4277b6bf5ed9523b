package itx

// Subscription statuses, as a cursor row stores them and list/describe report them.
const (
	StatusActive = "active"
	StatusHalted = "halted"
	// StatusParked: the receiver is absent (nothing mounted under its name). No attempts are
	// burnt and no retry is scheduled; the receiver's next mount resumes delivery.
	StatusParked = "parked"
)

// SubscriptionSummary is a row of Subscriptions.list: the catalog joined with the cursor row.
type SubscriptionSummary struct {
	Name               string
	Kind               string
	Status             string // StatusActive, StatusHalted or StatusParked
	ConfirmedOffset    int64
	DeliveredOffset    int64 // delivered through here: ahead of ConfirmedOffset only while offset-acking
	Lag                int64 // head - confirmed
	LastError          string
	ConfiguredAtOffset int64
	Attempt            int   // failed attempts in a row (0: none)
	NextAttemptAt      int64 // epoch ms of the next retry (0: none due)
}

// CursorState is a subscription's delivery position and retry state, as describe reports it.
type CursorState struct {
	Status                string // StatusActive, StatusHalted or StatusParked
	ConfiguredAtOffset    int64  // config epoch: the configured event in force (its birth, moved by a changed config)
	CursorChangedAtOffset int64  // seek epoch
	ConfirmedOffset       int64
	DeliveredOffset       int64 // delivered through here: ahead of ConfirmedOffset only while offset-acking

	Attempt             int
	NextAttemptAt       int64 // epoch ms
	FailingEventOffset  int64
	FailingEventAttempt int
	FailingEventSkips   int // since the last success
	LastError           string

	InFlightDeadlineAt           int64 // epoch ms
	InFlightConnectionGeneration int64
	UpdatedAt                    string
}

// SubscriptionDescription is a subscription's config and its whole cursor state.
type SubscriptionDescription struct {
	Config     SubscriptionConfig
	Kind       string
	HeadOffset int64
	// SecretSet: a webhook signing secret is set (Config holds only its reference).
	SecretSet bool
	CursorState
}

// DeliveryEnvelope says where a delivery comes from and which attempt it is.
type DeliveryEnvelope struct {
	ProjectID             string `json:"projectId"`
	StreamID              string `json:"streamId"`
	Path                  string `json:"path"`
	Subscription          string `json:"subscription"`
	ConfiguredAtOffset    int64  `json:"configuredAtOffset"`
	CursorChangedAtOffset int64  `json:"cursorChangedAtOffset"`
	DeliveryID            string `json:"deliveryId"` // stable across retries of the same range
	Attempt               int    `json:"attempt"`
	HeadOffset            int64  `json:"headOffset"`
}

// DeliveryBatch is what a push receiver is given: events of one stream, in offset order.
type DeliveryBatch struct {
	DeliveryEnvelope
	Events []Event `json:"events"`
}

// WebhookBody is the JSON body of one webhook delivery: the batch's envelope with its one event.
type WebhookBody struct {
	DeliveryEnvelope
	Event Event `json:"event"`
}

// WebhookBatchBody is the body of a webhook subscription that asked for more than one event per
// delivery (maxDeliveryEvents above 1): the envelope and the delivery's events, in offset order.
// A 2xx acknowledges them all.
type WebhookBatchBody = DeliveryBatch
