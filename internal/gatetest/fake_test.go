package gatetest

import (
	"testing"

	"github.com/tiergate/tiergate/dispatcher/queue/gate"
)

// TestFakeConforms holds the queue tests' Fake to the suite the Redis Gate
// passes too.
func TestFakeConforms(t *testing.T) {
	Run(t, Harness{NewFleet: func(*testing.T) (func(string) gate.Gate, func(Count) int) {
		f := NewFleet()
		f.HandOff(true)
		return func(name string) gate.Gate { return f.Gate(name) }, f.Count
	}})
}
