package controllers

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestPacerDelays: a burst goes at once, then each write waits its turn,
// one every interval after the last one granted; idle time refills the
// bucket, never beyond the burst.
func TestPacerDelays(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	p := newPacer(clk, 50*time.Millisecond, 3)
	var got []time.Duration
	delay := func() time.Duration { d, _ := p.delay(); return d }
	for range 5 {
		got = append(got, delay())
	}
	want := []time.Duration{0, 0, 0, 50 * time.Millisecond, 100 * time.Millisecond}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("delays of a burst of 5 (-want +got):\n%s", diff)
	}
	clk.Step(100 * time.Millisecond) // the two waiters' turns have come
	if d := delay(); d != 50*time.Millisecond {
		t.Errorf("after the waiters' turns: delay %s, want 50ms", d)
	}
	clk.Step(time.Hour) // refilled to the burst, not beyond
	got = got[:0]
	for range 4 {
		got = append(got, delay())
	}
	want = []time.Duration{0, 0, 0, 50 * time.Millisecond}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("delays after an hour idle (-want +got):\n%s", diff)
	}
}

// TestPacerWait: wait returns at once within the burst, after the delay
// on the clock otherwise, and with the context's error when it ends
// first; before does not wait for an unchanged status, nor does a nil
// pacer.
func TestPacerWait(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	p := newPacer(clk, time.Second, 1)
	ctx := context.Background()
	if err := p.before(ctx, "a", "b"); err != nil { // the burst
		t.Fatal(err)
	}
	if err := p.before(ctx, "same", "same"); err != nil { // nothing to write: no token taken
		t.Fatal(err)
	}
	var nilPacer *pacer
	if err := nilPacer.before(ctx, "a", "b"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.wait(ctx) }()
	for !clk.HasWaiters() {
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("wait returned %v before its turn", err)
	default:
	}
	clk.Step(time.Second)
	if err := <-done; err != nil {
		t.Errorf("wait after its turn: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	go func() { done <- p.wait(cctx) }()
	for !clk.HasWaiters() {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("wait with its context cancelled: %v, want context.Canceled", err)
	}
}
