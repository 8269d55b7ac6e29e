package fleet

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/redis/go-redis/v9"

	"github.com/tiergate/tiergate/internal/redistest"
	"github.com/tiergate/tiergate/internal/testutil"
)

// TestCapsHoldAcrossDispatchers floods two dispatchers with requests of a
// tenant capped at 2 and of another capped at 3, on a pool of 4 slots.
// simserver records what actually reached the model server: the capped
// tenant's peak must be exactly 2 and the pool's exactly 4. The same flood
// with --state=local (each dispatcher enforcing the pool-wide numbers
// alone) is the control: it must overshoot, or this test proves nothing.
func TestCapsHoldAcrossDispatchers(t *testing.T) {
	tests := map[string]struct {
		fleet bool
	}{
		"redis":           {fleet: true},
		"local (control)": {fleet: false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			rs := redistest.Start(t, redistest.Options{})
			sm := startSim(t, 16, "const:150ms")
			p := fleetPolicy(sm.Addr, 4, 200, 3, 200, map[string]int{"capped": 2})
			state := redisURL(rs)
			if !tc.fleet {
				state = "local"
			}
			ds := []*dispatcher{
				startDispatcher(t, "d1", state, p),
				startDispatcher(t, "d2", state, p),
			}
			const perWorker = 6
			workers := map[string]int{"capped": 8, "other": 4}
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			errs := make(chan error, 2*12*perWorker)
			for _, d := range ds {
				for tenant, n := range workers {
					oc := openai.NewClient(option.WithBaseURL(d.DataURL("/v1/")), option.WithAPIKey("unused"),
						option.WithHeader("X-Tenant-ID", tenant), option.WithMaxRetries(0), option.WithRequestTimeout(60*time.Second))
					for range n {
						wg.Add(1)
						go func() {
							defer wg.Done()
							for range perWorker {
								_, err := oc.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
									Model: "sim-model", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
								})
								if err != nil {
									errs <- fmt.Errorf("%s via %s: %w", tenant, d.name, err)
									return
								}
							}
						}()
					}
				}
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Errorf("completion: %v", err)
			}
			st := sm.Stats(t)
			capped, other := st.Tenants["capped"].PeakActive, st.Tenants["other"].PeakActive
			t.Logf("simserver peaks: pool %d, capped %d, other %d (completed %d)", st.PeakActive, capped, other, st.Completed)
			if st.Completed != 2*12*perWorker {
				t.Errorf("completed %d, want %d", st.Completed, 2*12*perWorker)
			}
			if !tc.fleet {
				if capped <= 2 && st.PeakActive <= 4 {
					t.Errorf("local mode kept the pool-wide caps without sharing: the flood is too weak to test anything")
				}
				return
			}
			if capped != 2 {
				t.Errorf("capped tenant peak %d at the model server, want exactly its cap 2", capped)
			}
			if other > 3 {
				t.Errorf("other tenant peak %d, over its cap 3", other)
			}
			if st.PeakActive != 4 {
				t.Errorf("pool peak %d at the model server, want exactly its 4 slots", st.PeakActive)
			}
		})
	}
}

