package itx

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/net/http/httpguts"
)

// The stream's own control event types, reduced by the core processor before commit.
const (
	TypeSubscriptionConfigured = "stream/subscription-configured"
	TypeSubscriptionCursorSet  = "stream/subscription-cursor-set"
	TypeSubscriptionResumed    = "stream/subscription-delivery-resumed"
	TypeSubscriptionHalted     = "stream/subscription-delivery-halted"
	TypeSubscriptionRemoved    = "stream/subscription-removed"
	TypeProcessorRevived       = "stream/processor-revived"
	TypeErrorOccurred          = "stream/error-occurred"
	TypeWoken                  = "stream/woken"
)

// IsPlatformFact reports whether typ is a stream/* fact the platform appends: a halt and a
// woken record (the server), a revival (a processor host's recovery keepalive). A client's raw
// append of a halt or a woken record is refused; a revival is taken (a remote host's keepalive
// appends it, and the user may revive by hand), held to its own processor only through a host's
// ports. An import leaves all three out: they tell the source's delivery, not the copy's.
func IsPlatformFact(typ string) bool {
	return typ == TypeSubscriptionHalted || typ == TypeWoken || typ == TypeProcessorRevived
}

// TypeDeadLetter is the type of the event a skipped event becomes in its subscription's
// dead-letter stream (DeliveryPolicy.DeadLetterPath); its payload is a DeadLetterPayload.
const TypeDeadLetter = "itx.dead-letter"

// DeadLetterPayload is a dead letter: the skipped event whole, where it came from, and why it
// was skipped. Replaying it means delivering Event again (see the README, "Dead letters").
type DeadLetterPayload struct {
	ProjectID             string `json:"projectId"`
	StreamID              string `json:"streamId"`
	Path                  string `json:"path"`
	Subscription          string `json:"subscription"`
	ConfiguredAtOffset    int64  `json:"configuredAtOffset"`
	CursorChangedAtOffset int64  `json:"cursorChangedAtOffset"`
	Offset                int64  `json:"offset"`   // the skipped event's offset in Path
	Attempts              int    `json:"attempts"` // event-specific attempts before the skip
	Error                 string `json:"error"`    // the last failure, as lastError showed it
	Event                 Event  `json:"event"`    // the skipped event, as stored
	// EventOmitted: the event was too large to travel inside its dead letter, so Event keeps
	// only its offset, type and time; read it at Offset in Path.
	EventOmitted bool `json:"eventOmitted,omitempty"`
}

// Processor-wake placements. PlacementFacet is the seed's name for in-process placement, taken
// as PlacementInProcess.
const (
	PlacementInProcess = "in-process"
	PlacementRemote    = "remote"
	PlacementFacet     = "facet"
)

// Receiver kinds: data, not schema. Adding one is one union member here plus one send adapter.
const (
	KindWebhookPost   = "webhook-post"
	KindCopyToStream  = "copy-to-stream"
	KindITXCall       = "itx-call"
	KindProcessorWake = "processor-wake"
)

// KindReader is the kind a registered reader shows as in Subscriptions.list, beside the
// subscriptions (its checkpoint in the confirmed offset). It is not a receiver kind.
const KindReader = "reader"

// Delivery start positions and failing-event policies.
const (
	StartBeginning = "beginning"
	StartNow       = "now"
	OnFailingHalt  = "halt"
	OnFailingSkip  = "skip"
)

// Subscription limits and the retry ladder (DESIGN.md "Constants").
const (
	MaxSubscriptionNameLength = 500
	GeneratedNamePrefix       = "subscription:"
	MaxSubscriptionsPerStream = 256
	// MaxSubscriptionConfigBytes bounds one subscription's config (its configured event's
	// payload): the catalog keeps every config in memory while the stream is loaded and in the
	// core-state checkpoint (--max-subscription-config-bytes).
	MaxSubscriptionConfigBytes    = 64 << 10
	MaxCopySubscriptionsPerTarget = 64 // from one source into one receiving stream
	MaxInboundSourceRecords       = 1000
	MaxDeliveryAttempts           = 15
	FailingEventConfirmAttempts   = 3
	MaxFailingEventSkips          = 3
	DeliveryBatchEvents           = 1000
	DeliveryBatchBytes            = 1 << 20
	DeliveryTimeout               = 20 * time.Second
	BackoffBase                   = time.Second
	BackoffCap                    = 30 * time.Minute
	BackoffJitter                 = 0.2
	MaxHaltErrorLength            = 4096
	MaxCursorErrorLength          = 2000
	InternalKeyPrefix             = "itx-internal/"
)

