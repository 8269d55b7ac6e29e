package testutil

import (
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestGetJSON(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Header.Get("Authorization") != "Bearer s3cret":
			http.Error(w, "no token", http.StatusUnauthorized)
		case r.URL.Path == "/bad":
			_, _ = w.Write([]byte("{"))
		default:
			_, _ = w.Write([]byte(`{"version":7}`))
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	base := "http://" + ln.Addr().String()

	tests := map[string]struct {
		path, token string
		wantFatal   string // "" means success
		wantVersion int
	}{
		"decodes a 200":  {path: "/ok", token: "s3cret", wantVersion: 7},
		"non-200 fails":  {path: "/ok", wantFatal: "GET " + base + "/ok: 401 Unauthorized no token\n"},
		"bad JSON fails": {path: "/bad", token: "s3cret", wantFatal: "GET " + base + "/bad: unexpected EOF"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := &recorder{TB: t}
			var v struct {
				Version int `json:"version"`
			}
			r.do(func() { GetJSON(r, base+tc.path, tc.token, &v) })
			var got string
			if len(r.errs) > 0 {
				got = strings.Join(r.errs, "|")
			}
			if diff := cmp.Diff([]any{tc.wantFatal, tc.wantVersion}, []any{got, v.Version}); diff != "" {
				t.Errorf("fatal, version (-want +got):\n%s", diff)
			}
		})
	}
}

// A client of CrashAfterRead sees its connection reset after the whole
// body was read, and gets no answer.
func TestCrashAfterRead(t *testing.T) {
	var read atomic.Int32
	srv := httptest.NewServer(CrashAfterRead(t, func() { read.Add(1) }))
	defer srv.Close()
	resp, err := srv.Client().Post(srv.URL, "application/json", strings.NewReader(`{"prompt":"hi"}`))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got %s, want no answer", resp.Status)
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("error %v, want ECONNRESET", err)
	}
	if n := read.Load(); n != 1 {
		t.Errorf("reached %d times, want 1", n)
	}
}
