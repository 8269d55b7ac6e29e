package controllers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/tiergate/tiergate/api/v1alpha1"
	seed "github.com/tiergate/tiergate/capacity/capacitytest"
)

// recordingSink is a logr.LogSink that keeps every line, by level.
type recordingSink struct {
	mu     *sync.Mutex
	infos  *[]string // "V(level) msg"
	errors *[]string
}

func newRecordingSink() recordingSink {
	return recordingSink{mu: &sync.Mutex{}, infos: &[]string{}, errors: &[]string{}}
}

func (s recordingSink) Init(logr.RuntimeInfo)  {}
func (s recordingSink) Enabled(level int) bool { return true }
func (s recordingSink) Info(level int, msg string, _ ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	*s.infos = append(*s.infos, fmt.Sprintf("V(%d) %s", level, msg))
}

func (s recordingSink) Error(err error, msg string, _ ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	*s.errors = append(*s.errors, msg+": "+err.Error())
}
func (s recordingSink) WithValues(...any) logr.LogSink { return s }
func (s recordingSink) WithName(string) logr.LogSink   { return s }
func (s recordingSink) lines() (infos, errs []string)  { return *s.infos, *s.errors }

// TestStatusConflictIsQuiet: a ModelPool status write that meets a
// Conflict (the optimistic lock) logs nothing at error level and returns
// no error (controller-runtime logs a returned error with its stack
// trace), only a requeue; another write error is returned.
func TestStatusConflictIsQuiet(t *testing.T) {
	conflict := apierrors.NewConflict(v1alpha1.GroupVersion.WithResource("modelpools").GroupResource(), seed.PoolName, errors.New("the object has been modified"))
	broken := errors.New("etcd is on fire")
	tests := map[string]struct {
		err         error
		wantErr     error
		wantRequeue time.Duration
		wantInfos   []string
	}{
		"a conflict is requeued quietly": {err: conflict, wantRequeue: conflictRequeue,
			wantInfos: []string{"V(1) the pool changed since it was read; reconciling it again"}},
		"another error is returned": {err: broken, wantErr: broken},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := newFakeClient(t, seedWorld(), interceptor.Funcs{SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
				if _, ok := obj.(*v1alpha1.ModelPool); ok {
					return tc.err
				}
				return c.Status().Patch(ctx, obj, p, opts...)
			}})
			pusher := &fakePusher{}
			r := &PoolReconciler{Client: c, Recorder: events.NewFakeRecorder(20), Pusher: pusher,
				Clock:        clocktesting.NewFakePassiveClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
				ResyncPeriod: time.Minute, MeasuredMinCompletions: 20, MeasuredTolerance: 0.1, UnreachableStrike: 3}
			sink := newRecordingSink()
			ctx := log.IntoContext(context.Background(), logr.New(sink))
			res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: seedKey})
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("Reconcile error %v, want %v", err, tc.wantErr)
			}
			if err == nil && res.RequeueAfter != tc.wantRequeue {
				t.Errorf("requeue after %s, want %s", res.RequeueAfter, tc.wantRequeue)
			}
			infos, errs := sink.lines()
			if len(errs) > 0 {
				t.Errorf("logged at error level: %q", errs)
			}
			if diff := cmp.Diff(tc.wantInfos, infos, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("info lines (-want +got):\n%s", diff)
			}
			if pusher.synced {
				t.Errorf("pushed %d targets after a failed status write", len(pusher.pushed))
			}
		})
	}
}

// TestStatusMemory: a cached pool at a version the controller's own
// writes replaced is read as the last write returned it; any other
// version (the cache caught up, someone else wrote, another pool of the
// same name) is read as cached, and the memory is cleared.
func TestStatusMemory(t *testing.T) {
	pool := func(uid, rv string, version int64) *v1alpha1.ModelPool {
		return &v1alpha1.ModelPool{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), ResourceVersion: rv},
			Status: v1alpha1.ModelPoolStatus{PolicyVersion: version}}
	}
	type write struct {
		readAt string
		got    *v1alpha1.ModelPool
	}
	tests := map[string]struct {
		writes []write
		cached *v1alpha1.ModelPool
		want   string // the rv and version read
		kept   bool   // the memory still holds a write
	}{
		"no write yet":                  {cached: pool("a", "10", 1), want: "10/1"},
		"the cache still at the read":   {writes: []write{{"10", pool("a", "11", 2)}}, cached: pool("a", "10", 1), want: "11/2", kept: true},
		"two writes ahead of the cache": {writes: []write{{"10", pool("a", "11", 2)}, {"11", pool("a", "12", 3)}}, cached: pool("a", "10", 1), want: "12/3", kept: true},
		"one write ahead, cache at the first": {writes: []write{{"10", pool("a", "11", 2)}, {"11", pool("a", "12", 3)}},
			cached: pool("a", "11", 2), want: "12/3", kept: true},
		"the cache caught up":           {writes: []write{{"10", pool("a", "11", 2)}}, cached: pool("a", "11", 2), want: "11/2"},
		"someone else wrote":            {writes: []write{{"10", pool("a", "11", 2)}}, cached: pool("a", "13", 1), want: "13/1"},
		"a new pool with the same name": {writes: []write{{"10", pool("a", "11", 2)}}, cached: pool("b", "10", 0), want: "10/0"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var m statusMemory
			for _, w := range tc.writes {
				m.wrote(w.readAt, w.got)
			}
			p := tc.cached.DeepCopy()
			m.freshen(p)
			if got := fmt.Sprintf("%s/%d", p.ResourceVersion, p.Status.PolicyVersion); got != tc.want {
				t.Errorf("read %s, want %s", got, tc.want)
			}
			if kept := m.written != nil; kept != tc.kept {
				t.Errorf("memory kept %v, want %v", kept, tc.kept)
			}
		})
	}
}

// TestStatusMemoryIsBounded: a cache that lags more writes than
// maxSuperseded behind is read as it is.
func TestStatusMemoryIsBounded(t *testing.T) {
	var m statusMemory
	for i := range maxSuperseded + 1 {
		m.wrote(fmt.Sprint(i), &v1alpha1.ModelPool{ObjectMeta: metav1.ObjectMeta{UID: "a", ResourceVersion: fmt.Sprint(i + 1)}})
	}
	p := &v1alpha1.ModelPool{ObjectMeta: metav1.ObjectMeta{UID: "a", ResourceVersion: "0"}}
	m.freshen(p)
	if p.ResourceVersion != "0" {
		t.Errorf("a pool %d writes behind was read at %s, want as cached", maxSuperseded+1, p.ResourceVersion)
	}
}
