package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/dispatcher"
)

// scaleEvent is one change of the pool's ready replicas and what the
// dispatchers and the controller made of it.
type scaleEvent struct {
	AtSeconds            float64        `json:"atSeconds"`
	From                 int32          `json:"from"`
	To                   int32          `json:"to"`
	Pods                 []string       `json:"pods"`
	Command              string         `json:"command"`
	SlotsBefore          int            `json:"slotsBefore"`
	SlotsAfter           int            `json:"slotsAfter"`
	BoundsBefore         map[string]int `json:"boundsBefore"`
	BoundsAfter          map[string]int `json:"boundsAfter"`
	TenantLimitsBefore   map[string]int `json:"tenantLimitsBefore"`
	TenantLimitsAfter    map[string]int `json:"tenantLimitsAfter"`
	Followed             bool           `json:"followed"`
	FollowedAfterSeconds float64        `json:"followedAfterSeconds"`
	StatusFollowed       bool           `json:"statusFollowed"`
	ServiceTiers         string         `json:"serviceTiers,omitempty"`
	Error                string         `json:"error,omitempty"`
}

// load runs the load phase: the streams, the observer, the scale schedule
// and the table.
func (d *demo) load(ctx context.Context) error {
	targets := make([]string, len(d.disps))
	for i, r := range d.disps {
		targets[i] = r.Data
	}
	d.started = time.Now()
	d.rec = newRecorder(d.started, d.cfg.MaxRequests)
	d.obs.setStart(d.started)
	gen := &loadGen{
		plan: d.plan, sched: d.sched, rec: d.rec, header: d.pool.TenantHeader, seed: d.cfg.Seed,
		client:  &http.Client{Transport: &serviceTransport{base: newTransport(), targets: targets}},
		timeout: 2 * time.Minute,
	}
	issueCtx, stopIssue := context.WithDeadline(ctx, d.started.Add(d.sched.Load))
	defer stopIssue()
	reqCtx, cancelReqs := context.WithCancel(ctx)
	defer cancelReqs()
	genDone := make(chan struct{})
	go func() { defer close(genDone); gen.run(issueCtx, reqCtx) }()
	obsCtx, stopObs := context.WithCancel(context.WithoutCancel(ctx))
	obsDone := make(chan struct{})
	go func() { defer close(obsDone); d.obs.run(obsCtx, d.cfg.Refresh) }()

	d.ui.logf("load running for %s (then up to %s for outstanding requests); scale to %d replicas at %s and back to %d at %s",
		d.sched.Load, d.sched.Grace, d.sched.Scale[0].Replicas, clock(d.sched.Scale[0].At), d.sched.Scale[1].Replicas, clock(d.sched.Scale[1].At))
	d.ui.setLive(true)
	tick := time.NewTicker(d.cfg.Refresh)
	defer tick.Stop()
	next := 0
	var runErr error
loop:
	for {
		select {
		case <-ctx.Done():
			runErr = context.Cause(ctx)
			break loop
		case p := <-d.sup.Exited():
			runErr = fmt.Errorf("%w: %s (pid %d): %v; last log lines:\n%s", ErrExited, p.Name, p.PID, p.err, tail(p.Log, 2048))
			break loop
		case <-genDone:
			break loop
		case <-tick.C:
			now := d.rec.since()
			for next < len(d.sched.Scale) && now >= d.sched.Scale[next].At && now < d.sched.Load {
				d.scale(ctx, d.sched.Scale[next])
				next++
			}
			if now >= d.sched.Load+d.sched.Grace {
				cancelReqs()
			}
			d.ui.frame(renderTable(d.view()))
		}
	}
	stopIssue()
	cancelReqs()
	d.awaitRequests(genDone, "")
	d.ended = d.rec.since()
	stopObs()
	<-obsDone
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	awaitIdle(fctx, d.obs)
	d.ui.frame(renderTable(d.view()))
	d.ui.setLive(false)
	d.follows.Wait()
	if n, err := d.kl.failures(); n > 0 {
		d.ui.logf("the kubelet stand-in failed %d times to write pod conditions; last: %v", n, err)
	}
	if runErr == nil {
		fs, err := d.k.final(fctx, d.pool)
		if err != nil {
			d.ui.logf("could not read the final state of the pool: %v", err)
		}
		d.final = fs
	}
	return runErr
}

