package state

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

	"github.com/tiergate/tiergate/dispatcher/state/redistest"
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

func TestAcquireScript(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	c := rawClient(t, s)
	ks := keysFor("ns/pool")
	all := []string{ks.slots(), ks.tenantSlots("acme"), ks.tierQueued("free"), ks.tenantQueued("acme"), ks.waiting()}

	tests := map[string]struct {
		pool, tenant         map[string]int64
		queuedMember         string
		slots, limit         int
		wantCode             int64
		wantPool, wantTenant []string
		wantQueued           []string // both queued sets
	}{
		"grants and drops the queued place": {
			queuedMember: "q1", slots: 2, limit: 1,
			wantCode: resOK, wantPool: []string{"new"}, wantTenant: []string{"new"}, wantQueued: []string{"q2"},
		},
		"grants with no queued place": {
			slots: 1, limit: 1,
			wantCode: resOK, wantPool: []string{"new"}, wantTenant: []string{"new"}, wantQueued: []string{"q1", "q2"},
		},
		"pool full": {
			pool:         map[string]int64{"a": far, "b": far},
			queuedMember: "q1", slots: 2, limit: 5,
			wantCode: resPoolFull, wantPool: []string{"a", "b"}, wantQueued: []string{"q1", "q2"},
		},
		"tenant full": {
			pool:         map[string]int64{"a": far},
			tenant:       map[string]int64{"a": far},
			queuedMember: "q1", slots: 3, limit: 1,
			wantCode: resTenantFull, wantPool: []string{"a"}, wantTenant: []string{"a"}, wantQueued: []string{"q1", "q2"},
		},
		"pool is checked before the tenant": {
			pool:   map[string]int64{"a": far},
			tenant: map[string]int64{"a": far},
			slots:  1, limit: 1,
			wantCode: resPoolFull, wantPool: []string{"a"}, wantTenant: []string{"a"}, wantQueued: []string{"q1", "q2"},
		},
		"expired slots come back": {
			pool:   map[string]int64{"a": gone, "b": gone},
			tenant: map[string]int64{"a": gone},
			slots:  2, limit: 1, queuedMember: "q2",
			wantCode: resOK, wantPool: []string{"new"}, wantTenant: []string{"new"}, wantQueued: []string{"q1"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			c.Del(ctx, all...)
			seed(t, c, all[0], tc.pool)
			seed(t, c, all[1], tc.tenant)
			seed(t, c, all[2], map[string]int64{"q1": far, "q2": far})
			seed(t, c, all[3], map[string]int64{"q1": far, "q2": far})
			got, err := acquireScript.Run(ctx, c, all, "new", 5000, tc.slots, tc.limit, tc.queuedMember, "me").Int64Slice()
			if err != nil {
				t.Fatalf("acquire: %v", err)
			}
			if got[0] != tc.wantCode {
				t.Errorf("code = %d, want %d", got[0], tc.wantCode)
			}
			// A refused dispatcher waits (and hears of releases); a granted
			// one is not added.
			wantWaiting := []string{}
			if tc.wantCode != resOK {
				wantWaiting = []string{"me"}
			}
			if diff := cmp.Diff(wantWaiting, members(t, c, all[4]), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("waiting (-want +got):\n%s", diff)
			}
			if tc.wantCode != resOK {
				// The wait is until the earliest lease of the full set expires.
				if got[1] <= far-5000 || got[1] > far {
					t.Errorf("wait = %dms, want about %dms", got[1], far)
				}
			}
			for i, want := range [][]string{tc.wantPool, tc.wantTenant, tc.wantQueued, tc.wantQueued} {
				if diff := cmp.Diff(want, members(t, c, all[i]), cmpopts.EquateEmpty()); diff != "" {
					t.Errorf("%s (-want +got):\n%s", all[i], diff)
				}
			}
		})
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
		msg, err := sub.ReceiveTimeout(ctx, 100*time.Millisecond)
		switch m := msg.(type) {
		case *redis.Message:
			if !tc.wantPubSub {
				t.Errorf("%s: unexpected message %q", tc.name, m.Payload)
			} else if m.Payload != tc.args[1] {
				t.Errorf("%s: payload %q, want %q", tc.name, m.Payload, tc.args[1])
			}
		default:
			if tc.wantPubSub {
				t.Errorf("%s: no message (%v, %v)", tc.name, msg, err)
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
