package controller

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policy "github.com/tiergate/tiergate/api/policy/v1"
	"github.com/tiergate/tiergate/internal/testutil"
	"github.com/tiergate/tiergate/internal/testutil/cluster"
)

// Labels of the two Deployments' pods.
const (
	modelLabel      = "llm"
	dispatcherLabel = "tiergate-dispatcher"
)

// startCluster starts kube-controller-manager, kube-scheduler and kwok
// (one fake Node) around the API server, the default model server and the
// pod network relaying the model pods' addresses to it.
func startCluster(cfg *rest.Config, assets string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	started := time.Now()
	var err error
	if kc, err = cluster.Start(ctx, testEnv, cfg, cluster.Options{
		Assets:   assets,
		StageCRD: filepath.Join(repoRoot, "bin", "kwok", "kwok.x-k8s.io_stages.yaml"),
		Dir:      filepath.Join(tmpDir, "cluster"),
		Stages:   suiteStages,
	}); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "test/controller: controller manager, scheduler, kwok and a Ready Node up in %s (pod CIDR %s)\n",
		time.Since(started).Round(time.Millisecond), kc.PodCIDR)
	if clientset, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	addr, err := startModelServer(nil, "--concurrency", "64", "--service-time", "const:20ms")
	if err != nil {
		return err
	}
	if podNet, err = kc.Network(ctx, 0, addr); err != nil {
		return err
	}
	return applyProbeStages(ctx)
}

// startModelServer starts a simserver on a free 127.0.0.1 port with args;
// with t, its Cleanup stops it, else it becomes the suite's sim.
func startModelServer(t *testing.T, args ...string) (string, error) {
	ports, err := testutil.FreePorts("127.0.0.1", 1)
	if err != nil {
		return "", err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	cmd := exec.Command(bins.Simserver, append([]string{"--listen", addr}, args...)...)
	var p *testutil.Process
	if t != nil {
		p = testutil.StartT(t, cmd, procOpts("simserver "+addr))
	} else if p, err = testutil.Start(cmd); err != nil {
		return "", err
	} else {
		sim = p
	}
	return addr, testutil.Poll(20*time.Second, func() error {
		if p.Exited() {
			return fmt.Errorf("simserver exited: %v\n%s", p.Err(), p.Output())
		}
		resp, err := http.Get("http://" + addr + "/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		return nil
	})
}

// serveModels puts a model server of its own (simserver with args) behind
// e's model pods: a pod network on a port of its own, which this test's
// samples then name. Call it before applySamples.
func (e *env) serveModels(args ...string) {
	e.t.Helper()
	if e.applied {
		e.t.Fatal("serveModels after applySamples: the samples name the model port")
	}
	addr, err := startModelServer(e.t, args...)
	if err != nil {
		e.t.Fatal(err)
	}
	n, err := cluster.ListenCIDR(kc.PodCIDR, 0, addr)
	if err != nil {
		e.t.Fatal(err)
	}
	stop, err := cluster.FollowPods(context.Background(), clientset, n)
	if err != nil {
		e.t.Fatal(errors.Join(err, n.Close()))
	}
	e.t.Cleanup(func() {
		stop()
		if err := n.Close(); err != nil {
			e.t.Errorf("closing the pod network: %v", err)
		}
	})
	e.modelPort = n.Port()
}

// podAddrs are the host addresses of the pod CIDR (a /24): a dispatcher
// pod may get any of them.
func podAddrs() []string {
	var out []string
	base := podNet.Prefix().Addr().As4()
	for host := 1; host < 255; host++ {
		base[3] = byte(host)
		out = append(out, net.IP(base[:]).String())
	}
	return out
}

// pods are the pods of ns with the app.kubernetes.io/name label app.
func (e *env) pods(app string) []corev1.Pod {
	e.t.Helper()
	var list corev1.PodList
	if err := k8s.List(context.Background(), &list, client.InNamespace(e.ns), client.MatchingLabels{"app.kubernetes.io/name": app}); err != nil {
		e.t.Fatal(err)
	}
	return list.Items
}

func isReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func describePods(pods []corev1.Pod) string {
	var out []string
	for _, p := range pods {
		out = append(out, fmt.Sprintf("%s ip=%q ready=%v terminating=%v", p.Name, p.Status.PodIP, isReady(&p), p.DeletionTimestamp != nil))
	}
	return "[" + strings.Join(out, "; ") + "]"
}

// scale plays the autoscaler as an HPA would: it writes n to the model
// Deployment's scale subresource (what `kubectl scale` writes; a client
// call spares a kubectl process per step), then it waits until n of its pods are Ready and not
// terminating and the Deployment's status (the Deployment controller's)
// reports n ready replicas (e.readyAt notes when it was first seen to). It
// returns those pods' backend addresses, as kwok gave them, sorted.
func (e *env) scale(n int) []policy.Backend {
	e.t.Helper()
	ctx := context.Background()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		sc, err := clientset.AppsV1().Deployments(e.ns).GetScale(ctx, "llm", metav1.GetOptions{})
		if err != nil {
			return err
		}
		sc.Spec.Replicas = int32(n)
		_, err = clientset.AppsV1().Deployments(e.ns).UpdateScale(ctx, "llm", sc, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		e.t.Fatalf("scaling deployment/llm to %d: %v", n, err)
	}
	var out []policy.Backend
	e.readyAt = time.Time{}
	testutil.Eventually(e.t, 30*time.Second, fmt.Sprintf("%d Ready model pods and the Deployment's readyReplicas %d", n, n), func() error {
		var d appsv1.Deployment
		if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: e.ns, Name: "llm"}, &d); err != nil {
			return err
		}
		pods := e.pods(modelLabel)
		out = out[:0]
		for i := range pods {
			if pods[i].DeletionTimestamp == nil && isReady(&pods[i]) {
				out = append(out, policy.Backend{Address: net.JoinHostPort(pods[i].Status.PodIP, strconv.Itoa(e.modelPort)), Scheme: "http"})
			}
		}
		s := d.Status
		if int(s.ReadyReplicas) == n && s.ObservedGeneration >= d.Generation && e.readyAt.IsZero() {
			e.readyAt = time.Now()
		}
		if len(out) != n || int(s.ReadyReplicas) != n || int(s.Replicas) != n || s.ObservedGeneration < d.Generation {
			return fmt.Errorf("deployment status %+v; pods %s", s, describePods(pods))
		}
		return nil
	})
	slices.SortFunc(out, func(a, b policy.Backend) int { return strings.Compare(a.Address, b.Address) })
	return out
}

