package cluster

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// rolloutStrategy is the model Deployment's strategy in TestRollingUpdate:
// up to 2 pods over the 6 (25%, rounded up), none of the 6 unavailable.
const rolloutStrategy = `  strategy:
    type: RollingUpdate
    rollingUpdate:
      maxSurge: 25%
      maxUnavailable: 0
`

// restartedAt is the template annotation `kubectl rollout restart` sets.
const restartedAt = "kubectl.kubernetes.io/restartedAt"

// TestRollingUpdate: the model Deployment of config/samples, with a
// rolling update of surge 25% and unavailable 0, is restarted with
// `kubectl rollout restart` (a new pod template) while a load runs.
// Asserted: the rollout completes with 6 Ready pods of the new template,
// which the pool and the dispatchers then hold; no policy a dispatcher
// applied had more slots than 4 × its backends, nor any version over the
// dispatchers, and none held more than the 8 pods the surge allows; no
// version was applied twice; every request was answered 200; and no
// terminating pod got new work: for each of the 6 old pods, no byte
// reached its address later than workSlack after the last dispatcher
// applied a policy without it, none while it drained (after its preStop
// sleep), and no dispatcher ejected any backend (a dial a terminating
// pod refused would have).
func TestRollingUpdate(t *testing.T) {
	p := startPool(t, withDeploymentSpec(rolloutStrategy))
	ld := startLoad(t, p.ds, 20*time.Millisecond)
	start := time.Now()
	rolled := startStep(t)
	kubectl.Must(t, "rollout", "restart", "-n", p.ns, "deployment/llm")
	kubectl.Must(t, "rollout", "status", "-n", p.ns, "deployment/llm", "--timeout=90s")
	rolled.done("kubectl rollout status: the rollout is complete")
	awaitFollow(t, p.ns, p.w, 6, 30*time.Second)
	rolled.done("pool status and dispatchers at the 6 new pods")
	await(t, 30*time.Second, "the 6 old pods gone", func() (bool, string) {
		dels := p.dels.since(start)
		gone := 0
		for _, d := range dels {
			if !d.gone.IsZero() {
				gone++
			}
		}
		return len(dels) == 6 && gone == 6, fmt.Sprintf("%d deletions seen, %d of them gone", len(dels), gone)
	})
	rolled.done("the 6 old pods gone")
	ld.stop()
	p.w.stop()

	checkNewTemplate(t, modelPods(t, p.ns))
	logs := p.logs(t)
	checkAppliesWithinBackends(t, logs)
	checkNoDuplicateApplies(t, logs)
	checkSurgeBound(t, p.w.all(), 8)
	answered, failures := ld.result()
	t.Logf("load: %d requests answered 200 during the rollout", answered)
	if failures != "" || answered == 0 {
		t.Errorf("load during the rollout: %d answered, and %s", answered, failures)
	}
	checkNoWorkAfterDrop(t, p.w, logs, p.dels.since(start))
	for i, d := range p.ds {
		if ej := ejections(t, d); len(ej) > 0 {
			t.Errorf("dispatcher %d ejected backends during the rollout: %v", i, ej)
		}
	}
	checkControllerQuiet(t, p.ns, p.ctl.Output())
}

// checkNewTemplate: the 6 pods are Ready and of the restarted template.
func checkNewTemplate(t *testing.T, pods []corev1.Pod) {
	t.Helper()
	if len(pods) != 6 || len(readyServing(pods)) != 6 {
		t.Fatalf("after the rollout: %s", describePods(pods))
	}
	for _, p := range pods {
		if p.Annotations[restartedAt] == "" {
			t.Errorf("pod %s is not of the restarted template: annotations %v", p.Name, p.Annotations)
		}
	}
}

// checkSurgeBound: no dispatcher held more than most backends, nor the
// dispatchers more than 4 × most slots; the largest are logged.
func checkSurgeBound(t *testing.T, samples []held, most int) {
	t.Helper()
	var backends, slots int
	for _, s := range samples {
		slots = max(slots, s.slots)
		for _, v := range s.per {
			backends = max(backends, len(v.backends))
		}
	}
	t.Logf("during the rollout the dispatchers held at most %d backends and %d slots in all (%d samples)", backends, slots, len(samples))
	if backends > most || slots > 4*most {
		t.Errorf("a dispatcher held %d backends and the dispatchers %d slots, more than the %d pods (%d slots) the surge allows", backends, slots, most, 4*most)
	}
}

// workSlack is how long after a dispatcher applied a policy without a pod
// a request it had already sent that pod may still be arriving.
const workSlack = 100 * time.Millisecond

// preStop is the model pods' preStop sleep in this suite (see samples).
const preStop = time.Second

// checkNoWorkAfterDrop: for each deletion, the address got no byte later
// than workSlack after the last dispatcher applied a policy without it,
// nor after its preStop sleep (when the server drains). What reached it
// after its deletion began is logged.
func checkNoWorkAfterDrop(t *testing.T, w *policyWatch, logs [][]applied, dels []deletion) {
	t.Helper()
	var parts []string
	for _, d := range dels {
		lat, ok := dropLatency(w, logs, d, d.gone)
		if !ok {
			t.Errorf("pod %s (%s) was still in some dispatcher's policy when it was gone", d.name, d.ip)
			continue
		}
		dropped := d.seen.Add(lat)
		bytes := d.atGone.Received - d.atSeen.Received
		parts = append(parts, fmt.Sprintf("%s: dropped %s after its deletion, %d bytes after it", d.ip, lat.Round(time.Millisecond), bytes))
		if bytes == 0 {
			continue
		}
		last := d.atGone.LastReceived
		if last.After(dropped.Add(workSlack)) || !last.Before(d.seen.Add(preStop)) {
			t.Errorf("pod %s (%s) got its last bytes %s after its deletion began, %s after the last dispatcher dropped it (want <= %s, and before its %s preStop ends)",
				d.name, d.ip, last.Sub(d.seen).Round(time.Millisecond), last.Sub(dropped).Round(time.Millisecond), workSlack, preStop)
		}
	}
	t.Logf("terminating pods: %s", strings.Join(parts, "; "))
}
