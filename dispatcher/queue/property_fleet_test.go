package queue

import (
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/tiergate/tiergate/dispatcher/queue/gate"
	"github.com/tiergate/tiergate/internal/gatetest"
)

// driverFleet is the property test's fleet: a Fleet whose exchanges the
// driver may hold, the pump the queue asked for (run when the driver
// chooses), and another dispatcher holding slots of the same pool.
type driverFleet struct {
	f       *gatetest.Fleet
	other   *gatetest.Fake
	mu      sync.Mutex // pending is also set from the expiry timer's goroutine
	pending func()
	held    *heldPump
	foreign []foreignSlot
}

type heldPump struct {
	call *gatetest.HeldCall
	done chan struct{}
}

type foreignSlot struct {
	lease  gate.Lease
	tenant string
}

// foreignTier is the tier the other dispatcher queues in, so its places
// never count against the queue's tiers.
const foreignTier = "foreign"

func newDriverFleet() *driverFleet {
	f := gatetest.NewFleet()
	return &driverFleet{f: f, other: f.Gate("other")}
}

func (df *driverFleet) spawn(run func()) {
	df.mu.Lock()
	defer df.mu.Unlock()
	if df.pending != nil {
		panic("a second pump scheduled while one is pending")
	}
	df.pending = run
}

// settleSpawn waits out a pump that is being scheduled: the queue's unlock
// marks the pump under its lock and spawns it just after, so the expiry
// timer's goroutine may be between the two when the driver looks.
func (d *driver) settleSpawn() {
	deadline := time.Now().Add(10 * time.Second)
	for {
		d.q.mu.Lock()
		pumping := d.q.fleet.pumping
		d.q.mu.Unlock()
		d.fleet.mu.Lock()
		scheduled := d.fleet.pending != nil || d.fleet.held != nil
		d.fleet.mu.Unlock()
		if !pumping || scheduled {
			return
		}
		if time.Now().After(deadline) {
			d.fail("the queue marked a pump that was never spawned")
		}
		runtime.Gosched()
	}
}

func (df *driverFleet) take() func() {
	df.mu.Lock()
	defer df.mu.Unlock()
	run := df.pending
	df.pending = nil
	return run
}

// fleetStep runs one of the fleet-only operations.
func (d *driver) fleetStep(op byte, o *ops) {
	switch op {
	case 12, 13:
		d.runPending()
	case 14:
		d.startHeld()
	case 15:
		d.proceedHeld()
	default:
		if o.next()%2 == 0 {
			d.foreignTake(o)
		} else {
			d.foreignGive(o)
		}
	}
}

// runPending runs the pump the queue asked for, every exchange answered at
// once.
func (d *driver) runPending() {
	if d.fleet == nil {
		return
	}
	d.settleSpawn()
	run := d.fleet.take()
	if run == nil {
		return
	}
	d.log = append(d.log, "pump")
	run()
	d.m.pump()
}

// startHeld starts the pending pump on its own goroutine with its first
// exchange held: the queue's claims are in flight until proceedHeld.
func (d *driver) startHeld() {
	if d.fleet.held != nil {
		return
	}
	d.settleSpawn()
	run := d.fleet.take()
	if run == nil {
		return
	}
	d.fleet.f.Hold(1)
	done := make(chan struct{})
	go func() { run(); close(done) }()
	r := d.m.startRound()
	select {
	case c := <-d.fleet.f.Held():
		d.log = append(d.log, fmt.Sprintf("exchange held: %d claims, %d returns", c.Claims, c.Returns))
		if r == nil || c.Claims != len(r.jobs) || c.Returns != len(r.returns) {
			d.fail("held exchange of %d claims and %d returns, model %+v", c.Claims, c.Returns, r)
		}
		d.fleet.held = &heldPump{call: c, done: done}
		d.m.fleet.round = r
	case <-done:
		d.log = append(d.log, "pump found nothing due")
		if r != nil {
			d.fail("the pump ended without an exchange, model sends %+v", r)
		}
		d.fleet.f.Hold(-1)
	}
}

