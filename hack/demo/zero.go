package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/capacity"
)

// The scale-from-zero phase runs after the main load, on the same
// processes: the pool gets spec.coldStart and kwok's Stage the same cold
// start, a lighter load starts, `kubectl scale` takes the Deployment to 0
// replicas while it continues (the dispatchers hold what the bounds at
// zero allow and refuse the tiers that cannot wait at once), then to 1,
// as an autoscaler that saw the demand would, whose pod is Ready a cold
// start later, and then to all of them.

// zeroColdStart is the pool's spec.coldStart in the phase: longer than
// premium's tolerable wait (5s), so premium is refused at zero, and
// shorter than standard's (20s), so standard and free are held.
const zeroColdStart = 8 * time.Second

// zeroReaction is how long after scaling to 0 the demo's autoscaler
// scales to 1 (KEDA reacting to the held requests).
const zeroReaction = 500 * time.Millisecond

// zeroSchedule is when the phase's events happen, relative to its start.
type zeroSchedule struct {
	ZeroAt  time.Duration // spec.replicas 6 → 0
	UpAt    time.Duration // 0 → 1
	FirstAt time.Duration // the first replica is due Ready, a cold start later
	BackAt  time.Duration // 1 → 6
	Load    time.Duration // load is offered in [0, Load)
	Grace   time.Duration // then outstanding requests get this long
}

// newZeroSchedule sizes the phase to the demo's duration: about 28s of
// load for the short demo, 59s for the 3-minute one; the cold start is
// fixed, and the load lasts until the last pods are Ready and then some.
func newZeroSchedule(main time.Duration) zeroSchedule {
	clampD := func(d, lo, hi time.Duration) time.Duration { return min(max(d, lo), hi) }
	z := zeroSchedule{ZeroAt: clampD(main/12, 3*time.Second, 15*time.Second)}
	z.UpAt = z.ZeroAt + zeroReaction
	z.FirstAt = z.UpAt + zeroColdStart
	z.BackAt = z.FirstAt + clampD(main/15, 4*time.Second, 12*time.Second)
	z.Load = z.BackAt + zeroColdStart + clampD(main/12, 4*time.Second, 15*time.Second)
	z.Grace = 15 * time.Second
	return z
}

// zeroPlan is the phase's load: about 3.1 req/s, well within six
// replicas (4/s) and far beyond one (2/3 per second), so the pool at zero
// has something to hold and the first replica alone a queue to drain.
func zeroPlan() []streamPlan {
	var free []string
	for i := 1; i <= 30; i++ {
		free = append(free, fmt.Sprintf("zero-free-%02d", i))
	}
	return []streamPlan{
		{Name: "acme", Steady: true, Role: "premium tenant, 1 req/s", Tier: "premium", Tenants: []string{"acme"}, Rate: 1, MaxOut: 20, To: 1},
		{Name: "globex", Steady: true, Role: "standard tenant, 0.3 req/s", Tier: "standard", Tenants: []string{"globex"}, Rate: 0.3, MaxOut: 15, To: 1},
		{Name: "hooli", Steady: true, Role: "standard tenant, 0.3 req/s", Tier: "standard", Tenants: []string{"hooli"}, Rate: 0.3, MaxOut: 15, To: 1},
		{Name: "vandelay", Steady: true, Role: "standard tenant, 0.3 req/s", Tier: "standard", Tenants: []string{"vandelay"}, Rate: 0.3, MaxOut: 15, To: 1},
		{Name: "free", Steady: true, Role: "30 free tenants without a TenantQuota, 1.2 req/s together", Tier: "free", Tenants: free, Rate: 1.2, MaxOut: 100, To: 1},
	}
}

// zeroRun is what the phase recorded.
type zeroRun struct {
	sched   zeroSchedule
	plan    []streamPlan
	rec     *recorder
	obs     *observer
	started time.Time
	ended   time.Duration
	command string // the kubectl patch that set spec.coldStart
	events  []*scaleEvent
	// atZero is the ServiceTiers while held: bound and maxWait per tier,
	// as `kubectl get servicetiers` printed them.
	atZero      map[string]v1alpha1.ServiceTierStatus
	tiersAtZero string
	desired     int32 // the highest status.desiredReplicas while held
	err         error
}

