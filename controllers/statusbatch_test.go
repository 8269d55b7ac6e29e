package controllers

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestStatusBatches: the worker writes each pool's latest batch once the
// pool has been quiet for quotaQuiet, and at the latest quotaMaxDelay
// after the first batch still pending; a batch replaced before it began
// is never written; a failed batch is logged (at V(1)) and the worker goes
// on; submit never blocks, and Start returns when its context ends.
func TestStatusBatches(t *testing.T) {
	var logMu sync.Mutex
	var logs []string
	log := funcr.New(func(prefix, args string) {
		logMu.Lock()
		defer logMu.Unlock()
		logs = append(logs, args)
	}, funcr.Options{Verbosity: 1})
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	b := newStatusBatches(log, clk)
	a, c := types.NamespacedName{Namespace: "ns", Name: "a"}, types.NamespacedName{Namespace: "ns", Name: "c"}

	var mu sync.Mutex
	var ran []string
	written := make(chan struct{}, 16)
	record := func(name string, err error) func(context.Context) error {
		return func(context.Context) error {
			mu.Lock()
			ran = append(ran, name)
			mu.Unlock()
			written <- struct{}{}
			return err
		}
	}
	got := func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), ran...) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- b.Start(ctx) }()
	// step moves the clock once the worker waits on its timer.
	step := func(d time.Duration) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !clk.HasWaiters() {
			if time.Now().After(deadline) {
				t.Fatal("the worker never armed its timer")
			}
			time.Sleep(time.Millisecond)
		}
		clk.Step(d)
	}
	expect := func(want ...string) {
		t.Helper()
		for range len(want) - len(got()) {
			select {
			case <-written:
			case <-time.After(5 * time.Second):
				t.Fatalf("batches written %v, want %v", got(), want)
			}
		}
		if diff := cmp.Diff(want, got()); diff != "" {
			t.Fatalf("batches written (-want +got):\n%s", diff)
		}
	}

	b.submit(a, record("a1", nil))
	b.submit(c, record("c1", errors.New("conflict")))
	step(500 * time.Millisecond)
	b.submit(a, record("a2", nil)) // a is quiet from here
	step(500 * time.Millisecond)   // c quiet for 1 s
	expect("c1")
	step(time.Second) // a quiet for 1 s: a2, never a1
	expect("c1", "a2")

	// A pool that never goes quiet is written quotaMaxDelay after its
	// first pending batch.
	for i := range 6 {
		b.submit(c, record("c"+string(rune('2'+i)), nil))
		step(900 * time.Millisecond)
	}
	expect("c1", "a2", "c7")
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Start: %v", err)
	}
	logMu.Lock()
	defer logMu.Unlock()
	wantLogs := []string{`"level"=1 "msg"="writing TenantQuota statuses failed; the next reconcile writes them" "pool"="ns/c" "err"="conflict"`}
	if diff := cmp.Diff(wantLogs, logs); diff != "" {
		t.Errorf("logs (-want +got):\n%s", diff)
	}
	if !b.NeedLeaderElection() {
		t.Error("status batches run on every replica, want the leader only")
	}
}
