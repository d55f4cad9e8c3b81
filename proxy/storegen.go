package proxy

import "github.com/storeguard/storeguard/storeinfo"

// Store reports the generation and backend of the store as learned in auto mode; ok is false
// while it is not known (and always with a generation configured).
func (s *Server) Store() (info storeinfo.Info, ok bool) { return s.store.Get() }

// storeTarget is the store the settings name now, for s.store.
func (s *Server) storeTarget() storeinfo.Target {
	st := s.set.Load()
	return storeinfo.Target{Addr: s.route.Route().Dial, Auto: st.dec.Gen.Auto, Gen: st.dec.Gen.Gen}
}

// storeNews counts and logs what s.store learns of the store (storeinfo.Observer).
type storeNews struct{ s *Server }

func (n storeNews) Failed(addr string, err error, live bool) {
	s := n.s
	s.m.storeProbes.WithLabelValues("failed").Inc()
	if live && s.every.dial.allow(s.now()) {
		s.log.Info("auto: the store's generation is not known yet; new connections wait for it", "upstream", addr, "err", err)
	}
}

func (n storeNews) Learned(addr string, info storeinfo.Info, live bool) {
	s := n.s
	s.m.storeProbes.WithLabelValues("learned").Inc()
	if live {
		s.m.setStore(info, true)
	}
	lim := s.set.Load().decoderFor(info).Limits
	s.log.Info("auto: the store speaks "+info.String(), "upstream", addr,
		"max-value-bytes", lim.MaxValueBytes, "max-message-bytes", lim.MaxMessageBytes)
}

func (n storeNews) Gone(addr string, info storeinfo.Info, err error) {
	s := n.s
	s.storeGone()
	s.m.setStore(info, false)
	s.log.Warn("auto: the store closed the guard's connection (a restart?); new connections wait until its generation is learned again",
		"upstream", addr, "err", err)
}

func (n storeNews) Forgot() { n.s.m.setStore(storeinfo.Info{}, false) }

func (n storeNews) KeyLookup(result string) { n.s.m.keyLookups.WithLabelValues(result).Inc() }
