// Package redistest starts real redis-server processes for tests: each on a
// free loopback port, in its own temporary directory, with persistence off.
// Every server a test starts is stopped by t.Cleanup.
//
// Concurrency model: a Server is used from one test goroutine; Stop, Kill
// and Restart must not race each other.
package redistest

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tiergate/tiergate/internal/testutil"
)

// Server is one redis-server process.
type Server struct {
	t       testing.TB
	tls     bool
	caFile  string
	caPool  *x509.CertPool
	dir     string
	port    int
	extra   []string
	proc    *testutil.Process
	logPath string
}

// Options change how the server starts.
type Options struct {
	// Cluster starts the server with cluster support and assigns it every
	// hash slot, so it is a one-node Redis Cluster.
	Cluster bool
	// Password sets requirepass.
	Password string
	// TLS serves TLS only (rediss://), with a certificate for 127.0.0.1
	// from a fresh test CA (CAFile).
	TLS bool
	// Extra arguments for redis-server.
	Extra []string

	noSlots bool // StartCluster assigns the slots itself
}

// Start starts a redis-server on a free loopback port, or skips the test
// when the binary is missing and the environment does not demand it
// (TIERGATE_REQUIRE_REDIS=1 turns the skip into a failure).
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("TIERGATE_REQUIRE_REDIS") == "1" || os.Getenv("CI") != "" {
			t.Fatalf("redis-server not found (install it with hack/ensure-deb.sh redis-server): %v", err)
		}
		t.Skipf("redis-server not found: %v", err)
	}
	s := &Server{t: t, dir: t.TempDir(), port: FreePort(t), tls: opts.TLS}
	if opts.TLS {
		s.makeCerts()
		s.extra = append(s.extra, "--tls-cert-file", filepath.Join(s.dir, "server.pem"),
			"--tls-key-file", filepath.Join(s.dir, "server-key.pem"),
			"--tls-ca-cert-file", s.caFile, "--tls-auth-clients", "no")
	}
	s.extra = append(s.extra, opts.Extra...)
	if opts.Password != "" {
		s.extra = append(s.extra, "--requirepass", opts.Password)
	}
	if opts.Cluster {
		s.extra = append(s.extra, "--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(s.dir, "nodes.conf"))
	}
	s.start()
	t.Cleanup(s.Stop)
	if opts.Cluster && !opts.noSlots {
		s.CLI(opts.Password, "CLUSTER", "ADDSLOTSRANGE", "0", "16383")
		s.waitClusterOK(opts.Password, 1)
	}
	return s
}

