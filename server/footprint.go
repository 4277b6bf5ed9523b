package server

// Footprint counts what the server holds in its registries: the entries a client's calls add and
// its session's end (or the thing's own end) must remove. A server at rest after clients came and
// went holds the same counts as before them; tests compare two footprints to find what churn
// leaves behind.
type Footprint struct {
	Sessions       int // logins registered for revocation
	SessionEnds    int // what open sessions registered to end with them (Session.OnEnd)
	SessionLive    int // live connections and views counted against open sessions
	Mounts         int // mounted Receivers
	MountProjects  int // projects counted by the Receivers' bound
	Pokes          int // presence signals running
	Hosts          int // mounted processor hosts
	HostContracts  int // contracts announced by mounted hosts
	HostProjects   int // projects counted by the hosts' bound
	HostStops      int // Stop calls to hosts not yet answered
	Actors         int // loaded stream actors
	Unloading      int // stream actors unloading
	SecretHolds    int // configures between storing a secret and their answer
	SecretsStoring int // secrets being stored
	Secrets        int // webhook secrets kept (each referenced by a subscription)
	JSONataWaiting int64
	ProcSeeks      int // rewind epochs loaded streams keep for their processors
}

// Footprint returns the server's current counts (tests and operators).
func (s *Server) Footprint() Footprint {
	var f Footprint
	a := s.acc
	a.mu.Lock()
	var open []*Session
	for _, m := range a.sessions {
		for x := range m {
			open = append(open, x)
		}
	}
	a.mu.Unlock()
	f.Sessions = len(open)
	for _, x := range open {
		x.endMu.Lock()
		f.SessionEnds += len(x.ends)
		x.endMu.Unlock()
		f.SessionLive += int(x.live.Load())
	}
	a.secretMu.Lock()
	f.SecretHolds, f.SecretsStoring = len(a.secretHolds)+len(a.secretStores), len(a.secretsStoring)
	f.Secrets = len(a.secrets)
	for _, n := range a.secretCounts {
		f.Secrets += n
	}
	a.secretMu.Unlock()

	s.recv.mu.Lock()
	f.Mounts, f.MountProjects = len(s.recv.mounts), len(s.recv.byProject)
	s.recv.mu.Unlock()
	s.recv.pokeMu.Lock()
	f.Pokes = len(s.recv.pokes)
	s.recv.pokeMu.Unlock()

	ph := &s.procHosts
	ph.mu.Lock()
	f.Hosts, f.HostContracts, f.HostProjects = len(ph.byName), len(ph.contract), len(ph.byProject)
	var hosts []*procMount
	for _, m := range ph.byName {
		hosts = append(hosts, m)
	}
	ph.mu.Unlock()
	for _, m := range hosts {
		m.stopMu.Lock()
		f.HostStops += len(m.stops)
		m.stopMu.Unlock()
	}

	s.mu.Lock()
	f.Actors, f.Unloading = len(s.actors), len(s.unloading)
	loaded := make([]*actor, 0, len(s.actors))
	for _, a := range s.actors {
		loaded = append(loaded, a)
	}
	s.mu.Unlock()
	for _, a := range loaded {
		a.procMu.Lock()
		f.ProcSeeks += len(a.procSeek)
		a.procMu.Unlock()
	}
	f.JSONataWaiting = jsonataWaiting.Load()
	return f
}
