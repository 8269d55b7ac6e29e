package dispatcher

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tiergate/tiergate/dispatcher"
	"github.com/tiergate/tiergate/internal/testutil"
)

// paced sends n requests at rate per second, each on its own goroutine,
// and returns their status codes (0 for a transport error) once all have
// answered. The requests take turns among tenants.
func paced(t *testing.T, d *disp, n int, rate float64, c call, tenants ...string) []int {
	t.Helper()
	codes := make([]int, n)
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	for i := range n {
		if i > 0 {
			<-tick.C
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			c := c
			if len(tenants) > 0 {
				c.tenant = tenants[i%len(tenants)]
			}
			r := d.fetch(ctx, t, c)
			codes[i] = r.code
		}()
	}
	wg.Wait()
	return codes
}

func count(codes []int, code int) int {
	n := 0
	for _, c := range codes {
		if c == code {
			n++
		}
	}
	return n
}

// watchEjection polls the dispatcher's stats from start on and reports,
// on the returned channel, how long after start addr was first ejected;
// it stops with ctx.
func watchEjection(ctx context.Context, d *disp, addr string, start time.Time) <-chan time.Duration {
	out := make(chan time.Duration, 1)
	go func() {
		defer close(out)
		for ctx.Err() == nil {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, d.AdminURL("/v1/stats"), nil)
			req.Header.Set("Authorization", "Bearer "+d.Token)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				var st dispatcher.Stats
				err := json.NewDecoder(resp.Body).Decode(&st)
				resp.Body.Close()
				for _, b := range st.Backends {
					if err == nil && b.Address == addr && b.Ejected {
						out <- time.Since(start)
						return
					}
				}
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	return out
}

// One of two backends refuses connections (a closed loopback port): at
// 20 requests/s through the real dispatcher every request is served. A
// request routed to the dead backend is retried on the live one inside
// its slot (nothing reached the dead one), and the dead backend is ejected
// at its first refusal, then probed with a back-off.
func TestDeadBackendIsEjected(t *testing.T) {
	s := startSim(t, "--concurrency", "8", "--service-time", "const:50ms")
	dead := freeAddrNoT()
	d := startDispatcher(t, dispOpts{policy: basePolicy(1, 8, dead, s.Addr)})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	ejected := watchEjection(ctx, d, dead, start)
	codes := paced(t, d, 100, 20, call{tenant: "acme"})
	took := time.Since(start)
	served := count(codes, http.StatusOK)
	cancel()
	after, ok := <-ejected
	t.Logf("dead backend: %d/100 served (%.0f%%) in %s; ejected %s after the first request", served, float64(served), took.Round(time.Millisecond), after.Round(time.Millisecond))
	if served < 99 {
		t.Errorf("%d of 100 served, want at least 99; codes %v", served, codes)
	}
	if !ok {
		t.Error("the dead backend was never seen ejected")
	}
	m := d.Metrics(t)
	ejections := m[`tiergate_backend_ejections_total{backend="`+dead+`",pool="default/llm"}`]
	t.Logf("tiergate_backend_ejections_total for the dead backend: %v (1s, 2s, 4s... back-off over %s)", ejections, took.Round(time.Second))
	if ejections < 1 || ejections > 4 {
		t.Errorf("%v ejections in %s, want 1 to 4 with a doubling back-off from 1s", ejections, took)
	}
	if got := m[`tiergate_backend_ejected{backend="`+dead+`",pool="default/llm"}`]; got != 1 {
		t.Errorf("tiergate_backend_ejected of the dead backend = %v, want 1", got)
	}
	if got := m[`tiergate_backend_ejected{backend="`+s.Addr+`",pool="default/llm"}`]; got != 0 {
		t.Errorf("tiergate_backend_ejected of the live backend = %v, want 0", got)
	}
	if sim := s.Stats(t); sim.Completed != int64(served) {
		t.Errorf("simserver completed %d, the dispatcher served %d", sim.Completed, served)
	}
	if st := d.stats(t); st.Queue.InFlight != 0 || st.Queue.DoubleReleases != 0 || st.Queue.Served != uint64(served) {
		t.Errorf("queue after the run: %+v", st.Queue)
	}
}

// One of two backends answers every request with 500. A 5xx reached the
// model, so it is not retried; its run of failures counts into its score,
// after five in a row it is ejected, and each probe that fails doubles the
// ejection, so few requests are lost. The live backend takes 300ms, so at
// 20/s it has about six requests outstanding and the failing one keeps
// being picked until it is ejected. The answers' share is reported.
func TestFailingBackendIsEjected(t *testing.T) {
	s := startSim(t, "--concurrency", "16", "--service-time", "const:300ms")
	var mu sync.Mutex
	failed := 0
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		failed++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, `{"error":"the model crashed"}`)
	}))
	defer bad.Close()
	badAddr := strings.TrimPrefix(bad.URL, "http://")
	d := startDispatcher(t, dispOpts{policy: basePolicy(1, 16, badAddr, s.Addr)})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	ejected := watchEjection(ctx, d, badAddr, start)
	codes := paced(t, d, 100, 20, call{}, "acme", "globex")
	took := time.Since(start)
	cancel()
	after, ok := <-ejected
	served := count(codes, http.StatusOK)
	mu.Lock()
	reached := failed
	mu.Unlock()
	ejections := d.Metrics(t)[`tiergate_backend_ejections_total{backend="`+badAddr+`",pool="default/llm"}`]
	t.Logf("500 backend: %d/100 served in %s, %d answered 500 by it; first ejected after %s (seen %v); %v ejections",
		served, took.Round(time.Millisecond), count(codes, http.StatusInternalServerError), after.Round(time.Millisecond), ok, ejections)
	if served+count(codes, http.StatusInternalServerError) != 100 || reached != count(codes, http.StatusInternalServerError) {
		t.Errorf("codes %v; the failing backend saw %d", codes, reached)
	}
	// Its run of failures counts into its score, so it is picked less and
	// less; five in a row eject it, and then each ejection costs one probe.
	lost := 100 - served
	switch {
	case ok && (lost < 5 || lost > 4+int(ejections)):
		t.Errorf("%d requests got the failing backend's 500 with %v ejections, want 5 to eject plus one per failed probe", lost, ejections)
	case !ok && lost > 4:
		t.Errorf("%d requests got the failing backend's 500 and it was never ejected", lost)
	}
}

