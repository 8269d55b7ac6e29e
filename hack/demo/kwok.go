package main

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterutil "github.com/tiergate/tiergate/internal/testutil/cluster"
)

// The rest of the cluster around the API server (internal/testutil/cluster):
// kube-controller-manager and kube-scheduler turn the applied Deployments
// into pods bound to kwok's fake Nodes; kwok starts them on addresses of
// the demo's /24 and makes them Ready a cold start later; a Network
// listens on each Ready model pod's address and relays to one simserver.
// Dispatcher processes run on the addresses kwok gave the dispatcher pods.

const (
	// mainColdStart is how long a started pod takes to be Ready in the
	// main load and the fairness phase (the Stage's delay).
	mainColdStart = 3 * time.Second
	// kwokNodes is how many fake Nodes the scheduler spreads pods over.
	kwokNodes = 3
	// dispatcherApp is the dispatcher pods' label (config/dispatcher).
	dispatcherApp = "tiergate-dispatcher"
)

// stageCRD is kwok's Stage CRD, which `hack/tools.sh kwok` installs.
func stageCRD(root string) string {
	return filepath.Join(root, "bin", "kwok", "kwok.x-k8s.io_stages.yaml")
}

// terminationDelay is how long a deleted model pod stays listed: its
// preStop sleep, then the generations it still runs (none outlives the
// pool's clientTimeout), within the pod's grace period, after which a
// kubelet would kill it.
func terminationDelay(p *poolInfo) time.Duration {
	d := p.PreStop + p.ClientTimeout
	if p.GracePeriod > 0 {
		d = min(d, p.GracePeriod)
	}
	return max(d, time.Second)
}

// startKwok starts the simserver, the components and the pod network.
func (d *demo) startKwok(ctx context.Context) error {
	p := d.pool
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	d.simAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	// One process serves every model pod: as many generations at once as
	// the whole pool, so the dispatchers' slots, not the simserver, bound
	// what each pod address carries (the Network counts that per address).
	simConcurrency := int(p.Replicas) * p.PerReplica
	if _, err := d.sup.start("simserver", d.bin("simserver"), "--listen", d.simAddr, "--concurrency", strconv.Itoa(simConcurrency),
		"--service-time", d.cfg.ServiceTime, "--seed", strconv.FormatUint(d.cfg.Seed, 10)); err != nil {
		return err
	}
	if err := d.waitHTTP(ctx, "simserver", "http://"+d.simAddr+"/health"); err != nil {
		return err
	}
	cidr := d.subnet + ".0/24"
	d.stages = clusterutil.StageOptions{ColdStart: mainColdStart, TerminationDelay: terminationDelay(p)}
	d.ui.logf("starting kube-controller-manager, kube-scheduler and kwok (%d fake Nodes, pod CIDR %s, pods Ready %s after they start, removed %s after their deletion begins)",
		kwokNodes, cidr, d.stages.ColdStart, d.stages.TerminationDelay)
	kc, err := clusterutil.Start(ctx, d.k.env, d.k.cfg, clusterutil.Options{
		Assets: d.cfg.K8sBin, StageCRD: stageCRD(d.cfg.Root), Dir: filepath.Join(d.work, "cluster"),
		Nodes: kwokNodes, PodCIDR: cidr, Stages: d.stages,
	})
	if err != nil {
		return fmt.Errorf("starting the cluster's components: %w", err)
	}
	d.kc = kc
	for _, c := range kc.Components() {
		d.sup.adopt(c.Name, c.Pid())
	}
	if d.components, err = kc.Describe(ctx); err != nil {
		return err
	}
	for _, c := range d.components {
		d.ui.logf("  %s (%s, pid %d): %s", c.Name, c.Version, c.Pid, relPaths([]string{c.Binary}, d.cfg.Root)[0])
	}
	d.ui.logf("  kube-controller-manager runs %s", strings.Join(kc.Controllers(), ", "))
	if d.net, err = kc.Network(ctx, p.ModelPort, d.simAddr); err != nil {
		return err
	}
	d.ui.logf("the pod network listens on each Ready model pod's address at port %d and relays to the simserver on %s (--concurrency %d, a stand-in for vLLM)",
		d.net.Port(), d.simAddr, simConcurrency)
	return nil
}

// stopKwok stops the network and the components (SIGTERM, then SIGKILL).
func (d *demo) stopKwok() error {
	if d.kc == nil {
		return nil
	}
	return d.kc.Stop()
}

