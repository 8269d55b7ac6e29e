package queue

import (
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	clocktesting "k8s.io/utils/clock/testing"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/internal/gatetest"
)

// tierQueues is each tier's queued count, and each job's tier.
func tierQueues(q *Queue, hs map[string]*Handle) (map[string]int, map[string]string) {
	counts := map[string]int{}
	for name, ts := range q.Stats().Tiers {
		if ts.Queued > 0 {
			counts[name] = ts.Queued
		}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	where := map[string]string{}
	for name, h := range hs {
		if h.state == stQueued {
			where[name] = h.j.tr.name
		}
	}
	return counts, where
}

// The race of a request identified under one policy and admitted under
// the next: acme's headers were read under v1 (acme in premium), its body
// arrived after v2 moved acme to free. The request joins free, the tier
// of the policy in force; acme's queued work stays where v2 put it, and
// nobody else's queued work moves.
func TestStaleIdentificationJoinsTheCurrentTier(t *testing.T) {
	v1 := func() *policy.Policy {
		p := seedPolicy(1)
		p.DefaultTier = "free"
		p.Tenants = []policy.Tenant{{ID: "acme", Tier: "premium"}, {ID: "globex", Tier: "premium"}, {ID: "initech", Tier: "standard"}}
		return p
	}
	v2 := func() *policy.Policy {
		p := v1()
		p.Version = 2
		p.Tenants[0].Tier = "free"
		return p
	}
	tests := map[string]struct {
		fleet     bool
		acmeFirst bool // acme already has a request queued under v1
	}{
		"local, acme had nothing queued":   {},
		"local, acme had a request queued": {acmeFirst: true},
		"fleet, acme had nothing queued":   {fleet: true},
		"fleet, acme had a request queued": {fleet: true, acmeFirst: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			q := newRaceQueue(t, tc.fleet, v1())
			hs := map[string]*Handle{"blocker": mustAdmit(t, q, "blocker", "free")}
			hs["globex"] = mustAdmit(t, q, "globex", "premium")
			hs["initech"] = mustAdmit(t, q, "initech", "standard")
			hs["bob"] = mustAdmit(t, q, "bob", "free") // unlisted: the default tier
			if tc.acmeFirst {
				hs["acme-1"] = mustAdmit(t, q, "acme", "premium")
			}
			q.UpdatePolicy(v2())
			// acme was identified under v1, so the caller says premium.
			h := mustAdmit(t, q, "acme", "premium")
			hs["acme-2"] = h
			if h.Tier() != "free" {
				t.Errorf("the stale request joined %s, want free", h.Tier())
			}
			counts, where := tierQueues(q, hs)
			wantWhere := map[string]string{"globex": "premium", "initech": "standard", "bob": "free", "acme-2": "free"}
			wantCounts := map[string]int{"premium": 1, "standard": 1, "free": 2}
			if tc.acmeFirst {
				wantWhere["acme-1"] = "free"
				wantCounts["free"] = 3
			}
			if diff := cmp.Diff(wantWhere, where); diff != "" {
				t.Errorf("queued jobs' tiers (-want +got)\n%s", diff)
			}
			if diff := cmp.Diff(wantCounts, counts); diff != "" {
				t.Errorf("tier queues (-want +got)\n%s", diff)
			}
			if err := checkStructure(q); err != nil {
				t.Fatal(err)
			}
			for _, h := range hs {
				h.Release()
			}
			assertEmpty(t, q)
		})
	}
}

func newRaceQueue(t *testing.T, fleet bool, p *policy.Policy) *Queue {
	t.Helper()
	if !fleet {
		q, _ := newTestQueue(t, p)
		return q
	}
	f := gatetest.NewFleet()
	p.SharedState = "Redis"
	q := New(clocktesting.NewFakeClock(t0), WithGate(f.Gate(fmt.Sprint("d", 0))), withSpawn(inline))
	q.UpdatePolicy(p)
	t.Cleanup(func() {
		if err := f.Err(true); err != nil {
			t.Error(err)
		}
	})
	return q
}

// The tier a request joins, by what the policy in force says of its
// tenant; the caller's tier decides only for a tenant the policy neither
// lists nor defaults.
func TestTierOfTheCurrentPolicy(t *testing.T) {
	tests := map[string]struct {
		defaultTier string
		listed      []policy.Tenant
		tenant      string
		callerTier  string
		want        string
		wantErr     error
	}{
		"listed: its listed tier":                  {listed: []policy.Tenant{{ID: "a", Tier: "standard"}}, tenant: "a", callerTier: "premium", want: "standard"},
		"unlisted with a default: the default":     {defaultTier: "free", tenant: "u", callerTier: "premium", want: "free"},
		"unlisted without a default: the caller's": {tenant: "u", callerTier: "premium", want: "premium"},
		"unlisted, the caller's tier is unknown":   {tenant: "u", callerTier: "gold", wantErr: ErrUnknownTier},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := seedPolicy(4)
			p.DefaultTier = tc.defaultTier
			p.Tenants = tc.listed
			q, _ := newTestQueue(t, p)
			h, err := q.Admit(tc.tenant, tc.callerTier)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Admit = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if h.Tier() != tc.want {
				t.Errorf("joined %s, want %s", h.Tier(), tc.want)
			}
			h.Release()
		})
	}
}
