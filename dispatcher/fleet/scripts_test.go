package fleet

import (
	"context"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/redis/go-redis/v9"

	"github.com/tiergate/tiergate/internal/redistest"
)

// far is an expiry well in the future; gone is one in the past.
const (
	far  = int64(60_000)
	gone = int64(-1)
)

func TestEnqueueScript(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	c := rawClient(t, s)
	ks := keysFor("ns/pool")
	tierKey, tenantKey := ks.tierQueued("free"), ks.tenantQueued("acme")

	tests := map[string]struct {
		tier, tenant  map[string]int64
		bound, qlimit int
		want          []int64
		wantTier      []string
		wantTenant    []string
	}{
		"empty admits": {
			bound: 2, qlimit: 1,
			want: []int64{0, 1}, wantTier: []string{"new"}, wantTenant: []string{"new"},
		},
		"tier at its bound refuses with the tier count": {
			tier:  map[string]int64{"a": far, "b": far},
			bound: 2, qlimit: 5,
			want: []int64{1, 2}, wantTier: []string{"a", "b"},
		},
		"tenant at its queue limit refuses with the tier count": {
			tier:   map[string]int64{"a": far, "x": far},
			tenant: map[string]int64{"a": far},
			bound:  5, qlimit: 1,
			want: []int64{2, 2}, wantTier: []string{"a", "x"}, wantTenant: []string{"a"},
		},
		"tier bound is checked before the tenant limit": {
			tier:   map[string]int64{"a": far},
			tenant: map[string]int64{"a": far},
			bound:  1, qlimit: 1,
			want: []int64{1, 1}, wantTier: []string{"a"}, wantTenant: []string{"a"},
		},
		"expired leases do not count and are dropped": {
			tier:   map[string]int64{"a": gone, "b": gone, "c": far},
			tenant: map[string]int64{"a": gone},
			bound:  2, qlimit: 1,
			want: []int64{0, 2}, wantTier: []string{"c", "new"}, wantTenant: []string{"new"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			c.Del(ctx, tierKey, tenantKey)
			seed(t, c, tierKey, tc.tier)
			seed(t, c, tenantKey, tc.tenant)
			got, err := enqueueScript.Run(ctx, c, []string{tierKey, tenantKey}, "new", 5000, tc.bound, tc.qlimit).Int64Slice()
			if err != nil {
				t.Fatalf("enqueue: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("reply (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantTier, members(t, c, tierKey), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("tier set (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantTenant, members(t, c, tenantKey), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("tenant set (-want +got):\n%s", diff)
			}
		})
	}
}

// xclaim is one claim of an exchange in a script test.
type xclaim struct {
	member, tenant string
	limit          int
}

// xreturn is one lease an exchange gives back: its member and its sets.
type xreturn struct {
	member string
	sets   [2]string
}

// The script tests' lease TTL, hold and starved TTL (ms).
const testTTL, testHold, testStarved = 5000, 2000, 6000

// runExchange runs exchangeScript as the Gate does (tier "free", pool
// "ns/pool", dispatcher "me"): removals first, then the claims.
func runExchange(t *testing.T, c *redis.Client, slots int, removals []xreturn, claims []xclaim) []int64 {
	t.Helper()
	return runExchangeAs(t, c, "me", slots, removals, claims)
}

// runExchangeAs is runExchange for dispatcher id.
func runExchangeAs(t *testing.T, c *redis.Client, id string, slots int, removals []xreturn, claims []xclaim) []int64 {
	t.Helper()
	ks := keysFor("ns/pool")
	keys := []string{ks.slots(), ks.waiting(), ks.starved(), ks.handoff()}
	args := []any{testTTL, slots, id, ks.freed(), len(removals), testHold, testStarved}
	for _, r := range removals {
		keys = append(keys, r.sets[0], r.sets[1])
		args = append(args, r.member)
	}
	for _, cl := range claims {
		keys = append(keys, ks.tenantSlots(cl.tenant), ks.tierQueued("free"), ks.tenantQueued(cl.tenant))
		args = append(args, cl.member, cl.limit)
	}
	got, err := exchangeScript.Run(context.Background(), c, keys, args...).Int64Slice()
	if err != nil {
		t.Fatalf("exchange: %v", err)
	}
	return got
}

func TestExchangeScript(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	c := rawClient(t, s)
	ks := keysFor("ns/pool")
	pool, acme, bob := ks.slots(), ks.tenantSlots("acme"), ks.tenantSlots("bob")
	tierQ, acmeQ, bobQ := ks.tierQueued("free"), ks.tenantQueued("acme"), ks.tenantQueued("bob")
	all := []string{pool, acme, bob, tierQ, acmeQ, bobQ, ks.waiting(), ks.starved(), ks.handoff()}
	q1, q2, b1 := xclaim{"q1", "acme", 1}, xclaim{"q2", "acme", 1}, xclaim{"b1", "bob", 1}

	tests := map[string]struct {
		pool, acme map[string]int64
		slots      int
		removals   []xreturn
		claims     []xclaim
		want       []int64 // codes
		wantWait   int64   // ms; 0: about far, the seeded leases' expiry
		wantSets   map[string][]string
	}{
		"grants in order, each member moving from its queued sets to the slot sets": {
			slots: 2, claims: []xclaim{q1, b1}, want: []int64{resOK, resOK},
			wantSets: map[string][]string{pool: {"b1", "q1"}, acme: {"q1"}, bob: {"b1"}, tierQ: {"q2"}, acmeQ: {"q2"}},
		},
		"a full pool refuses this and every later claim": {
			pool: map[string]int64{"x": far, "y": far}, slots: 2, claims: []xclaim{q1, b1}, want: []int64{resPoolFull, resPoolFull},
			wantSets: map[string][]string{pool: {"x", "y"}, tierQ: {"b1", "q1", "q2"}, acmeQ: {"q1", "q2"}, bobQ: {"b1"}},
		},
		"a full tenant is skipped, the next tenant granted": {
			pool: map[string]int64{"x": far}, acme: map[string]int64{"x": far}, slots: 3,
			claims: []xclaim{q1, b1}, want: []int64{resTenantFull, resOK},
			wantSets: map[string][]string{pool: {"b1", "x"}, acme: {"x"}, bob: {"b1"}, tierQ: {"q1", "q2"}, acmeQ: {"q1", "q2"}},
		},
		"a tenant's second claim meets its first": {
			slots: 3, claims: []xclaim{q1, q2}, want: []int64{resOK, resTenantFull}, wantWait: 5000,
			wantSets: map[string][]string{pool: {"q1"}, acme: {"q1"}, tierQ: {"b1", "q2"}, acmeQ: {"q2"}, bobQ: {"b1"}},
		},
		"removals land before the claims": {
			pool: map[string]int64{"x": far}, acme: map[string]int64{"x": far}, slots: 1,
			removals: []xreturn{{"x", [2]string{pool, acme}}, {"b1", [2]string{tierQ, bobQ}}},
			claims:   []xclaim{q1}, want: []int64{resOK},
			wantSets: map[string][]string{pool: {"q1"}, acme: {"q1"}, tierQ: {"q2"}, acmeQ: {"q2"}},
		},
		"expired slots come back": {
			pool: map[string]int64{"x": gone, "y": gone}, acme: map[string]int64{"x": gone}, slots: 2,
			claims: []xclaim{q1}, want: []int64{resOK},
			wantSets: map[string][]string{pool: {"q1"}, acme: {"q1"}, tierQ: {"b1", "q2"}, acmeQ: {"q2"}, bobQ: {"b1"}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c.Del(context.Background(), all...)
			seed(t, c, pool, tc.pool)
			seed(t, c, acme, tc.acme)
			seed(t, c, tierQ, map[string]int64{"q1": far, "q2": far, "b1": far})
			seed(t, c, acmeQ, map[string]int64{"q1": far, "q2": far})
			seed(t, c, bobQ, map[string]int64{"b1": far})
			got := runExchange(t, c, tc.slots, tc.removals, tc.claims)
			if diff := cmp.Diff(tc.want, got[:len(got)-1]); diff != "" {
				t.Errorf("codes (-want +got):\n%s", diff)
			}
			refused, starved := false, []string{}
			for _, code := range tc.want {
				refused = refused || code != resOK
				if code == resPoolFull {
					starved = []string{"me"}
				}
			}
			// Only a refusal for the pool makes it starved.
			if diff := cmp.Diff(starved, members(t, c, ks.starved()), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("starved (-want +got):\n%s", diff)
			}
			// A refused dispatcher waits (and hears of releases) until about
			// when the earliest lease of the full set expires.
			wantWaiting := []string{}
			if refused {
				wantWaiting = []string{"me"}
				want := tc.wantWait
				if want == 0 {
					want = far
				}
				if w := got[len(got)-1]; w <= want-1000 || w > want {
					t.Errorf("wait = %dms, want about %dms", w, want)
				}
			}
			if diff := cmp.Diff(wantWaiting, members(t, c, ks.waiting()), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("waiting (-want +got):\n%s", diff)
			}
			for _, k := range all[:6] {
				if diff := cmp.Diff(tc.wantSets[k], members(t, c, k), cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("%s (-want +got):\n%s", k, diff)
				}
			}
		})
	}
}

// TestExchangeScriptAnnouncesNetFreedSlots: an exchange publishes only
// when its removals freed more slots than its claims took, and only when
// another dispatcher waits.
func TestExchangeScriptAnnouncesNetFreedSlots(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	c := rawClient(t, s)
	ks := keysFor("ns/pool")
	sub := c.Subscribe(context.Background(), ks.freed())
	defer sub.Close()
	if _, err := sub.Receive(context.Background()); err != nil { // the subscription
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		waiting []string
		claim   bool
		want    bool
	}{
		{"freed, someone else waits", []string{"other"}, false, true},
		{"freed and taken again at once", []string{"other"}, true, false},
		{"freed, only this one waits", []string{"me"}, false, false},
		{"freed, nobody waits", nil, false, false},
	}
	for _, tc := range tests {
		c.Del(context.Background(), ks.slots(), ks.waiting(), ks.starved(), ks.handoff(), ks.tenantSlots("acme"), ks.tierQueued("free"), ks.tenantQueued("acme"))
		seed(t, c, ks.slots(), map[string]int64{"x": far})
		seed(t, c, ks.tierQueued("free"), map[string]int64{"q": far})
		w := map[string]int64{}
		for _, m := range tc.waiting {
			w[m] = far
		}
		seed(t, c, ks.waiting(), w)
		var claims []xclaim
		if tc.claim {
			claims = []xclaim{{"q", "acme", 1}}
		}
		runExchange(t, c, 1, []xreturn{{"x", [2]string{ks.slots(), ks.tenantSlots("acme")}}}, claims)
		// A PUBLISH after each case orders the channel: the case's own
		// message, if any, arrives before this marker.
		c.Publish(context.Background(), ks.freed(), "marker")
		m, err := sub.ReceiveMessage(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Payload == "me"; got != tc.want {
			t.Errorf("%s: announced %v, want %v", tc.name, got, tc.want)
		}
		if m.Payload == "me" {
			if m, err = sub.ReceiveMessage(context.Background()); err != nil || m.Payload != "marker" {
				t.Fatalf("%s: after the announcement got %v, %v", tc.name, m, err)
			}
		}
	}
}

func TestRemoveScriptAnnouncesFreedSlotsToWaiters(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	c := rawClient(t, s)
	ctx := context.Background()
	ks := keysFor("ns/pool")
	sub := c.Subscribe(ctx, ks.freed())
	defer sub.Close()
	if _, err := sub.ReceiveTimeout(ctx, 5*time.Second); err != nil { // the subscription ack
		t.Fatalf("subscribe: %v", err)
	}
	release := []string{ks.waiting(), ks.slots(), ks.tenantSlots("acme")}

	tests := []struct {
		name       string
		waiting    map[string]int64
		keys       []string
		args       []any
		want       int64
		wantPubSub bool
	}{
		{"a waiter hears a release", map[string]int64{"d9": far}, release,
			[]any{ks.freed(), "d1", 1, 1, "a", 1, "a"}, 1, true},
		{"releasing a gone lease is silent", map[string]int64{"d9": far}, release,
			[]any{ks.freed(), "d1", 1, 1, "a", 1, "a"}, 0, false},
		{"nobody waiting: no message", nil, release,
			[]any{ks.freed(), "d1", 1, 1, "b", 1, "b"}, 1, false},
		{"only itself waiting: no message", map[string]int64{"d1": far}, release,
			[]any{ks.freed(), "d1", 1, 1, "c", 0}, 1, false},
		{"an expired waiter does not count", map[string]int64{"d9": gone}, release,
			[]any{ks.freed(), "d1", 1, 1, "d", 0}, 1, false},
		{"no announce flag (dequeue), no message", map[string]int64{"d9": far}, release,
			[]any{ks.freed(), "d1", 0, 1, "e", 0}, 1, false},
		{"many at once", map[string]int64{"d9": far, "d1": far}, release,
			[]any{ks.freed(), "d2", 1, 2, "f", "zz", 1, "f"}, 1, true},
	}
	seed(t, c, ks.slots(), map[string]int64{"a": far, "b": far, "c": far, "d": far, "e": far, "f": far, "g": far})
	seed(t, c, ks.tenantSlots("acme"), map[string]int64{"a": far, "b": far, "f": far, "g": far})
	for _, tc := range tests {
		c.Del(ctx, ks.waiting())
		seed(t, c, ks.waiting(), tc.waiting)
		got, err := removeScript.Run(ctx, c, tc.keys, tc.args...).Int64()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got != tc.want {
			t.Errorf("%s: removed %d, want %d", tc.name, got, tc.want)
		}
		// A PUBLISH after each case orders the channel: the case's own
		// message, if any, arrives before this marker.
		c.Publish(ctx, ks.freed(), "marker")
		m, err := sub.ReceiveMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Payload != "marker"; got != tc.wantPubSub {
			t.Errorf("%s: message %q, want an announcement %v", tc.name, m.Payload, tc.wantPubSub)
		}
		if m.Payload != "marker" {
			if m.Payload != tc.args[1] {
				t.Errorf("%s: payload %q, want %q", tc.name, m.Payload, tc.args[1])
			}
			if m, err = sub.ReceiveMessage(ctx); err != nil || m.Payload != "marker" {
				t.Fatalf("%s: after the announcement got %v, %v", tc.name, m, err)
			}
		}
	}
	if diff := cmp.Diff([]string{"g"}, members(t, c, ks.slots())); diff != "" {
		t.Errorf("slots left (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"g"}, members(t, c, ks.tenantSlots("acme"))); diff != "" {
		t.Errorf("tenant slots left (-want +got):\n%s", diff)
	}
}

func TestRenewScript(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	c := rawClient(t, s)
	ctx := context.Background()
	ks := keysFor("ns/pool")
	reg, a, b := ks.dispatchers(), ks.slots(), ks.tenantSlots("acme")

	seed(t, c, reg, map[string]int64{"old": gone, "other": far})
	seed(t, c, a, map[string]int64{"d:1": 100, "d:2": 100, "x:1": 100})
	seed(t, c, b, map[string]int64{"d:1": 100})

	// d holds d:1 and d:2 in a, d:1 and d:3 in b: d:3 is missing.
	v, err := renewScript.Run(ctx, c, []string{reg, a, b}, 30_000, "d", 0, 2, "d:1", "d:2", 2, "d:1", "d:3").Slice()
	if err != nil {
		t.Fatalf("renew: %v", err)
	}
	alive, missing, err := parseRenew(v, &batch{keys: []string{a, b}})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"d", "other"}, sortStrings(alive)); diff != "" {
		t.Errorf("alive (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]missingLease{{key: b, member: "d:3"}}, missing, cmp.AllowUnexported(missingLease{})); diff != "" {
		t.Errorf("missing (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"d:1"}, members(t, c, b)); diff != "" {
		t.Errorf("restore=0 must not add (-want +got):\n%s", diff)
	}
	now := redisNowMs(t, c)
	for _, m := range []string{"d:1", "d:2"} {
		sc := c.ZScore(ctx, a, m).Val()
		if int64(sc) < now+29_000 {
			t.Errorf("%s not extended: expires in %dms", m, int64(sc)-now)
		}
	}
	if sc := c.ZScore(ctx, a, "x:1").Val(); int64(sc) > now+1000 {
		t.Errorf("another dispatcher's lease was extended")
	}
	if pttl := c.PTTL(ctx, a).Val(); pttl < 29*time.Second {
		t.Errorf("key expiry %s, want about the TTL", pttl)
	}

	// restore=1 writes back what is missing.
	if _, err := renewScript.Run(ctx, c, []string{reg, b}, 30_000, "", 1, 2, "d:1", "d:3").Slice(); err != nil {
		t.Fatalf("renew restore: %v", err)
	}
	if diff := cmp.Diff([]string{"d:1", "d:3"}, members(t, c, b)); diff != "" {
		t.Errorf("restore=1 (-want +got):\n%s", diff)
	}

	// A large batch goes through in chunks (unpack limits).
	var args []any
	big := make([]string, 1700)
	args = append(args, 30_000, "d", 1, len(big))
	for i := range big {
		big[i] = "d:big" + strings.Repeat("x", i%3) + strconv.Itoa(i)
		args = append(args, big[i])
	}
	if _, err := renewScript.Run(ctx, c, []string{reg, ks.tierQueued("free")}, args...).Slice(); err != nil {
		t.Fatalf("renew big: %v", err)
	}
	if n := live(t, c, ks.tierQueued("free")); n != len(big) {
		t.Errorf("big restore: %d live, want %d", n, len(big))
	}
	rm := append([]any{"", "", 0, len(big)}, args[4:]...)
	if n, err := removeScript.Run(ctx, c, []string{ks.waiting(), ks.tierQueued("free")}, rm...).Int64(); err != nil || n != int64(len(big)) {
		t.Errorf("big remove: %d, %v", n, err)
	}
}

func sortStrings(s []string) []string {
	out := append([]string(nil), s...)
	sort.Strings(out)
	return out
}