// dispatcherYAML is config/dispatcher as kustomize renders it, once.
var dispatcherYAML struct {
	once sync.Once
	out  string
	err  error
}

// dispatcherManifest is config/dispatcher as kustomize renders it, with n
// replicas; in a probed env (see probe_test.go) its pods' cold start is an
// hour, so kwok leaves their readiness to the probe loop.
func (e *env) dispatcherManifest(n int) string {
	e.t.Helper()
	dispatcherYAML.once.Do(func() {
		r := kubectl.Run("kustomize", filepath.Join(repoRoot, "config", "dispatcher"))
		dispatcherYAML.out, dispatcherYAML.err = r.Stdout, r.Err
		if r.Err != nil {
			dispatcherYAML.err = fmt.Errorf("%s", r)
		}
	})
	if dispatcherYAML.err != nil {
		e.t.Fatal(dispatcherYAML.err)
	}
	out := dispatcherYAML.out
	out = replaceOnce(e.t, out, "  replicas: 2\n", fmt.Sprintf("  replicas: %d\n", n))
	if e.kubelet != nil {
		out = replaceOnce(e.t, out, "  template:\n    metadata:\n      labels:\n",
			"  template:\n    metadata:\n      annotations:\n        "+cluster.ColdStartAnnotation+": 1h\n      labels:\n")
	}
	return out
}

