package controller

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tiergate/tiergate/api/v1alpha1"
	"github.com/tiergate/tiergate/internal/testutil"
	"github.com/tiergate/tiergate/internal/testutil/cluster"
)

// slotsOf waits until every dispatcher holds a policy with backends and
// the slots sum to want, and returns each pod's slots.
func slotsOf(t *testing.T, e *env, want int) map[string]int {
	t.Helper()
	got := map[string]int{}
	testutil.Eventually(t, 10*time.Second, fmt.Sprintf("the dispatchers hold %d slots in all", want), func() error {
		sum := 0
		for _, d := range e.disp {
			p, err := getPolicy(d)
			if err != nil {
				return err
			}
			if len(p.Backends) == 0 {
				return fmt.Errorf("%s holds a policy without backends", d.pod)
			}
			got[d.pod] = p.Slots
			sum += p.Slots
		}
		if sum != want {
			return fmt.Errorf("slots %v sum to %d", got, sum)
		}
		return nil
	})
	return got
}

// readyz is a dispatcher's /readyz answer.
func readyz(t *testing.T, d *dispatcher) (int, string) {
	t.Helper()
	resp, err := http.Get(d.AdminURL("/readyz"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// readyPods are the dispatchers whose Pod is Ready: where a Service sends
// traffic.
func readyPods(t *testing.T, e *env) []*dispatcher {
	t.Helper()
	var out []*dispatcher
	for _, d := range e.disp {
		ready, err := podIsReady(e.ns, d.pod)
		if err != nil {
			t.Fatal(err)
		}
		if ready {
			out = append(out, d)
		}
	}
	return out
}

// complete sends one completion to d's data port and returns the status.
func complete(t *testing.T, d *dispatcher) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, d.DataURL("/v1/chat/completions"),
		strings.NewReader(`{"model":"sim-model","messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("X-Tenant-ID", "acme")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Three dispatchers for 2 slots (2 replicas × 1): the one left without a
// slot reports NotReady, so its Pod is NotReady and a Service sends it
// nothing; the pool says why; every request sent to the Ready ones is
// served.
//
// The dispatcher pods' readiness is the probe loop's (newProbedEnv): the
// test is about the slot-less pod's probe failing.
func TestFewerSlotsThanDispatchers(t *testing.T) {
	e := newProbedEnv(t)
	// Two model pods, each one request at a time: one simserver of 2. They
	// are Ready before the dispatchers come: kwok makes them Ready one at a
	// time, and at 1 ready replica 2 of 3 dispatchers would hold no slot
	// (the Warning event would say that).
	e.serveModels("--concurrency", "2", "--service-time", "const:50ms")
	e.applySamples(func(s string) string {
		return replaceOnce(t, s, "concurrencyPerReplica: 4", "concurrencyPerReplica: 1")
	})
	e.scale(2)
	e.startDispatchers(3)

	slots := slotsOf(t, e, 2)
	var idle *dispatcher
	for _, d := range e.disp {
		switch slots[d.pod] {
		case 0:
			if idle != nil {
				t.Fatalf("two dispatchers without a slot: %v", slots)
			}
			idle = d
		case 1:
		default:
			t.Fatalf("slots %v, want 1, 1 and 0", slots)
		}
	}
	if idle == nil {
		t.Fatalf("slots %v: nobody without a slot", slots)
	}
	t.Logf("slots %v: %s holds none", slots, idle.pod)

	p, err := getPolicy(idle)
	if err != nil {
		t.Fatal(err)
	}
	code, body := readyz(t, idle)
	wantBody := fmt.Sprintf("this dispatcher holds no slot of pool %s/llm (policy version %d gives it 0 slots with 2 ready backends, in Local mode): it would refuse every request, so it asks to be routed around", e.ns, p.Version)
	if code != http.StatusServiceUnavailable || body != wantBody {
		t.Errorf("the slot-less dispatcher's /readyz: %d %q, want 503 %q", code, body, wantBody)
	}
	testutil.Eventually(t, 5*time.Second, "only the slot-less pod NotReady", func() error {
		for _, d := range e.disp {
			ready, err := podIsReady(e.ns, d.pod)
			if err != nil {
				return err
			}
			if ready == (d == idle) {
				return fmt.Errorf("%s Ready=%v", d.pod, ready)
			}
		}
		return nil
	})
	testutil.Eventually(t, 5*time.Second, "FewerSlotsThanDispatchers on the pool", func() error {
		st := e.pool().Status
		if err := conditionIs(st.Conditions, v1alpha1.ModelPoolFewerSlotsThanDispatchers, metav1.ConditionTrue, "FewerSlotsThanDispatchers"); err != nil {
			return err
		}
		msg := condition(st.Conditions, v1alpha1.ModelPoolFewerSlotsThanDispatchers).Message
		want := fmt.Sprintf("1 of 3 healthy dispatchers holds no slot: the pool has 2 slots and Local mode gives each dispatcher a whole number of them; %s reports NotReady so the Service routes around it. "+
			"Set spec.sharedState: Redis to share every slot among all dispatchers, or run at most 2 dispatcher replicas", idle.pod)
		if msg != want {
			return fmt.Errorf("message %q, want %q", msg, want)
		}
		if got := st.Dispatchers; got != (v1alpha1.DispatcherCounts{Total: 3, Ready: 2, Synced: 3}) {
			return fmt.Errorf("dispatchers %+v, want 3 total, 2 ready, 3 synced", got)
		}
		return hasEvent(e.ns, "llm", corev1.EventTypeWarning, "FewerSlotsThanDispatchers", "1 of 3 healthy dispatchers holds no slot")
	})

	// A Service's view: only Ready pods get requests, one at a time each
	// within its slot; every one is served.
	ready := readyPods(t, e)
	if len(ready) != 2 {
		t.Fatalf("%d Ready dispatchers, want 2", len(ready))
	}
	for i := 0; i < 20; i++ {
		d := ready[i%2]
		if code, body := complete(t, d); code != http.StatusOK {
			t.Fatalf("request %d through Ready %s: %d %s", i, d.pod, code, body)
		}
	}
	// What the Service spares the clients: the slot-less one refuses.
	if code, _ := complete(t, idle); code != http.StatusServiceUnavailable {
		t.Errorf("the slot-less dispatcher answered %d, want 503", code)
	}

	// Its NotReady is its own share's doing, not a failure: resyncs later
	// (every 500ms) the split is the same and nobody is excluded.
	idle.waitPushes(t, idle.pushes(), 4)
	if again := slotsOf(t, e, 2); fmt.Sprint(again) != fmt.Sprint(slots) {
		t.Errorf("slots moved from %v to %v", slots, again)
	}
	if msg := condition(e.pool().Status.Conditions, v1alpha1.ModelPoolFewerSlotsThanDispatchers).Message; strings.Contains(msg, "failing") {
		t.Errorf("the slot-less pod was judged failing: %q", msg)
	}

}

// A dispatcher pod marked restarting (its container's restart count rose
// and it ended a moment ago, as a kubelet reports it) or crash-looping
// loses its share at once: the others get the slots, it reports NotReady,
// and the pool names it. The crash loop is kwok's chaos Stage (the label
// cluster.ChaosLabel); a restarted container that runs again, Ready, is no
// Stage's, so that status is written as a kubelet would report it.
func TestFailingDispatcherLosesItsShare(t *testing.T) {
	for name, mark := range map[string]func(e *env, pod string){
		"restarted": func(e *env, pod string) {
			kubectl.Must(e.t, "label", "-n", e.ns, "pod", pod, cluster.RestartLabel+"=once")
		},
		"crash-looping": func(e *env, pod string) {
			kubectl.Must(e.t, "label", "-n", e.ns, "pod", pod, cluster.ChaosLabel+"=crash-loop")
		},
	} {
		t.Run(name, func(t *testing.T) {
			e, _ := sampleEnv(t, 3)
			if got := slotsOf(t, e, 24); got[e.disp[1].pod] != 8 {
				t.Fatalf("slots %v before, want 8 each", got)
			}
			failing := e.disp[1]
			mark(e, failing.pod)

			var reason string
			testutil.Eventually(t, 10*time.Second, "the failing pod's share goes to the others", func() error {
				got := map[string]int{}
				for _, d := range e.disp {
					p, err := getPolicy(d)
					if err != nil {
						return err
					}
					got[d.pod] = p.Slots
				}
				want := map[string]int{e.disp[0].pod: 12, failing.pod: 0, e.disp[2].pod: 12}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					return fmt.Errorf("slots %v, want %v", got, want)
				}
				return nil
			})
			if code, body := readyz(t, failing); code != http.StatusServiceUnavailable || !strings.Contains(body, "holds no slot") {
				t.Errorf("the failing dispatcher's /readyz: %d %q", code, body)
			}
			reason = map[string]string{"restarted": "restarted within the last 2m0s", "crash-looping": "CrashLoopBackOff"}[name]
			testutil.Eventually(t, 5*time.Second, "the pool names the failing pod", func() error {
				st := e.pool().Status
				if err := conditionIs(st.Conditions, v1alpha1.ModelPoolFewerSlotsThanDispatchers, metav1.ConditionFalse, "DispatchersHoldSlots"); err != nil {
					return err
				}
				want := fmt.Sprintf("no healthy dispatcher is left without a slot; failing, so holding no slot: %s (%s)", failing.pod, reason)
				if msg := condition(st.Conditions, v1alpha1.ModelPoolFewerSlotsThanDispatchers).Message; msg != want {
					return fmt.Errorf("message %q, want %q", msg, want)
				}
				return hasEvent(e.ns, "llm", corev1.EventTypeWarning, "DispatcherExcluded", failing.pod+" ("+reason+") is failing")
			})
		})
	}
}