// zeroPhase runs the phase. Its errors end the demo as the main load's do.
func (d *demo) zeroPhase(ctx context.Context) error {
	z := &zeroRun{sched: newZeroSchedule(d.cfg.Duration), plan: zeroPlan()}
	d.zero = z
	if err := checkPlan(z.plan, d.pool); err != nil {
		return err
	}
	if err := d.setColdStart(ctx, z); err != nil {
		return err
	}
	stages := d.stages
	stages.ColdStart = zeroColdStart
	if err := d.kc.ApplyStages(ctx, stages); err != nil {
		return err
	}
	d.ui.logf("kwok's Stage now makes pods Ready %s after they start", zeroColdStart)
	z.started = time.Now()
	z.rec = newRecorder(z.started, d.cfg.MaxRequests)
	z.obs = newObserver(d.disps, d.token)
	z.obs.setStart(z.started)
	gen := &loadGen{
		plan: z.plan, sched: schedule{Load: z.sched.Load}, rec: z.rec, header: d.pool.TenantHeader, seed: d.cfg.Seed + 1000,
		client:  &http.Client{Transport: &serviceTransport{base: newTransport(), targets: d.dataTargets()}},
		timeout: 2 * time.Minute,
	}
	issueCtx, stopIssue := context.WithDeadline(ctx, z.started.Add(z.sched.Load))
	defer stopIssue()
	reqCtx, cancelReqs := context.WithCancel(ctx)
	defer cancelReqs()
	genDone := make(chan struct{})
	go func() { defer close(genDone); gen.run(issueCtx, reqCtx) }()
	obsCtx, stopObs := context.WithCancel(context.WithoutCancel(ctx))
	obsDone := make(chan struct{})
	go func() { defer close(obsDone); z.obs.run(obsCtx, d.cfg.Refresh) }()

	d.ui.logf("scale-from-zero phase: load for %s; kubectl scale to 0 replicas at %s, to 1 at %s (Ready about %s, the cold start of %s later), to %d at %s",
		z.sched.Load, clock(z.sched.ZeroAt), clock(z.sched.UpAt), clock(z.sched.FirstAt), zeroColdStart, d.pool.Replicas, clock(z.sched.BackAt))
	d.ui.setLive(true)
	runErr := d.zeroLoop(ctx, z, genDone, cancelReqs)
	stopIssue()
	cancelReqs()
	d.awaitRequests(genDone, " of the scale-from-zero phase")
	z.ended = z.rec.since()
	stopObs()
	<-obsDone
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	awaitIdle(fctx, z.obs)
	d.ui.frame(renderTable(d.zeroView(z)))
	d.ui.setLive(false)
	d.follows.Wait()
	z.err = runErr
	return runErr
}

// zeroLoop plays the phase's schedule and redraws the table until the load
// and its grace are over.
func (d *demo) zeroLoop(ctx context.Context, z *zeroRun, genDone <-chan struct{}, cancelReqs func()) error {
	tl := timeline{rec: z.rec, obs: z.obs, events: &z.events}
	steps := []scaleStep{{At: z.sched.ZeroAt, Replicas: 0}, {At: z.sched.UpAt, Replicas: 1}, {At: z.sched.BackAt, Replicas: d.pool.Replicas}}
	tick := time.NewTicker(min(d.cfg.Refresh, 250*time.Millisecond))
	defer tick.Stop()
	lastFrame, next := time.Duration(0), 0
	for {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case p := <-d.sup.Exited():
			return fmt.Errorf("%w: %s (pid %d): %v; last log lines:\n%s", ErrExited, p.Name, p.PID, p.err, tail(p.Log, 2048))
		case <-genDone:
			return nil
		case <-tick.C:
		}
		now := z.rec.since()
		for next < len(steps) && now >= steps[next].At {
			d.scaleOn(ctx, tl, steps[next])
			next++
		}
		// Held from the scale to 0 until the first replica is Ready.
		if next >= 1 && next < len(steps) {
			d.watchHeld(ctx, z)
		}
		if now >= z.sched.Load+z.sched.Grace {
			cancelReqs()
		}
		if now-lastFrame >= d.cfg.Refresh {
			lastFrame = now
			d.ui.frame(renderTable(d.zeroView(z)))
		}
	}
}

