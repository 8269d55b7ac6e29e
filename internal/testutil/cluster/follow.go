package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
)

// PodState is what a pod's address does, as its model server would: it
// serves while the pod runs, stops accepting once the pod's deletion
// begins (SIGTERM; see follower for a preStop hook, which puts the SIGTERM
// off) and is closed when the pod does not run (pending, finished, gone).
// A pod with ChaosLabel has crashed: closed, though it may be listed
// Ready for CrashDetection still. A real server listens before its pod is
// Ready (its readiness probe passes only then), and the dispatchers send
// nothing to a pod that is not Ready; serving only once this package's
// own informer saw Ready lost the race with the controller's push by a
// few milliseconds, and a dispatcher's first dial was refused.
func PodState(p *corev1.Pod) State {
	switch {
	case p.DeletionTimestamp != nil:
		return Draining
	default:
		return liveState(p)
	}
}

// liveState is PodState of a pod whose server has not been sent SIGTERM.
func liveState(p *corev1.Pod) State {
	if _, crashed := p.Labels[ChaosLabel]; crashed {
		return Closed
	}
	if p.Status.Phase == corev1.PodRunning {
		return Serving
	}
	return Closed
}

// PreStopSleep is the longest preStop sleep action of p's containers: how
// long the kubelet waits after the deletion began before it sends the
// containers SIGTERM. kwok runs no hooks, so the follower plays this one.
// Only the sleep action is read; an exec or httpGet hook counts as none.
func PreStopSleep(p *corev1.Pod) time.Duration {
	var d time.Duration
	for _, c := range p.Spec.Containers {
		if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
			d = max(d, time.Duration(c.Lifecycle.PreStop.Sleep.Seconds)*time.Second)
		}
	}
	return d
}

// follower keeps a Network's states in step with the pods holding its
// addresses. A terminating pod with a preStop sleep keeps the state it had
// (serving, if it was Ready) until the sleep has passed since the follower
// first saw its deletion, then drains, as the kubelet sends SIGTERM only
// after the hook.
type follower struct {
	n     *Network
	clock clock.WithDelayedExecution

	mu    sync.Mutex
	owner map[string]types.UID // address -> the pod that holds it
	// hooks are the preStop sleeps running, by pod; sigterm are the pods
	// whose sleep has ended (or that had none) once their deletion began.
	hooks   map[types.UID]clock.Timer
	sigterm map[types.UID]bool
}

func newFollower(n *Network, c clock.WithDelayedExecution) *follower {
	return &follower{n: n, clock: c, owner: map[string]types.UID{},
		hooks: map[types.UID]clock.Timer{}, sigterm: map[types.UID]bool{}}
}

// observe applies p's state to its addresses in the Network.
func (f *follower) observe(p *corev1.Pod) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.stateLocked(p)
	for _, ip := range podIPs(p) {
		if !f.n.Contains(ip) {
			continue
		}
		f.owner[ip] = p.UID
		// A Contained address; a port another socket took makes the pod
		// unreachable, which the tests relying on it then see.
		_ = f.n.SetState(ip, st)
	}
}

// stateLocked is PodState, but for a terminating pod whose preStop sleep
// still runs: that one is as it was before its deletion began.
func (f *follower) stateLocked(p *corev1.Pod) State {
	if p.DeletionTimestamp == nil || f.sigterm[p.UID] {
		return PodState(p)
	}
	if _, running := f.hooks[p.UID]; running {
		return liveState(p)
	}
	d := PreStopSleep(p)
	if d <= 0 {
		f.sigterm[p.UID] = true
		return Draining
	}
	uid := p.UID
	f.hooks[uid] = f.clock.AfterFunc(d, func() { f.hookDone(uid) })
	return liveState(p)
}

// hookDone drains the addresses uid still holds: its preStop sleep ended.
func (f *follower) hookDone(uid types.UID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, running := f.hooks[uid]; !running {
		return // the pod is gone already
	}
	delete(f.hooks, uid)
	f.sigterm[uid] = true
	for ip, owner := range f.owner {
		if owner == uid {
			_ = f.n.SetState(ip, Draining)
		}
	}
}

// gone closes p's addresses unless another pod holds them by now (kwok
// hands a removed pod's address out again).
func (f *follower) gone(p *corev1.Pod) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t, ok := f.hooks[p.UID]; ok {
		t.Stop()
		delete(f.hooks, p.UID)
	}
	delete(f.sigterm, p.UID)
	for _, ip := range podIPs(p) {
		if !f.n.Contains(ip) || f.owner[ip] != p.UID {
			continue
		}
		delete(f.owner, ip)
		_ = f.n.SetState(ip, Closed)
	}
}

func podIPs(p *corev1.Pod) []string {
	var out []string
	for _, ip := range p.Status.PodIPs {
		out = append(out, ip.IP)
	}
	if len(out) == 0 && p.Status.PodIP != "" {
		out = append(out, p.Status.PodIP)
	}
	return out
}

// followedNetwork is a Network and the informer that drives it.
type followedNetwork struct {
	*Network
	stop func()
}

func (fn *followedNetwork) close() error {
	fn.stop()
	return fn.Close()
}

// FollowPods keeps n's states in step with the pods of cs (every
// namespace) until ctx ends: each pod address is PodState of the pod
// holding it, Closed when none does. It returns once the informer has
// synced; the returned stop function ends it and waits.
func FollowPods(ctx context.Context, cs kubernetes.Interface, n *Network) (stop func(), err error) {
	ctx, cancel := context.WithCancel(ctx)
	factory := informers.NewSharedInformerFactory(cs, 0)
	inf := factory.Core().V1().Pods().Informer()
	f := newFollower(n, clock.RealClock{})
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { observeObj(f, obj) },
		UpdateFunc: func(_, obj any) { observeObj(f, obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				f.gone(p)
			}
		},
	}); err != nil {
		cancel()
		return nil, err
	}
	factory.Start(ctx.Done())
	syncCtx, syncCancel := context.WithTimeout(ctx, 30*time.Second)
	defer syncCancel()
	if !cache.WaitForCacheSync(syncCtx.Done(), inf.HasSynced) {
		cancel()
		factory.Shutdown()
		return nil, errors.Join(errors.New("the pod informer did not sync"), syncCtx.Err())
	}
	return func() { cancel(); factory.Shutdown() }, nil
}

func observeObj(f *follower, obj any) {
	if p, ok := obj.(*corev1.Pod); ok {
		f.observe(p)
	}
}

// Network starts a Network on the cluster's pod CIDR at port (0: a free
// one) relaying to backend, driven by FollowPods; Stop closes it.
func (c *Cluster) Network(ctx context.Context, port int, backend string) (*Network, error) {
	n, err := ListenCIDR(c.PodCIDR, port, backend)
	if err != nil {
		return nil, err
	}
	cs, err := c.Clientset()
	if err != nil {
		return nil, errors.Join(err, n.Close())
	}
	// The Network outlives ctx (which may be a start-up deadline): Stop ends it.
	stop, err := FollowPods(context.WithoutCancel(ctx), cs, n)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("following pods: %w", err), n.Close())
	}
	c.networks = append(c.networks, &followedNetwork{Network: n, stop: stop})
	return n, nil
}