// view assembles the table's data.
func (d *demo) view() tableView {
	s, ok := d.obs.latest()
	return tableView{
		Now: d.rec.since(), Load: d.sched.Load, Grace: d.sched.Grace,
		Pool: d.pool.Namespace + "/" + d.pool.Name, Ready: d.ready, Replicas: d.pool.Replicas, PerReplica: d.pool.PerReplica,
		Sample: s, HaveSample: ok, Tiers: tierOrder(d.plan), Live: d.rec.live(waitWindow), Dispatchers: len(d.disps),
		Events: d.ui.lastEvents(8), ServiceTime: d.cfg.ServiceTime, WaitWindow: waitWindow,
	}
}

// scale plays the autoscaler: the pods that go away (or come back) change
// their Ready condition first, then the Deployment's status says how many
// replicas are ready. The dispatchers' bounds follow through the
// controller, which follow() measures.
func (d *demo) scale(ctx context.Context, step scaleStep) {
	d.scaleOn(ctx, timeline{rec: d.rec, obs: d.obs, events: &d.events}, step)
}

// timeline is where a phase's scale events go: its clock (the recorder's
// start) and its list of events, guarded by d.mu.
type timeline struct {
	rec    *recorder
	obs    *observer
	events *[]*scaleEvent
}

// scaleOn is scale on a phase's timeline; it returns the event, which the
// follow goroutine completes.
func (d *demo) scaleOn(ctx context.Context, tl timeline, step scaleStep) *scaleEvent {
	at := tl.rec.since()
	before, _ := tl.obs.latest()
	ev := &scaleEvent{
		AtSeconds: at.Seconds(), From: d.ready, To: step.Replicas,
		SlotsBefore: before.Slots, BoundsBefore: bounds(before), TenantLimitsBefore: tenantLimits(before),
	}
	var verb string
	if step.Replicas < d.ready {
		ev.Pods, verb = d.models[step.Replicas:d.ready], "NotReady"
		d.kl.setWant(ev.Pods, false)
	} else {
		ev.Pods, verb = d.models[d.ready:step.Replicas], "Ready"
		d.kl.setWant(ev.Pods, true)
	}
	var errs []string
	if err := d.kl.sync(ctx); err != nil {
		errs = append(errs, err.Error())
	}
	cmd, err := d.k.patchReadyReplicas(ctx, d.pool, step.Replicas)
	if err != nil {
		errs = append(errs, err.Error())
	}
	ev.Command = cmd
	ev.Error = strings.Join(errs, "; ")
	d.ui.event(at, "scale %d→%d: pods %s %s; %s", ev.From, ev.To, strings.Join(ev.Pods, ", "), verb, cmd)
	if ev.Error != "" {
		d.ui.event(at, "scale failed: %s", ev.Error)
	}
	d.ready = step.Replicas
	d.mu.Lock()
	*tl.events = append(*tl.events, ev)
	d.mu.Unlock()
	d.follows.Add(1)
	go func() { defer d.follows.Done(); d.follow(ctx, tl.rec, ev, at) }()
	return ev
}

