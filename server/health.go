package server

import (
	"context"
	"errors"
	"fmt"
)

// Ready reports whether the server takes work: it is not shutting down and its directory
// database answers. A supervisor's readiness probe asks this (itxd's /readyz).
func (s *Server) Ready(ctx context.Context) error {
	s.mu.Lock()
	closing := s.closing
	s.mu.Unlock()
	if closing {
		return errors.New("shutting down")
	}
	if err := s.dir.Ping(ctx); err != nil {
		return fmt.Errorf("directory: %w", err)
	}
	return nil
}

// DiskRoom is nil while the data directory's disk has room above its reserve, else the
// resourceExhausted error appends that add events are refused with now (read afresh when the
// last reading may no longer hold). A server below its reserve is still ready: it serves reads,
// and the trims and deletes that give space back.
func (s *Server) DiskRoom() error { return s.disk.room() }
