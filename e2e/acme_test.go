package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// pebbleDir is where the pebble module (a tool dependency) keeps its test certificates.
func pebbleDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/letsencrypt/pebble/v2").Output()
	if err != nil {
		t.Fatalf("locate pebble: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// startPebble runs Pebble (the ACME test CA) and pebble-challtestsrv as its DNS, both on loopback.
// httpPort and tlsPort are where Pebble validates challenges: the edge's ports.
func startPebble(t *testing.T, httpPort, tlsPort string) (dir, root, dnsAddr, mgmt, challtest string) {
	t.Helper()
	src := pebbleDir(t)
	tmp := t.TempDir()
	for _, tool := range []string{"pebble", "pebble-challtestsrv"} {
		if out, err := exec.Command("go", "build", "-o", filepath.Join(tmp, tool), "github.com/letsencrypt/pebble/v2/cmd/"+tool).CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v %s", tool, err, out)
		}
	}
	dnsAddr, acmeAddr, mgmtAddr, chMgmt := freePort(t), freePort(t), freePort(t), freePort(t)
	cfg := map[string]any{"pebble": map[string]any{
		"listenAddress": acmeAddr, "managementListenAddress": mgmtAddr,
		"certificate": filepath.Join(src, "test/certs/localhost/cert.pem"), "privateKey": filepath.Join(src, "test/certs/localhost/key.pem"),
		"httpPort": mustAtoi(httpPort), "tlsPort": mustAtoi(tlsPort), "ocspResponderURL": "", "externalAccountBindingRequired": false,
	}}
	b, _ := json.Marshal(cfg)
	cfgPath := filepath.Join(tmp, "pebble.json")
	os.WriteFile(cfgPath, b, 0o644)
	run := func(name string, env []string, args ...string) {
		c := exec.Command(filepath.Join(tmp, name), args...)
		c.Env = append(os.Environ(), env...)
		logs := &syncBuffer{}
		c.Stdout, c.Stderr = logWriter{logs}, logWriter{logs}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			c.Process.Kill()
			c.Wait()
			if t.Failed() {
				t.Logf("%s logs:\n%s", name, logs.String())
			}
		})
	}
	run("pebble-challtestsrv", nil, "-dnsserver", dnsAddr, "-management", chMgmt, "-http01", "", "-https01", "", "-tlsalpn01", "", "-doh", "", "-defaultIPv6", "")
	run("pebble", []string{"PEBBLE_VA_NOSLEEP=1", "PEBBLE_WFE_NONCEREJECT=0"}, "-config", cfgPath, "-dnsserver", dnsAddr)
	minica := filepath.Join(src, "test/certs/pebble.minica.pem")
	waitTCP(t, acmeAddr)
	waitTCP(t, mgmtAddr)
	waitTCP(t, chMgmt)
	return "https://" + acmeAddr + "/dir", minica, dnsAddr, mgmtAddr, "http://" + chMgmt
}

type logWriter struct{ b *syncBuffer }

func (w logWriter) Write(p []byte) (int, error) { w.b.WriteString(string(p)); return len(p), nil }

func mustAtoi(s string) int {
	var n int
	fmt.Sscan(s, &n)
	return n
}

func waitTCP(t *testing.T, addr string) {
	t.Helper()
	for range 100 {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s does not listen", addr)
}

// pebbleRoots fetches the roots Pebble issues under (they change at every start).
func pebbleRoots(t *testing.T, mgmt, minica string) *x509.CertPool {
	t.Helper()
	pem, err := os.ReadFile(minica)
	if err != nil {
		t.Fatal(err)
	}
	mpool := x509.NewCertPool()
	mpool.AppendCertsFromPEM(pem)
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: mpool}}}
	resp, err := c.Get("https://" + mgmt + "/roots/0")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	root, _ := io.ReadAll(resp.Body)
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(root) {
		t.Fatalf("pebble root: %q", root)
	}
	// Intermediates come in the chain Caddy serves.
	return pool
}

// acmeStack is sandboxd, Pebble (with pebble-challtestsrv) and a Caddy binary running config.
type acmeStack struct {
	d         *daemon
	key       string
	httpsPort string
	home      string // Caddy's XDG dirs
	roots     *x509.CertPool
}

// startACMEStack starts the stack; env adds settings for the Caddyfile given Pebble's addresses.
func startACMEStack(t *testing.T, caddyBin, config string, env func(dir, minica, dnsAddr, challtest string) []string) *acmeStack {
	t.Helper()
	dataDir := t.TempDir()
	key := lastLine(sandboxdCmd(t, "keys", "create", "--data-dir", dataDir, "--owner", "alice"))
	d := startDaemon(t, dataDir, "--pool-size", "0")
	httpsAddr, httpAddr, adminAddr := freePort(t), freePort(t), freePort(t)
	_, httpsPort, _ := net.SplitHostPort(httpsAddr)
	_, httpPort, _ := net.SplitHostPort(httpAddr)
	dir, minica, dnsAddr, mgmt, challtest := startPebble(t, httpPort, httpsPort)

	home := t.TempDir()
	cmd := exec.Command(caddyBin, "run", "--config", config)
	cmd.Env = append(os.Environ(), "PORTHOLE_HTTPS_PORT="+httpsPort, "PORTHOLE_HTTP_PORT="+httpPort, "PORTHOLE_ADMIN="+adminAddr,
		"PORTHOLE_DATA_DIR="+dataDir, "XDG_DATA_HOME="+home+"/data", "XDG_CONFIG_HOME="+home+"/config")
	cmd.Env = append(cmd.Env, env(dir, minica, dnsAddr, challtest)...)
	logs := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = logWriter{logs}, logWriter{logs}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
		if t.Failed() {
			t.Logf("caddy logs:\n%s", logs.String())
		}
	})
	waitTCP(t, "127.0.0.1:"+httpsPort)
	return &acmeStack{d: d, key: key, httpsPort: httpsPort, home: home, roots: pebbleRoots(t, mgmt, minica)}
}

