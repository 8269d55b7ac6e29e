package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clusterutil "github.com/tiergate/tiergate/internal/testutil/cluster"
)

// What the report says of the cluster: the components that ran, the model
// pods the controllers made (who owns them, where they were bound, who
// wrote their status) and what each pod address carried.

// clusterSummary is the cluster part of summary.json.
type clusterSummary struct {
	Components  []clusterutil.ComponentInfo `json:"components"`
	Controllers []string                    `json:"controllers"`
	Nodes       []string                    `json:"nodes"`
	PodCIDR     string                      `json:"podCIDR"`
	ColdStart   float64                     `json:"coldStartSeconds"`
	Termination float64                     `json:"terminationDelaySeconds"`
	// Simserver is the one model server process every model pod address
	// relays to, and its --concurrency.
	Simserver            string `json:"simserver"`
	SimserverConcurrency int    `json:"simserverConcurrency"`
	// ReplicasOwners are the field managers that own the model
	// Deployment's spec.replicas at the end ("manager/subresource" when
	// written through one), StatusWriters those of its status.
	ReplicasOwners []string     `json:"replicasOwners"`
	StatusWriters  []string     `json:"statusWriters"`
	ModelPods      []podRecord  `json:"modelPods"`
	Addresses      []addrRecord `json:"addresses"`
}

// podRecord is one model pod as last seen.
type podRecord struct {
	Name  string `json:"name"`
	UID   string `json:"uid"`
	IP    string `json:"ip"`
	Node  string `json:"node"`
	Owner string `json:"owner"` // Kind/name of its controller
	// Created, ReadyAt and Deleting are times since the main load began
	// (negative: before it); ReadyAt and Deleting are absent when not seen.
	Created  float64  `json:"createdSeconds"`
	ReadyAt  *float64 `json:"readySeconds,omitempty"`
	Deleting *float64 `json:"deletingSeconds,omitempty"`
	// StatusWriters are the field managers of its status.
	StatusWriters []string `json:"statusWriters"`
	// SpecWriters are those of the rest (the ReplicaSet controller that
	// made it, the scheduler's binding...).
	SpecWriters []string `json:"specWriters"`
}

// addrRecord is what the pod network counted on one model pod address.
type addrRecord struct {
	IP   string   `json:"ip"`
	Pods []string `json:"pods"`
	clusterutil.AddrStats
}

// notePods keeps the latest view of each model pod.
func (d *demo) notePods(pods []corev1.Pod) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pods == nil {
		d.pods = map[string]corev1.Pod{}
	}
	for _, p := range pods {
		d.pods[string(p.UID)] = p
	}
}

// summarizeCluster is the cluster part of the summary (nil before the
// components ran).
func (d *demo) summarizeCluster(ctx context.Context) *clusterSummary {
	if d.kc == nil {
		return nil
	}
	cs := &clusterSummary{
		Components: d.components, Controllers: d.kc.Controllers(), Nodes: d.kc.Nodes, PodCIDR: d.kc.PodCIDR,
		ColdStart: d.stages.ColdStart.Seconds(), Termination: d.stages.TerminationDelay.Seconds(),
		Simserver: d.simAddr, SimserverConcurrency: int(d.pool.Replicas) * d.pool.PerReplica,
	}
	if dep, err := d.deployment(ctx); err == nil {
		cs.ReplicasOwners = replicasOwners(dep.ManagedFields)
		cs.StatusWriters = writers(dep.ManagedFields, func(s string) bool { return s == "status" })
	}
	_, _ = d.modelPods(ctx)
	d.mu.Lock()
	pods := make([]corev1.Pod, 0, len(d.pods))
	for _, p := range d.pods {
		pods = append(pods, p)
	}
	d.mu.Unlock()
	sort.Slice(pods, func(i, j int) bool { return pods[i].CreationTimestamp.Before(&pods[j].CreationTimestamp) })
	byIP := map[string][]string{}
	var ips []string
	for i := range pods {
		r := d.podRecord(&pods[i])
		cs.ModelPods = append(cs.ModelPods, r)
		if r.IP == "" {
			continue
		}
		if _, seen := byIP[r.IP]; !seen {
			ips = append(ips, r.IP)
		}
		byIP[r.IP] = append(byIP[r.IP], r.Name)
	}
	for _, ip := range ips {
		cs.Addresses = append(cs.Addresses, addrRecord{IP: ip, Pods: byIP[ip], AddrStats: d.net.Stats(ip)})
	}
	return cs
}

func (d *demo) podRecord(p *corev1.Pod) podRecord {
	since := func(t time.Time) float64 { return t.Sub(d.started).Seconds() }
	r := podRecord{Name: p.Name, UID: string(p.UID), IP: p.Status.PodIP, Node: p.Spec.NodeName, Created: since(p.CreationTimestamp.Time),
		StatusWriters: writers(p.ManagedFields, func(s string) bool { return s == "status" }),
		SpecWriters:   writers(p.ManagedFields, func(s string) bool { return s == "" })}
	if ref := metav1.GetControllerOf(p); ref != nil {
		r.Owner = ref.Kind + "/" + ref.Name
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			at := since(c.LastTransitionTime.Time)
			r.ReadyAt = &at
		}
	}
	if p.DeletionTimestamp != nil {
		at := since(p.DeletionTimestamp.Time)
		r.Deleting = &at
	}
	return r
}

