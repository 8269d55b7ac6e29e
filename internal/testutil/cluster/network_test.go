package cluster

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestListenCIDRRefusals(t *testing.T) {
	tests := map[string]struct {
		cidr, want string
	}{
		"not an address":  {"nonsense", `pod CIDR: netip.ParsePrefix("nonsense"): no '/'`},
		"not loopback":    {"10.0.0.0/24", "pod CIDR 10.0.0.0/24 is not inside 127.0.0.0/8"},
		"wider than lo":   {"126.0.0.0/7", "pod CIDR 126.0.0.0/7 is not inside 127.0.0.0/8"},
		"IPv6 loopback":   {"::1/128", "pod CIDR ::1/128 is not inside 127.0.0.0/8"},
		"too many hosts":  {"127.90.0.0/19", "pod CIDR 127.90.0.0/19 has 8190 host addresses, want at most 4096"},
		"masked to lower": {"127.0.0.77/7", "pod CIDR 126.0.0.0/7 is not inside 127.0.0.0/8"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			n, err := ListenCIDR(tc.cidr, 0, "127.0.0.1:1")
			if err == nil {
				n.Close()
				t.Fatalf("ListenCIDR(%q) succeeded", tc.cidr)
			}
			if err.Error() != tc.want {
				t.Errorf("error %q, want %q", err, tc.want)
			}
		})
	}
}

func TestHostAddrs(t *testing.T) {
	tests := map[string]struct {
		cidr string
		want []string
	}{
		"/29 without network and broadcast": {"127.88.250.0/29", []string{"127.88.250.1", "127.88.250.2", "127.88.250.3", "127.88.250.4", "127.88.250.5", "127.88.250.6"}},
		"/31 both":                          {"127.88.250.8/31", []string{"127.88.250.8", "127.88.250.9"}},
		"/32 the one":                       {"127.88.250.9/32", []string{"127.88.250.9"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			n, err := ListenCIDR(tc.cidr, 0, "127.0.0.1:1")
			if err != nil {
				t.Fatal(err)
			}
			defer n.Close()
			var got []string
			for _, a := range hostAddrs(n.Prefix()) {
				got = append(got, a.String())
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("addresses (-want +got):\n%s", diff)
			}
		})
	}
}

// backend is an HTTP server on 127.0.0.1 that answers "ok".
func backend(t *testing.T) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(s.Close)
	return s
}

// get GETs / on ip:port over c (one connection per client) and returns
// the body.
func get(c *http.Client, ip string, port int) (string, error) {
	resp, err := c.Get("http://" + net.JoinHostPort(ip, strconv.Itoa(port)) + "/")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func oneConnClient() *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1}}
}

func TestNetworkStates(t *testing.T) {
	b := backend(t)
	n, err := ListenCIDR("127.88.251.0/29", 0, b.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	const ip, other = "127.88.251.1", "127.88.251.2"
	port := n.Port()

	// Closed: nothing listens, the connection is refused.
	c := oneConnClient()
	if _, err := get(c, ip, port); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("GET on a closed address: %v, want connection refused", err)
	}
	if err := n.SetState(ip, Serving); err != nil {
		t.Fatal(err)
	}
	if got, err := get(c, ip, port); err != nil || got != "ok" {
		t.Fatalf("GET on a serving address: %q, %v", got, err)
	}
	if _, err := get(oneConnClient(), other, port); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("GET on the other, closed, address: %v, want connection refused", err)
	}

	// Draining: the kept-alive connection still works, a new one does not.
	if err := n.SetState(ip, Draining); err != nil {
		t.Fatal(err)
	}
	if got, err := get(c, ip, port); err != nil || got != "ok" {
		t.Errorf("GET on the draining address's open connection: %q, %v", got, err)
	}
	if _, err := get(oneConnClient(), ip, port); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("GET on a new connection to a draining address: %v, want connection refused", err)
	}

	// Closed again: the open connection is cut.
	if err := n.SetState(ip, Closed); err != nil {
		t.Fatal(err)
	}
	if _, err := get(c, ip, port); err == nil {
		t.Error("GET on the cut connection succeeded")
	}
	// The kernel refused the connections made while nothing listened:
	// none was accepted, so none counts as Refused.
	got := n.Stats(ip)
	if got.Received == 0 || got.LastReceived.IsZero() {
		t.Errorf("%s received %d bytes, the last at %s: want the GETs' bytes", ip, got.Received, got.LastReceived)
	}
	got.Received, got.LastReceived = 0, time.Time{} // TestNetworkCountsReceived counts them
	want := AddrStats{Accepted: 1, Reset: 1, PeakOpen: 1}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("stats of %s (-want +got):\n%s", ip, diff)
	}
	if diff := cmp.Diff(AddrStats{}, n.Stats(other)); diff != "" {
		t.Errorf("stats of %s (-want +got):\n%s", other, diff)
	}
}

