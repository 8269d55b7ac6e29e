package cluster

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/tiergate/tiergate/internal/testutil"
	"github.com/tiergate/tiergate/internal/testutil/cluster"
)

// applied is one "applied policy" line of a dispatcher's JSON log.
type applied struct {
	at       time.Time
	version  int64
	slots    int
	backends int
}

// funcrTime is the timestamp layout of the dispatcher's logger (funcr's
// default, in local time).
const funcrTime = "2006-01-02 15:04:05.000000"

// applies are every policy d applied, in its log's order.
func applies(t *testing.T, d *testutil.Dispatcher) []applied {
	t.Helper()
	var out []applied
	sc := bufio.NewScanner(strings.NewReader(d.Output()))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `"applied policy"`) {
			continue
		}
		var e struct {
			TS       string `json:"ts"`
			Msg      string `json:"msg"`
			Version  int64  `json:"version"`
			Slots    int    `json:"slots"`
			Backends int    `json:"backends"`
		}
		if err := json.Unmarshal([]byte(line), &e); err != nil || e.Msg != "applied policy" {
			t.Fatalf("a dispatcher log line that is not a JSON apply (%v): %s", err, line)
		}
		at, err := time.ParseInLocation(funcrTime, e.TS, time.Local)
		if err != nil {
			t.Fatalf("apply time %q: %v", e.TS, err)
		}
		out = append(out, applied{at: at, version: e.Version, slots: e.Slots, backends: e.Backends})
	}
	return out
}

// appliedAt is when d's log says it applied version v (zero if never).
func appliedAt(log []applied, v int64) time.Time {
	for _, a := range log {
		if a.version == v {
			return a.at
		}
	}
	return time.Time{}
}

// overBackends are the applied policies with more slots than
// concurrency × their backends.
func overBackends(log []applied, concurrency int) []applied {
	var out []applied
	for _, a := range log {
		if a.slots > concurrency*a.backends {
			out = append(out, a)
		}
	}
	return out
}

// poolSlots are the versions the dispatchers applied, each with its slots
// summed over the dispatchers that applied it and its backends (every
// dispatcher's policy of a version lists the same), by version.
func poolSlots(logs [][]applied) []applied {
	byVersion := map[int64]*applied{}
	for _, log := range logs {
		seen := map[int64]bool{}
		for _, a := range log {
			if seen[a.version] {
				continue // applied again: counted once
			}
			seen[a.version] = true
			v, ok := byVersion[a.version]
			if !ok {
				v = &applied{at: a.at, version: a.version, backends: a.backends}
				byVersion[a.version] = v
			}
			v.slots += a.slots
			v.backends = min(v.backends, a.backends)
		}
	}
	var out []applied
	for _, v := range byVersion {
		out = append(out, *v)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].version < out[b].version })
	return out
}

// duplicates counts the applies of a version d had applied before.
func duplicates(log []applied) (n int, versions []int64) {
	seen := map[int64]int{}
	for _, a := range log {
		seen[a.version]++
		if seen[a.version] == 2 {
			versions = append(versions, a.version)
		}
		if seen[a.version] > 1 {
			n++
		}
	}
	return n, versions
}

// deletion is a model pod whose deletion the test saw begin.
type deletion struct {
	name, ip string
	seen     time.Time
	// gone is when the test saw the pod removed (zero while it is not).
	gone time.Time
	// atSeen and atGone are its address's counts in the pod network then.
	atSeen, atGone cluster.AddrStats
}

// deletionWatch notes, from an informer of its own, when each model pod
// of a namespace is first seen terminating.
type deletionWatch struct {
	stop func()

	mu   sync.Mutex
	seen map[types.UID]deletion
}