// dialVerified retries a TLS handshake for host, verified against Pebble's roots, while the
// certificate is being obtained (up to a minute).
func (s *acmeStack) dialVerified(t *testing.T, host string) *tls.Conn {
	t.Helper()
	var err error
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		var conn *tls.Conn
		if conn, err = tls.Dial("tcp", "127.0.0.1:"+s.httpsPort, &tls.Config{ServerName: host, RootCAs: s.roots}); err == nil {
			return conn
		}
	}
	t.Fatalf("no certificate from Pebble for %s: %v", host, err)
	return nil
}

// storedCertificates lists the names Caddy keeps certificates for.
func (s *acmeStack) storedCertificates() []string {
	dirs, _ := filepath.Glob(filepath.Join(s.home, "data", "caddy", "certificates", "*", "*"))
	var names []string
	for _, d := range dirs {
		names = append(names, filepath.Base(d))
	}
	return names
}

// TestOnDemandACME: the edge gets a preview certificate from Pebble through on-demand TLS, only for a
// live sandbox, with real ACME validation (Pebble connects back to the edge).
func TestOnDemandACME(t *testing.T) {
	st := startACMEStack(t, binDir+"/caddy", "testdata/Caddyfile.acme", func(dir, minica, _, _ string) []string {
		return []string{"ACME_DIR=" + dir, "ACME_ROOT=" + minica}
	})
	id := startApp(t, st.d, st.key, "acme", "public")
	host := "3000-" + id + ".preview.localhost"
	conn := st.dialVerified(t, host)
	fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host)
	body, _ := io.ReadAll(conn)
	conn.Close()
	if !strings.Contains(string(body), "hello from acme") {
		t.Fatalf("through the ACME-certified edge: %q", body)
	}
	// An unknown sandbox gets nothing: no handshake, no order at Pebble, nothing in storage.
	unknown := "3000-" + strings.Repeat("u", 26) + ".preview.localhost"
	if c, err := tls.Dial("tcp", "127.0.0.1:"+st.httpsPort, &tls.Config{ServerName: unknown, InsecureSkipVerify: true}); err == nil {
		c.Close()
		t.Fatal("a handshake for an unknown sandbox succeeded")
	}
	if stored := st.storedCertificates(); len(stored) != 1 || stored[0] != host {
		t.Fatalf("stored certificates: %v, want only %s", stored, host)
	}
}

// TestWildcardDNS01: one DNS-01 wildcard certificate for *.preview.localhost from Pebble, with
// pebble-challtestsrv as the DNS server Pebble asks and the provider publishes to; every preview host
// is served under it, and no per-preview certificate is issued.
func TestWildcardDNS01(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "testcaddy")
	if out, err := exec.Command("go", "build", "-o", bin, "./internal/testcaddy").CombinedOutput(); err != nil {
		t.Fatalf("build testcaddy: %v %s", err, out)
	}
	st := startACMEStack(t, bin, "testdata/Caddyfile.wildcard", func(dir, minica, dnsAddr, challtest string) []string {
		// challtestsrv answers no SOA queries, which the ACME client uses to find the zone of the
		// challenge record: a small DNS front before it is authoritative for the SOA of
		// preview.localhost and passes every other question through.
		return []string{"ACME_DIR=" + dir, "ACME_ROOT=" + minica, "ACME_DNS=" + startSOAFront(t, "preview.localhost.", dnsAddr), "CHALLTEST_URL=" + challtest}
	})
	a := startApp(t, st.d, st.key, "one", "public")
	b := startApp(t, st.d, st.key, "two", "public")
	for _, id := range []string{a, b} {
		host := "3000-" + id + ".preview.localhost"
		conn := st.dialVerified(t, host)
		names := conn.ConnectionState().PeerCertificates[0].DNSNames
		if len(names) != 1 || names[0] != "*.preview.localhost" {
			t.Fatalf("%s is served with a certificate for %v, want the wildcard", host, names)
		}
		fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host)
		body, _ := io.ReadAll(conn)
		conn.Close()
		if !strings.Contains(string(body), "hello from") {
			t.Fatalf("%s: %q", host, body)
		}
	}
	if stored := st.storedCertificates(); len(stored) != 1 || stored[0] != "wildcard_.preview.localhost" {
		t.Fatalf("stored certificates: %v, want only the wildcard", stored)
	}
}

// startSOAFront serves DNS on loopback UDP: SOA questions within zone get an SOA for zone, every
// other question is forwarded to upstream.
func startSOAFront(t *testing.T, zone, upstream string) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		if len(r.Question) == 1 && r.Question[0].Qtype == dns.TypeSOA && dns.IsSubDomain(zone, r.Question[0].Name) {
			m := new(dns.Msg)
			m.SetReply(r)
			m.Authoritative = true
			soa := &dns.SOA{Hdr: dns.RR_Header{Name: zone, Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: 1},
				Ns: "ns." + zone, Mbox: "hostmaster." + zone, Serial: 1, Refresh: 1, Retry: 1, Expire: 1, Minttl: 1}
			if r.Question[0].Name == zone {
				m.Answer = []dns.RR{soa}
			} else {
				m.Ns = []dns.RR{soa}
			}
			w.WriteMsg(m)
			return
		}
		resp, err := dns.Exchange(r, upstream)
		if err != nil {
			m := new(dns.Msg)
			m.SetRcode(r, dns.RcodeServerFailure)
			w.WriteMsg(m)
			return
		}
		w.WriteMsg(resp)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	return pc.LocalAddr().String()
}
