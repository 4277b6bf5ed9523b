package server

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"sync"
	"testing"

	"github.com/itx-dev/itx"
	"github.com/stretchr/testify/require"
)

// Storing distinct webhook secrets concurrently never takes a project past
// Config.MaxSecretsPerProject: a secret being stored counts against the bound until it is kept.
func TestStoreSecret_BoundHoldsUnderConcurrency(t *testing.T) {
	const bound, tries = 3, 40
	s, projectID := mustOpen(t, Config{DataDir: t.TempDir(), MaxSecretsPerProject: bound})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var kept, refused int
	var other []error
	start := make(chan struct{})
	for range tries {
		b := make([]byte, 24)
		rand.Read(b)
		secret := "whsec_" + base64.StdEncoding.EncodeToString(b)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, release, err := s.storeSecret(context.Background(), projectID, secret)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
			case itx.ErrorCode(err) == itx.ELimitExceeded:
				refused++
				return
			default:
				other = append(other, err)
				return
			}
			kept++
			_ = release // held: a configure in progress keeps its secret
		}()
	}
	close(start)
	wg.Wait()
	require.Empty(t, other)
	require.Equal(t, bound, kept, "secrets kept")
	require.Equal(t, tries-bound, refused)
	s.acc.secretMu.RLock()
	defer s.acc.secretMu.RUnlock()
	require.Equal(t, bound, s.acc.secretCounts[projectID])
	require.Empty(t, s.acc.secretsStoring)
}

// Two configures storing the same new secret at once keep one secret: the second is not refused
// as if it added another (a bound of 3 with 2 kept leaves room for it).
func TestStoreSecret_SameSecretStoredConcurrentlyCountsOnce(t *testing.T) {
	const bound = 3
	s, projectID := mustOpen(t, Config{DataDir: t.TempDir(), MaxSecretsPerProject: bound})
	newSecret := func() string {
		b := make([]byte, 24)
		rand.Read(b)
		return "whsec_" + base64.StdEncoding.EncodeToString(b)
	}
	ctx := context.Background()
	for range bound - 1 {
		_, _, err := s.storeSecret(ctx, projectID, newSecret())
		require.NoError(t, err)
	}
	secret := newSecret()
	var nested error
	storeSecretHook = func() {
		storeSecretHook = nil // only the first store: the second runs while it is being stored
		_, _, nested = s.storeSecret(ctx, projectID, secret)
	}
	t.Cleanup(func() { storeSecretHook = nil })
	_, _, err := s.storeSecret(ctx, projectID, secret)
	require.NoError(t, err)
	require.NoError(t, nested, "the same secret, stored while it is being stored")
	s.acc.secretMu.RLock()
	defer s.acc.secretMu.RUnlock()
	require.Equal(t, bound, s.acc.secretCounts[projectID])
}
