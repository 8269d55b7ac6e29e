package dispatcher

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

// ack pushes p and returns the dispatcher's acknowledgement.
func (d *disp) ack(t *testing.T, p *policy.Policy) policy.Ack {
	t.Helper()
	code, body := d.PutPolicy(t, p)
	if code != http.StatusOK {
		t.Fatalf("PUT /v1/policy: %d %s", code, body)
	}
	var a policy.Ack
	if err := json.Unmarshal(body, &a); err != nil {
		t.Fatal(err)
	}
	return a
}

// The measured service time the ack reports (what the controller folds
// into S in Measured mode) comes from served requests only. Fast failures
// (a backend answering 500, one refusing connections) and clients that
// leave mid-generation do not shrink it, nor count as samples.
func TestFailuresDoNotShrinkTheMeasuredServiceTime(t *testing.T) {
	s := startSim(t, "--concurrency", "4", "--service-time", "const:200ms")
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusInternalServerError)
	}))
	defer bad.Close()
	d := startDispatcher(t, dispOpts{policy: basePolicy(1, 4, s.Addr)})
	for range 5 {
		if r := d.fetch(context.Background(), t, call{tenant: "acme"}); r.code != http.StatusOK {
			t.Fatalf("served: %d %s", r.code, r.body)
		}
	}
	before := d.ack(t, basePolicy(1, 4, s.Addr)).Stats
	if before.Completed != 5 || before.ServiceTimeSeconds < 0.2 || before.ServiceTimeSeconds > 0.4 {
		t.Fatalf("after 5 served requests of 200ms the ack says %+v", before)
	}

	// A client that leaves mid-generation.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	r := d.fetch(ctx, t, call{tenant: "acme", header: http.Header{"X-Sim-Service-Time": {"2s"}}})
	cancel()
	if r.err == nil {
		t.Fatalf("the impatient client got %d", r.code)
	}
	// Twenty fast failures: the first of two backends refuses connections
	// (retried on the second), the second answers 500.
	failing := basePolicy(2, 4, freeAddrNoT(), strings.TrimPrefix(bad.URL, "http://"))
	d.MustPutPolicy(t, failing)
	for range 20 {
		if r := d.fetch(context.Background(), t, call{tenant: "acme"}); r.code != http.StatusInternalServerError && r.code != http.StatusBadGateway {
			t.Fatalf("a failing backend answered %d %s", r.code, r.body)
		}
	}
	after := d.ack(t, failing).Stats
	t.Logf("ack before the failures %+v, after 20 failures and a client that left %+v", before, after)
	if after.Completed != before.Completed || after.ServiceTimeSeconds != before.ServiceTimeSeconds {
		t.Errorf("the ack changed from %+v to %+v: failures or a cancellation counted as service time", before, after)
	}
	if st := d.stats(t).Queue; st.Completed != 26 || st.Served != 5 {
		t.Errorf("queue completed %d and served %d, want 26 released and 5 served", st.Completed, st.Served)
	}
}
