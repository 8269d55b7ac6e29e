package testutil

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"
)

// pollEvery is how often Poll asks again.
const pollEvery = 10 * time.Millisecond

// Poll calls f until it returns nil, and returns nil; when timeout passes
// first, it returns f's last error.
func Poll(timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s: %w", timeout, err)
		}
		time.Sleep(pollEvery)
	}
}

// Eventually calls f until it returns nil, and fails t with f's last error
// when timeout passes first.
func Eventually(t testing.TB, timeout time.Duration, what string, f func() error) {
	t.Helper()
	if err := Poll(timeout, f); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// EventuallyTrue calls cond until it holds, and fails t when timeout
// passes first.
func EventuallyTrue(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	err := Poll(timeout, func() error {
		if !cond() {
			return errNotYet
		}
		return nil
	})
	if err != nil {
		t.Fatalf("timed out after %s waiting for %s", timeout, what)
	}
}

var errNotYet = errors.New("not yet")

// FreePort is a TCP port on ip (a loopback address) that was free a moment
// ago.
func FreePort(t testing.TB, ip string) int {
	t.Helper()
	ports, err := FreePorts(ip, 1)
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	return ports[0]
}

// FreeAddr is ip:port with a FreePort.
func FreeAddr(t testing.TB, ip string) string {
	t.Helper()
	return net.JoinHostPort(ip, strconv.Itoa(FreePort(t, ip)))
}

// FreePorts finds n distinct ports that were free a moment ago on ip and
// on every one of more.
func FreePorts(ip string, n int, more ...string) ([]int, error) {
	var out []int
	for tries := 0; len(out) < n && tries < 200; tries++ {
		l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			return nil, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		ok := true
		var extra []net.Listener
		for _, other := range more {
			ol, err := net.Listen("tcp", net.JoinHostPort(other, strconv.Itoa(port)))
			if err != nil {
				ok = false
				break
			}
			extra = append(extra, ol)
		}
		for _, ol := range extra {
			ol.Close()
		}
		l.Close()
		if ok && !slices.Contains(out, port) {
			out = append(out, port)
		}
	}
	if len(out) < n {
		return nil, fmt.Errorf("no %d free ports on %s %v", n, ip, more)
	}
	return out, nil
}