// Backoff is the delay after failed attempt number attempt (1-based): 1 s x 2^(attempt-1),
// capped at 30 min, with +-20% jitter. Pure: the caller supplies r in [0,1), which maps to a
// jitter factor of 1 + 0.2*(2r-1).
func Backoff(attempt int, r float64) time.Duration {
	base := float64(BackoffBase) * math.Pow(2, float64(max(0, attempt-1)))
	base = math.Min(base, float64(BackoffCap))
	return time.Duration(math.Round(base * (1 + BackoffJitter*(r*2-1))))
}

// SubscriptionConfig is the payload of stream/subscription-configured, the subscription's birth
// certificate. Its JSON form is what the log stores.
type SubscriptionConfig struct {
	Name        string              `json:"name,omitempty"`
	Description string              `json:"description,omitempty"`
	Filter      *SubscriptionFilter `json:"filter,omitempty"`
	Receiver    Receiver            `json:"receiver"`
	// Per-subscription delivery controls (0: the kind's default, see BatchLimits): events and
	// bytes per delivery, narrowing the push batch limits (a webhook's default of one event may
	// widen up to DeliveryBatchEvents).
	MaxDeliveryEvents int `json:"maxDeliveryEvents,omitempty"`
	MaxDeliveryBytes  int `json:"maxDeliveryBytes,omitempty"`
	// ConfirmWindow makes the subscription offset-acking (itx-call and webhook-post; 0: off): a
	// receiver's answer marks its batch delivered and confirms only through the offset it names
	// (or Subscription.confirm does later); delivery goes on while at most ConfirmWindow events
	// are delivered and unconfirmed, and those are delivered again after a failure, a new mount
	// of the receiver's name or a restart.
	ConfirmWindow int `json:"confirmWindow,omitempty"`
	// Scope is the path prefix of the token that configured the subscription ("": the whole
	// project). Its receiver reads the stream as that token does (ScopedEvent): filter,
	// transform and the events delivered never show a stream outside the prefix. The server
	// sets it from the configuring token; it is not a field of the wire schema.
	Scope string `json:"scope,omitempty"`
}

// MaxConfirmWindow bounds SubscriptionConfig.ConfirmWindow: the events an offset-acking receiver
// may hold delivered and unconfirmed (the server keeps a mark per delivery within it).
const MaxConfirmWindow = 10_000

// BatchLimits is the most one delivery of this subscription carries: MaxDeliveryEvents (default
// DeliveryBatchEvents, one for webhook-post) and MaxDeliveryBytes (default DeliveryBatchBytes).
func (c *SubscriptionConfig) BatchLimits() (events, bytes int) {
	events, bytes = DeliveryBatchEvents, DeliveryBatchBytes
	if c.Receiver.Action == KindWebhookPost {
		events = 1
	}
	if c.MaxDeliveryEvents > 0 {
		events = c.MaxDeliveryEvents
	}
	if c.MaxDeliveryBytes > 0 {
		bytes = c.MaxDeliveryBytes
	}
	return events, bytes
}

// ProcessorContract is the registered contract a processor-wake subscription runs: its
// receiver's Processor, or its name.
func (c *SubscriptionConfig) ProcessorContract() string {
	if c.Receiver.Processor != "" {
		return c.Receiver.Processor
	}
	return c.Name
}

// WebhookBatches reports whether a webhook-post subscription's body carries an "events" array
// (WebhookBatchBody) rather than one "event" (WebhookBody): when it asked for more than one
// event per delivery. The shape depends on the config alone, never on how many events a
// delivery happens to hold.
func (c *SubscriptionConfig) WebhookBatches() bool { return c.MaxDeliveryEvents > 1 }