// One of two backends crashes on every request: it reads the request,
// then resets the connection unanswered (SO_LINGER 0), as a server process
// that died mid-request does. The request it took gets a 502
// backend_error (its body reached the model, so it is not replayed), and
// that one dropped connection ejects the backend at once: had it counted
// as one 5xx of five, the failure would rank the backend last and light
// traffic would never try it again. Then 100 requests at 20/s are served
// but the probes of the back-off.
func TestCrashedBackendIsEjected(t *testing.T) {
	s := startSim(t, "--concurrency", "8", "--service-time", "const:50ms")
	var reached atomic.Int64
	crashed := httptest.NewServer(testutil.CrashAfterRead(t, func() { reached.Add(1) }))
	defer crashed.Close()
	addr := strings.TrimPrefix(crashed.URL, "http://")
	d := startDispatcher(t, dispOpts{policy: basePolicy(1, 8, addr, s.Addr)})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	ejected := watchEjection(ctx, d, addr, start)

	// Ties go round-robin: one of the first two requests reaches it.
	var refusals []result
	for i := 0; i < 2; i++ {
		if r := d.fetch(ctx, t, call{tenant: "acme"}); r.code != http.StatusOK {
			refusals = append(refusals, r)
		}
	}
	if len(refusals) != 1 || reached.Load() != 1 {
		t.Fatalf("%d refusals of 2 requests, the crashed backend reached %d times; want 1 and 1", len(refusals), reached.Load())
	}
	checkRefusal(t, refusals[0], wantRefusal{code: 502, typ: "backend_error", msg: "the model backend failed before answering", tier: "premium"})
	select {
	case after := <-ejected:
		t.Logf("ejected %s after the first request, at its first dropped connection", after.Round(time.Millisecond))
	case <-time.After(5 * time.Second):
		t.Fatal("the crashed backend was not ejected after its dropped connection")
	}

	codes := paced(t, d, 100, 20, call{tenant: "acme"})
	cancel()
	served := count(codes, http.StatusOK)
	ejections := d.Metrics(t)[`tiergate_backend_ejections_total{backend="`+addr+`",pool="default/llm"}`]
	probes := reached.Load() - 1
	t.Logf("then %d/100 served; the crashed backend probed %d times, %v ejections", served, probes, ejections)
	if served+int(probes) != 100 || count(codes, http.StatusBadGateway) != int(probes) {
		t.Errorf("codes %v: want 200s but one 502 for each of the %d probes", codes, probes)
	}
	if probes > 3 || ejections != float64(probes+1) {
		t.Errorf("%d probes and %v ejections in 5 s of 1 s, 2 s, 4 s back-off; want at most 3 probes, each ejecting again", probes, ejections)
	}
	if st := d.stats(t); st.Queue.InFlight != 0 || st.Queue.DoubleReleases != 0 {
		t.Errorf("queue after the run: %+v", st.Queue)
	}
}