// writers are the field managers of the entries whose subresource match
// accepts, sorted and once each.
func writers(mf []metav1.ManagedFieldsEntry, match func(subresource string) bool) []string {
	seen := map[string]bool{}
	out := []string{}
	for _, e := range mf {
		if match(e.Subresource) && !seen[e.Manager] {
			seen[e.Manager] = true
			out = append(out, e.Manager)
		}
	}
	sort.Strings(out)
	return out
}

// replicasOwners are the managers whose fields include spec.replicas.
func replicasOwners(mf []metav1.ManagedFieldsEntry) []string {
	out := []string{}
	for _, e := range mf {
		if e.FieldsV1 == nil {
			continue
		}
		var fields struct {
			Spec map[string]json.RawMessage `json:"f:spec"`
		}
		if json.Unmarshal(e.FieldsV1.GetRawBytes(), &fields) != nil {
			continue
		}
		if _, ok := fields.Spec["f:replicas"]; ok {
			name := e.Manager
			if e.Subresource != "" {
				name += "/" + e.Subresource
			}
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// deletingByName maps each pod's name to whether its deletion has begun.
func deletingByName(pods []corev1.Pod) map[string]bool {
	out := make(map[string]bool, len(pods))
	for _, p := range pods {
		out[p.Name] = p.DeletionTimestamp != nil
	}
	return out
}

// joinOrNone is names joined, or "none".
func joinOrNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// clusterMarkdown is the report's section on the cluster ("" when the
// components never ran).
func clusterMarkdown(c *clusterSummary) string {
	if c == nil {
		return ""
	}
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("## The cluster that ran\n\n")
	w("Nothing played the kubelet or the autoscaler's controllers by hand: every pod below was made by a controller, bound by the scheduler and played by kwok, and the demo changed the pool only by writing the Deployment's `spec.replicas` with `kubectl scale`.\n\n")
	w("| component | version | binary | pid |\n|---|---|---|--:|\n")
	for _, comp := range c.Components {
		w("| %s | %s | `%s` | %d |\n", comp.Name, comp.Version, comp.Binary, comp.Pid)
	}
	w("\nkube-controller-manager ran the controllers %s. kwok ran %d fake Nodes (%s), gave pods addresses of %s, made a started pod Ready %s later (the model's cold start; %s in the scale-from-zero phase) and removed a deleted one %s after its deletion began (the preStop sleep plus the longest generation, within the grace period). ",
		strings.Join(c.Controllers, ", "), len(c.Nodes), strings.Join(c.Nodes, ", "), c.PodCIDR, secondsD(c.ColdStart), secondsD(zeroColdStart.Seconds()), secondsD(c.Termination))
	w("At the end the model Deployment's spec.replicas belonged to %s and its status was written by %s", joinOrNone(c.ReplicasOwners), joinOrNone(c.StatusWriters))
	if len(c.ReplicasOwners) == 0 {
		// Seen with v1.37: `kubectl scale --replicas=0` leaves no
		// managedFields entry owning spec.replicas, and later scales
		// through the subresource do not make one again.
		w(" (no manager owns spec.replicas once it went to 0 through the scale subresource: the API server dropped the entry, and later scales did not restore it; each scale event below names its owner right after the command)")
	}
	w(".\n\n")
	w("One simserver (`%s`, `--concurrency %d`, the whole pool's slots) serves every model pod: the pod network listens on a pod's address only while the pod is Ready and not terminating (a terminating one keeps its open connections and refuses new ones) and relays to it. So what one replica carried is the pod network's count for its address, not a process of its own:\n\n",
		c.Simserver, c.SimserverConcurrency)
	w("| pod | owner | node | address | created | Ready | deletion began | status written by |\n|---|---|---|---|--:|--:|--:|---|\n")
	for _, p := range c.ModelPods {
		w("| %s | %s | %s | %s | %s | %s | %s | %s |\n", p.Name, p.Owner, p.Node, p.IP, fmtAt(&p.Created), fmtAt(p.ReadyAt), fmtAt(p.Deleting), joinOrNone(p.StatusWriters))
	}
	w("\nTimes are since the main load began. Per address (kwok hands a removed pod's address out again, so an address may name several pods):\n\n")
	w("| address | pods | connections accepted | most open at once | bytes received |\n|---|---|--:|--:|--:|\n")
	for _, a := range c.Addresses {
		w("| %s | %s | %d | %d | %d |\n", a.IP, strings.Join(a.Pods, ", "), a.Accepted, a.PeakOpen, a.Received)
	}
	w("\nThe dispatchers keep connections alive, so open connections bound from above the requests a pod carried at once.\n\n")
	return b.String()
}

// fmtAt is a time since the load began, or "–".
func fmtAt(s *float64) string {
	if s == nil {
		return "–"
	}
	return fmt.Sprintf("%.2fs", *s)
}
