package simulate

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/capacity"
)

// zeroPool is one replica of 2 slots, S = 10s constant, a cold start of
// 10s, ageing 1s per point and two tiers: fast (W 5s, base 0), which
// cannot wait out the cold start, and t (W 40s, base 10). At zero μ₁ =
// 2/10s: t holds ⌊0.2/s × (40s − 10s)⌋ = 6, fast 0; t's maxWait at zero is
// 10s + 10 × 1s + ⌈6 × 10s / 2⌉ + 10s = 60s.
const zeroPool = `apiVersion: tiergate.dev/v1alpha1
kind: ModelPool
metadata: {name: p}
spec:
  deploymentRef: {name: p}
  concurrencyPerReplica: 2
  serviceTime: {mean: 10s}
  coldStart: 10s
  ageing: {rate: 1s}
  backend: {port: 8000}
  dispatchers: {selector: {matchLabels: {app: d}}}
  defaultTier: t
---
apiVersion: tiergate.dev/v1alpha1
kind: ServiceTier
metadata: {name: fast}
spec: {poolRef: {name: p}, basePriority: 0, tolerableWait: 5s, tenantShare: "1"}
---
apiVersion: tiergate.dev/v1alpha1
kind: ServiceTier
metadata: {name: t}
spec: {poolRef: {name: p}, basePriority: 10, tolerableWait: 40s, tenantShare: "1"}
---
apiVersion: tiergate.dev/v1alpha1
kind: TenantQuota
metadata: {name: f}
spec: {tenant: f, tierRef: {name: fast}}
---
`

func zeroLoad(changes string) string {
	return `apiVersion: tiergate.dev/v1alpha1
kind: Load
spec:
  replicas: 1
  replicaChanges: ` + changes + `
  duration: 60s
  serviceTime: {distribution: constant, mean: 10s}
  tenants:
  - {tenant: a, arrival: {process: burst, at: 6s, count: 1}}
  - {tenant: f, arrival: {process: burst, at: 7s, count: 1}}
  - {tenant: b, arrival: {process: burst, at: 8s, count: 1}}
`
}

// The pool goes to zero at 5s and its first replica is Ready at 15s,
// exactly its cold start later. a (6s) and b (8s) are held by the real
// queue and dispatched at 15s, after 9s and 7s; f's fast request (7s) is
// refused at once. The policy change at zero shows capacity's own numbers.
func TestScaleToZeroAndBackHoldsRequests(t *testing.T) {
	in, err := Read(src("zero.yaml", zeroPool+zeroLoad("[{at: 5s, replicas: 0}, {at: 15s, replicas: 1}]")))
	if err != nil {
		t.Fatal(err)
	}
	res := run(t, in)

	wantHeld := map[string]HeldFigures{
		"fast": {RefusedAtZero: 1, WithinMaxWait: true},
		"t":    {Held: 2, Dispatched: 2, MaxWait: 9, StatedMaxWait: 60, WithinMaxWait: true},
	}
	gotHeld := map[string]HeldFigures{}
	for name, tr := range res.Tiers {
		if tr.HeldAtZero == nil {
			t.Fatalf("tier %s has no held figures", name)
		}
		gotHeld[name] = *tr.HeldAtZero
	}
	if diff := cmp.Diff(wantHeld, gotHeld); diff != "" {
		t.Errorf("held at zero (-want +got):\n%s", diff)
	}
	if w := res.Tiers["t"].Wait; w.Count != 2 || w.Max != 9 || w.Mean != 8 {
		t.Errorf("t waits %+v, want 9s and 7s", w)
	}
	if got := res.Tiers["fast"].Refused.Unavailable; got != 1 {
		t.Errorf("fast 503s %d, want 1", got)
	}

	// The zero phase as the controller computes it: status.queueBound and
	// maxWait of the tiers, the printer columns' BOUND, the pushed policy.
	b, err := capacity.ComputeBounds(capacity.BoundsInput{Pool: in.Pool, ReadyReplicas: 0, Tiers: in.Tiers, Quotas: in.Quotas, Dispatchers: 1})
	if err != nil {
		t.Fatal(err)
	}
	want := PolicyChange{AtSeconds: 5, Bounds: map[string]int{}, MaxWait: map[string]float64{}, ColdStartSeconds: b.Pool.ColdStart.Seconds()}
	for _, tb := range b.Tiers {
		want.Bounds[tb.Name] = int(tb.QueueBound)
		if tb.QueueBound == 0 {
			want.RefusedAtZero = append(want.RefusedAtZero, tb.Name)
		} else {
			want.MaxWait[tb.Name] = tb.MaxWait.Seconds()
		}
	}
	if diff := cmp.Diff(PolicyChange{AtSeconds: 5, Bounds: map[string]int{"fast": 0, "t": 6}, MaxWait: map[string]float64{"t": 60},
		ColdStartSeconds: 10, RefusedAtZero: []string{"fast"}}, want); diff != "" {
		t.Errorf("capacity's bounds at zero are not the worked ones (-want +got):\n%s", diff)
	}
	if len(res.PolicyChanges) != 2 {
		t.Fatalf("policy changes %+v, want 2", res.PolicyChanges)
	}
	if diff := cmp.Diff(want, res.PolicyChanges[0]); diff != "" {
		t.Errorf("simulate's zero phase against capacity's (-want +got):\n%s", diff)
	}
	pol := b.PolicyFor(0)
	if !pol.HoldsForColdStart() || pol.Slots != 0 || pol.Tiers[0].QueueBound != 0 || pol.Tiers[1].QueueBound != 6 {
		t.Errorf("the pushed policy at zero %+v does not hold with bounds 0 and 6", pol)
	}

	wantWarnings := []string{
		"replicaChanges[0]: the pool scales to 0 at 5s: with coldStart 10s requests are held for the first replica within the bounds at zero (t 6); fast cannot wait out the cold start and is refused at once with 503 unavailable (Retry-After 10s)",
	}
	if diff := cmp.Diff(wantWarnings, res.Warnings); diff != "" {
		t.Errorf("warnings (-want +got):\n%s", diff)
	}

	var text bytes.Buffer
	if err := WriteText(&text, res); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"  at 5s: 0 replicas, 0 slots, held for a cold start of 10s, bounds fast 0 (refused at zero), t 6; maxWait t 1m0s",
		"  at 15s: 1 replicas, 2 slots, bounds fast 1, t 8; maxWait fast 55s, t 1m5s",
	} {
		if !strings.Contains(text.String(), line+"\n") {
			t.Errorf("the text lacks %q:\n%s", line, text.String())
		}
	}
	for _, row := range [][]string{{"fast", "0", "0", "0", "0", "1", "0s", "refused", "-"}, {"t", "2", "2", "0", "0", "0", "9s", "1m0s", "yes"}} {
		if !containsFields(text.String(), row) {
			t.Errorf("the held table lacks the row %v:\n%s", row, text.String())
		}
	}
}

