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
)

// TestStatusBatches: the worker writes each pool's latest batch once, in
// the order the pools were first submitted; a batch replaced before it
// began is never written; a failed batch is logged (at V(1)) and the
// worker goes on; submit never blocks, and Start returns when its context
// ends.
func TestStatusBatches(t *testing.T) {
	var logs []string
	var logMu sync.Mutex
	log := funcr.New(func(prefix, args string) {
		logMu.Lock()
		defer logMu.Unlock()
		logs = append(logs, args)
	}, funcr.Options{Verbosity: 1})
	b := newStatusBatches(log)
	a, c := types.NamespacedName{Namespace: "ns", Name: "a"}, types.NamespacedName{Namespace: "ns", Name: "c"}

	var mu sync.Mutex
	var ran []string
	record := func(name string, err error) func(context.Context) error {
		return func(context.Context) error {
			mu.Lock()
			defer mu.Unlock()
			ran = append(ran, name)
			return err
		}
	}
	// Before the worker runs: a's first batch is replaced by its second.
	b.submit(a, record("a1", nil))
	b.submit(c, record("c1", errors.New("conflict")))
	b.submit(a, record("a2", nil))

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- b.Start(ctx) }()
	wait := func(n int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			mu.Lock()
			got := len(ran)
			mu.Unlock()
			if got >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d batches written, want %d", got, n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	wait(2)
	b.submit(c, record("c2", nil)) // after the worker went idle
	wait(3)
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Start: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff([]string{"a2", "c1", "c2"}, ran); diff != "" {
		t.Errorf("batches written (-want +got):\n%s", diff)
	}
	logMu.Lock()
	defer logMu.Unlock()
	want := []string{`"level"=1 "msg"="writing TenantQuota statuses failed; the next reconcile writes them" "pool"="ns/c" "err"="conflict"`}
	if diff := cmp.Diff(want, logs); diff != "" {
		t.Errorf("logs (-want +got):\n%s", diff)
	}
	if !b.NeedLeaderElection() {
		t.Error("status batches run on every replica, want the leader only")
	}
}
