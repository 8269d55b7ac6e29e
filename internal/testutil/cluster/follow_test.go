package cluster

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
)

// pod is a pod with uid and ip in phase, Ready or not, deleting or not.
func pod(uid, ip string, phase corev1.PodPhase, ready, deleting bool) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Name: uid}}
	p.Status.Phase = phase
	if ip != "" {
		p.Status.PodIP = ip
		p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	}
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}, {Type: corev1.PodReady, Status: status}}
	if deleting {
		now := metav1.Now()
		p.DeletionTimestamp = &now
	}
	return p
}

// crashed labels p with ChaosLabel.
func crashed(p *corev1.Pod) *corev1.Pod {
	p.Labels = map[string]string{ChaosLabel: "true"}
	return p
}

func TestPodState(t *testing.T) {
	tests := map[string]struct {
		pod  *corev1.Pod
		want State
	}{
		"pending":                   {pod("a", "", corev1.PodPending, false, false), Closed},
		"running, cold starting":    {pod("a", "127.88.0.1", corev1.PodRunning, false, false), Serving},
		"running and Ready":         {pod("a", "127.88.0.1", corev1.PodRunning, true, false), Serving},
		"Ready but terminating":     {pod("a", "127.88.0.1", corev1.PodRunning, true, true), Draining},
		"not Ready, terminating":    {pod("a", "127.88.0.1", corev1.PodRunning, false, true), Draining},
		"failed":                    {pod("a", "127.88.0.1", corev1.PodFailed, false, false), Closed},
		"Ready, crashed by chaos":   {crashed(pod("a", "127.88.0.1", corev1.PodRunning, true, false)), Closed},
		"no Ready condition at all": {&corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning}}, Serving},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := PodState(tc.pod); got != tc.want {
				t.Errorf("PodState = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestFollowerStates(t *testing.T) {
	n, err := ListenCIDR("127.88.249.0/29", 0, "127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	f := newFollower(n, clocktesting.NewFakeClock(time.Now()))
	const ip = "127.88.249.1"
	steps := []struct {
		what string
		do   func()
		want State
	}{
		{"a is scheduled", func() { f.observe(pod("a", ip, corev1.PodPending, false, false)) }, Closed},
		{"a runs, cold starting", func() { f.observe(pod("a", ip, corev1.PodRunning, false, false)) }, Serving},
		{"a is Ready", func() { f.observe(pod("a", ip, corev1.PodRunning, true, false)) }, Serving},
		{"a terminates", func() { f.observe(pod("a", ip, corev1.PodRunning, true, true)) }, Draining},
		{"a is gone", func() { f.gone(pod("a", ip, corev1.PodRunning, true, true)) }, Closed},
		{"b gets a's address and is Ready", func() { f.observe(pod("b", ip, corev1.PodRunning, true, false)) }, Serving},
		// A late delete of a, after b took the address, leaves b alone.
		{"a's delete again", func() { f.gone(pod("a", ip, corev1.PodRunning, true, true)) }, Serving},
		{"b crashes, still listed Ready", func() { f.observe(crashed(pod("b", ip, corev1.PodRunning, true, false))) }, Closed},
		{"b turns NotReady", func() { f.observe(crashed(pod("b", ip, corev1.PodRunning, false, false))) }, Closed},
		{"a pod outside the network", func() { f.observe(pod("c", "127.0.0.9", corev1.PodRunning, true, false)) }, Closed},
	}
	for _, s := range steps {
		s.do()
		if got := n.State(ip); got != s.want {
			t.Errorf("after %s: %s is %s, want %s", s.what, ip, got, s.want)
		}
	}
	if got := n.State("127.0.0.9"); got != Closed {
		t.Errorf("an address outside the network is %s", got)
	}
}

// withPreStop gives p a container whose preStop hook sleeps for seconds,
// and one without a hook.
func withPreStop(p *corev1.Pod, seconds int64) *corev1.Pod {
	p.Spec.Containers = []corev1.Container{
		{Name: "sidecar"},
		{Name: "server", Lifecycle: &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: seconds}}}},
	}
	return p
}

func TestPreStopSleep(t *testing.T) {
	exec := pod("a", "", corev1.PodRunning, true, false)
	exec.Spec.Containers = []corev1.Container{{Name: "server", Lifecycle: &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"sleep", "5"}}}}}}
	tests := map[string]struct {
		pod  *corev1.Pod
		want time.Duration
	}{
		"no containers":        {pod("a", "", corev1.PodRunning, true, false), 0},
		"a sleep of 3s":        {withPreStop(pod("a", "", corev1.PodRunning, true, false), 3), 3 * time.Second},
		"an exec hook is none": {exec, 0},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := PreStopSleep(tc.pod); got != tc.want {
				t.Errorf("PreStopSleep = %s, want %s", got, tc.want)
			}
		})
	}
}

// TestFollowerPlaysPreStop: a terminating pod with a preStop sleep keeps
// serving until the sleep has passed on the follower's clock, then
// drains; one removed during its sleep is closed and its timer has no
// effect on the pod that takes its address next.
func TestFollowerPlaysPreStop(t *testing.T) {
	n, err := ListenCIDR("127.88.248.0/29", 0, "127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	clk := clocktesting.NewFakeClock(time.Now())
	f := newFollower(n, clk)
	const ip = "127.88.248.1"
	steps := []struct {
		what string
		do   func()
		want State
	}{
		{"a is Ready", func() { f.observe(withPreStop(pod("a", ip, corev1.PodRunning, true, false), 2)) }, Serving},
		{"a terminates", func() { f.observe(withPreStop(pod("a", ip, corev1.PodRunning, true, true), 2)) }, Serving},
		{"1.9s later", func() { clk.Step(1900 * time.Millisecond) }, Serving},
		{"a seen again", func() { f.observe(withPreStop(pod("a", ip, corev1.PodRunning, true, true), 2)) }, Serving},
		{"2s after its deletion", func() { clk.Step(100 * time.Millisecond) }, Draining},
		{"a seen after the hook", func() { f.observe(withPreStop(pod("a", ip, corev1.PodRunning, true, true), 2)) }, Draining},
		{"a is gone", func() { f.gone(pod("a", ip, corev1.PodRunning, true, true)) }, Closed},
		{"b takes the address", func() { f.observe(withPreStop(pod("b", ip, corev1.PodRunning, true, false), 2)) }, Serving},
		{"b terminates", func() { f.observe(withPreStop(pod("b", ip, corev1.PodRunning, true, true), 2)) }, Serving},
		{"b is gone during its hook", func() { f.gone(pod("b", ip, corev1.PodRunning, true, true)) }, Closed},
		{"c takes the address", func() { f.observe(pod("c", ip, corev1.PodRunning, true, false)) }, Serving},
		{"b's hook would have ended", func() { clk.Step(3 * time.Second) }, Serving},
		{"c terminates without a hook", func() { f.observe(pod("c", ip, corev1.PodRunning, true, true)) }, Draining},
	}
	for _, s := range steps {
		s.do()
		if got := n.State(ip); got != s.want {
			t.Errorf("after %s: %s is %s, want %s", s.what, ip, got, s.want)
		}
	}
	if clk.HasWaiters() {
		t.Errorf("a preStop timer is still set after every pod went or drained")
	}
}
