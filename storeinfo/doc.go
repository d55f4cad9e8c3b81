// Package storeinfo learns what storeguard needs to know of the store it guards by asking it
// and the host it runs on: the generation and backend it speaks (Learn, Learner), the keys it
// holds (Learner.Exists, Learner.Count), its descriptor limit, which caps the guard's store
// connections (Limiter), and whether it listens beyond loopback (WarnExposure). No policy: what
// it learns is told to an Observer, and the caps are set on an admission.StoreSlots.
package storeinfo
