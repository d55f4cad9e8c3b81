package identity

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// FileOptions tunes Files.
type FileOptions struct {
	Poll time.Duration // how often the files are read again; default 2s
	Log  *slog.Logger  // nil: slog.Default()
	// OnReload is called, from the polling goroutine, after each reload of a pair or a bundle
	// whose content changed: nil when it is now served, else why the last good one stays.
	OnReload func(err error)
}

// FileError is a certificate, key or CA file that could not be used, and why.
type FileError struct {
	File string
	Err  error
}

func (e *FileError) Error() string { return "identity: " + e.File + ": " + e.Err.Error() }
func (e *FileError) Unwrap() error { return e.Err }

// FileSource serves a certificate chain, its key and a CA bundle read from files, and the last
// good ones while a renewal is half written.
type FileSource struct {
	certFile, keyFile, caFile string
	opt                       FileOptions

	cert  atomic.Pointer[tls.Certificate]
	roots atomic.Pointer[x509.CertPool]

	// Hashes of what was last read, good or not, so that a bad write is reported once.
	pairSum, caSum [sha256.Size]byte

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// Files reads a PEM certificate chain, its key and a CA bundle, and reads them again every
// opt.Poll. It compares contents, not mtimes: a Kubernetes secret volume swaps a ..data
// symlink, and cert-manager may write the certificate and the key one after the other. A pair
// that does not load (half written, or a certificate with the old key) keeps the last good
// one and is reported to opt.OnReload; a mismatched pair is never served.
func Files(certFile, keyFile, caFile string, opt FileOptions) (*FileSource, error) {
	if opt.Poll <= 0 {
		opt.Poll = 2 * time.Second
	}
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	s := &FileSource{certFile: certFile, keyFile: keyFile, caFile: caFile, opt: opt,
		stop: make(chan struct{}), done: make(chan struct{})}
	if _, err := s.reloadPair(); err != nil {
		return nil, err
	}
	if _, err := s.reloadCA(); err != nil {
		return nil, err
	}
	go s.poll()
	return s, nil
}

func (s *FileSource) Certificate() (*tls.Certificate, error) { return s.cert.Load(), nil }
func (s *FileSource) Roots() (*x509.CertPool, error)         { return s.roots.Load(), nil }

// Close stops the polling; the last good certificate and roots stay served.
func (s *FileSource) Close() error {
	s.closeOnce.Do(func() { close(s.stop) })
	<-s.done
	return nil
}

func (s *FileSource) poll() {
	defer close(s.done)
	t := time.NewTicker(s.opt.Poll)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		for _, reload := range []func() (bool, error){s.reloadPair, s.reloadCA} {
			changed, err := reload()
			if !changed {
				continue
			}
			if err != nil {
				s.opt.Log.Warn("identity: reload failed, keeping the last good files", "err", err)
			}
			if s.opt.OnReload != nil {
				s.opt.OnReload(err)
			}
		}
	}
}

// reloadPair loads the certificate and key when either changed since the last read.
func (s *FileSource) reloadPair() (changed bool, err error) {
	certPEM, err := os.ReadFile(s.certFile)
	if err != nil {
		return s.pairChanged(nil, nil), &FileError{File: s.certFile, Err: err}
	}
	keyPEM, err := os.ReadFile(s.keyFile)
	if err != nil {
		return s.pairChanged(certPEM, nil), &FileError{File: s.keyFile, Err: err}
	}
	if !s.pairChanged(certPEM, keyPEM) {
		return false, nil
	}
	if _, err := parseCerts(certPEM); err != nil {
		return true, &FileError{File: s.certFile, Err: err}
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		// The chain parsed, so what is wrong is the key or its match with the chain.
		return true, &FileError{File: s.keyFile, Err: fmt.Errorf("with %s: %w", s.certFile, err)}
	}
	s.cert.Store(&cert)
	s.opt.Log.Info("identity: certificate loaded", "file", s.certFile, "id", PeerOf(cert.Leaf).ID,
		"serial", cert.Leaf.SerialNumber.Text(16), "not_after", cert.Leaf.NotAfter)
	return true, nil
}

// pairChanged records the pair's hash and says whether it differs from the last one. A read
// error counts as a change only once, as any content does.
func (s *FileSource) pairChanged(certPEM, keyPEM []byte) bool {
	h := sha256.New()
	fmt.Fprintf(h, "%d:", len(certPEM))
	h.Write(certPEM)
	h.Write(keyPEM)
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	changed := sum != s.pairSum
	s.pairSum = sum
	return changed
}

func (s *FileSource) reloadCA() (changed bool, err error) {
	caPEM, err := os.ReadFile(s.caFile)
	sum := sha256.Sum256(caPEM) // an unreadable file hashes as empty
	if sum == s.caSum && s.roots.Load() != nil {
		return false, nil
	}
	s.caSum = sum
	if err != nil {
		return true, &FileError{File: s.caFile, Err: err}
	}
	certs, err := parseCerts(caPEM)
	if err != nil {
		return true, &FileError{File: s.caFile, Err: err}
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	s.roots.Store(pool)
	s.opt.Log.Info("identity: CA bundle loaded", "file", s.caFile, "certificates", len(certs))
	return true, nil
}

// parseCerts reads every CERTIFICATE block; anything else in the file is refused, since a
// truncated write shows up as a block PEM cannot decode.
func parseCerts(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	rest := data
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("PEM block %d is %q, want CERTIFICATE", len(certs)+1, block.Type)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", len(certs)+1, err)
		}
		certs = append(certs, c)
	}
	if len(bytes.TrimSpace(rest)) > 0 {
		return nil, fmt.Errorf("after certificate %d: data that is not a whole PEM block (truncated?)", len(certs))
	}
	if len(certs) == 0 {
		return nil, errors.New("no PEM certificate")
	}
	return certs, nil
}
