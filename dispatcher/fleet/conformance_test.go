package fleet

import (
	"strconv"
	"testing"
	"time"

	"github.com/tiergate/tiergate/dispatcher/queue/gate"
	"github.com/tiergate/tiergate/internal/gatetest"
	"github.com/tiergate/tiergate/internal/redistest"
)

// TestRedisConforms holds the Redis Gate to the suite the queue tests'
// Fake passes: one real redis-server, a fresh pool per case, every
// dispatcher renewing its leases until the case crashes it.
func TestRedisConforms(t *testing.T) {
	s := redistest.Start(t, redistest.Options{})
	c := rawClient(t, s)
	const ttl = time.Second
	cases := 0
	var current map[string]*Redis
	gatetest.Run(t, gatetest.Harness{
		LeaseTTL: ttl,
		NewFleet: func(t *testing.T) (func(string) gate.Gate, func(gatetest.Count) int) {
			cases++
			pool := "conformance/" + strconv.Itoa(cases)
			gates := map[string]*Redis{}
			current = gates
			get := func(name string) gate.Gate {
				if g := gates[name]; g != nil {
					return g
				}
				g := newGate(t, s, name, Config{LeaseTTL: ttl, RenewInterval: 100 * time.Millisecond})
				g.ObservePolicy(fleetPolicy(pool, 2))
				g.Start(func() {})
				gates[name] = g
				return g
			}
			ks := keysFor(pool)
			count := func(n gatetest.Count) int {
				key := map[gatetest.CountKind]string{
					gatetest.PoolSlots: ks.slots(), gatetest.TenantSlots: ks.tenantSlots(n.Name),
					gatetest.TierQueued: ks.tierQueued(n.Name), gatetest.TenantQueued: ks.tenantQueued(n.Name),
				}[n.Kind]
				return live(t, c, key)
			}
			return get, count
		},
		Crash: func(_ *testing.T, name string) { crash(current[name]) },
	})
}
