package itx

// LiveStreamState is the stream's live state: its head, a row per subscription, the registered
// readers and the open connections.
type LiveStreamState struct {
	Path          string                         `json:"path"`
	StreamID      string                         `json:"streamId"`
	Head          int64                          `json:"head"`
	LastAppendAt  int64                          `json:"lastAppendAt"`
	Subscriptions map[string]LiveSubscriptionRow `json:"subscriptions"`
	Readers       map[string]LiveReaderRow       `json:"readers"`
	// Connections lists the open connections, the first MaxLiveConnectionRows by key;
	// ConnectionsOpen counts them all. (Every open connection may receive this document: listing
	// all of them would make its size, and each append's patch, grow with their number.)
	Connections     map[string]LiveConnectionRow `json:"connections"`
	ConnectionsOpen int                          `json:"connectionsOpen"`
}

// MaxLiveConnectionRows bounds the connections a stream's live state lists.
const MaxLiveConnectionRows = 256

// LiveSubscriptionRow is a subscription as the live state shows it.
type LiveSubscriptionRow struct {
	Kind          string `json:"kind"`
	Status        string `json:"status"`
	Confirmed     int64  `json:"confirmed"`
	Delivered     int64  `json:"delivered,omitempty"` // offset-acking subscriptions: delivered through here
	Lag           int64  `json:"lag"`
	LastError     string `json:"lastError,omitempty"`
	NextAttemptAt int64  `json:"nextAttemptAt,omitempty"`
	// Attempt is the retry ladder's rung: failed attempts in a row (0: none), as
	// subscriptions.list() shows it, so a view tells a first retry from one near the halt.
	Attempt int `json:"attempt,omitempty"`
}

// LiveReaderRow is a registered reader as the live state shows it.
type LiveReaderRow struct {
	Checkpoint int64 `json:"checkpoint"`
	Lag        int64 `json:"lag"`
}

// LiveConnectionRow is an open connection as the live state shows it.
type LiveConnectionRow struct {
	OpenedBy  string `json:"openedBy,omitempty"`
	Delivered int64  `json:"delivered"`
}