func TestNetworkListensOnItsAddressesOnly(t *testing.T) {
	b := backend(t)
	n, err := ListenCIDR("127.88.252.0/30", 0, b.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	for _, ip := range []string{"127.88.252.1", "127.88.252.2"} {
		if err := n.SetState(ip, Serving); err != nil {
			t.Fatal(err)
		}
		if got, err := get(oneConnClient(), ip, n.Port()); err != nil || got != "ok" {
			t.Errorf("GET %s: %q, %v", ip, got, err)
		}
	}
	// The network and broadcast addresses, and 127.0.0.1, have no listener.
	for _, ip := range []string{"127.88.252.0", "127.88.252.3", "127.0.0.1"} {
		conn, err := net.DialTimeout("tcp", net.JoinHostPort(ip, strconv.Itoa(n.Port())), time.Second)
		if err == nil {
			conn.Close()
			t.Errorf("%s:%d accepted a connection", ip, n.Port())
			continue
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("dialling %s: %v, want connection refused", ip, err)
		}
	}
	if err := n.SetState("127.88.252.3", Serving); err == nil || err.Error() != "127.88.252.3: not an address of the pod network 127.88.252.0/30" {
		t.Errorf("SetState outside the network: %v", err)
	}
	if err := n.SetState("nonsense", Serving); err == nil || err.Error() != `"nonsense": ParseAddr("nonsense"): unable to parse IP` {
		t.Errorf("SetState of nonsense: %v", err)
	}
}

// TestNetworkListenFails: an address whose port another socket holds
// cannot serve, and says so; it serves once the port is free, stops
// listening when it closes and listens again when it serves again.
func TestNetworkListenFails(t *testing.T) {
	b := backend(t)
	n, err := ListenCIDR("127.88.246.0/30", 0, b.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	const ip = "127.88.246.1"
	addr := net.JoinHostPort(ip, strconv.Itoa(n.Port()))
	squatter, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	want := "pod address " + ip + ": listen tcp " + addr + ": bind: address already in use"
	if err := n.SetState(ip, Serving); err == nil || err.Error() != want {
		t.Errorf("SetState Serving on a taken port: %v, want %q", err, want)
	}
	if got := n.State(ip); got != Closed {
		t.Errorf("after the failed listen %s is %s, want closed", ip, got)
	}
	squatter.Close()
	for i, s := range []State{Serving, Closed, Serving} {
		if err := n.SetState(ip, s); err != nil {
			t.Fatalf("step %d: SetState %s: %v", i, s, err)
		}
		got, err := get(oneConnClient(), ip, n.Port())
		switch {
		case s == Serving && (err != nil || got != "ok"):
			t.Errorf("step %d: GET on the serving address: %q, %v", i, got, err)
		case s == Closed && !errors.Is(err, syscall.ECONNREFUSED):
			t.Errorf("step %d: GET on the closed address: %v, want connection refused", i, err)
		}
	}
}

func TestNetworkCloseCutsAndWaits(t *testing.T) {
	b := backend(t)
	n, err := ListenCIDR("127.88.253.0/30", 0, b.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	const ip = "127.88.253.1"
	if err := n.SetState(ip, Serving); err != nil {
		t.Fatal(err)
	}
	// An idle connection to the address: only Close ends its relay.
	conn, err := net.Dial("tcp", net.JoinHostPort(ip, strconv.Itoa(n.Port())))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitFor(t, func() bool { return n.Stats(ip).Open == 1 })
	done := make(chan error, 1)
	go func() { done <- n.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return with a connection open")
	}
	if err := conn.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("read on the cut connection: %v, want a reset", err)
	}
	if err := n.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := net.DialTimeout("tcp", net.JoinHostPort(ip, strconv.Itoa(n.Port())), time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dialling after Close: %v, want connection refused", err)
	}
}

func TestNetworkBackendDown(t *testing.T) {
	// A port nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	n, err := ListenCIDR("127.88.254.0/30", 0, dead)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	const ip = "127.88.254.1"
	if err := n.SetState(ip, Serving); err != nil {
		t.Fatal(err)
	}
	if _, err := get(oneConnClient(), ip, n.Port()); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("GET with the backend down: %v, want a reset", err)
	}
	waitFor(t, func() bool { return n.Stats(ip).Open == 0 })
	if diff := cmp.Diff(AddrStats{Refused: 1, PeakOpen: 1}, n.Stats(ip)); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
}

// sink is a TCP server on 127.0.0.1 that reads and drops what it gets.
func sink(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(io.Discard, c)
			}()
		}
	}()
	return l.Addr().String()
}

// TestNetworkCountsReceived: every byte a client sends through an address
// counts, with the time of the last, on an open connection too; an idle
// connection adds nothing; another address counts apart.
func TestNetworkCountsReceived(t *testing.T) {
	n, err := ListenCIDR("127.88.247.0/29", 0, sink(t))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	const ip, other = "127.88.247.1", "127.88.247.2"
	for _, a := range []string{ip, other} {
		if err := n.SetState(a, Serving); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := net.Dial("tcp", net.JoinHostPort(ip, strconv.Itoa(n.Port())))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	send := func(b string) (before time.Time) {
		t.Helper()
		before = time.Now()
		if _, err := io.WriteString(conn, b); err != nil {
			t.Fatal(err)
		}
		return before
	}
	first := send("hello")
	waitFor(t, func() bool { return n.Stats(ip).Received == 5 })
	got := n.Stats(ip)
	if got.LastReceived.Before(first) || got.LastReceived.After(time.Now()) {
		t.Errorf("last received at %s, want between the write (%s) and now", got.LastReceived, first)
	}
	idle := got.LastReceived
	time.Sleep(20 * time.Millisecond) // an idle connection: nothing arrives
	if got := n.Stats(ip); got.Received != 5 || !got.LastReceived.Equal(idle) {
		t.Errorf("while idle: %d bytes, last at %s; want 5 at %s", got.Received, got.LastReceived, idle)
	}
	second := send("abc")
	waitFor(t, func() bool { return n.Stats(ip).Received == 8 })
	if got := n.Stats(ip).LastReceived; got.Before(second) {
		t.Errorf("last received at %s, before the second write at %s", got, second)
	}
	if diff := cmp.Diff(AddrStats{}, n.Stats(other)); diff != "" {
		t.Errorf("stats of %s, which got nothing (-want +got):\n%s", other, diff)
	}
}

func TestStateString(t *testing.T) {
	got := fmt.Sprint(Closed, " ", Serving, " ", Draining, " ", State(7))
	if want := "closed serving draining State(7)"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
