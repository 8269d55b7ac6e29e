package controllers

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/tiergate/tiergate/api/v1alpha1"
	seed "github.com/tiergate/tiergate/capacity/capacitytest"
)

func TestPlanVersion(t *testing.T) {
	type plan struct {
		Version, Ceiling int64
		Reserve          bool
	}
	cases := map[string]struct {
		mem    poolMemory
		stored v1alpha1.ModelPoolStatus
		held   int64
		want   plan
	}{
		"the first version reserves the first block": {
			want: plan{1, 64, true},
		},
		"the same content keeps its version": {
			mem: poolMemory{contentHash: "a", version: 5}, stored: v1alpha1.ModelPoolStatus{PolicyVersion: 5, PolicyVersionReserved: 64},
			want: plan{5, 64, false},
		},
		"new content within the block writes nothing first": {
			mem: poolMemory{contentHash: "b", version: 5}, stored: v1alpha1.ModelPoolStatus{PolicyVersion: 1, PolicyVersionReserved: 64},
			want: plan{6, 64, false},
		},
		"a dispatcher holding the version makes a new one": {
			mem: poolMemory{contentHash: "a", version: 5}, stored: v1alpha1.ModelPoolStatus{PolicyVersion: 5, PolicyVersionReserved: 64}, held: 5,
			want: plan{6, 64, false},
		},
		"past the block's last version: the next block": {
			mem: poolMemory{contentHash: "b", version: 64}, stored: v1alpha1.ModelPoolStatus{PolicyVersion: 60, PolicyVersionReserved: 64},
			want: plan{65, 128, true},
		},
		"a restart starts above the ceiling, whatever the stored version": {
			stored: v1alpha1.ModelPoolStatus{PolicyVersion: 3, PolicyVersionReserved: 64}, held: 12,
			want: plan{65, 128, true},
		},
		"a dispatcher holding a version above the ceiling": {
			mem: poolMemory{contentHash: "a", version: 5}, stored: v1alpha1.ModelPoolStatus{PolicyVersion: 5, PolicyVersionReserved: 64}, held: 70,
			want: plan{71, 134, true},
		},
		"a status from before reservations (upgrade)": {
			stored: v1alpha1.ModelPoolStatus{PolicyVersion: 9},
			want:   plan{10, 73, true},
		},
		"a pool recreated under its name: the memory goes on, the new status has no ceiling": {
			mem:  poolMemory{version: 40},
			want: plan{41, 104, true},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			states := []PodState{{Name: "d-0", HeldVersion: tc.held}, {Name: "d-1"}}
			var got plan
			got.Version = tc.mem.nextVersion("a", tc.stored, states)
			got.Ceiling = versionCeiling(tc.stored.PolicyVersionReserved, got.Version)
			got.Reserve = got.Ceiling != tc.stored.PolicyVersionReserved
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// reserveRig reconciles the seed's pool on a fake API server whose pool
// status writes it counts; churn deletes and recreates a model pod, so
// that every reconcile has new content and a new version.
type reserveRig struct {
	t      *testing.T
	c      client.Client
	writes int
	clk    *clocktesting.FakePassiveClock
	gone   bool
}

func newReserveRig(t *testing.T) *reserveRig {
	rig := &reserveRig{t: t, clk: clocktesting.NewFakePassiveClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}
	rig.c = newFakeClient(t, seedWorld(), interceptor.Funcs{SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
		if _, ok := obj.(*v1alpha1.ModelPool); ok {
			rig.writes++
		}
		return c.Status().Patch(ctx, obj, p, opts...)
	}})
	return rig
}

// reconciler is a new controller process: no memory. Its status delay is
// long, so that only the reservations are written.
func (rig *reserveRig) reconciler(c client.Client, p *fakePusher) *PoolReconciler {
	return &PoolReconciler{Client: c, Recorder: events.NewFakeRecorder(1000), Clock: rig.clk, Pusher: p, StatusDelay: time.Hour,
		ResyncPeriod: time.Minute, MeasuredMinCompletions: 20, MeasuredTolerance: 0.1, UnreachableStrike: 3}
}

func (rig *reserveRig) churn() {
	rig.t.Helper()
	ctx := context.Background()
	pod := readyPod("vllm-5", "10.0.0.6", modelLabels)
	var err error
	if rig.gone {
		err = rig.c.Create(ctx, pod)
	} else {
		err = rig.c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: seed.Namespace, Name: pod.Name}})
	}
	if err != nil {
		rig.t.Fatal(err)
	}
	rig.gone = !rig.gone
}

// reconcile runs r once and returns the version pushed (0: nothing).
func (rig *reserveRig) reconcile(r *PoolReconciler, p *fakePusher) int64 {
	rig.t.Helper()
	rig.clk.SetTime(rig.clk.Now().Add(10 * time.Millisecond))
	p.synced, p.pushed = false, nil
	if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: seedKey}); err != nil {
		rig.t.Fatal(err)
	}
	if !p.synced || len(p.pushed) == 0 {
		return 0
	}
	return p.pushed[0].Policy.Version
}

