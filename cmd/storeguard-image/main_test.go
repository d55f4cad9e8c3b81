package main

import (
	"archive/tar"
	"encoding/json"
	"io"
	"runtime/debug"
	"slices"
	"testing"
	"time"
)

var info = &debug.BuildInfo{
	GoVersion: "go1.26.8",
	Main:      debug.Module{Path: "github.com/storeguard/storeguard", Version: "v0.0.0-20261202000000-abcdef123456"},
	Deps: []*debug.Module{
		{Path: "github.com/google/nftables", Version: "v0.3.0", Sum: "h1:bkyZ0cbpVeMHXOrtlFc8ISmfVqq5gPJukoYieyVmITg="},
		{Path: "example.com/old", Version: "v1.0.0", Replace: &debug.Module{Path: "example.com/new", Version: "v1.1.0"}},
	},
	Settings: []debug.BuildSetting{{Key: "GOARCH", Value: "amd64"}, {Key: "CGO_ENABLED", Value: "0"}, {Key: "vcs.revision", Value: "abc"}},
}

// One input, one digest: nothing in the image depends on when or where it was built; another
// epoch is another image.
func TestImageIsReproducible(t *testing.T) {
	when := time.Unix(1764700000, 0)
	digest := func(bin string, at time.Time) string {
		img, err := image([]byte(bin), info, at, "https://example.com/storeguard")
		if err != nil {
			t.Fatal(err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		return d.String()
	}
	a, b := digest("binary", when), digest("binary", when)
	if a != b {
		t.Fatalf("two builds of one input: %s and %s", a, b)
	}
	if c := digest("binary", when.Add(time.Second)); c == a {
		t.Fatal("another epoch gave the same digest")
	}
	if c := digest("other binary", when); c == a {
		t.Fatal("another binary gave the same digest")
	}
}

// The image: non-root, its entrypoint the binary, one layer of the named files only (no shell).
func TestImageHoldsTheBinaryOnly(t *testing.T) {
	img, err := image([]byte("#!binary"), info, time.Unix(1764700000, 0), "")
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "65532:65532" || !slices.Equal(cf.Config.Entrypoint, []string{"/storeguard"}) || cf.Architecture != "amd64" {
		t.Fatalf("config: user %q, entrypoint %q, arch %q", cf.Config.User, cf.Config.Entrypoint, cf.Architecture)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Name == "storeguard" && (h.Mode != 0o755 || h.Uid != 0) {
			t.Errorf("storeguard: mode %o, uid %d", h.Mode, h.Uid)
		}
	}
	want := []string{"etc/", "etc/group", "etc/passwd", "home/", "home/nonroot/", "storeguard", "tmp/"}
	if !slices.Equal(names, want) {
		t.Fatalf("layer holds %q, want %q", names, want)
	}
}

// The SBOM names every module the binary was built with, a replaced one as its replacement, with
// go.sum's hash in hex.
func TestSBOMListsTheModules(t *testing.T) {
	img, _ := image([]byte("x"), info, time.Unix(1764700000, 0), "")
	d, _ := img.Digest()
	b, err := sbom(info, d, time.Unix(1764700000, 0))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		BOMFormat, SpecVersion string
		Components             []struct {
			Name, Version, PURL string
			Hashes              []struct{ Alg, Content string }
		}
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.BOMFormat != "CycloneDX" || doc.SpecVersion != "1.5" || len(doc.Components) != 2 {
		t.Fatalf("%s %s, %d components", doc.BOMFormat, doc.SpecVersion, len(doc.Components))
	}
	c := doc.Components[0]
	if c.Name != "github.com/google/nftables" || c.PURL != "pkg:golang/github.com/google/nftables@v0.3.0" ||
		len(c.Hashes) != 1 || c.Hashes[0].Content != "6e4c99d1c6e955e3075ceaed94573c21299f56aab980f26e9286227b25662138" {
		t.Errorf("nftables: %+v", c)
	}
	if r := doc.Components[1]; r.Name != "example.com/new" || r.Version != "v1.1.0" {
		t.Errorf("a replaced module is listed as %s %s, want its replacement example.com/new v1.1.0", r.Name, r.Version)
	}
}