// TestBoundsHoldAcrossDispatchers fills a tier's queue (or one tenant's
// share of it) through two dispatchers, half on each: neither is full on
// its own, yet both refuse the next request with the fleet-wide cause and
// position.
func TestBoundsHoldAcrossDispatchers(t *testing.T) {
	tests := map[string]struct {
		qlimit   int
		tenants  [2][]string // queued through d1, d2
		next     string      // the refused request's tenant
		wantType string
		wantPos  int
		wantMsg  string
	}{
		"tier bound": {
			qlimit: 4, tenants: [2][]string{{"q1", "q2"}, {"q3", "q4"}}, next: "q5",
			wantType: "capacity", wantPos: 5,
			wantMsg: `the queue of tier "standard" is full; retry after `,
		},
		"tenant queue limit": {
			qlimit: 2, tenants: [2][]string{{"t"}, {"t"}}, next: "t",
			wantType: "tenant_limit", wantPos: 3,
			wantMsg: `tenant "t" has as many requests queued as tier "standard" allows one tenant; retry after `,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			rs := redistest.Start(t, redistest.Options{})
			sm := startSim(t, 4, "const:10ms")
			p := fleetPolicy(sm.Addr, 1, 4, 1, tc.qlimit, nil)
			ds := []*dispatcher{startDispatcher(t, "d1", redisURL(rs), p), startDispatcher(t, "d2", redisURL(rs), p)}

			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			results := make(chan result, 8)
			send := func(d *dispatcher, tenant, st string) {
				wg.Add(1)
				go func() { defer wg.Done(); results <- complete(ctx, d, tenant, st) }()
			}
			defer func() {
				cancel()
				wg.Wait()
			}()
			// One long request holds the pool's only slot.
			send(ds[0], "holder", "60s")
			testutil.EventuallyTrue(t, 10*time.Second, "the slot taken", func() bool { return sm.Stats(t).Active == 1 })
			for i, d := range ds {
				for _, tenant := range tc.tenants[i] {
					send(d, tenant, "10ms")
				}
			}
			testutil.EventuallyTrue(t, 10*time.Second, "the queues filled", func() bool {
				return ds[0].queued(t) == len(tc.tenants[0]) && ds[1].queued(t) == len(tc.tenants[1])
			})
			for _, d := range ds {
				r := complete(context.Background(), d, tc.next, "10ms")
				if r.err != nil || r.status != http.StatusTooManyRequests {
					t.Fatalf("%s: %d %v %s, want 429", d.name, r.status, r.err, r.body)
				}
				eb := testutil.ParseRefusal(t, r.body)
				if eb.Error.Type != tc.wantType || eb.Error.QueuePosition != tc.wantPos || eb.Error.Tier != "standard" {
					t.Errorf("%s: refusal %+v, want type %s position %d", d.name, eb.Error, tc.wantType, tc.wantPos)
				}
				if !strings.HasPrefix(eb.Error.Message, tc.wantMsg) {
					t.Errorf("%s: message %q, want prefix %q", d.name, eb.Error.Message, tc.wantMsg)
				}
				if got := r.header.Get("X-Queue-Position"); got != fmt.Sprint(tc.wantPos) {
					t.Errorf("%s: X-Queue-Position %q", d.name, got)
				}
				if r.header.Get("Retry-After") == "" || r.header.Get("X-Tier") != "standard" {
					t.Errorf("%s: headers %v", d.name, r.header)
				}
			}
			// Clients that leave give their places back, fleet-wide.
			cancel()
			wg.Wait()
			rc := redis.NewClient(&redis.Options{Addr: rs.Addr()})
			defer rc.Close()
			testutil.EventuallyTrue(t, 10*time.Second, "the queued and slot leases gone", func() bool {
				n1, _ := rc.ZCard(context.Background(), "tg:{fleet/llm}:queued:tier:standard").Result()
				n2, _ := rc.ZCard(context.Background(), "tg:{fleet/llm}:slots").Result()
				return n1 == 0 && n2 == 0
			})
		})
	}
}

// TestCrashedDispatcherCapacityReturnsWithinTTL kills -9 a dispatcher
// that holds every slot of the pool. Its leases are never released; the
// other dispatcher's queued request must run once they expire: not before
// they can have expired, and within the TTL.
func TestCrashedDispatcherCapacityReturnsWithinTTL(t *testing.T) {
	const ttl, renew = 2 * time.Second, 500 * time.Millisecond
	flags := []string{"--state-lease-ttl=" + ttl.String(), "--state-renew-interval=" + renew.String()}
	rs := redistest.Start(t, redistest.Options{})
	sm := startSim(t, 8, "const:10ms")
	p := fleetPolicy(sm.Addr, 4, 50, 4, 50, nil)
	d1 := startDispatcher(t, "d1", redisURL(rs), p, flags...)
	d2 := startDispatcher(t, "d2", redisURL(rs), p, flags...)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	for range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); _ = complete(ctx, d1, "a", "60s") }()
	}
	testutil.EventuallyTrue(t, 10*time.Second, "d1 holding all 4 slots", func() bool { return sm.Stats(t).Active == 4 })
	waiting := make(chan result, 1)
	go func() { waiting <- complete(ctx, d2, "b", "10ms") }()
	testutil.EventuallyTrue(t, 10*time.Second, "d2's request queued", func() bool { return d2.queued(t) == 1 })

	killed := time.Now()
	d1.Kill()
	r := <-waiting
	back := time.Since(killed)
	if r.err != nil || r.status != http.StatusOK {
		t.Fatalf("d2's request: %d %v %s", r.status, r.err, r.body)
	}
	t.Logf("capacity back %s after kill -9 (lease TTL %s, renew every %s)", back.Round(time.Millisecond), ttl, renew)
	// Leases renewed every 500ms cannot all expire in under half the TTL:
	// sooner would mean the crash gave the slots back some other way.
	if back < ttl/2 {
		t.Errorf("served %s after the crash: sooner than the leases could expire (TTL %s, renew %s)", back, ttl, renew)
	}
	if back > ttl+time.Second {
		t.Errorf("served %s after the crash, want within the TTL %s (+1s for the processes)", back, ttl)
	}

	// The full capacity is back: 4 at once through d2.
	sm.ResetStats(t)
	var wg2 sync.WaitGroup
	for range 4 {
		wg2.Add(1)
		go func() {
			defer wg2.Done()
			if r := complete(ctx, d2, "b", "500ms"); r.status != http.StatusOK {
				t.Errorf("after recovery: %d %v", r.status, r.err)
			}
		}()
	}
	wg2.Wait()
	if got := sm.Stats(t).PeakActive; got != 4 {
		t.Errorf("peak after recovery %d, want the pool's 4", got)
	}
}

