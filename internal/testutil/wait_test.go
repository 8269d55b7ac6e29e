package testutil

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestPoll(t *testing.T) {
	errStill := errors.New("still no")
	t.Run("nil once f holds", func(t *testing.T) {
		n := 0
		err := Poll(5*time.Second, func() error {
			if n++; n < 3 {
				return errStill
			}
			return nil
		})
		if err != nil || n != 3 {
			t.Errorf("Poll = %v after %d calls, want nil after 3", err, n)
		}
	})
	t.Run("the last error after the timeout", func(t *testing.T) {
		start := time.Now()
		err := Poll(50*time.Millisecond, func() error { return errStill })
		if took := time.Since(start); took < 50*time.Millisecond {
			t.Errorf("gave up after %s", took)
		}
		if !errors.Is(err, errStill) || err.Error() != "not within 50ms: still no" {
			t.Errorf("Poll = %v, want \"not within 50ms: still no\" wrapping the last error", err)
		}
	})
}

func TestEventually(t *testing.T) {
	t.Run("holds after a few tries", func(t *testing.T) {
		n := 0
		Eventually(t, 5*time.Second, "three calls", func() error {
			if n++; n < 3 {
				return fmt.Errorf("call %d", n)
			}
			return nil
		})
		if n != 3 {
			t.Errorf("%d calls, want 3", n)
		}
	})
	t.Run("fails with the last error", func(t *testing.T) {
		r := &recorder{TB: t}
		start := time.Now()
		r.do(func() {
			Eventually(r, 100*time.Millisecond, "never", func() error { return errors.New("still no") })
		})
		if took := time.Since(start); took < 100*time.Millisecond {
			t.Errorf("gave up after %s", took)
		}
		if !r.fatal || len(r.errs) != 1 || r.errs[0] != "never: not within 100ms: still no" {
			t.Errorf("failures = %q", r.errs)
		}
	})
}

func TestEventuallyTrue(t *testing.T) {
	t.Run("holds", func(t *testing.T) {
		n := 0
		EventuallyTrue(t, 5*time.Second, "two calls", func() bool { n++; return n == 2 })
		if n != 2 {
			t.Errorf("%d calls, want 2", n)
		}
	})
	t.Run("fails", func(t *testing.T) {
		r := &recorder{TB: t}
		r.do(func() { EventuallyTrue(r, 50*time.Millisecond, "never", func() bool { return false }) })
		if !r.fatal || len(r.errs) != 1 || r.errs[0] != "timed out after 50ms waiting for never" {
			t.Errorf("failures = %q", r.errs)
		}
	})
}

func TestFreePortBindsLoopback(t *testing.T) {
	for _, ip := range []string{"127.0.0.1", "127.0.0.2"} {
		t.Run(ip, func(t *testing.T) {
			port := FreePort(t, ip)
			if port <= 0 || port > 65535 {
				t.Fatalf("port %d", port)
			}
			l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
			if err != nil {
				t.Fatalf("the free port %d is not free on %s: %v", port, ip, err)
			}
			l.Close()
			addr := FreeAddr(t, ip)
			host, _, err := net.SplitHostPort(addr)
			if err != nil || host != ip {
				t.Errorf("FreeAddr = %q, want host %s", addr, ip)
			}
		})
	}
}

func TestFreePorts(t *testing.T) {
	ports, err := FreePorts("127.0.0.1", 3, "127.0.0.2", "127.0.0.3")
	if err != nil {
		t.Fatal(err)
	}
	if len(ports) != 3 || ports[0] == ports[1] || ports[1] == ports[2] || ports[0] == ports[2] {
		t.Fatalf("ports %v, want 3 distinct", ports)
	}
	for _, port := range ports {
		for _, ip := range []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"} {
			l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
			if err != nil {
				t.Errorf("port %d is not free on %s: %v", port, ip, err)
				continue
			}
			l.Close()
		}
	}
	// 192.0.2.1 (TEST-NET-1) is no address of this machine.
	if _, err := FreePorts("192.0.2.1", 1); err == nil || !strings.Contains(err.Error(), "192.0.2.1") {
		t.Errorf("FreePorts on a foreign address: %v, want a bind error", err)
	}
	if _, err := FreePorts("127.0.0.1", 1, "192.0.2.1"); err == nil || err.Error() != "no 1 free ports on 127.0.0.1 [192.0.2.1]" {
		t.Errorf("FreePorts with a foreign extra address: %v", err)
	}
}
