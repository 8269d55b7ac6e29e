package fleet

import (
	"context"
	"math"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/dispatcher/queue"
	"github.com/tiergate/tiergate/internal/redistest"
)

// orderTenant is one tenant of the fleet-order scenario: its request size
// and closed-loop clients at each dispatcher.
type orderTenant struct {
	id             string
	prompt, output int64
	clients        []int // per dispatcher
}

// orderJob is a client's request at one dispatcher.
type orderJob struct {
	h      *queue.Handle
	tenant *orderTenant
	end    time.Duration // while running
}

// orderDisp is one dispatcher of the scenario: its queue, the requests it
// holds by tenant (queued ones in arrival order, so a tenant's dispatch is
// its oldest) and the running ones.
type orderDisp struct {
	q        *queue.Queue
	counters *Counters
	queued   map[string][]*orderJob
	running  []*orderJob
	inFlight map[string]int
}

// fleetOrder is the outcome of one run: the largest difference of the two
// tenants' fleet-wide counters (weighted tokens served) over the run, in
// units of the larger request's cost, and the first tenant's share.
type fleetOrder struct {
	maxGapU, shareA float64
}

// oneQueue, as runFleetOrder's sync, runs one queue of two slots that
// every client sends to: one VTC over the whole fleet, the reference.
const oneQueue = time.Duration(math.MinInt64)

