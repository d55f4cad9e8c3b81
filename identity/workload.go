package identity

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"sync"

	"github.com/spiffe/go-spiffe/v2/workloadapi"
)

// WorkloadSource serves the X509-SVID and trust bundle the SPIFFE Workload API hands this
// workload; go-spiffe's X509Source follows the agent's rotations.
type WorkloadSource struct {
	x509  *workloadapi.X509Source
	log   *slog.Logger
	stop  context.CancelFunc
	done  chan struct{}
	close sync.Once
}

// Workload connects to the Workload API at socket (e.g. "unix:///run/spire/agent.sock") and
// returns once the first SVID has arrived or ctx is done.
func Workload(ctx context.Context, socket string, log *slog.Logger) (*WorkloadSource, error) {
	if log == nil {
		log = slog.Default()
	}
	src, err := workloadapi.NewX509Source(ctx, workloadapi.WithClientOptions(
		workloadapi.WithAddr(socket), workloadapi.WithLogger(spiffeLog{log})))
	if err != nil {
		return nil, fmt.Errorf("identity: workload API at %s: %w", socket, err)
	}
	watchCtx, stop := context.WithCancel(context.Background())
	w := &WorkloadSource{x509: src, log: log, stop: stop, done: make(chan struct{})}
	w.logSVID("identity: SVID received")
	go w.logRotations(watchCtx)
	return w, nil
}

// Certificate is the current SVID with its chain.
func (w *WorkloadSource) Certificate() (*tls.Certificate, error) {
	svid, err := w.x509.GetX509SVID()
	if err != nil {
		return nil, err
	}
	cert := &tls.Certificate{PrivateKey: svid.PrivateKey, Leaf: svid.Certificates[0]}
	for _, c := range svid.Certificates {
		cert.Certificate = append(cert.Certificate, c.Raw)
	}
	return cert, nil
}

// Roots is the X.509 bundle of this workload's own trust domain; federated trust domains are
// not served.
func (w *WorkloadSource) Roots() (*x509.CertPool, error) {
	svid, err := w.x509.GetX509SVID()
	if err != nil {
		return nil, err
	}
	bundle, err := w.x509.GetX509BundleForTrustDomain(svid.ID.TrustDomain())
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	for _, c := range bundle.X509Authorities() {
		pool.AddCert(c)
	}
	return pool, nil
}

// Close drops the connection to the Workload API; Certificate and Roots fail after it.
func (w *WorkloadSource) Close() error {
	var err error
	w.close.Do(func() {
		w.stop()
		<-w.done
		err = w.x509.Close()
	})
	return err
}

func (w *WorkloadSource) logRotations(ctx context.Context) {
	defer close(w.done)
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.x509.Updated():
			w.logSVID("identity: SVID rotated")
		}
	}
}

func (w *WorkloadSource) logSVID(msg string) {
	svid, err := w.x509.GetX509SVID()
	if err != nil {
		return
	}
	leaf := svid.Certificates[0]
	w.log.Info(msg, "id", svid.ID.String(), "serial", leaf.SerialNumber.Text(16), "not_after", leaf.NotAfter)
}

// spiffeLog carries go-spiffe's messages (lost agent connections, retries) into slog.
type spiffeLog struct{ log *slog.Logger }

func (l spiffeLog) Debugf(format string, args ...any) { l.log.Debug(fmt.Sprintf(format, args...)) }
func (l spiffeLog) Infof(format string, args ...any)  { l.log.Info(fmt.Sprintf(format, args...)) }
func (l spiffeLog) Warnf(format string, args ...any)  { l.log.Warn(fmt.Sprintf(format, args...)) }
func (l spiffeLog) Errorf(format string, args ...any) { l.log.Error(fmt.Sprintf(format, args...)) }