func watchDeletions(t *testing.T, ns string) *deletionWatch {
	t.Helper()
	cs, err := kc.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	w := &deletionWatch{seen: map[types.UID]deletion{}}
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns))
	inf := factory.Core().V1().Pods().Informer()
	note := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok || p.DeletionTimestamp == nil || p.Labels["app.kubernetes.io/name"] != "llm" {
			return
		}
		now := time.Now()
		w.mu.Lock()
		defer w.mu.Unlock()
		if _, ok := w.seen[p.UID]; !ok {
			w.seen[p.UID] = deletion{name: p.Name, ip: p.Status.PodIP, seen: now, atSeen: podNet.Stats(p.Status.PodIP)}
		}
	}
	// A removed pod's counts are read before kwok can hand its address
	// to a new pod that turns Ready (a cold start later, at the soonest).
	gone := func(obj any) {
		if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		now := time.Now()
		w.mu.Lock()
		defer w.mu.Unlock()
		if d, ok := w.seen[p.UID]; ok && d.gone.IsZero() {
			d.gone, d.atGone = now, podNet.Stats(d.ip)
			w.seen[p.UID] = d
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: note, UpdateFunc: func(_, o any) { note(o) }, DeleteFunc: gone}); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	factory.Start(done)
	if !cache.WaitForCacheSync(done, inf.HasSynced) {
		t.Fatal("the deletion watch did not sync")
	}
	var once sync.Once
	w.stop = func() { once.Do(func() { close(done); factory.Shutdown() }) }
	t.Cleanup(w.stop)
	return w
}

// since are the deletions seen from start on, by time.
func (w *deletionWatch) since(start time.Time) []deletion {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []deletion
	for _, d := range w.seen {
		if !d.seen.Before(start) && d.ip != "" {
			out = append(out, d)
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].seen.Before(out[b].seen) })
	return out
}

// dropLatency is how long after the test saw del begin every dispatcher
// had applied a policy without its address: for each dispatcher, the
// apply time of the first sampled version above every sampled version
// that still listed the address, up to until (when its address may be
// another pod's). It over-estimates by at most one version the sampling
// missed; ok is false when some dispatcher was never seen without it.
func dropLatency(w *policyWatch, logs [][]applied, del deletion, until time.Time) (time.Duration, bool) {
	addr := net.JoinHostPort(del.ip, strconv.Itoa(podNet.Port()))
	var latest time.Time
	for i := range logs {
		var listed, dropped int64
		samples := w.all()
		for _, s := range samples {
			if !s.at.After(until) && slices.Contains(s.per[i].backends, addr) {
				listed = max(listed, s.per[i].version)
			}
		}
		for _, s := range samples {
			if v := s.per[i].version; !s.at.After(until) && v > listed && (dropped == 0 || v < dropped) {
				dropped = v
			}
		}
		if dropped == 0 {
			return 0, false
		}
		at := appliedAt(logs[i], dropped)
		if at.IsZero() {
			return 0, false
		}
		latest = later(latest, at)
	}
	return latest.Sub(del.seen), true
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// percentile is the q-quantile (nearest rank) of ds, which it sorts.
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := int(q*float64(len(ds))+0.999999) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

// controllerErrors are the error-level lines of the controller's log
// (zap's JSON) that name ns or no namespace, and how many of them are
// optimistic-lock conflicts.
func controllerErrors(out, ns string) (lines []string, conflicts int) {
	for _, line := range strings.Split(out, "\n") {
		if !strings.Contains(line, `"level":"error"`) {
			continue
		}
		if strings.Contains(line, `"namespace":"`) && !strings.Contains(line, `"namespace":"`+ns+`"`) {
			continue
		}
		lines = append(lines, line)
		if strings.Contains(line, "the object has been modified") {
			conflicts++
		}
	}
	return lines, conflicts
}

func describeApplies(as []applied) string {
	var parts []string
	for _, a := range as {
		parts = append(parts, fmt.Sprintf("v%d %d slots/%d backends at %s", a.version, a.slots, a.backends, a.at.Format("15:04:05.000")))
	}
	return strings.Join(parts, "; ")
}
