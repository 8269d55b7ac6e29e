package clusterscale

import (
	"context"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// point is a count seen by a watch, and when.
type point struct {
	at time.Time
	n  int
}

// series are the values of a count in the order a watch saw them change.
type series struct {
	mu  sync.Mutex
	pts []point
}

func (s *series) add(at time.Time, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pts) == 0 || s.pts[len(s.pts)-1].n != n {
		s.pts = append(s.pts, point{at: at, n: n})
	}
}

// reached is the first time at or after since the count was n (since
// itself when it was n then), and whether it is n now.
func (s *series) reached(since time.Time, n int) (at time.Time, ok, now bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pts) == 0 {
		return time.Time{}, false, false
	}
	now = s.pts[len(s.pts)-1].n == n
	for i, p := range s.pts {
		if p.n != n {
			continue
		}
		if !p.at.Before(since) {
			return p.at, true, now
		}
		if i+1 == len(s.pts) || s.pts[i+1].at.After(since) {
			return since, true, now
		}
	}
	return time.Time{}, false, now
}

// poolWatch follows the model Deployment and its pods through informers:
// how many pods are Ready and not terminating, how many exist, and the
// Deployment's status.
type poolWatch struct {
	ready, total, deployReady series

	mu   sync.Mutex
	pods map[types.UID]bool // ready and not terminating
	stop context.CancelFunc
}

// watchPool starts the informers of ns's pods labelled app and its
// Deployment named app, and waits until they synced.
func watchPool(t *testing.T, cs kubernetes.Interface, ns, app string) *poolWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &poolWatch{pods: map[types.UID]bool{}, stop: cancel}
	f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = "app.kubernetes.io/name=" + app }))
	pods := f.Core().V1().Pods().Informer()
	deps := f.Apps().V1().Deployments().Informer()
	if _, err := pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.pod(obj, false) },
		UpdateFunc: func(_, obj any) { w.pod(obj, false) },
		DeleteFunc: func(obj any) { w.pod(obj, true) },
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := deps.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    w.deployment,
		UpdateFunc: func(_, obj any) { w.deployment(obj) },
	}); err != nil {
		t.Fatal(err)
	}
	f.Start(ctx.Done())
	t.Cleanup(func() { cancel(); f.Shutdown() })
	if !cache.WaitForCacheSync(ctx.Done(), pods.HasSynced, deps.HasSynced) {
		t.Fatal("the pool's informers did not sync")
	}
	return w
}

func (w *poolWatch) pod(obj any, deleted bool) {
	now := time.Now()
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	w.mu.Lock()
	if deleted {
		delete(w.pods, p.UID)
	} else {
		w.pods[p.UID] = p.DeletionTimestamp == nil && podReady(p)
	}
	ready := 0
	for _, r := range w.pods {
		if r {
			ready++
		}
	}
	total := len(w.pods)
	w.mu.Unlock()
	w.ready.add(now, ready)
	w.total.add(now, total)
}

// deployment records status.readyReplicas while status.replicas (every
// pod of the Deployment, terminating ones aside) equals it too; -1 else.
func (w *poolWatch) deployment(obj any) {
	d, ok := obj.(*appsv1.Deployment)
	if !ok {
		return
	}
	n := -1
	if d.Status.Replicas == d.Status.ReadyReplicas && d.Status.ObservedGeneration >= d.Generation {
		n = int(d.Status.ReadyReplicas)
	}
	w.deployReady.add(time.Now(), n)
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// rssPeak samples a process's resident set every period and keeps the
// highest since the last take.
type rssPeak struct {
	mu   sync.Mutex
	peak int64
	done chan struct{}
	wg   sync.WaitGroup
}

func sampleRSS(t *testing.T, pid int, period time.Duration) *rssPeak {
	r := &rssPeak{done: make(chan struct{})}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			if s, err := ReadProc(pid); err == nil {
				r.mu.Lock()
				r.peak = max(r.peak, s.RSS)
				r.mu.Unlock()
			}
			select {
			case <-r.done:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { close(r.done); r.wg.Wait() })
	return r
}

// take is the peak since the last take, and starts a new one.
func (r *rssPeak) take() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.peak
	r.peak = 0
	return p
}
