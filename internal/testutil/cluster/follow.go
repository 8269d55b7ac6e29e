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
)

// PodState is what a pod's address does, as its model server would: it
// serves once the pod is Ready (the server listens once its weights are
// loaded), stops accepting once the pod's deletion begins (SIGTERM, with
// no preStop hook) and is closed when the pod is not Ready otherwise
// (still starting, or crashed) or gone.
func PodState(p *corev1.Pod) State {
	switch {
	case p.DeletionTimestamp != nil:
		return Draining
	case p.Status.Phase == corev1.PodRunning && podIsReady(p):
		return Serving
	default:
		return Closed
	}
}

// follower keeps a Network's states in step with the pods holding its
// addresses.
type follower struct {
	n *Network

	mu    sync.Mutex
	owner map[string]types.UID // address -> the pod that holds it
}

// observe applies p's state to its addresses in the Network.
func (f *follower) observe(p *corev1.Pod) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, ip := range podIPs(p) {
		if !f.n.Contains(ip) {
			continue
		}
		f.owner[ip] = p.UID
		_ = f.n.SetState(ip, PodState(p)) // a Contained address
	}
}

// gone closes p's addresses unless another pod holds them by now (kwok
// hands a removed pod's address out again).
func (f *follower) gone(p *corev1.Pod) {
	f.mu.Lock()
	defer f.mu.Unlock()
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
	f := &follower{n: n, owner: map[string]types.UID{}}
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
