// Command storeguard-image builds storeguard's container image from a static storeguard binary,
// with no Docker daemon and nothing pulled from a registry: one layer on an empty base (the
// binary, /etc/passwd and /etc/group naming the non-root user, an empty /tmp), run as 65532:65532,
// no shell. Every timestamp is --epoch (the commit's time), so that two builds of one commit give
// one digest. It writes an OCI image layout (--oci) and/or a docker-archive tarball (--tar, what
// podman load and docker load take), and a CycloneDX SBOM of the binary's Go modules (--sbom),
// read from the binary itself (what `go version -m` prints).
//
//	go run ./cmd/storeguard-image --binary bin/storeguard --epoch 1764700000 \
//	    --tag storeguard:dev --oci out/oci --tar out/storeguard.tar --sbom out/storeguard.cdx.json
package main

import (
	"archive/tar"
	"bytes"
	"debug/buildinfo"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The user the image runs as: distroless's nonroot, the uid the Kubernetes manifests give.
const uid = 65532

func main() {
	var o options
	flag.StringVar(&o.binary, "binary", "", "the static storeguard binary (CGO_ENABLED=0 go build -trimpath)")
	flag.Int64Var(&o.epoch, "epoch", 0, "every timestamp in the image, in Unix seconds (the commit's time: git log -1 --format=%ct)")
	flag.StringVar(&o.tag, "tag", "storeguard:dev", "the image's name in the tarball")
	flag.StringVar(&o.oci, "oci", "", "write an OCI image layout to this directory")
	flag.StringVar(&o.tar, "tar", "", "write a docker-archive tarball (podman load, docker load) to this file")
	flag.StringVar(&o.sbom, "sbom", "", "write the CycloneDX 1.5 SBOM of the binary's Go modules to this file")
	flag.StringVar(&o.source, "source", "", "org.opencontainers.image.source label (the repository's address)")
	flag.Parse()
	if err := o.run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "storeguard-image:", err)
		os.Exit(1)
	}
}

type options struct {
	binary, tag, oci, tar, sbom, source string
	epoch                               int64
}