// setColdStart patches spec.coldStart into the pool and waits until the
// controller has seen it (the Ready condition's observedGeneration). At 6
// ready replicas it changes no bound.
func (d *demo) setColdStart(ctx context.Context, z *zeroRun) error {
	patch := fmt.Sprintf(`{"spec":{"coldStart":"%s"}}`, zeroColdStart)
	args := []string{"-n", d.pool.Namespace, "patch", "modelpool", d.pool.Name, "--type=merge", "-p", patch}
	out, err := d.k.kubectl(ctx, args...)
	if err != nil {
		return err
	}
	z.command = "kubectl " + strings.Join(args[:len(args)-1], " ") + " '" + patch + "'"
	d.ui.logf("%s\n%s", z.command, indent(out))
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var p v1alpha1.ModelPool
		if err := d.k.c.Get(ctx, types.NamespacedName{Namespace: d.pool.Namespace, Name: d.pool.Name}, &p); err == nil {
			for _, c := range p.Status.Conditions {
				if c.Type == v1alpha1.ConditionReady && c.ObservedGeneration == p.Generation {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("the controller did not observe spec.coldStart within 30s")
}

// watchHeld records, while the pool is at zero, the ServiceTiers' bounds
// and maxWait at zero (once the controller states them) and the highest
// desiredReplicas.
func (d *demo) watchHeld(ctx context.Context, z *zeroRun) {
	var p v1alpha1.ModelPool
	if err := d.k.c.Get(ctx, types.NamespacedName{Namespace: d.pool.Namespace, Name: d.pool.Name}, &p); err == nil && p.Status.ReadyReplicas == 0 {
		if p.Status.DesiredReplicas > z.desired {
			d.ui.event(z.rec.since(), "status.desiredReplicas %d→%d from the dispatchers' acks (offered load and held requests)", z.desired, p.Status.DesiredReplicas)
			z.desired = p.Status.DesiredReplicas
		}
	}
	if z.atZero != nil {
		return
	}
	var tiers v1alpha1.ServiceTierList
	if err := d.k.c.List(ctx, &tiers, client.InNamespace(d.pool.Namespace)); err != nil {
		return
	}
	held := map[string]v1alpha1.ServiceTierStatus{}
	for _, t := range tiers.Items {
		c := meta.FindStatusCondition(t.Status.Conditions, v1alpha1.ConditionReady)
		if c == nil || (c.Reason != string(v1alpha1.ReasonTierHeldForColdStart) && t.Status.QueueBound != 0) {
			return // not restated for zero yet
		}
		held[t.Name] = t.Status
	}
	if out, err := d.k.kubectl(ctx, "-n", d.pool.Namespace, "get", "servicetiers"); err == nil {
		z.tiersAtZero = out
	}
	z.atZero = held
	var parts []string
	for _, t := range tierOrder(z.plan) {
		st := held[t]
		if st.QueueBound == 0 {
			parts = append(parts, t+" 0 (refused at once)")
		} else if st.MaxWait != nil {
			parts = append(parts, fmt.Sprintf("%s %d (maxWait %s)", t, st.QueueBound, st.MaxWait.Duration))
		}
	}
	d.ui.event(z.rec.since(), "held for the cold start: ServiceTier bounds at zero %s", strings.Join(parts, ", "))
}

// tierStatusIsPoolWide reports whether the ServiceTiers' status shows the
// pool-wide bounds of replicas ready replicas, as capacity computes them.
// Where the dispatchers' shares do not add up to the pool-wide bound (one
// replica's 4 slots split in two floor each share), their sum cannot be
// compared with the status; this can.
func (d *demo) tierStatusIsPoolWide(ctx context.Context, replicas int32) bool {
	var pool v1alpha1.ModelPool
	if err := d.k.c.Get(ctx, types.NamespacedName{Namespace: d.pool.Namespace, Name: d.pool.Name}, &pool); err != nil {
		return false
	}
	var tiers v1alpha1.ServiceTierList
	if err := d.k.c.List(ctx, &tiers, client.InNamespace(d.pool.Namespace)); err != nil || len(tiers.Items) == 0 {
		return false
	}
	b, err := capacity.ComputeBounds(capacity.BoundsInput{Pool: &pool, ReadyReplicas: replicas, Tiers: tiers.Items})
	if err != nil {
		return false
	}
	want := map[string]int32{}
	for _, tb := range b.Tiers {
		want[tb.Name] = tb.QueueBound
	}
	for _, t := range tiers.Items {
		if w, ok := want[t.Name]; !ok || t.Status.QueueBound != w {
			return false
		}
	}
	return true
}

// holdingNow reports whether every dispatcher holds a policy that holds
// requests for a cold start.
func (d *demo) holdingNow(ctx context.Context) bool {
	for _, ref := range d.disps {
		var p policy.Policy
		if err := d.obs.getJSON(ctx, ref, "/v1/policy", &p); err != nil || !p.HoldsForColdStart() {
			return false
		}
	}
	return true
}

// dataTargets are the dispatchers' data addresses, the Service's
// endpoints.
func (d *demo) dataTargets() []string {
	targets := make([]string, len(d.disps))
	for i, r := range d.disps {
		targets[i] = r.Data
	}
	return targets
}

// zeroView is the live table during the phase.
func (d *demo) zeroView(z *zeroRun) tableView {
	s, ok := z.obs.latest()
	ready, spec := d.readyNow()
	return tableView{
		Now: z.rec.since(), Load: z.sched.Load, Grace: z.sched.Grace, Phase: "scale from zero",
		Pool: d.pool.Namespace + "/" + d.pool.Name, Ready: ready, Replicas: spec, PerReplica: d.pool.PerReplica,
		Sample: s, HaveSample: ok, Tiers: tierOrder(z.plan), Live: z.rec.live(waitWindow), Dispatchers: len(d.disps),
		Events: d.ui.lastEvents(8), ServiceTime: d.cfg.ServiceTime, WaitWindow: waitWindow,
	}
}
