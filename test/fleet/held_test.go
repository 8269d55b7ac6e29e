package fleet

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/internal/redistest"
	"github.com/tiergate/tiergate/internal/testutil"
)

// heldFleetPolicy is fleetPolicy at zero replicas, holding for a first
// replica 3s away: standard holds 3 fleet-wide, "fast" (W 2s) none.
func heldFleetPolicy(version int64) *policy.Policy {
	p := fleetPolicy("", 0, 3, 1, 1, nil)
	p.Version, p.Backends, p.ColdStartSeconds, p.ServiceRate = version, []policy.Backend{}, 3, 1
	p.Tiers = append(p.Tiers, policy.Tier{Name: "fast", BasePriority: 0, TolerableWaitSeconds: 2, QueueBound: 0, TenantConcurrencyLimit: 1, TenantQueueLimit: 1})
	p.Tenants = []policy.Tenant{{ID: "quick", Tier: "fast"}}
	return p
}

// Two dispatchers on one real redis-server hold requests at zero with the
// tier's bound exact across the fleet, take no slot in Redis and ask for
// none; a tier that cannot wait is refused at once. The first replica's
// policy starts the exchanges: every held request is served, never more
// at once than the pool's slots.
func TestHeldAcrossDispatchersUntilTheFirstReplica(t *testing.T) {
	rs := redistest.Start(t, redistest.Options{})
	sm := startSim(t, 4, "const:300ms")
	ds := []*dispatcher{startDispatcher(t, "d1", redisURL(rs), heldFleetPolicy(1)), startDispatcher(t, "d2", redisURL(rs), heldFleetPolicy(1))}
	rc := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	defer rc.Close()
	card := func(key string) int64 {
		n, err := rc.ZCard(context.Background(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	results := make(chan result, 3)
	var wg sync.WaitGroup
	for i, tenant := range []string{"a", "b", "c"} {
		d := ds[i%2]
		wg.Add(1)
		go func() { defer wg.Done(); results <- complete(context.Background(), d, tenant, "") }()
	}
	testutil.EventuallyTrue(t, 10*time.Second, "three held across the fleet", func() bool {
		return ds[0].queued(t) == 2 && ds[1].queued(t) == 1
	})
	if n := card("tg:{fleet/llm}:queued:tier:standard"); n != 3 {
		t.Errorf("queued places in Redis %d, want 3", n)
	}
	r := complete(context.Background(), ds[1], "d", "")
	if ref := testutil.ParseRefusal(t, r.body); r.status != http.StatusTooManyRequests || ref.Error.Type != "capacity" || ref.Error.QueuePosition != 4 {
		t.Errorf("a fourth held request: %d %s, want 429 capacity at position 4 (the bound is fleet-wide)", r.status, r.body)
	}
	r = complete(context.Background(), ds[0], "quick", "")
	if ref := testutil.ParseRefusal(t, r.body); r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") != "3" || ref.Error.Type != "unavailable" {
		t.Errorf("fast at zero: %d Retry-After %q %s, want 503 unavailable after 3s", r.status, r.header.Get("Retry-After"), r.body)
	}
	if n := card("tg:{fleet/llm}:slots"); n != 0 || sm.Stats(t).Requests != 0 {
		t.Errorf("slots in Redis %d, requests at the backend %d while held; want none", n, sm.Stats(t).Requests)
	}

	first := fleetPolicy(sm.Addr, 2, 10, 1, 1, nil)
	first.Version = 2
	for _, d := range ds {
		d.MustPutPolicy(t, first)
	}
	wg.Wait()
	close(results)
	for res := range results {
		if res.err != nil || res.status != http.StatusOK || res.header.Get("X-Queue-Wait-Ms") == "" {
			t.Errorf("held request: %d %v %s, want 200 with its wait", res.status, res.err, res.body)
		}
	}
	if st := sm.Stats(t); st.Completed != 3 || st.PeakActive > 2 {
		t.Errorf("backend: %d completed, peak %d at once; want 3 and at most the 2 slots", st.Completed, st.PeakActive)
	}
	testutil.EventuallyTrue(t, 10*time.Second, "every lease returned", func() bool {
		return card("tg:{fleet/llm}:slots") == 0 && card("tg:{fleet/llm}:queued:tier:standard") == 0
	})
}
