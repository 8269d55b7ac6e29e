package queue

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

func TestAdmitRefusals(t *testing.T) {
	tests := map[string]struct {
		setup   func(t *testing.T, q *Queue)
		tenant  string
		tier    string
		wantIs  error
		wantErr string
	}{
		"no policy": {
			setup:  func(*testing.T, *Queue) {},
			tenant: "a", tier: "premium",
			wantIs:  ErrNoPolicy,
			wantErr: "queue: no policy",
		},
		"unknown tier": {
			setup:  func(_ *testing.T, q *Queue) { q.UpdatePolicy(seedPolicy(1)) },
			tenant: "a", tier: "gold",
			wantIs:  ErrUnknownTier,
			wantErr: `queue: unknown tier "gold"`,
		},
		"no capacity": {
			setup: func(_ *testing.T, q *Queue) {
				p := seedPolicy(0)
				p.Backends = nil
				q.UpdatePolicy(p)
			},
			tenant: "a", tier: "premium",
			wantIs:  ErrNoCapacity,
			wantErr: "queue: no capacity",
		},
		"draining": {
			setup: func(_ *testing.T, q *Queue) {
				q.UpdatePolicy(seedPolicy(1))
				q.Drain()
			},
			tenant: "a", tier: "premium",
			wantIs:  ErrDraining,
			wantErr: "queue: draining",
		},
		"draining wins over no policy": {
			setup:  func(_ *testing.T, q *Queue) { q.Drain() },
			tenant: "a", tier: "premium",
			wantIs:  ErrDraining,
			wantErr: "queue: draining",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			q, _ := newTestQueue(t, nil)
			tc.setup(t, q)
			h, err := q.Admit(tc.tenant, tc.tier)
			if h != nil {
				t.Fatalf("got a handle, want refusal")
			}
			if !errors.Is(err, tc.wantIs) {
				t.Fatalf("err = %v, want errors.Is %v", err, tc.wantIs)
			}
			if err.Error() != tc.wantErr {
				t.Fatalf("message %q, want %q", err.Error(), tc.wantErr)
			}
			var r *Refusal
			if errors.As(err, &r) {
				t.Fatalf("%v should not be a *Refusal", err)
			}
			assertEmpty(t, q)
		})
	}
}

// fill keeps the single slot busy and queues n jobs per tenant of tier.
func fill(t *testing.T, q *Queue, tier string, tenants []string, n int) []*Handle {
	t.Helper()
	var hs []*Handle
	for _, tn := range tenants {
		for range n {
			h := mustAdmit(t, q, tn, tier)
			if dispatched(h) {
				t.Fatalf("%s's job dispatched; the slot should be busy", tn)
			}
			hs = append(hs, h)
		}
	}
	return hs
}

func TestBoundAndTenantLimit(t *testing.T) {
	tests := map[string]struct {
		tier      string
		tenants   []string
		per       int
		tenant    string
		want      Refusal
		wantError string
	}{
		"premium bound 20 refuses the 21st": {
			tier: "premium", tenants: []string{"t0", "t1", "t2", "t3"}, per: 5, tenant: "t4",
			// ceil(21/4) = 6s by serviceRate, clamped to W = 5s
			want:      Refusal{Cause: ErrQueueFull, Tier: "premium", Position: 21, RetryAfter: 5 * time.Second},
			wantError: `queue: tier queue is full: tier "premium", position 21, retry after 5s`,
		},
		"premium tenant queue limit 5 refuses a 6th from one tenant": {
			tier: "premium", tenants: []string{"t0", "t1"}, per: 5, tenant: "t1",
			want:      Refusal{Cause: ErrTenantLimit, Tier: "premium", Position: 11, RetryAfter: 3 * time.Second},
			wantError: `queue: tenant queue limit reached: tier "premium", position 11, retry after 3s`,
		},
		"standard tenant queue limit 8": {
			tier: "standard", tenants: []string{"s"}, per: 8, tenant: "s",
			want:      Refusal{Cause: ErrTenantLimit, Tier: "standard", Position: 9, RetryAfter: 3 * time.Second},
			wantError: `queue: tenant queue limit reached: tier "standard", position 9, retry after 3s`,
		},
		"the bound is checked before the tenant limit": {
			tier: "premium", tenants: []string{"t0", "t1", "t2", "t3"}, per: 5, tenant: "t3",
			want:      Refusal{Cause: ErrQueueFull, Tier: "premium", Position: 21, RetryAfter: 5 * time.Second},
			wantError: `queue: tier queue is full: tier "premium", position 21, retry after 5s`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			q, _ := newTestQueue(t, seedPolicy(1))
			blocker := mustAdmit(t, q, "blocker", "free")
			hs := fill(t, q, tc.tier, tc.tenants, tc.per)
			_, err := q.Admit(tc.tenant, tc.tier)
			var r *Refusal
			if !errors.As(err, &r) {
				t.Fatalf("err = %v, want *Refusal", err)
			}
			if !errors.Is(err, tc.want.Cause) {
				t.Errorf("errors.Is(err, %v) = false", tc.want.Cause)
			}
			if diff := cmp.Diff(tc.want, *r, cmp.Comparer(func(a, b error) bool { return errors.Is(a, b) && errors.Is(b, a) })); diff != "" {
				t.Errorf("refusal (-want +got):\n%s", diff)
			}
			if err.Error() != tc.wantError {
				t.Errorf("message %q, want %q", err.Error(), tc.wantError)
			}
			s := q.Stats()
			wantRefused := map[string]uint64{CauseCapacity: 0, CauseTenantLimit: 0}
			wantRefused[r.CauseLabel()] = 1
			if diff := cmp.Diff(wantRefused, s.Tiers[tc.tier].Refused); diff != "" {
				t.Errorf("refused counts (-want +got):\n%s", diff)
			}
			if got := s.Tiers[tc.tier].Queued; got != len(hs) {
				t.Errorf("queued %d, want %d (a refusal must not enqueue)", got, len(hs))
			}
			// Space frees: the next admission of another tenant succeeds.
			hs[0].Release()
			if h, err := q.Admit("newcomer", tc.tier); err != nil {
				t.Errorf("after a cancel, Admit: %v", err)
			} else {
				hs = append(hs, h)
			}
			for _, h := range hs {
				h.Release()
			}
			blocker.Release()
			assertEmpty(t, q)
		})
	}
}