// follow measures how long the dispatchers take to hold the new pool's
// slots, records their bounds then, and waits for the ServiceTier status
// to show the same bounds.
func (d *demo) follow(ctx context.Context, rec *recorder, ev *scaleEvent, at time.Duration) {
	want := int(ev.To) * d.pool.PerReplica
	deadline := time.Now().Add(30 * time.Second)
	var after map[string]int
	slots := 0
	for time.Now().Before(deadline) && ctx.Err() == nil {
		var ok bool
		slots, after, ok = d.quickStats(ctx)
		// At zero the policy to wait for is the held one: pods going
		// NotReady before the Deployment's status may briefly leave the
		// dispatchers with no backend, and so no slot, at the old bounds.
		if ok && slots == want && (ev.To > 0 || d.holdingNow(ctx)) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	lag := rec.since() - at
	limits := d.tenantLimitsNow(ctx)
	d.mu.Lock()
	ev.SlotsAfter, ev.BoundsAfter, ev.TenantLimitsAfter = slots, after, limits
	ev.Followed = slots == want
	ev.FollowedAfterSeconds = lag.Seconds()
	d.mu.Unlock()
	order := tierOrder(d.plan)
	if slots != want {
		d.ui.event(rec.since(), "the dispatchers did not reach %d slots within 30s (they hold %d)", want, slots)
		return
	}
	var changes []string
	for _, t := range order {
		changes = append(changes, fmt.Sprintf("%s %d→%d", t, ev.BoundsBefore[t], after[t]))
	}
	d.ui.event(rec.since(), "bounds followed %.2fs after the patch: slots %d→%d; queue bounds %s", lag.Seconds(), ev.SlotsBefore, slots, strings.Join(changes, ", "))

	// The controller's status shows the same numbers (the pool-wide bound
	// is the sum of the dispatchers' equal shares here).
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if d.tierStatusMatches(ctx, after) || d.tierStatusIsPoolWide(ctx, ev.To) {
			d.mu.Lock()
			ev.StatusFollowed = true
			d.mu.Unlock()
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if out, err := d.k.kubectl(ctx, "-n", d.pool.Namespace, "get", "servicetiers"); err == nil {
		d.mu.Lock()
		ev.ServiceTiers = out
		d.mu.Unlock()
	}
}

// quickStats sums the dispatchers' slots and queue bounds.
func (d *demo) quickStats(ctx context.Context) (int, map[string]int, bool) {
	slots, b := 0, map[string]int{}
	for _, ref := range d.disps {
		var st dispatcher.Stats
		if err := d.obs.getJSON(ctx, ref, "/v1/stats", &st); err != nil {
			return 0, nil, false
		}
		slots += st.Queue.Slots
		for name, t := range st.Queue.Tiers {
			if !t.Retired {
				b[name] += t.Bound
			}
		}
	}
	return slots, b, true
}

// tenantLimitsNow sums the dispatchers' tenant concurrency limits per tier.
func (d *demo) tenantLimitsNow(ctx context.Context) map[string]int {
	out := map[string]int{}
	for _, ref := range d.disps {
		var p policy.Policy
		if err := d.obs.getJSON(ctx, ref, "/v1/policy", &p); err != nil {
			return nil
		}
		for _, t := range p.Tiers {
			out[t.Name] += t.TenantConcurrencyLimit
		}
	}
	return out
}

func (d *demo) tierStatusMatches(ctx context.Context, want map[string]int) bool {
	var tiers v1alpha1.ServiceTierList
	if err := d.k.c.List(ctx, &tiers, client.InNamespace(d.pool.Namespace)); err != nil {
		return false
	}
	for _, t := range tiers.Items {
		if int(t.Status.QueueBound) != want[t.Name] {
			return false
		}
	}
	return len(tiers.Items) > 0
}

// scaleEvents copies the events (follow goroutines write them).
func (d *demo) scaleEvents() []scaleEvent {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]scaleEvent, len(d.events))
	for i, e := range d.events {
		out[i] = *e
	}
	return out
}

// awaitRequests waits, for at most 15s, until the cancelled requests of a
// phase (what names it in the log; "" for the main one) have ended.
func (d *demo) awaitRequests(genDone <-chan struct{}, what string) {
	select {
	case <-genDone:
	case <-time.After(15 * time.Second):
		d.ui.logf("some requests%s did not end 15s after they were cancelled", what)
	}
}

// awaitIdle waits, while fctx lasts, until the dispatchers have seen every
// client go, so the final counters are taken from idle dispatchers.
func awaitIdle(fctx context.Context, o *observer) {
	for s := o.scrape(fctx); s.OK && (s.Queued > 0 || s.InFlight > 0) && fctx.Err() == nil; s = o.scrape(fctx) {
		time.Sleep(100 * time.Millisecond)
	}
}