func (rig *reserveRig) stored() v1alpha1.ModelPoolStatus {
	rig.t.Helper()
	var pool v1alpha1.ModelPool
	if err := rig.c.Get(context.Background(), seedKey, &pool); err != nil {
		rig.t.Fatal(err)
	}
	return pool.Status
}

// TestOneReservationWritePerBlock: 130 versions in a row (a pod churning)
// make three pool status writes, each before the first version of its
// block is pushed, and no version is skipped.
func TestOneReservationWritePerBlock(t *testing.T) {
	rig := newReserveRig(t)
	p := &fakePusher{}
	r := rig.reconciler(rig.c, p)
	type mark struct{ Version, Writes, Reserved int64 }
	var marks []mark
	for i := range 130 {
		if i > 0 {
			rig.churn()
		}
		v := rig.reconcile(r, p)
		if v != int64(i+1) {
			t.Fatalf("reconcile %d pushed version %d, want %d", i, v, i+1)
		}
		if st := rig.stored(); len(marks) == 0 || marks[len(marks)-1].Reserved != st.PolicyVersionReserved {
			marks = append(marks, mark{v, int64(rig.writes), st.PolicyVersionReserved})
		}
	}
	want := []mark{{1, 1, 64}, {65, 2, 128}, {129, 3, 192}}
	if diff := cmp.Diff(want, marks); diff != "" {
		t.Errorf("versions at which a new ceiling was stored, with the writes so far (-want +got):\n%s", diff)
	}
	if rig.writes != 3 {
		t.Errorf("%d pool status writes for 130 versions, want 3", rig.writes)
	}
}

// TestReservationsKeepVersionsApart: a restarted controller, whose memory
// is gone and whose dispatchers hold nothing, starts above the stored
// ceiling although the stored version lags the pushed ones. One whose
// cache lags a reservation is refused its own (the optimistic lock) and
// pushes nothing until it reads the pool again.
func TestReservationsKeepVersionsApart(t *testing.T) {
	rig := newReserveRig(t)
	var first []int64
	p := &fakePusher{}
	r := rig.reconciler(rig.c, p)
	for i := range 5 {
		if i > 0 {
			rig.churn()
		}
		first = append(first, rig.reconcile(r, p))
	}
	if diff := cmp.Diff([]int64{1, 2, 3, 4, 5}, first); diff != "" {
		t.Fatalf("first controller's versions (-want +got):\n%s", diff)
	}
	if st := rig.stored(); st.PolicyVersion != 1 || st.PolicyVersionReserved != 64 {
		t.Fatalf("stored version %d, ceiling %d; want 1, 64 (later versions wait for their write)", st.PolicyVersion, st.PolicyVersionReserved)
	}
	var before v1alpha1.ModelPool
	if err := rig.c.Get(context.Background(), seedKey, &before); err != nil {
		t.Fatal(err)
	}

	p2 := &fakePusher{}
	if v := rig.reconcile(rig.reconciler(rig.c, p2), p2); v != 65 {
		t.Errorf("restarted controller pushed version %d, want 65", v)
	}
	if st := rig.stored(); st.PolicyVersion != 65 || st.PolicyVersionReserved != 128 {
		t.Errorf("after the restart: stored version %d, ceiling %d; want 65, 128", st.PolicyVersion, st.PolicyVersionReserved)
	}

	// A third process whose cache still holds the pool from before the
	// second one's reservation.
	lagging := interceptor.NewClient(rig.c.(client.WithWatch), interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		if p, ok := obj.(*v1alpha1.ModelPool); ok {
			before.DeepCopyInto(p)
			return nil
		}
		return c.Get(ctx, key, obj, opts...)
	}})
	p3 := &fakePusher{}
	r3 := rig.reconciler(lagging, p3)
	writes := rig.writes
	res, err := r3.Reconcile(context.Background(), ctrl.Request{NamespacedName: seedKey})
	got := fmt.Sprintf("err %v, requeue %s, pushed %v, writes %d", err, res.RequeueAfter, p3.synced, rig.writes-writes)
	if want := fmt.Sprintf("err <nil>, requeue %s, pushed false, writes 1", conflictRequeue); got != want {
		t.Errorf("lagging cache: %s; want %s", got, want)
	}
	if st := rig.stored(); st.PolicyVersionReserved != 128 {
		t.Errorf("the refused reservation moved the ceiling to %d", st.PolicyVersionReserved)
	}
	r3.Client = rig.c // its cache catches up
	if v := rig.reconcile(r3, p3); v != 129 {
		t.Errorf("after its cache caught up the third controller pushed version %d, want 129", v)
	}
}