// TestRedisOutageFallsBackAndResumes stops Redis under load: the
// dispatchers keep serving every request, each within its slice of the
// caps, and say so in tiergate_state_degraded; when Redis is back they
// write their leases back and fleet mode resumes.
func TestRedisOutageFallsBackAndResumes(t *testing.T) {
	flags := []string{"--state-lease-ttl=2s", "--state-renew-interval=300ms"}
	rs := redistest.Start(t, redistest.Options{})
	sm := startSim(t, 16, "const:40ms")
	p := fleetPolicy(sm.Addr, 4, 200, 4, 200, map[string]int{"capped": 2})
	ds := []*dispatcher{
		startDispatcher(t, "d1", redisURL(rs), p, flags...),
		startDispatcher(t, "d2", redisURL(rs), p, flags...),
	}
	degraded := func(d *dispatcher) float64 {
		v, ok := d.metric(t, "tiergate_state_degraded")
		if !ok {
			t.Fatalf("%s: no tiergate_state_degraded on /metrics", d.name)
		}
		return v
	}
	testutil.EventuallyTrue(t, 10*time.Second, "both dispatchers registered", func() bool {
		for _, d := range ds {
			if v, _ := d.metric(t, "tiergate_state_dispatchers"); v != 2 {
				return false
			}
		}
		return true
	})

	phase := func(name string, d time.Duration) {
		t.Helper()
		sm.ResetStats(t)
		served, failures := load(t, ds, d)
		st := sm.Stats(t)
		t.Logf("%s: served %d; simserver peaks: pool %d, capped %d", name, served, st.PeakActive, st.Tenants["capped"].PeakActive)
		for _, f := range failures {
			t.Errorf("%s: %s", name, f)
		}
		if served == 0 {
			t.Errorf("%s: nothing served", name)
		}
		if st.PeakActive > 4 || st.Tenants["capped"].PeakActive > 2 {
			t.Errorf("%s: caps exceeded: pool %d > 4 or capped %d > 2", name, st.PeakActive, st.Tenants["capped"].PeakActive)
		}
	}

	phase("fleet", 1500*time.Millisecond)
	for _, d := range ds {
		if v := degraded(d); v != 0 {
			t.Errorf("%s degraded before the outage", d.name)
		}
	}

	rs.Kill()
	phase("redis down", 3*time.Second)
	for _, d := range ds {
		if v := degraded(d); v != 1 {
			t.Errorf("%s: tiergate_state_degraded = %v during the outage, want 1", d.name, v)
		}
	}

	rs.Restart() // empty: the dispatchers must write their leases back
	testutil.EventuallyTrue(t, 10*time.Second, "fleet mode resumed", func() bool {
		return degraded(ds[0]) == 0 && degraded(ds[1]) == 0
	})
	phase("redis back", 1500*time.Millisecond)
	rc := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	defer rc.Close()
	if n, err := rc.ZCard(context.Background(), "tg:{fleet/llm}:dispatchers").Result(); err != nil || n != 2 {
		t.Errorf("dispatchers registered after the outage: %d, %v", n, err)
	}
	for _, d := range ds {
		out := d.Output()
		if n := strings.Count(out, "Redis unreachable"); n != 1 {
			t.Errorf("%s logged the outage %d times, want once", d.name, n)
		}
		if n := strings.Count(out, "fleet mode resumed"); n != 1 {
			t.Errorf("%s logged the recovery %d times, want once", d.name, n)
		}
	}
}

// load runs 3 workers of "capped" and 3 of "other" per dispatcher until d
// has passed; every request must succeed.
func load(t *testing.T, ds []*dispatcher, d time.Duration) (served int, failures []string) {
	t.Helper()
	deadline := time.Now().Add(d)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, disp := range ds {
		for _, tenant := range []string{"capped", "capped", "capped", "other", "other", "other"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
					r := complete(ctx, disp, tenant, "")
					cancel()
					mu.Lock()
					if r.err != nil || r.status != http.StatusOK {
						failures = append(failures, fmt.Sprintf("%s %s: %d %v %s (after %s)", disp.name, tenant, r.status, r.err, r.body, r.took))
					} else {
						served++
					}
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	return served, failures
}
