package cluster

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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

func TestPodState(t *testing.T) {
	tests := map[string]struct {
		pod  *corev1.Pod
		want State
	}{
		"pending":                   {pod("a", "", corev1.PodPending, false, false), Closed},
		"running, cold starting":    {pod("a", "127.88.0.1", corev1.PodRunning, false, false), Closed},
		"running and Ready":         {pod("a", "127.88.0.1", corev1.PodRunning, true, false), Serving},
		"Ready but terminating":     {pod("a", "127.88.0.1", corev1.PodRunning, true, true), Draining},
		"not Ready, terminating":    {pod("a", "127.88.0.1", corev1.PodRunning, false, true), Draining},
		"failed":                    {pod("a", "127.88.0.1", corev1.PodFailed, false, false), Closed},
		"no Ready condition at all": {&corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning}}, Closed},
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
	f := &follower{n: n, owner: map[string]types.UID{}}
	const ip = "127.88.249.1"
	steps := []struct {
		what string
		do   func()
		want State
	}{
		{"a starts", func() { f.observe(pod("a", ip, corev1.PodRunning, false, false)) }, Closed},
		{"a is Ready", func() { f.observe(pod("a", ip, corev1.PodRunning, true, false)) }, Serving},
		{"a terminates", func() { f.observe(pod("a", ip, corev1.PodRunning, true, true)) }, Draining},
		{"a is gone", func() { f.gone(pod("a", ip, corev1.PodRunning, true, true)) }, Closed},
		{"b gets a's address and is Ready", func() { f.observe(pod("b", ip, corev1.PodRunning, true, false)) }, Serving},
		// A late delete of a, after b took the address, leaves b alone.
		{"a's delete again", func() { f.gone(pod("a", ip, corev1.PodRunning, true, true)) }, Serving},
		{"b crashes", func() { f.observe(pod("b", ip, corev1.PodRunning, false, false)) }, Closed},
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