// SubscriptionFilter makes the cursor a watermark: events that do not match still advance it.
type SubscriptionFilter struct {
	EventTypes       []string `json:"eventTypes,omitempty"`       // "*" = all
	JSONataCondition string   `json:"jsonataCondition,omitempty"` // must evaluate to exactly true
}

func (f *SubscriptionFilter) condition() string {
	if f == nil {
		return ""
	}
	return f.JSONataCondition
}

// Receiver is the union of receiver kinds, discriminated by Action.
type Receiver struct {
	Action string `json:"action"`

	// webhook-post
	URL     string            `json:"url,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
	Secret  string            `json:"secret,omitempty"` // Standard Webhooks "whsec_<base64>"

	// copy-to-stream
	ReceivingStreamPath string `json:"receivingStreamPath,omitempty"`

	// itx-call
	Capability string `json:"capability,omitempty"`

	// processor-wake
	Placement string `json:"placement,omitempty"` // "in-process" | "remote"
	// Processor is the registered contract this instance runs; empty: the subscription's name
	// (the seed's name == slug). Two subscriptions may run one contract under two names, each
	// with its own progress, keepalive and cursor, all keyed by the subscription's name.
	Processor string `json:"processor,omitempty"`

	// push kinds
	JSONataTransform string          `json:"jsonataTransform,omitempty"`
	Delivery         *DeliveryPolicy `json:"delivery,omitempty"`
}

// DeliveryPolicy is a push receiver's start position and failing-event policy.
type DeliveryPolicy struct {
	Start          string `json:"start"`
	OnFailingEvent string `json:"onFailingEvent"`
	// DeadLetterPath (skip only) is a stream of the same project where each skipped event lands
	// once, whole, as a TypeDeadLetter event with its error, before the cursor moves past it.
	DeadLetterPath string `json:"deadLetterPath,omitempty"`
}

// EffectiveDelivery returns the policy with its defaults (beginning, halt).
func (r *Receiver) EffectiveDelivery() DeliveryPolicy {
	d := DeliveryPolicy{Start: StartBeginning, OnFailingEvent: OnFailingHalt}
	if r.Delivery != nil {
		if r.Delivery.Start != "" {
			d.Start = r.Delivery.Start
		}
		if r.Delivery.OnFailingEvent != "" {
			d.OnFailingEvent = r.Delivery.OnFailingEvent
		}
		d.DeadLetterPath = r.Delivery.DeadLetterPath
	}
	return d
}

// ValidateSubscriptionName checks a caller-chosen name (already trimmed).
func ValidateSubscriptionName(name string) error { return ValidateName("subscription name", name) }

// DecodeStrict decodes a JSON object into v, refusing unknown fields and trailing data.
func DecodeStrict(raw []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	// Whatever follows the object, a stray "]" or "}" too (which More does not report), is
	// trailing data: only whitespace may end the input.
	if _, err := d.Token(); err != io.EOF {
		return fmt.Errorf("trailing data after the object")
	}
	return nil
}

// ParseSubscriptionConfig decodes and checks a configured payload's shape: everything that can
// be checked without the stream's state (names against the catalog, caps and JSONata compilation
// are the core reducer's). Strings are trimmed in place.
func ParseSubscriptionConfig(payload []byte) (*SubscriptionConfig, error) {
	var c SubscriptionConfig
	if err := DecodeStrict(payload, &c); err != nil {
		return nil, Errorf(EInvalid, "subscription config: %v", err)
	}
	c.Name = strings.TrimSpace(c.Name)
	c.Description = strings.TrimSpace(c.Description)
	if c.Name != "" {
		if err := ValidateSubscriptionName(c.Name); err != nil {
			return nil, err
		}
	}
	if f := c.Filter; f != nil {
		if f.EventTypes != nil && len(f.EventTypes) == 0 {
			return nil, Errorf(EInvalid, "filter.eventTypes must list at least one type (or \"*\")")
		}
		for i, t := range f.EventTypes {
			if f.EventTypes[i] = strings.TrimSpace(t); f.EventTypes[i] == "" {
				return nil, Errorf(EInvalid, "filter.eventTypes[%d] is empty", i)
			}
		}
		f.JSONataCondition = strings.TrimSpace(f.JSONataCondition)
	}
	if c.Scope != "" {
		if err := ValidatePath(c.Scope); err != nil {
			return nil, Errorf(EInvalid, "scope: %s", ErrorMessage(err))
		}
	}
	if c.MaxDeliveryEvents < 0 || c.MaxDeliveryEvents > DeliveryBatchEvents {
		return nil, Errorf(EInvalid, "maxDeliveryEvents must be 1..%d (0: the receiver kind's default), got %d", DeliveryBatchEvents, c.MaxDeliveryEvents)
	}
	if c.MaxDeliveryBytes < 0 || c.MaxDeliveryBytes > DeliveryBatchBytes {
		return nil, Errorf(EInvalid, "maxDeliveryBytes must be 1..%d (0: the default, %d), got %d", DeliveryBatchBytes, DeliveryBatchBytes, c.MaxDeliveryBytes)
	}
	if c.ConfirmWindow < 0 || c.ConfirmWindow > MaxConfirmWindow {
		return nil, Errorf(EInvalid, "confirmWindow must be 1..%d events (0: not offset-acking), got %d", MaxConfirmWindow, c.ConfirmWindow)
	}
	if c.ConfirmWindow > 0 && c.Receiver.Action != KindITXCall && c.Receiver.Action != KindWebhookPost {
		return nil, Errorf(EInvalid, "confirmWindow is for itx-call and webhook-post receivers (they confirm offsets), not %s", c.Receiver.Action)
	}
	r := &c.Receiver
	r.JSONataTransform = strings.TrimSpace(r.JSONataTransform)
	for field, src := range map[string]string{"filter.jsonataCondition": c.Filter.condition(), "receiver.jsonataTransform": r.JSONataTransform} {
		if len(src) > MaxJSONataLength {
			return nil, Errorf(EInvalid, "%s is %d bytes, at most %d", field, len(src), MaxJSONataLength)
		}
	}
	if d := r.Delivery; d != nil {
		if d.Start != StartBeginning && d.Start != StartNow {
			return nil, Errorf(EInvalid, "receiver.delivery.start must be %q or %q", StartBeginning, StartNow)
		}
		if d.OnFailingEvent != OnFailingHalt && d.OnFailingEvent != OnFailingSkip {
			return nil, Errorf(EInvalid, "receiver.delivery.onFailingEvent must be %q or %q", OnFailingHalt, OnFailingSkip)
		}
		if d.DeadLetterPath = strings.TrimSpace(d.DeadLetterPath); d.DeadLetterPath != "" {
			if d.OnFailingEvent != OnFailingSkip {
				return nil, Errorf(EInvalid, "receiver.delivery.deadLetterPath needs onFailingEvent %q: only skipped events are dead-lettered", OnFailingSkip)
			}
			if err := ValidatePath(d.DeadLetterPath); err != nil {
				return nil, Errorf(EInvalid, "receiver.delivery.deadLetterPath: %s", ErrorMessage(err))
			}
		}
	}
	only := func(kind string, set map[string]bool) error {
		for field, isSet := range set {
			if isSet {
				return Errorf(EInvalid, "receiver.%s is not a field of a %s receiver", field, kind)
			}
		}
		return nil
	}
	switch r.Action {
	case KindWebhookPost:
		if err := only(r.Action, map[string]bool{"receivingStreamPath": r.ReceivingStreamPath != "", "capability": r.Capability != "", "placement": r.Placement != "", "processor": r.Processor != ""}); err != nil {
			return nil, err
		}
		u, err := url.Parse(r.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, Errorf(EInvalid, "receiver.url must be an absolute http or https URL, got %q", r.URL)
		}
		// A reference stands for a secret the server stored apart from the log (validated then).
		if !IsSecretRef(r.Secret) {
			if r.Secret != "" && !strings.HasPrefix(r.Secret, "whsec_") {
				return nil, Errorf(EInvalid, "receiver.secret must be a Standard Webhooks secret (\"whsec_<base64>\")")
			}
			if _, err := WebhookSecretKey(r.Secret); err != nil {
				return nil, err
			}
		}
		if err := validateHeaders(r.Headers); err != nil {
			return nil, err
		}
	case KindCopyToStream:
		if err := only(r.Action, map[string]bool{"url": r.URL != "", "headers": r.Headers != nil, "secret": r.Secret != "", "capability": r.Capability != "", "placement": r.Placement != "", "processor": r.Processor != ""}); err != nil {
			return nil, err
		}
		r.ReceivingStreamPath = strings.TrimSpace(r.ReceivingStreamPath)
		if err := ValidatePath(r.ReceivingStreamPath); err != nil {
			return nil, Errorf(EInvalid, "receiver.receivingStreamPath: %s", ErrorMessage(err))
		}
		if r.EffectiveDelivery().OnFailingEvent != OnFailingHalt {
			return nil, Errorf(EInvalid, "copy-to-stream receivers always halt on a failing event: ordered receivers never skip")
		}
	case KindITXCall:
		if err := only(r.Action, map[string]bool{"url": r.URL != "", "headers": r.Headers != nil, "secret": r.Secret != "", "receivingStreamPath": r.ReceivingStreamPath != "", "placement": r.Placement != "", "processor": r.Processor != ""}); err != nil {
			return nil, err
		}
		if r.Capability = strings.TrimSpace(r.Capability); r.Capability == "" {
			return nil, Errorf(EInvalid, "receiver.capability must name a mounted Receiver")
		}
		if err := ValidateMountName(r.Capability); err != nil {
			return nil, Errorf(EInvalid, "receiver.capability: %s", ErrorMessage(err))
		}
	case KindProcessorWake:
		if err := only(r.Action, map[string]bool{"url": r.URL != "", "headers": r.Headers != nil, "secret": r.Secret != "", "receivingStreamPath": r.ReceivingStreamPath != "", "capability": r.Capability != ""}); err != nil {
			return nil, err
		}
		if r.JSONataTransform != "" {
			return nil, Errorf(EInvalid, "processor-wake receivers take no jsonataTransform: replays must be deterministic")
		}
		if r.Delivery != nil {
			return nil, Errorf(EInvalid, "processor-wake receivers take no delivery policy: the processor owns its checkpoint")
		}
		if c.MaxDeliveryEvents != 0 || c.MaxDeliveryBytes != 0 {
			return nil, Errorf(EInvalid, "processor-wake receivers take no maxDeliveryEvents or maxDeliveryBytes: the processor reads its own frames")
		}
		switch r.Placement = strings.TrimSpace(r.Placement); r.Placement {
		case "", PlacementInProcess, PlacementRemote:
		case PlacementFacet:
			r.Placement = PlacementInProcess // the seed's facet placement: next to the stream
		default:
			return nil, Errorf(EInvalid, "receiver.placement must be %q (or the seed's %q) or %q", PlacementInProcess, PlacementFacet, PlacementRemote)
		}
		if r.Processor = strings.TrimSpace(r.Processor); r.Processor != "" {
			if err := ValidateName("receiver.processor", r.Processor); err != nil {
				return nil, err
			}
		}
	case "":
		return nil, Errorf(EInvalid, "receiver.action is required: one of %s, %s, %s, %s", KindWebhookPost, KindCopyToStream, KindITXCall, KindProcessorWake)
	default:
		return nil, Errorf(EInvalid, "unknown receiver action %q", r.Action)
	}
	return &c, nil
}

// SecretRefPrefix starts the reference a subscription's config holds in place of its webhook
// signing secret: the secret itself is stored apart from the log (see the server's secrets).
const SecretRefPrefix = "itxsecret:"

// IsSecretRef reports whether s is a secret reference ("itxsecret:" and 32 hex digits).
func IsSecretRef(s string) bool {
	h, ok := strings.CutPrefix(s, SecretRefPrefix)
	if !ok || len(h) != 32 {
		return false
	}
	for _, c := range h {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// WebhookSecretKey decodes a Standard Webhooks secret into its HMAC key (nil for none).
func WebhookSecretKey(secret string) ([]byte, error) {
	if secret == "" {
		return nil, nil
	}
	if len(secret) > len("whsec_")+base64Std.EncodedLen(MaxWebhookSecretBytes) {
		return nil, Errorf(EInvalid, "receiver.secret must be \"whsec_\" followed by base64 of 16 to %d bytes", MaxWebhookSecretBytes)
	}
	key, err := base64Std.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil || len(key) < 16 || len(key) > MaxWebhookSecretBytes {
		return nil, Errorf(EInvalid, "receiver.secret must be \"whsec_\" followed by base64 of 16 to %d bytes", MaxWebhookSecretBytes)
	}
	return key, nil
}

// Payloads of the other core events.
type (
	// CursorSetPayload rewinds or advances a subscription: delivery resumes after AfterOffset.
	CursorSetPayload struct {
		Name        string `json:"name"`
		AfterOffset int64  `json:"afterOffset"`
	}
	// NamePayload names a subscription (delivery-resumed).
	NamePayload struct {
		Name string `json:"name"`
	}
	// RemovedPayload removes a subscription.
	RemovedPayload struct {
		Name   string `json:"name"`
		Reason string `json:"reason"` // "requested"
	}
	// HaltedPayload is the loud end of the retry ladder.
	HaltedPayload struct {
		Name        string `json:"name"`
		Reason      string `json:"reason"` // "delivery-failed"
		AfterOffset int64  `json:"afterOffset"`
		Attempts    int    `json:"attempts"`
		Error       string `json:"error,omitempty"`
	}
	// ErrorOccurredPayload records an error on the stream (evidence, not enforcement).
	ErrorOccurredPayload struct {
		Message string          `json:"message"`
		Error   json.RawMessage `json:"error,omitempty"`
	}
)

var base64Std = base64.StdEncoding

// CheckNewSubscriptionConfig holds the rules a parsed config meets when a client configures it,
// beyond ParseSubscriptionConfig's: rules that came after configs were stored without them, so a
// stream rebuilt from its log keeps such a subscription as it was accepted. A filter type no
// event can have (a space, a control character, past MaxTypeLength) would filter out everything,
// silently: refused as every other type filter is. Two webhook header names that differ only in
// case name one header: a request would carry one of the two values, a different one from one
// delivery to the next. A header itxd sets itself (reservedWebhookHeaders) would be overwritten
// or dropped, or pass for a signature.
func CheckNewSubscriptionConfig(c *SubscriptionConfig) error {
	if f := c.Filter; f != nil {
		if err := ValidateTypeFilter("filter.eventTypes", f.EventTypes); err != nil {
			return err
		}
	}
	folded := make(map[string]string, len(c.Receiver.Headers))
	for name := range c.Receiver.Headers {
		if reservedWebhookHeaders[strings.ToLower(name)] {
			return Errorf(EInvalid, "receiver.headers: %q is set by itxd on every delivery (the signing headers, the body's type and length, the host, the user agent); a configured one would be overwritten or, for webhook-signature, pass for a signature no secret made", name)
		}
		if other, ok := folded[strings.ToLower(name)]; ok {
			if other > name {
				other, name = name, other // the same message whatever the map's order
			}
			return Errorf(EInvalid, "receiver.headers: %q and %q name one header (header names are case-insensitive)", other, name)
		}
		folded[strings.ToLower(name)] = name
	}
	return nil
}

// reservedWebhookHeaders are the headers itxd sets on every webhook delivery, lower-cased.
var reservedWebhookHeaders = map[string]bool{
	"webhook-id": true, "webhook-timestamp": true, "webhook-signature": true,
	"content-type": true, "content-length": true, "host": true, "user-agent": true,
}

// validateHeaders refuses webhook headers no request could carry: a name that is not an HTTP
// token, a value with CR, LF or another control character (every delivery would fail, or worse,
// split the request), or a value that is not valid UTF-8.
func validateHeaders(h map[string]string) error {
	for name, value := range h {
		if !httpguts.ValidHeaderFieldName(name) {
			return Errorf(EInvalid, "receiver.headers: %q is not a valid HTTP header name", name)
		}
		if !httpguts.ValidHeaderFieldValue(value) || !utf8.ValidString(value) {
			return Errorf(EInvalid, "receiver.headers[%q]: the value has a control character (CR, LF, ...) or invalid UTF-8", name)
		}
	}
	return nil
}