func TestFreeSlotBypassesFullBound(t *testing.T) {
	p := seedPolicy(2)
	p.Tiers[2].QueueBound = 1 // free
	q, _ := newTestQueue(t, p)
	a1 := mustAdmit(t, q, "a", "free") // runs; a is at its cap of 1
	a2 := mustAdmit(t, q, "a", "free") // queued: free's queue is now full
	if dispatched(a2) {
		t.Fatal("a2 dispatched, want queued")
	}
	// c is under its cap and a slot is free: it runs, although free is full.
	c1 := mustAdmit(t, q, "c", "free")
	if !dispatched(c1) {
		t.Fatal("c1 not dispatched at once")
	}
	if _, err := q.Admit("d", "free"); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("no slot left and free full: err = %v, want ErrQueueFull", err)
	}
	a1.Release()
	if !dispatched(a2) {
		t.Fatal("a2 not dispatched after a1")
	}
	a2.Release()
	c1.Release()
	assertEmpty(t, q)
}

func TestRetryAfter(t *testing.T) {
	tests := map[string]struct {
		policy func(p *policy.Policy)
		// drive dispatches from tier "standard" every interval for span
		interval, span time.Duration
		idle           time.Duration // then nothing for this long
		pos            int
		want           time.Duration
		rate           float64 // the nominal drain rate; Stats must be within 15%
	}{
		"fallback to serviceRate, rounded up to 1s": {pos: 1, want: time.Second},
		"fallback to serviceRate":                   {pos: 10, want: 3 * time.Second},
		"clamped to W":                              {pos: 80, want: 20 * time.Second},
		"no rate at all gives W": {
			policy: func(p *policy.Policy) { p.ServiceRate = 0 },
			pos:    1, want: 20 * time.Second,
		},
		"W below 1s still gives 1s": {
			policy: func(p *policy.Policy) { p.Tiers[1].TolerableWaitSeconds = 0.5 },
			pos:    50, want: time.Second,
		},
		"fractional W rounds down": {
			policy: func(p *policy.Policy) { p.Tiers[1].TolerableWaitSeconds = 7.9 },
			pos:    79, want: 7 * time.Second,
		},
		"measured 2/s replaces serviceRate": {
			interval: 500 * time.Millisecond, span: 30 * time.Second,
			pos: 9, want: 5 * time.Second, rate: 2, // measured 1.95/s
		},
		"measured 0.5/s": {
			// measured one interval after the last dispatch: 0.45/s, so
			// 3/0.45 = 6.6 -> 7s
			interval: 2 * time.Second, span: 60 * time.Second,
			pos: 3, want: 7 * time.Second, rate: 0.5,
		},
		"a stalled tier's rate decays to W": {
			interval: 500 * time.Millisecond, span: 30 * time.Second, idle: 100 * time.Second,
			pos: 1, want: 20 * time.Second,
		},
		"under a second of measurement falls back": {
			interval: 100 * time.Millisecond, span: 800 * time.Millisecond,
			pos: 10, want: 3 * time.Second,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := seedPolicy(1)
			if tc.policy != nil {
				tc.policy(p)
			}
			q, clk := newTestQueue(t, p)
			if tc.span > 0 {
				for el := time.Duration(0); el <= tc.span; el += tc.interval {
					h := mustAdmit(t, q, "s", "standard")
					if !dispatched(h) {
						t.Fatal("not dispatched")
					}
					h.Release()
					clk.Step(tc.interval)
				}
			}
			clk.Step(tc.idle)
			q.mu.Lock()
			got := q.retryAfter(q.tiers["standard"], tc.pos, q.now())
			q.mu.Unlock()
			if got != tc.want {
				t.Fatalf("retryAfter(pos %d) = %s, want %s", tc.pos, got, tc.want)
			}
			if tc.rate > 0 {
				m := q.Stats().Tiers["standard"].DrainRate
				if m < tc.rate*0.85 || m > tc.rate*1.15 {
					t.Fatalf("DrainRate = %.3f, want %.2f within 15%%", m, tc.rate)
				}
			}
		})
	}
}
