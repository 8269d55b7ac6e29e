package testutil

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"testing"
)

// GetJSON GETs url, with token as a Bearer token when it is not empty, and
// decodes the 200 answer into v; anything else fails the test.
func GetJSON(t testing.TB, url, token string, v any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %s %s", url, resp.Status, b)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

// CrashAfterRead is a backend that dies mid-request: it reads the whole
// request, calls reached (when not nil), then resets the connection
// unanswered (SO_LINGER 0), as the host of a crashed server process does.
func CrashAfterRead(t testing.TB, reached func()) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if reached != nil {
			reached()
		}
		c, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		if err := c.(*net.TCPConn).SetLinger(0); err != nil {
			t.Error(err)
		}
		_ = c.Close()
	}
}