func (o options) run(out io.Writer) error {
	if o.binary == "" || o.epoch <= 0 {
		return errors.New("--binary and --epoch are needed")
	}
	if o.oci == "" && o.tar == "" && o.sbom == "" {
		return errors.New("nothing to write: give --oci, --tar or --sbom")
	}
	bin, err := os.ReadFile(o.binary)
	if err != nil {
		return err
	}
	info, err := buildinfo.ReadFile(o.binary)
	if err != nil {
		return fmt.Errorf("%s: no Go build information: %w", o.binary, err)
	}
	if s := setting(info, "CGO_ENABLED"); s != "0" {
		return fmt.Errorf("%s: CGO_ENABLED=%q: the image has no libc, build with CGO_ENABLED=0", o.binary, s)
	}
	when := time.Unix(o.epoch, 0).UTC()
	img, err := image(bin, info, when, o.source)
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	if o.oci != "" {
		if err := os.RemoveAll(o.oci); err != nil {
			return err
		}
		p, err := layout.Write(o.oci, empty.Index)
		if err != nil {
			return err
		}
		if err := p.AppendImage(img); err != nil {
			return err
		}
	}
	if o.tar != "" {
		tag, err := name.NewTag(o.tag, name.WithDefaultRegistry("localhost"))
		if err != nil {
			return fmt.Errorf("--tag: %w", err)
		}
		if err := tarball.WriteToFile(o.tar, tag, img); err != nil {
			return err
		}
	}
	if o.sbom != "" {
		b, err := sbom(info, digest, when)
		if err != nil {
			return err
		}
		if err := os.WriteFile(o.sbom, b, 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintln(out, digest)
	return nil
}

func setting(info *debug.BuildInfo, key string) string {
	for _, s := range info.Settings {
		if s.Key == key {
			return s.Value
		}
	}
	return ""
}

// image is the one layer on an empty base, with its config.
func image(bin []byte, info *debug.BuildInfo, when time.Time, source string) (v1.Image, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(h *tar.Header, body []byte) error {
		h.ModTime, h.Format = when, tar.FormatPAX
		h.Uname, h.Gname = "root", "root"
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(body))
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(body)
		return err
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", uid, uid)
	group := fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", uid)
	for _, f := range []struct {
		h    tar.Header
		body []byte
	}{
		{tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755}, nil},
		{tar.Header{Name: "etc/group", Typeflag: tar.TypeReg, Mode: 0o644}, []byte(group)},
		{tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644}, []byte(passwd)},
		{tar.Header{Name: "home/", Typeflag: tar.TypeDir, Mode: 0o755}, nil},
		{tar.Header{Name: "home/nonroot/", Typeflag: tar.TypeDir, Mode: 0o700, Uid: uid, Gid: uid}, nil},
		{tar.Header{Name: "storeguard", Typeflag: tar.TypeReg, Mode: 0o755}, bin},
		{tar.Header{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777}, nil},
	} {
		h := f.h
		if err := add(&h, f.body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(buf.Bytes())), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img, err := mutate.Append(mutate.MediaType(empty.Image, types.OCIManifestSchema1), mutate.Addendum{
		Layer: layer, History: v1.History{Created: v1.Time{Time: when}, CreatedBy: "storeguard-image: /storeguard, /etc/passwd, /etc/group, /tmp"},
	})
	if err != nil {
		return nil, err
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", setting(info, "GOARCH")
	cf.Created = v1.Time{Time: when}
	cf.Config = v1.Config{
		Entrypoint: []string{"/storeguard"},
		Cmd:        []string{"--help"},
		User:       fmt.Sprintf("%d:%d", uid, uid),
		WorkingDir: "/home/nonroot",
		Env:        []string{"HOME=/home/nonroot"},
		Labels: map[string]string{
			"org.opencontainers.image.title":       "storeguard",
			"org.opencontainers.image.description": "A guard proxy for PyTorch's TCPStore (MASTER_PORT)",
			"org.opencontainers.image.revision":    setting(info, "vcs.revision"),
			"org.opencontainers.image.created":     when.Format(time.RFC3339),
			"org.opencontainers.image.source":      source,
		},
	}
	for k, v := range cf.Config.Labels {
		if v == "" {
			delete(cf.Config.Labels, k)
		}
	}
	return mutate.ConfigFile(img, cf)
}

// sbom is a CycloneDX 1.5 document: storeguard (the main module, at the image's digest) and
// every Go module the binary was built with, as `go version -m` lists them (path, version, h1
// sum), each a pkg:golang purl.
func sbom(info *debug.BuildInfo, digest v1.Hash, when time.Time) ([]byte, error) {
	type hash struct {
		Alg     string `json:"alg"`
		Content string `json:"content"`
	}
	type component struct {
		Type    string `json:"type"`
		BOMRef  string `json:"bom-ref"`
		Name    string `json:"name"`
		Version string `json:"version"`
		PURL    string `json:"purl"`
		Hashes  []hash `json:"hashes,omitempty"`
	}
	purl := func(path, version string) string {
		return "pkg:golang/" + strings.ToLower(path) + "@" + version
	}
	mod := func(m *debug.Module) component {
		if m.Replace != nil {
			m = m.Replace
		}
		c := component{Type: "library", Name: m.Path, Version: m.Version, PURL: purl(m.Path, m.Version)}
		c.BOMRef = c.PURL
		// go.sum's h1: is a SHA-256 (over the module's file hashes), in base64; CycloneDX takes it
		// in hex, as cyclonedx-gomod gives it.
		if h, ok := strings.CutPrefix(m.Sum, "h1:"); ok {
			if b, err := base64.StdEncoding.DecodeString(h); err == nil {
				c.Hashes = []hash{{Alg: "SHA-256", Content: fmt.Sprintf("%x", b)}}
			}
		}
		return c
	}
	main := component{Type: "application", Name: "storeguard", Version: info.Main.Version,
		PURL: purl(info.Main.Path, info.Main.Version)}
	main.BOMRef = main.PURL
	var comps []component
	var deps []string
	for _, d := range info.Deps {
		c := mod(d)
		comps = append(comps, c)
		deps = append(deps, c.BOMRef)
	}
	doc := map[string]any{
		"bomFormat":    "CycloneDX",
		"specVersion":  "1.5",
		"serialNumber": "urn:uuid:" + uuidFrom(digest.Hex),
		"version":      1,
		"metadata": map[string]any{
			"timestamp": when.Format(time.RFC3339),
			"tools":     map[string]any{"components": []map[string]string{{"type": "application", "name": "storeguard-image"}}},
			"component": map[string]any{
				"type": "container", "name": "storeguard", "version": digest.String(),
				"bom-ref":    "storeguard-image",
				"components": []component{main},
			},
			"properties": []map[string]string{
				{"name": "go.version", "value": info.GoVersion},
				{"name": "vcs.revision", "value": setting(info, "vcs.revision")},
			},
		},
		"components":   comps,
		"dependencies": []map[string]any{{"ref": main.BOMRef, "dependsOn": deps}},
	}
	return json.MarshalIndent(doc, "", "  ")
}

// uuidFrom makes a version-4-shaped UUID of a hex digest, so that one image has one serial number.
func uuidFrom(hex string) string {
	b := []byte(hex[:32])
	b[12] = '4'
	b[16] = "89ab"[strings.IndexByte("0123456789abcdef", b[16])%4]
	return fmt.Sprintf("%s-%s-%s-%s-%s", b[0:8], b[8:12], b[12:16], b[16:20], b[20:32])
}