// StartCluster starts an n-node Redis Cluster (masters only, the hash
// slots split evenly) and returns its nodes.
func StartCluster(t testing.TB, n int) []*Server {
	t.Helper()
	nodes := make([]*Server, n)
	for i := range nodes {
		nodes[i] = Start(t, Options{Cluster: true, noSlots: true})
		lo, hi := i*16384/n, (i+1)*16384/n-1
		nodes[i].CLI("", "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(lo), strconv.Itoa(hi))
	}
	for _, x := range nodes[1:] {
		nodes[0].CLI("", "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(x.port))
	}
	for _, x := range nodes {
		x.waitClusterOK("", n)
	}
	return nodes
}

var clusterSize = regexp.MustCompile(`cluster_size:(\d+)`)

// waitClusterOK waits until the node reports cluster_state:ok with n known
// masters.
func (s *Server) waitClusterOK(password string, n int) {
	s.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		info := s.CLI(password, "CLUSTER", "INFO")
		m := clusterSize.FindStringSubmatch(info)
		if strings.Contains(info, "cluster_state:ok") && m != nil && m[1] == strconv.Itoa(n) {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("redis cluster node on port %d not ok with %d masters:\n%s", s.port, n, info)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	return testutil.FreePort(t, "127.0.0.1")
}

func (s *Server) start() {
	s.t.Helper()
	s.logPath = filepath.Join(s.dir, "redis.log")
	portArgs := []string{"--port", strconv.Itoa(s.port)}
	if s.tls {
		portArgs = []string{"--port", "0", "--tls-port", strconv.Itoa(s.port)}
	}
	args := append(append(portArgs,
		"--bind", "127.0.0.1",
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--logfile", s.logPath,
		"--daemonize", "no",
	), s.extra...)
	p, err := testutil.Start(exec.Command("redis-server", args...))
	if err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	s.proc = p
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.Addr(), 100*time.Millisecond)
		if err == nil && s.tls {
			tc := tls.Client(c, &tls.Config{RootCAs: s.caPool, ServerName: "127.0.0.1"})
			_ = tc.SetDeadline(time.Now().Add(time.Second))
			if err = tc.Handshake(); err == nil {
				c = tc
			} else {
				c.Close()
			}
		}
		if err == nil {
			// The port accepts before the server has loaded; PING proves it.
			ok := ping(c)
			c.Close()
			if ok {
				return
			}
		}
		if p.Exited() {
			s.t.Fatalf("redis-server on port %d exited at start; log:\n%s", s.port, s.Log())
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("redis-server on port %d did not answer within 10s; log:\n%s", s.port, s.Log())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func ping(c net.Conn) bool {
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	// +PONG, or -NOAUTH when a password is set: either way it serves.
	return err == nil && (strings.HasPrefix(line, "+PONG") || strings.HasPrefix(line, "-NOAUTH"))
}

// Addr is host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Port is the TCP port.
func (s *Server) Port() int { return s.port }

// URL is redis://127.0.0.1:port/db, or rediss:// for a TLS server.
func (s *Server) URL(db int) string {
	if s.tls {
		return fmt.Sprintf("rediss://%s/%d", s.Addr(), db)
	}
	return fmt.Sprintf("redis://%s/%d", s.Addr(), db)
}

// CAFile is the PEM file of the CA that signed a TLS server's certificate.
func (s *Server) CAFile() string { return s.caFile }

// makeCerts writes a fresh CA and a server certificate for 127.0.0.1.
func (s *Server) makeCerts() {
	s.t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		s.t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "redistest CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		s.t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		s.t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		s.t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		s.t.Fatal(err)
	}
	s.caFile = filepath.Join(s.dir, "ca.pem")
	for path, block := range map[string]*pem.Block{
		s.caFile:                               {Type: "CERTIFICATE", Bytes: caDER},
		filepath.Join(s.dir, "server.pem"):     {Type: "CERTIFICATE", Bytes: der},
		filepath.Join(s.dir, "server-key.pem"): {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			s.t.Fatal(err)
		}
	}
	s.caPool = x509.NewCertPool()
	s.caPool.AddCert(ca)
}

// Log returns the server's log file.
func (s *Server) Log() string {
	b, _ := os.ReadFile(s.logPath)
	return string(b)
}

// Running reports whether the process is alive.
func (s *Server) Running() bool { return s.proc != nil && !s.proc.Exited() }

// Stop ends the server (SIGINT, then SIGKILL after 5s). Idempotent.
func (s *Server) Stop() {
	if !s.Running() {
		return
	}
	s.Resume() // a paused server would not see SIGINT
	s.proc.Terminate(os.Interrupt, 5*time.Second)
}

// Kill ends the server with SIGKILL, like a crash. Its data is gone, since
// persistence is off.
func (s *Server) Kill() {
	if !s.Running() {
		return
	}
	s.proc.Kill()
}

// Pause freezes the server (SIGSTOP): connections stay open and nothing
// answers, like a hung or partitioned server. Resume undoes it.
func (s *Server) Pause() { _ = s.proc.Signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() { _ = s.proc.Signal(syscall.SIGCONT) }

// Restart starts a fresh, empty server on the same port after Stop or Kill.
func (s *Server) Restart() {
	s.t.Helper()
	if s.Running() {
		s.t.Fatalf("redistest: Restart while running")
	}
	s.start()
}

// CLI runs redis-cli against the server and returns its output; it fails
// the test on error.
func (s *Server) CLI(password string, args ...string) string {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	base := []string{"-h", "127.0.0.1", "-p", strconv.Itoa(s.port)}
	if password != "" {
		base = append(base, "--no-auth-warning", "-a", password)
	}
	out, err := exec.CommandContext(ctx, "redis-cli", append(base, args...)...).CombinedOutput()
	if err != nil {
		s.t.Fatalf("redis-cli %v: %v\n%s", args, err, out)
	}
	return string(out)
}
