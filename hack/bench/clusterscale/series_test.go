package clusterscale

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestSeriesReached(t *testing.T) {
	var s series
	for _, p := range []point{{at(0), 1000}, {at(100), 1000}, {at(1000), 800}, {at(1200), 500}, {at(3000), 700}, {at(5000), 1000}} {
		s.add(p.at, p.n)
	}
	for _, tc := range []struct {
		name      string
		since     time.Time
		n         int
		at        time.Time
		ok, isNow bool
	}{
		{"reached after since", at(900), 500, at(1200), true, false},
		{"in force at since counts from since", at(50), 1000, at(50), true, true},
		{"the next time it is reached", at(2000), 1000, at(5000), true, true},
		{"never reached", at(0), 600, time.Time{}, false, false},
		{"only before since", at(2000), 800, time.Time{}, false, false},
		{"the last value is in force from then on", at(9000), 1000, at(9000), true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gotAt, ok, isNow := s.reached(tc.since, tc.n)
			if diff := cmp.Diff([]any{tc.at, tc.ok, tc.isNow}, []any{gotAt, ok, isNow}); diff != "" {
				t.Errorf("reached (-want +got):\n%s", diff)
			}
		})
	}
	var empty series
	if _, ok, isNow := empty.reached(at(0), 0); ok || isNow {
		t.Error("an empty series reached 0")
	}
	if len(s.pts) != 5 {
		t.Errorf("%d points, want 5 (a repeated value is not a change)", len(s.pts))
	}
}
