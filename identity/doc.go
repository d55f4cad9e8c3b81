// Package identity says who is at the other end of a guard-to-guard connection: it loads this
// guard's certificate and trust roots (from files that renew under a running job, or from the
// SPIFFE Workload API), builds the mutual TLS 1.3 configs, and refuses a handshake with a
// [Reason] that audit events and metrics can use. It knows certificates and nothing about the
// TCPStore protocol or sockets beyond what crypto/tls needs.
package identity
