package client

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/itx-dev/itx"
)

// WebhookTolerance is how far a delivery's webhook-timestamp may be from the receiver's clock
// before VerifyWebhook refuses it: the Standard Webhooks default, which bounds replays.
const WebhookTolerance = 5 * time.Minute

// VerifyWebhook checks that a webhook-post delivery comes from a subscription configured with
// secret (its "whsec_..." receiver secret), the Standard Webhooks way: one of the
// webhook-signature header's space-separated "v1,<base64>" entries is the HMAC-SHA256 of
// "<webhook-id>.<webhook-timestamp>.<body>" under the secret's key, and the timestamp is within
// WebhookTolerance of now. Pass the exact bytes received, before any decoding. A delivery that
// fails is refused with EUnauthenticated (bad or missing signature) or EInvalid (a malformed or
// stale timestamp); answer it 4xx. A retry of the same events keeps its webhook-id, but the id
// names a delivery, not an event: an event delivered again after a changed config or a cursor
// set comes under a new id, and so does a batch (maxDeliveryEvents above 1) whose retry carries
// events appended since the failed try. Deduplicate on (streamId, event offset).
func VerifyWebhook(secret string, header http.Header, body []byte, now time.Time) error {
	key, err := itx.WebhookSecretKey(secret)
	if err != nil {
		return err
	}
	if key == nil {
		return itx.Errorf(itx.EInvalid, "verify webhook: no secret given")
	}
	id, ts, sigs := header.Get("webhook-id"), header.Get("webhook-timestamp"), header.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return itx.Errorf(itx.EUnauthenticated, "verify webhook: webhook-id, webhook-timestamp and webhook-signature are required")
	}
	secs, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return itx.Errorf(itx.EInvalid, "verify webhook: webhook-timestamp %q is not seconds since the epoch", ts)
	}
	if d := now.Sub(time.Unix(secs, 0)); d > WebhookTolerance || d < -WebhookTolerance {
		return itx.Errorf(itx.EInvalid, "verify webhook: webhook-timestamp is %s from this clock, beyond %s", d.Round(time.Second), WebhookTolerance)
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + ts + "."))
	mac.Write(body)
	want := mac.Sum(nil)
	for _, sig := range strings.Fields(sigs) {
		version, b64, ok := strings.Cut(sig, ",")
		if !ok || version != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(b64)
		if err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return itx.Errorf(itx.EUnauthenticated, "verify webhook: no v1 signature matches this body under the secret")
}