// startDispatchers waits until kwok gave the dispatcher pods addresses
// and runs a `tiergate dispatcher` process on each. kwok, which plays no
// probes, makes the pods Ready; the controller pushes to them meanwhile.
func (d *demo) startDispatchers(ctx context.Context) error {
	pods, err := d.awaitPods(ctx, map[string]string{"app.kubernetes.io/name": dispatcherApp}, dispatchers, 60*time.Second)
	if err != nil {
		return err
	}
	tokenFile := filepath.Join(d.work, "push-token")
	for i, pod := range pods {
		ip := pod.Status.PodIP
		ref := dispatcherRef{Name: pod.Name, Admin: net.JoinHostPort(ip, strconv.Itoa(d.pool.AdminPort)), Data: net.JoinHostPort(ip, strconv.Itoa(dataPort))}
		if _, err := d.sup.start(fmt.Sprintf("tiergate-dispatcher-%d", i), d.bin("tiergate"), "dispatcher", "--listen", ref.Data, "--admin-listen", ref.Admin,
			"--admin-token-file", tokenFile, "--drain-timeout", "5s", "--log-format", "text"); err != nil {
			return err
		}
		d.disps = append(d.disps, ref)
	}
	for _, ref := range d.disps {
		if err := d.waitHTTP(ctx, ref.Name, "http://"+ref.Admin+"/healthz"); err != nil {
			return err
		}
	}
	d.ui.logf("%d dispatchers (tiergate dispatcher) run on their pods' addresses: %s (data %s, admin %s), ...", len(d.disps), d.disps[0].Name, d.disps[0].Data, d.disps[0].Admin)
	return nil
}

// awaitPods waits until n pods with labels have addresses, and returns
// them sorted by name.
func (d *demo) awaitPods(ctx context.Context, labels map[string]string, n int, timeout time.Duration) ([]corev1.Pod, error) {
	deadline := time.Now().Add(timeout)
	for {
		var list corev1.PodList
		err := d.k.c.List(ctx, &list, client.InNamespace(d.pool.Namespace), client.MatchingLabels(labels))
		var out []corev1.Pod
		for _, p := range list.Items {
			if p.Status.PodIP != "" && p.DeletionTimestamp == nil {
				out = append(out, p)
			}
		}
		if err == nil && len(out) == n {
			sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
			return out, nil
		}
		if err := d.checkChildren(); err != nil {
			return nil, err
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d of %d pods %v had addresses after %s (list error %v); see the cluster's logs in %s", len(out), n, labels, timeout, err, filepath.Join(d.cfg.Report, "logs"))
		}
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// scaleDeployment writes the model Deployment's spec.replicas through its
// scale subresource, as an autoscaler does, and returns the command.
func (d *demo) scaleDeployment(ctx context.Context, replicas int32) (string, error) {
	args := []string{"-n", d.pool.Namespace, "scale", "deployment", d.pool.Deployment, "--replicas=" + strconv.Itoa(int(replicas))}
	_, err := d.k.kubectl(ctx, args...)
	return "kubectl " + strings.Join(args, " "), err
}

// deployment is the model Deployment now.
func (d *demo) deployment(ctx context.Context) (*appsv1.Deployment, error) {
	var dep appsv1.Deployment
	err := d.k.c.Get(ctx, types.NamespacedName{Namespace: d.pool.Namespace, Name: d.pool.Deployment}, &dep)
	return &dep, err
}

// readyNow is the Deployment's status.readyReplicas and spec.replicas,
// for the live table (the last values read when the API is slow).
func (d *demo) readyNow() (ready, replicas int32) {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	dep, err := d.deployment(ctx)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err == nil && dep.Spec.Replicas != nil {
		d.lastReady, d.lastSpec = dep.Status.ReadyReplicas, *dep.Spec.Replicas
	}
	return d.lastReady, d.lastSpec
}

// modelPods are the model Deployment's pods now.
func (d *demo) modelPods(ctx context.Context) ([]corev1.Pod, error) {
	var list corev1.PodList
	if err := d.k.c.List(ctx, &list, client.InNamespace(d.pool.Namespace), client.MatchingLabels(d.pool.ModelLabels)); err != nil {
		return nil, err
	}
	d.notePods(list.Items)
	return list.Items, nil
}
