package wire

import (
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/schema"
)

// Subscription statuses cross the wire as the SubscriptionStatus enumerant of the same name
// (wire_test.go checks that every itx status has one); an empty status, a subscription with no
// cursor row yet, encodes as active.

// SetSubscriptionSummary encodes a row of subscriptions.list().
func SetSubscriptionSummary(dst schema.SubscriptionSummary, s itx.SubscriptionSummary) error {
	dst.SetStatus(schema.SubscriptionStatusFromString(s.Status))
	dst.SetConfirmedOffset(uint64(s.ConfirmedOffset))
	dst.SetDeliveredOffset(uint64(s.DeliveredOffset))
	dst.SetLag(uint64(s.Lag))
	dst.SetConfiguredAtOffset(uint64(s.ConfiguredAtOffset))
	dst.SetAttempt(uint32(max(0, s.Attempt)))
	dst.SetNextAttemptAt(s.NextAttemptAt)
	return setTexts(
		field{dst.SetName, s.Name}, field{dst.SetKind, s.Kind}, field{dst.SetLastError, s.LastError})
}

// SubscriptionSummaryFromSchema decodes a row of subscriptions.list().
func SubscriptionSummaryFromSchema(src schema.SubscriptionSummary) (itx.SubscriptionSummary, error) {
	out := itx.SubscriptionSummary{Status: src.Status().String(), ConfirmedOffset: int64(src.ConfirmedOffset()), DeliveredOffset: int64(src.DeliveredOffset()),
		Lag: int64(src.Lag()), ConfiguredAtOffset: int64(src.ConfiguredAtOffset()), Attempt: int(src.Attempt()), NextAttemptAt: src.NextAttemptAt()}
	var err error
	if out.Name, err = src.Name(); err != nil {
		return out, err
	}
	if out.Kind, err = src.Kind(); err != nil {
		return out, err
	}
	out.LastError, err = src.LastError()
	return out, err
}

// SetSubscriptionDescription encodes describe()'s answer.
func SetSubscriptionDescription(dst schema.SubscriptionDescription, d *itx.SubscriptionDescription) error {
	c, err := dst.NewConfig()
	if err != nil {
		return err
	}
	if err := SetSubscriptionConfig(c, &d.Config); err != nil {
		return err
	}
	dst.SetStatus(schema.SubscriptionStatusFromString(d.Status))
	dst.SetConfiguredAtOffset(uint64(d.ConfiguredAtOffset))
	dst.SetCursorChangedAtOffset(uint64(d.CursorChangedAtOffset))
	dst.SetConfirmedOffset(uint64(d.ConfirmedOffset))
	dst.SetDeliveredOffset(uint64(d.DeliveredOffset))
	dst.SetHeadOffset(uint64(d.HeadOffset))
	dst.SetAttempt(uint32(d.Attempt))
	dst.SetNextAttemptAt(d.NextAttemptAt)
	dst.SetFailingEventOffset(uint64(d.FailingEventOffset))
	dst.SetFailingEventAttempt(uint32(d.FailingEventAttempt))
	dst.SetFailingEventSkipsSinceLastSuccess(uint32(d.FailingEventSkips))
	dst.SetInFlightDeadlineAt(d.InFlightDeadlineAt)
	dst.SetInFlightConnectionGeneration(uint64(d.InFlightConnectionGeneration))
	dst.SetSecretSet(d.SecretSet)
	return setTexts(field{dst.SetKind, d.Kind}, field{dst.SetLastError, d.LastError}, field{dst.SetUpdatedAt, d.UpdatedAt})
}

// SubscriptionDescriptionFromSchema decodes describe()'s answer.
func SubscriptionDescriptionFromSchema(src schema.SubscriptionDescription) (itx.SubscriptionDescription, error) {
	out := itx.SubscriptionDescription{HeadOffset: int64(src.HeadOffset()), SecretSet: src.SecretSet(), CursorState: itx.CursorState{
		Status:                       src.Status().String(),
		ConfiguredAtOffset:           int64(src.ConfiguredAtOffset()),
		CursorChangedAtOffset:        int64(src.CursorChangedAtOffset()),
		ConfirmedOffset:              int64(src.ConfirmedOffset()),
		DeliveredOffset:              int64(src.DeliveredOffset()),
		Attempt:                      int(src.Attempt()),
		NextAttemptAt:                src.NextAttemptAt(),
		FailingEventOffset:           int64(src.FailingEventOffset()),
		FailingEventAttempt:          int(src.FailingEventAttempt()),
		FailingEventSkips:            int(src.FailingEventSkipsSinceLastSuccess()),
		InFlightDeadlineAt:           src.InFlightDeadlineAt(),
		InFlightConnectionGeneration: int64(src.InFlightConnectionGeneration()),
	}}
	var err error
	if out.Kind, err = src.Kind(); err != nil {
		return out, err
	}
	if out.LastError, err = src.LastError(); err != nil {
		return out, err
	}
	if out.UpdatedAt, err = src.UpdatedAt(); err != nil {
		return out, err
	}
	if src.HasConfig() {
		c, err := src.Config()
		if err != nil {
			return out, err
		}
		if out.Config, err = SubscriptionConfigFromSchema(c); err != nil {
			return out, err
		}
	}
	return out, nil
}

// SetDeliveryBatch encodes a batch pushed to a Receiver. The envelope's project is not sent: the
// receiver mounted the capability in that project.
func SetDeliveryBatch(dst schema.DeliveryBatch, b *itx.DeliveryBatch) error {
	dst.SetHeadOffset(uint64(b.HeadOffset))
	dst.SetCursorChangedAtOffset(uint64(b.CursorChangedAtOffset))
	dst.SetConfiguredAtOffset(uint64(b.ConfiguredAtOffset))
	dst.SetAttempt(uint32(b.Attempt))
	if err := setTexts(field{dst.SetStreamId, b.StreamID}, field{dst.SetPath, b.Path},
		field{dst.SetSubscription, b.Subscription}, field{dst.SetDeliveryId, b.DeliveryID}); err != nil {
		return err
	}
	return SetEvents(b.Events, dst.NewEvents)
}

// DeliveryBatchFromSchema decodes a batch pushed to a Receiver.
func DeliveryBatchFromSchema(src schema.DeliveryBatch) (itx.DeliveryBatch, error) {
	out := itx.DeliveryBatch{DeliveryEnvelope: itx.DeliveryEnvelope{
		HeadOffset: int64(src.HeadOffset()), CursorChangedAtOffset: int64(src.CursorChangedAtOffset()),
		ConfiguredAtOffset: int64(src.ConfiguredAtOffset()), Attempt: int(src.Attempt()),
	}}
	var err error
	for _, get := range []struct {
		f func() (string, error)
		v *string
	}{{src.StreamId, &out.StreamID}, {src.Path, &out.Path}, {src.Subscription, &out.Subscription}, {src.DeliveryId, &out.DeliveryID}} {
		if *get.v, err = get.f(); err != nil {
			return out, err
		}
	}
	out.Events, err = eventList(src.Events())
	return out, err
}

// field is one text field to set.
type field struct {
	set func(string) error
	v   string
}

func setTexts(fields ...field) error {
	for _, f := range fields {
		if err := f.set(f.v); err != nil {
			return err
		}
	}
	return nil
}
