package caddymodule

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// TestCaddyfileAdapt adapts each testdata/*.caddyfile and compares the JSON with its golden file,
// so the Caddyfile syntax of our modules is pinned down.
func TestCaddyfileAdapt(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.caddyfile")
	if len(files) == 0 {
		t.Fatal("no testdata")
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			in, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			adapter := caddyfile.Adapter{ServerType: httpcaddyfileServerType()}
			out, warnings, err := adapter.Adapt(in, nil)
			if err != nil {
				t.Fatalf("adapt: %v", err)
			}
			for _, w := range warnings {
				t.Logf("warning: %s", w.Message)
			}
			var pretty bytes.Buffer
			if err := json.Indent(&pretty, out, "", "\t"); err != nil {
				t.Fatal(err)
			}
			golden := strings.TrimSuffix(f, ".caddyfile") + ".json"
			if *update {
				if err := os.WriteFile(golden, append(pretty.Bytes(), '\n'), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("golden file: %v (run go test -update)", err)
			}
			if strings.TrimSpace(pretty.String()) != strings.TrimSpace(string(want)) {
				t.Fatalf("adapted JSON differs from %s:\n%s", golden, pretty.String())
			}
		})
	}
}

func TestCaddyfileErrors(t *testing.T) {
	for name, in := range map[string]string{
		"unknown handler option":  "a.example {\n\tporthole_preview {\n\t\tbogus 1\n\t}\n}\n",
		"missing data_dir value":  "a.example {\n\tporthole_preview {\n\t\tdata_dir\n\t}\n}\n",
		"unknown upstream option": "a.example {\n\treverse_proxy {\n\t\tdynamic porthole {\n\t\t\tnope x\n\t\t}\n\t}\n}\n",
	} {
		adapter := caddyfile.Adapter{ServerType: httpcaddyfileServerType()}
		if _, _, err := adapter.Adapt([]byte(in), nil); err == nil {
			t.Errorf("%s: adapted without error", name)
		}
	}
}

// TestShippedCaddyfiles: the root Caddyfile (local stack) and the on-demand production one adapt.
// (deploy/Caddyfile.wildcard needs a DNS provider module this build does not include.)
func TestShippedCaddyfiles(t *testing.T) {
	for _, f := range []string{"../Caddyfile", "../deploy/Caddyfile.on-demand"} {
		in, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		adapter := caddyfile.Adapter{ServerType: httpcaddyfileServerType()}
		out, _, err := adapter.Adapt(in, nil)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, want := range []string{`"handler":"porthole_preview"`, `"source":"porthole"`, `"module":"porthole"`, `"strict_sni_host":true`} {
			if !strings.Contains(string(out), want) {
				t.Errorf("%s: adapted config lacks %s", f, want)
			}
		}
	}
}
