package queue

import (
	"testing"
	"time"
)

func TestSmokeSeedOrder(t *testing.T) {
	q, clk := newTestQueue(t, seedPolicy(1))
	busy := mustAdmit(t, q, "hog", "premium")
	if !dispatched(busy) {
		t.Fatal("first job not dispatched")
	}
	free := mustAdmit(t, q, "f1", "free")
	clk.Step(60 * time.Second)
	std := mustAdmit(t, q, "s1", "standard")
	busy.Release()
	if !dispatched(free) || dispatched(std) {
		t.Fatalf("free=%v std=%v", dispatched(free), dispatched(std))
	}
	free.Release()
	if !dispatched(std) {
		t.Fatal("std not dispatched")
	}
	std.Release()
	s := q.Stats()
	if s.Queued != 0 || s.InFlight != 0 || len(q.tenants) != 0 {
		t.Fatalf("stats %+v tenants %d", s, len(q.tenants))
	}
}
