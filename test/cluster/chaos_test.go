package cluster

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/tiergate/tiergate/internal/testutil"
	"github.com/tiergate/tiergate/internal/testutil/cluster"
)

// followCeiling is how soon after a pod's readiness changes every
// dispatcher must hold the policy that follows it (issue 24: within a
// second).
const followCeiling = time.Second

// cutAnswer is what a request in flight at a crashed pod gets: its body
// was sent, so the dispatcher may not replay it elsewhere.
const cutAnswer = "502 Bad Gateway backend_error"

// TestChaosPodFails: while a load runs, one of the 6 model pods of
// config/samples is labelled chaos.tiergate.dev/fail: its server is gone
// at once (the pod network resets its open connections and refuses new
// ones, as a crashed server's would), and kwok's chaos Stage makes its
// containers crashed and the pod NotReady crashDetection later, as the
// kubelet would notice. Asserted: every dispatcher drops it within followCeiling of the
// test seeing it NotReady, and the pool and the dispatchers hold 5 × 4
// slots; once the label is removed it is Ready a cold start later and
// back in every dispatcher's policy within followCeiling. Every request
// is answered: 200, or 502 backend_error for one in flight when the crash
// cut its connection (no more of those than the connections the crash
// reset); a request whose dial the crashed address refused is retried on
// another backend. Every dispatcher that sent it a request after the
// crash ejects the address at its first refused or dropped connection
// (passive health; its log says so), and at least one does. No policy had more slots than 4 × its
// backends, and the controller logged no error.
func TestChaosPodFails(t *testing.T) {
	p := startPool(t)
	victim := readyModelPod(t, p.ns)
	ip, addr := victim.Status.PodIP, modelAddr(victim.Status.PodIP)
	ld := startLoad(t, p.ds, 20*time.Millisecond)
	testutil.EventuallyTrue(t, 10*time.Second, "the load reaching "+ip, func() bool { return podNet.Stats(ip).Received > 0 })

	before := podNet.Stats(ip)
	failed := startStep(t)
	kubectl.Must(t, "label", "-n", p.ns, "pod", victim.Name, cluster.ChaosLabel+"=crash")
	failed.done("kubectl label " + cluster.ChaosLabel + " returned")
	notReady := awaitPodReady(t, p.ns, victim.Name, false)
	if took := failed.done(fmt.Sprintf("the pod NotReady (kwok's chaos Stage, after %s)", crashDetection)); took < crashDetection {
		t.Errorf("the pod turned NotReady %s after the label, before the %s crash detection", took.Round(time.Millisecond), crashDetection)
	}
	awaitFollow(t, p.ns, p.w, 5, 10*time.Second)
	failed.done("pool status and dispatchers at 5 x 4 slots")
	checkFollowed(t, p.w, addr, failed.start, notReady, false)
	after := podNet.Stats(ip)

	recovered := startStep(t)
	kubectl.Must(t, "label", "-n", p.ns, "pod", victim.Name, cluster.ChaosLabel+"-")
	ready := awaitPodReady(t, p.ns, victim.Name, true)
	recovered.done(fmt.Sprintf("the pod Ready again (cold start %s)", coldStart))
	awaitFollow(t, p.ns, p.w, 6, 10*time.Second)
	recovered.done("pool status and dispatchers at 6 x 4 slots")
	checkFollowed(t, p.w, addr, recovered.start, ready, true)
	ld.stop()
	p.w.stop()

	// Reset: open when the address closed; Refused: accepted as it closed.
	cut := after.Reset - before.Reset + after.Refused - before.Refused
	answered, _ := ld.result()
	fails := ld.failures()
	t.Logf("load: %d answered 200, %d %s; the crash reset %d connections", answered, fails[cutAnswer], cutAnswer, cut)
	if n := fails[cutAnswer]; int64(n) > cut {
		t.Errorf("%d requests got %s, more than the %d connections the crash reset", n, cutAnswer, cut)
	}
	delete(fails, cutAnswer)
	if _, others := ld.result(); len(fails) > 0 || answered == 0 {
		t.Errorf("load during the failure: %d answered; other failures: %s", answered, others)
	}
	var ejected []int
	for _, d := range p.ds {
		ejected = append(ejected, ejections(t, d)[addr])
	}
	t.Logf("ejections of %s by dispatcher: %v", addr, ejected)
	if sum(ejected) == 0 {
		t.Errorf("no dispatcher ejected the crashed %s", addr)
	}
	logs := p.logs(t)
	checkAppliesWithinBackends(t, logs)
	checkNoDuplicateApplies(t, logs)
	checkControllerQuiet(t, p.ns, p.ctl.Output())
}

// readyModelPod is the first, by name, of ns's Ready model pods.
func readyModelPod(t *testing.T, ns string) corev1.Pod {
	t.Helper()
	pods := modelPods(t, ns)
	slices.SortFunc(pods, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	for _, p := range pods {
		if p.DeletionTimestamp == nil && isReady(&p) {
			return p
		}
	}
	t.Fatalf("no Ready model pod: %s", describePods(pods))
	return corev1.Pod{}
}

// awaitPodReady waits until the pod's Ready condition is ready and returns
// when the test saw it so.
func awaitPodReady(t *testing.T, ns, name string, ready bool) time.Time {
	t.Helper()
	await(t, 15*time.Second, fmt.Sprintf("pod %s Ready %t", name, ready), func() (bool, string) {
		var p corev1.Pod
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &p); err != nil {
			return false, err.Error()
		}
		return isReady(&p) == ready, fmt.Sprintf("conditions %+v", p.Status.Conditions)
	})
	return time.Now()
}

// checkFollowed: the first policy sample since the label was written in
// which every dispatcher lists addr (in true) or none does (in false) came
// within followCeiling of changed, when the test saw the readiness
// change; the delay is logged (0 if the dispatchers were first).
func checkFollowed(t *testing.T, w *policyWatch, addr string, labelled, changed time.Time, in bool) {
	t.Helper()
	for _, s := range w.all() {
		if s.at.Before(labelled) {
			continue
		}
		all := true
		for _, v := range s.per {
			all = all && slices.Contains(v.backends, addr) == in
		}
		if !all {
			continue
		}
		d := max(s.at.Sub(changed), 0)
		t.Logf("%s %s every dispatcher's policy %s after the test saw its readiness change", addr, map[bool]string{true: "back in", false: "out of"}[in], d.Round(time.Millisecond))
		if d > followCeiling {
			t.Errorf("%s followed its readiness %s late, want within %s", addr, d.Round(time.Millisecond), followCeiling)
		}
		return
	}
	t.Errorf("no policy sample after %s with %s in=%t on every dispatcher", changed.Format("15:04:05.000"), addr, in)
}

// ejections counts d's "backend ejected" log lines by backend.
func ejections(t *testing.T, d *testutil.Dispatcher) map[string]int {
	t.Helper()
	out := map[string]int{}
	sc := bufio.NewScanner(strings.NewReader(d.Output()))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if !strings.Contains(sc.Text(), `"backend ejected"`) {
			continue
		}
		var e struct {
			Msg     string `json:"msg"`
			Backend string `json:"backend"`
		}
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("an ejection line that is not JSON (%v): %s", err, sc.Text())
		}
		if e.Msg == "backend ejected" {
			out[e.Backend]++
		}
	}
	return out
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}