// containsFields reports whether a line of s has exactly these fields.
func containsFields(s string, fields []string) bool {
	for _, l := range strings.Split(s, "\n") {
		if cmp.Equal(strings.Fields(l), fields) {
			return true
		}
	}
	return false
}

func TestScaleToZeroWarnings(t *testing.T) {
	held := "with coldStart 10s requests are held for the first replica within the bounds at zero (t 6); fast cannot wait out the cold start and is refused at once with 503 unavailable (Retry-After 10s)"
	tests := map[string]struct {
		pool, changes string
		want          []string
	}{
		"back within the cold start": {pool: zeroPool, changes: "[{at: 5s, replicas: 0}, {at: 12s, replicas: 1}]",
			want: []string{"replicaChanges[0]: the pool scales to 0 at 5s: " + held}},
		"back later than the cold start": {pool: zeroPool, changes: "[{at: 5s, replicas: 0}, {at: 30s, replicas: 1}]",
			want: []string{
				"replicaChanges[0]: the pool scales to 0 at 5s: " + held,
				"replicaChanges[0]: the pool stays at zero for 25s (until its first replica at 30s), longer than its coldStart 10s: requests held early wait longer than the bounds at zero assume and may expire",
			}},
		"never back": {pool: zeroPool, changes: "[{at: 5s, replicas: 0}]",
			want: []string{
				"replicaChanges[0]: the pool scales to 0 at 5s: " + held,
				"replicaChanges[0]: the pool stays at zero for 55s (until the end of the run), longer than its coldStart 10s: requests held early wait longer than the bounds at zero assume and may expire",
			}},
		"no cold start: refused": {pool: strings.Replace(zeroPool, "  coldStart: 10s\n", "", 1), changes: "[{at: 5s, replicas: 0}, {at: 15s, replicas: 1}]",
			want: []string{"replicaChanges[0]: the pool scales to 0 at 5s: requests are refused with 503 unavailable until it scales up"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			in, err := Read(src("zero.yaml", tc.pool+zeroLoad(tc.changes)))
			if err != nil {
				t.Fatal(err)
			}
			res := run(t, in)
			if diff := cmp.Diff(tc.want, res.Warnings); diff != "" {
				t.Errorf("warnings (-want +got):\n%s", diff)
			}
		})
	}
}

// A held tier whose maxWait at zero outlasts the client timeout is warned
// of: its held requests may expire first.
func TestHeldMaxWaitBeyondClientTimeoutWarns(t *testing.T) {
	pool := strings.Replace(zeroPool, "  coldStart: 10s\n", "  coldStart: 10s\n  clientTimeout: 40s\n", 1)
	in, err := Read(src("zero.yaml", pool+zeroLoad("[{at: 5s, replicas: 0}, {at: 15s, replicas: 1}]")))
	if err != nil {
		t.Fatal(err)
	}
	b, err := capacity.ComputeBounds(capacity.BoundsInput{Pool: in.Pool, Tiers: in.Tiers, Dispatchers: 1, Backends: []policy.Backend{}})
	if err != nil {
		t.Fatal(err)
	}
	if mw := b.Tiers[1].MaxWait; mw != 60*time.Second {
		t.Fatalf("t's maxWait at zero %s, want 60s", mw)
	}
	res := run(t, in)
	w := "tier t: the stated maxWait at zero 1m0s exceeds clientTimeout 40s: a request held for the first replica may expire before it is served"
	found := false
	for _, got := range res.Warnings {
		found = found || got == w
	}
	if !found {
		t.Errorf("warnings %q lack %q", res.Warnings, w)
	}
}