// proceedHeld lets the held exchange be answered and the pump finish.
func (d *driver) proceedHeld() {
	h := d.fleet.held
	if h == nil {
		return
	}
	d.log = append(d.log, "exchange proceeds")
	h.call.Proceed()
	<-h.done
	d.fleet.held = nil
	r := d.m.fleet.round
	d.m.fleet.round = nil
	d.m.settle(r, d.m.decide(r))
	d.m.pump()
}

// foreignTake makes the other dispatcher take a slot, if the pool has one.
func (d *driver) foreignTake(o *ops) {
	tenant := tenantNames[int(o.next())%len(tenantNames)]
	if d.m.slots < 1 {
		return
	}
	d.log = append(d.log, "foreign take "+tenant)
	p, err := d.fleet.other.Enqueue(tenant, foreignTier, 1000, 1000)
	if err != nil || p.Result != gate.OK {
		d.fail("other dispatcher's enqueue: %+v, %v", p, err)
	}
	c := []gate.Claim{{Lease: p.Lease, TenantLimit: 1000}}
	d.fleet.other.Exchange(d.m.slots, nil, c)
	want := d.m.fleetSlots() < d.m.slots
	if got := c[0].Result == gate.OK; got != want {
		d.fail("other dispatcher's claim: %v, model grants %v", c[0].Result, want)
	}
	if !want {
		d.fleet.other.Exchange(0, []gate.Lease{p.Lease}, nil)
		return
	}
	d.fleet.foreign = append(d.fleet.foreign, foreignSlot{p.Lease, tenant})
	d.m.fleet.foreign[tenant]++
}

// foreignGive makes the other dispatcher release one of its slots; the
// queue is not told (a Kick op may follow).
func (d *driver) foreignGive(o *ops) {
	if len(d.fleet.foreign) == 0 {
		return
	}
	i := int(o.next()) % len(d.fleet.foreign)
	fs := d.fleet.foreign[i]
	d.fleet.foreign = append(d.fleet.foreign[:i], d.fleet.foreign[i+1:]...)
	d.log = append(d.log, "foreign give "+fs.tenant)
	d.fleet.other.Exchange(0, []gate.Lease{fs.lease}, nil)
	if d.m.fleet.foreign[fs.tenant]--; d.m.fleet.foreign[fs.tenant] == 0 {
		delete(d.m.fleet.foreign, fs.tenant)
	}
}

// fleetQuiesce ends what is in flight and gives the other dispatcher's
// slots back, then kicks the queue, so that the load can stop.
func (d *driver) fleetQuiesce() {
	d.proceedHeld()
	for len(d.fleet.foreign) > 0 {
		d.foreignGive(&ops{})
	}
	d.q.Kick()
	d.m.kick()
	d.m.afterOp()
}

// checkFleet compares the pump and the fleet's counts with the model.
func (d *driver) checkFleet(s Stats) {
	d.t.Helper()
	d.settleSpawn()
	df := d.fleet
	df.mu.Lock()
	scheduled := df.pending != nil || df.held != nil
	df.mu.Unlock()
	if scheduled != d.m.fleet.pumping {
		d.fail("pump scheduled %v, model %v", scheduled, d.m.fleet.pumping)
	}
	if want := d.m.claimedCount(""); s.Acquiring != want {
		d.fail("acquiring %d, model %d", s.Acquiring, want)
	}
	if err := df.f.Err(false); err != nil {
		d.fail("fleet: %v", err)
	}
	want := map[gatetest.Count]int{{Kind: gatetest.PoolSlots}: d.m.fleetSlots()}
	for _, t := range tenantNames {
		want[gatetest.Count{Kind: gatetest.TenantSlots, Name: t}] = d.m.fleetTenantSlots(t)
		want[gatetest.Count{Kind: gatetest.TenantQueued, Name: t}] = d.m.fleetTenantQueued(t)
	}
	for _, tr := range append([]string{foreignTier}, tierNames...) {
		want[gatetest.Count{Kind: gatetest.TierQueued, Name: tr}] = d.m.fleetTierQueued(tr)
	}
	for c, n := range want {
		if got := df.f.Count(c); got != n {
			d.fail("fleet %v = %d, model %d", c, got, n)
		}
	}
}