// runFleetOrder plays two dispatchers of one slot each in front of
// simulated model slots whose service time is prompt ÷ 4000 + output ÷
// 200 seconds, for the given simulated time, syncing their counters
// through Redis every sync (0: after every event; < 0: never, each
// orders by its own; oneQueue: the reference). Tenant A sends long
// prompts to the first dispatcher only; B short ones to both.
func runFleetOrder(t *testing.T, s *redistest.Server, pool string, sync, run time.Duration) fleetOrder {
	t.Helper()
	ctx := context.Background()
	a := &orderTenant{id: "a", prompt: 1000, output: 20, clients: []int{4, 0}}
	b := &orderTenant{id: "b", prompt: 25, output: 20, clients: []int{4, 4}}
	nDisp, slots := 2, 1
	if sync == oneQueue {
		a.clients, b.clients = []int{4}, []int{8}
		nDisp, slots = 1, 2
	}
	tenants := []*orderTenant{a, b}
	fair := policy.Fairness{Mode: policy.FairnessTokens, InputWeight: 1, OutputWeight: 2}
	p := &policy.Policy{
		Version: 1, Pool: pool, Slots: slots, ServiceRate: 3, AgeingRate: 6,
		Authentication: policy.Authentication{Mode: policy.AuthTrustedHeader},
		Tiers:          []policy.Tier{{Name: "std", TolerableWaitSeconds: 600, QueueBound: 100, TenantConcurrencyLimit: slots, TenantQueueLimit: 100}},
		Tenants:        []policy.Tenant{{ID: "a", Tier: "std"}, {ID: "b", Tier: "std"}},
		Fairness:       &fair,
		Backends:       []policy.Backend{{Address: "127.0.0.1:1"}},
	}
	clk := clocktesting.NewFakeClock(time.Unix(0, 0))
	start := clk.Now()
	now := func() time.Duration { return clk.Since(start) }
	disps := make([]*orderDisp, nDisp)
	for i := range disps {
		d := &orderDisp{queued: map[string][]*orderJob{}, inFlight: map[string]int{}}
		var opts []queue.Option
		if sync >= 0 && nDisp > 1 {
			d.counters = newGate(t, s, "d"+string(rune('0'+i)), Config{OpTimeout: 5 * time.Second}).
				Counters(func(tier string, others map[string]float64) { d.q.ApplySharedCounters(tier, others) })
			d.counters.SetTiers(pool, []string{"std"})
			opts = append(opts, queue.WithCounterSink(d.counters.Add))
		}
		d.q = queue.New(clk, opts...)
		d.q.UpdatePolicy(p)
		disps[i] = d
	}
	served := map[string]float64{}
	maxGap := 0.0
	submit := func(d *orderDisp, ot *orderTenant) {
		h, err := d.q.AdmitCost(ot.id, "std", queue.Cost{Prompt: ot.prompt, Output: ot.output})
		if err != nil {
			t.Fatalf("admit %s: %v", ot.id, err)
		}
		d.queued[ot.id] = append(d.queued[ot.id], &orderJob{h: h, tenant: ot})
	}
	// collect moves the jobs the queue dispatched (its in-flight counts
	// grew) from queued to running, oldest first within each tenant.
	collect := func(d *orderDisp) {
		in := d.q.Stats().TenantInFlight
		for _, ot := range tenants {
			for d.inFlight[ot.id] < in[ot.id] {
				j := d.queued[ot.id][0]
				d.queued[ot.id] = d.queued[ot.id][1:]
				j.end = now() + time.Duration((float64(ot.prompt)/4000+float64(ot.output)/200)*float64(time.Second))
				d.running = append(d.running, j)
				d.inFlight[ot.id]++
			}
		}
	}
	syncAll := func() {
		for _, d := range disps {
			if d.counters != nil {
				if err := d.counters.Sync(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	for i, d := range disps {
		for _, ot := range tenants {
			for range ot.clients[i] {
				submit(d, ot)
			}
		}
		collect(d)
	}
	nextSync := sync
	for now() < run {
		// The next event: the earliest end of a running job, or a sync.
		var first *orderJob
		var at *orderDisp
		for _, d := range disps {
			for _, j := range d.running {
				if first == nil || j.end < first.end {
					first, at = j, d
				}
			}
		}
		if sync > 0 && nextSync <= first.end {
			clk.SetTime(start.Add(nextSync))
			syncAll()
			nextSync += sync
			continue
		}
		clk.SetTime(start.Add(first.end))
		at.running = removeJob(at.running, first)
		at.inFlight[first.tenant.id]--
		first.h.ReleaseServed()
		first.h.Settle(first.tenant.prompt, first.tenant.output)
		served[first.tenant.id] += float64(fair.Cost(first.tenant.prompt, first.tenant.output))
		submit(at, first.tenant)
		for _, d := range disps {
			collect(d)
		}
		if sync == 0 {
			syncAll()
		}
		maxGap = max(maxGap, math.Abs(served["a"]-served["b"]))
	}
	u := float64(fair.Cost(a.prompt, a.output))
	return fleetOrder{maxGapU: maxGap / u, shareA: served["a"] / (served["a"] + served["b"])}
}

func removeJob(js []*orderJob, j *orderJob) []*orderJob {
	for i, x := range js {
		if x == j {
			return append(js[:i], js[i+1:]...)
		}
	}
	return js
}

// TestFleetOrderAgainstOneVTC measures how far two dispatchers sharing
// their counters through Redis stay from one VTC over the fleet, with a
// tenant that reaches only one of them. One VTC keeps the two tenants'
// counters within about one request of the larger size (U) of each
// other; measured as weighted tokens served, at each request's end, the
// requests in flight add up to a slot's worth each, so within about 3 U
// with two slots. Each dispatcher ordering by its own counters halves
// the first dispatcher between them, so B, served alone by the second, runs
// away from A without bound. Shared counters keep the gap bounded; how far
// beyond U it may go grows with the sync interval: by what the other
// dispatcher serves in one interval. The figures are in docs/fleet.md.
func TestFleetOrderAgainstOneVTC(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	const run = 10 * time.Minute
	one := runFleetOrder(t, s, "ns/one", oneQueue, run)
	t.Logf("one VTC: max gap %.2f U, A's share %.3f", one.maxGapU, one.shareA)
	if one.maxGapU > 4 {
		t.Errorf("one VTC: max gap %.2f U, want at most 4 U", one.maxGapU)
	}
	unshared := runFleetOrder(t, s, "ns/unshared", -1, run)
	t.Logf("own counters: max gap %.1f U, A's share %.3f", unshared.maxGapU, unshared.shareA)
	if unshared.maxGapU < 100 {
		t.Errorf("own counters: max gap %.1f U, want it to run away (> 100 U over %s)", unshared.maxGapU, run)
	}
	for _, tc := range []struct {
		sync    time.Duration
		maxGapU float64
	}{
		{sync: 0, maxGapU: 4},
		{sync: 50 * time.Millisecond, maxGapU: 4},
		{sync: time.Second, maxGapU: 4},
		{sync: 5 * time.Second, maxGapU: 8},
	} {
		got := runFleetOrder(t, s, "ns/sync-"+tc.sync.String(), tc.sync, run)
		t.Logf("shared, sync %v: max gap %.2f U, A's share %.3f", tc.sync, got.maxGapU, got.shareA)
		if got.maxGapU > tc.maxGapU {
			t.Errorf("shared, sync %v: max gap %.2f U, want at most %.0f U", tc.sync, got.maxGapU, tc.maxGapU)
		}
		if got.shareA < 0.45 || got.shareA > 0.55 {
			t.Errorf("shared, sync %v: A's share %.3f, want about half", tc.sync, got.shareA)
		}
	}
}