// dispatcherPods creates config/dispatcher's objects (rendered once by
// kubectl kustomize; created with the client, which spares a kubectl
// process per test) with n replicas and returns the pods once each has the
// address kwok gave it; no process runs on them yet.
func (e *env) dispatcherPods(n int) []*dispatcher {
	e.t.Helper()
	dec := yaml.NewYAMLOrJSONDecoder(strings.NewReader(e.dispatcherManifest(n)), 4096)
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			e.t.Fatalf("config/dispatcher: %v", err)
		}
		if len(u.Object) == 0 {
			continue
		}
		u.SetNamespace(e.ns)
		if err := k8s.Create(context.Background(), u); err != nil {
			e.t.Fatalf("creating %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
	return e.newDispatcherPods(n)
}

// scaleDispatchers scales the dispatcher Deployment to n and returns the
// pods it added.
func (e *env) scaleDispatchers(n int) []*dispatcher {
	e.t.Helper()
	kubectl.Must(e.t, "scale", "-n", e.ns, "deployment/tiergate-dispatcher", "--replicas="+strconv.Itoa(n))
	return e.newDispatcherPods(n)
}

// newDispatcherPods waits until n dispatcher pods that are not terminating
// have addresses, and returns those e has not seen yet in the order the
// controller hands out slots: newest first, then by name.
func (e *env) newDispatcherPods(n int) []*dispatcher {
	e.t.Helper()
	var fresh []*dispatcher
	created := map[string]metav1.Time{}
	testutil.Eventually(e.t, 30*time.Second, fmt.Sprintf("%d dispatcher pods with addresses", n), func() error {
		pods := e.pods(dispatcherLabel)
		fresh = fresh[:0]
		live := 0
		for _, p := range pods {
			if p.DeletionTimestamp != nil {
				continue
			}
			if p.Status.PodIP == "" {
				return fmt.Errorf("%s has no address yet: %s", p.Name, describePods(pods))
			}
			live++
			if !e.seen[p.Name] {
				fresh = append(fresh, &dispatcher{pod: p.Name, ip: p.Status.PodIP})
				created[p.Name] = p.CreationTimestamp
			}
		}
		if live != n {
			return fmt.Errorf("%d live dispatcher pods, want %d: %s", live, n, describePods(pods))
		}
		return nil
	})
	slices.SortFunc(fresh, func(a, b *dispatcher) int {
		if c := created[b.pod].Compare(created[a.pod].Time); c != 0 {
			return c
		}
		return strings.Compare(a.pod, b.pod)
	})
	for _, d := range fresh {
		e.seen[d.pod] = true
	}
	return fresh
}

// startDispatchers applies config/dispatcher with n replicas and runs a
// dispatcher process with the push token on each pod's address (probed
// by the probe loop in a probed env).
func (e *env) startDispatchers(n int) []*dispatcher {
	e.t.Helper()
	ds := e.dispatcherPods(n)
	for _, d := range ds {
		e.adopt(d, bins.Tiergate, pushToken)
		if e.kubelet != nil {
			e.probe(d)
		}
	}
	return ds
}

// adopt runs bin as d's dispatcher process with tokenFile and counts it
// among e's dispatchers.
func (e *env) adopt(d *dispatcher, bin, tokenFile string) *dispatcher {
	e.t.Helper()
	d.run(e, bin, tokenFile)
	e.disp = append(e.disp, d)
	return d
}

// removeDispatcherPod scales the dispatcher Deployment down to n, with d's
// pod the one the ReplicaSet controller deletes (the lowest
// pod-deletion-cost goes first), and waits until it is gone.
func (e *env) removeDispatcherPod(d *dispatcher, n int) {
	e.t.Helper()
	kubectl.Must(e.t, "annotate", "-n", e.ns, "pod", d.pod, "controller.kubernetes.io/pod-deletion-cost=-1000")
	kubectl.Must(e.t, "scale", "-n", e.ns, "deployment/tiergate-dispatcher", "--replicas="+strconv.Itoa(n))
	testutil.Eventually(e.t, 30*time.Second, d.pod+" deleted by the ReplicaSet controller", func() error {
		var p corev1.Pod
		err := k8s.Get(context.Background(), types.NamespacedName{Namespace: e.ns, Name: d.pod}, &p)
		if client.IgnoreNotFound(err) != nil {
			return err
		}
		if err == nil && p.DeletionTimestamp == nil {
			return fmt.Errorf("%s not deleted: %s", d.pod, describePods(e.pods(dispatcherLabel)))
		}
		return nil
	})
}
