package main

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/dispatcher"
)

// scaleEvent is one write of the model Deployment's spec.replicas and
// what the controllers, the dispatchers and the tiergate controller made
// of it.
type scaleEvent struct {
	AtSeconds float64 `json:"atSeconds"`
	From      int32   `json:"from"`
	To        int32   `json:"to"`
	// Command wrote spec.replicas; SpecReplicas is what the Deployment
	// said it was right afterwards, and ReplicasOwners the field managers
	// that owned it then.
	Command        string   `json:"command"`
	SpecReplicas   int32    `json:"specReplicas"`
	ReplicasOwners []string `json:"replicasOwners"`
	// Pods are those the ReplicaSet controller deleted (scale down) or
	// created (scale up).
	Pods []string `json:"pods"`
	// ReadyAfterSeconds is when, after the command, the Deployment's
	// status showed To ready replicas (Ready tells whether it did in 30s).
	Ready                bool           `json:"ready"`
	ReadyAfterSeconds    float64        `json:"readyAfterSeconds"`
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
	ready, spec := d.readyNow()
	return tableView{
		Now: d.rec.since(), Load: d.sched.Load, Grace: d.sched.Grace,
		Pool: d.pool.Namespace + "/" + d.pool.Name, Ready: ready, Replicas: spec, PerReplica: d.pool.PerReplica,
		Sample: s, HaveSample: ok, Tiers: tierOrder(d.plan), Live: d.rec.live(waitWindow), Dispatchers: len(d.disps),
		Events: d.ui.lastEvents(8), ServiceTime: d.cfg.ServiceTime, WaitWindow: waitWindow,
	}
}

// scale plays the autoscaler: it writes the Deployment's spec.replicas.
// The ReplicaSet controller deletes or creates pods, kwok makes new ones
// Ready a cold start later, the Deployment controller counts them, and the
// dispatchers' bounds follow through the tiergate controller, which
// follow() measures.
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
		AtSeconds: at.Seconds(), From: d.replicas, To: step.Replicas,
		SlotsBefore: before.Slots, BoundsBefore: bounds(before), TenantLimitsBefore: tenantLimits(before),
	}
	var errs []string
	pods, err := d.modelPods(ctx)
	if err != nil {
		errs = append(errs, err.Error())
	}
	cmd, err := d.scaleDeployment(ctx, step.Replicas)
	if err != nil {
		errs = append(errs, err.Error())
	}
	ev.Command = cmd
	if dep, err := d.deployment(ctx); err == nil && dep.Spec.Replicas != nil {
		ev.SpecReplicas, ev.ReplicasOwners = *dep.Spec.Replicas, replicasOwners(dep.ManagedFields)
	}
	ev.Error = strings.Join(errs, "; ")
	d.ui.event(at, "scale %d→%d: %s", ev.From, ev.To, cmd)
	if ev.Error != "" {
		d.ui.event(at, "scale failed: %s", ev.Error)
	}
	d.replicas = step.Replicas
	d.mu.Lock()
	*tl.events = append(*tl.events, ev)
	d.mu.Unlock()
	d.follows.Add(1)
	go func() { defer d.follows.Done(); d.follow(ctx, tl.rec, ev, at, deletingByName(pods)) }()
	return ev
}

// follow measures how long the Deployment takes to count To ready
// replicas and the dispatchers to hold the new pool's slots, records
// their bounds then and the pods the scale changed, and waits for the
// ServiceTier status to show the same bounds.
func (d *demo) follow(ctx context.Context, rec *recorder, ev *scaleEvent, at time.Duration, before map[string]bool) {
	want := int(ev.To) * d.pool.PerReplica
	deadline := time.Now().Add(30 * time.Second)
	var after map[string]int
	slots, readyAt, followedAt := 0, time.Duration(-1), time.Duration(-1)
	for time.Now().Before(deadline) && ctx.Err() == nil && (readyAt < 0 || followedAt < 0) {
		if readyAt < 0 {
			if dep, err := d.deployment(ctx); err == nil && dep.Status.ReadyReplicas == ev.To && dep.Status.ObservedGeneration >= dep.Generation {
				readyAt = rec.since() - at
			}
		}
		if followedAt < 0 {
			var ok bool
			slots, after, ok = d.quickStats(ctx)
			// At zero the policy to wait for is the held one.
			if ok && slots == want && (ev.To > 0 || d.holdingNow(ctx)) {
				followedAt = rec.since() - at
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	limits := d.tenantLimitsNow(ctx)
	changed := d.changedPods(ctx, before, ev.To < ev.From)
	d.mu.Lock()
	ev.SlotsAfter, ev.BoundsAfter, ev.TenantLimitsAfter = slots, after, limits
	ev.Followed, ev.FollowedAfterSeconds = followedAt >= 0, followedAt.Seconds()
	ev.Ready, ev.ReadyAfterSeconds = readyAt >= 0, readyAt.Seconds()
	ev.Pods = changed
	d.mu.Unlock()
	verb := "created"
	if ev.To < ev.From {
		verb = "deleted"
	}
	d.ui.event(rec.since(), "the ReplicaSet controller %s pods %s; readyReplicas %d %.2fs after the command", verb, joinOrNone(changed), ev.To, readyAt.Seconds())
	if followedAt < 0 {
		d.ui.event(rec.since(), "the dispatchers did not reach %d slots within 30s (they hold %d)", want, slots)
		return
	}
	var changes []string
	for _, t := range tierOrder(d.plan) {
		changes = append(changes, fmt.Sprintf("%s %d→%d", t, ev.BoundsBefore[t], after[t]))
	}
	d.ui.event(rec.since(), "bounds followed %.2fs after kubectl scale: slots %d→%d; queue bounds %s", followedAt.Seconds(), ev.SlotsBefore, slots, strings.Join(changes, ", "))
	d.followStatus(ctx, ev, after, deadline)
}

// followStatus waits until the controller's status shows the same numbers
// (the pool-wide bound is the sum of the dispatchers' equal shares here).
func (d *demo) followStatus(ctx context.Context, ev *scaleEvent, after map[string]int, deadline time.Time) {
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

// changedPods are the model pods a scale deleted (those live before, by
// name to whether their deletion had begun, now terminating or gone) or
// created (those not listed before at all).
func (d *demo) changedPods(ctx context.Context, before map[string]bool, down bool) []string {
	pods, err := d.modelPods(ctx)
	if err != nil {
		return nil
	}
	now := map[string]bool{}
	var out []string
	for _, p := range pods {
		now[p.Name] = true
		deleting, listed := before[p.Name]
		switch {
		case down && listed && !deleting && p.DeletionTimestamp != nil:
			out = append(out, p.Name)
		case !down && !listed:
			out = append(out, p.Name)
		}
	}
	for n, deleting := range before {
		if down && !deleting && !now[n] {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
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
