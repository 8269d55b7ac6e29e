package controllers

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestStatusBatches: the worker writes a settled pool's latest batch once
// the pool has been quiet for statusQuiet, a moving pool's once it has
// been quiet for movingQuiet (a batch of the content pending is no
// change), and either at the latest statusMaxStale after
// the first batch still pending; a batch replaced before it began is never
// written; a failed batch is logged (at V(1)) and the worker goes on;
// submit never blocks, and Start returns when its context ends.
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
		for len(got()) < len(want) {
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

	// Every batch's content differs but where a test says so.
	n := 0
	settled := func(name string, err error) statusBatch {
		n++
		return statusBatch{write: record(name, err), settled: true, content: n}
	}
	moving := func(name string) statusBatch { n++; return statusBatch{write: record(name, nil), content: n} }
	b.submit(a, settled("a1", nil))
	b.submit(c, settled("c1", errors.New("conflict")))
	step(500 * time.Millisecond)
	b.submit(a, settled("a2", nil)) // a is quiet from here
	step(500 * time.Millisecond)    // c quiet for 1 s
	expect("c1")
	step(time.Second) // a quiet for 1 s: a2, never a1
	expect("c1", "a2")

	// A moving pool waits for movingQuiet, however many batches come
	// before: a scale-up's versions, 0.9 s apart for 9 s, are written once.
	for i := range 10 {
		b.submit(a, moving(fmt.Sprintf("a-moving-%d", i)))
		step(900 * time.Millisecond)
	}
	step(9 * time.Second) // 9.9 s after the last: not yet
	b.submit(c, settled("c2", nil))
	step(100 * time.Millisecond) // a's 10 s
	expect("c1", "a2", "a-moving-9")
	// The pool settles: its batch goes out a quiet second after, even
	// behind a moving one.
	b.submit(a, moving("a-moving-10"))
	step(500 * time.Millisecond)
	b.submit(a, settled("a3", nil))
	step(400 * time.Millisecond) // c's second
	expect("c1", "a2", "a-moving-9", "c2")
	step(600 * time.Millisecond)
	expect("c1", "a2", "a-moving-9", "c2", "a3")

	// Batches of the same content (resyncs, acks) do not restart the
	// quiet second: the first of them is due a second after it came.
	same := func(name string) statusBatch {
		return statusBatch{write: record(name, nil), settled: true, content: "bounds"}
	}
	b.submit(a, same("a-same-0"))
	step(600 * time.Millisecond)
	b.submit(a, same("a-same-1"))
	step(400 * time.Millisecond)
	expect("c1", "a2", "a-moving-9", "c2", "a3", "a-same-1")

	// A pool that never goes quiet is written statusMaxStale after its
	// first pending batch.
	for i := range 60 {
		b.submit(c, moving(fmt.Sprintf("c-moving-%d", i)))
		step(time.Second)
	}
	expect("c1", "a2", "a-moving-9", "c2", "a3", "a-same-1", "c-moving-59")
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Start: %v", err)
	}
	logMu.Lock()
	defer logMu.Unlock()
	wantLogs := []string{`"level"=1 "msg"="writing the tiers' and quotas' statuses failed; the next reconcile writes them" "pool"="ns/c" "err"="conflict"`}
	if diff := cmp.Diff(wantLogs, logs); diff != "" {
		t.Errorf("logs (-want +got):\n%s", diff)
	}
	if !b.NeedLeaderElection() {
		t.Error("status batches run on every replica, want the leader only")
	}
}
