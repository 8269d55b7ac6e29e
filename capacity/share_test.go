package capacity

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tiergate/tiergate/api/v1alpha1"
	seed "github.com/tiergate/tiergate/capacity/capacitytest"
)

func TestShareSlots(t *testing.T) {
	for name, tc := range map[string]struct {
		p        int64
		n        int
		excluded []bool
		want     []int64
	}{
		"nobody excluded":                          {24, 3, nil, []int64{8, 8, 8}},
		"an empty mark is nobody":                  {24, 3, []bool{false, false, false}, []int64{8, 8, 8}},
		"the failing one's share goes to the rest": {24, 3, []bool{false, true, false}, []int64{12, 0, 12}},
		"the remainder goes to the first holders":  {7, 3, []bool{true, false, false}, []int64{0, 4, 3}},
		"fewer slots than dispatchers":             {2, 3, nil, []int64{1, 1, 0}},
		"fewer slots than holders, one excluded":   {2, 4, []bool{true, false, false, false}, []int64{0, 1, 1, 0}},
		"everyone excluded: split among all":       {24, 3, []bool{true, true, true}, []int64{8, 8, 8}},
		"no slots":                                 {0, 2, []bool{true, false}, []int64{0, 0}},
	} {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, shareSlots(tc.p, tc.n, tc.excluded)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// An excluded dispatcher holds no slot and the floor bounds; the others
// split the pool and its bounds between them. Redis mode ignores the marks.
func TestComputeBoundsExcluded(t *testing.T) {
	type row struct {
		Slots   int
		Rate    float64
		Premium int // queue bound
	}
	for name, tc := range map[string]struct {
		redis    bool
		excluded []bool
		want     []row
	}{
		"one of three failing": {excluded: []bool{true, false, false},
			want: []row{{0, 0, 1}, {12, 2, 10}, {12, 2, 10}}},
		"none failing": {excluded: []bool{false, false, false},
			want: []row{{8, 8.0 / 6, 6}, {8, 8.0 / 6, 6}, {8, 8.0 / 6, 6}}},
		"Redis: every one holds the pool-wide numbers": {redis: true, excluded: []bool{true, false, false},
			want: []row{{24, 4, 20}, {24, 4, 20}, {24, 4, 20}}},
	} {
		t.Run(name, func(t *testing.T) {
			pool := seed.Pool(seed.WithClientTimeout(30 * time.Second))
			if tc.redis {
				pool.Spec.SharedState = v1alpha1.SharedStateRedis
			}
			got, err := ComputeBounds(BoundsInput{Pool: pool, ReadyReplicas: 6, Tiers: seed.Tiers(), Dispatchers: 3, Excluded: tc.excluded})
			if err != nil {
				t.Fatal(err)
			}
			var rows []row
			for _, p := range got.Policies {
				rows = append(rows, row{p.Slots, p.ServiceRate, p.Tiers[0].QueueBound})
			}
			if diff := cmp.Diff(tc.want, rows); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	_, err := ComputeBounds(BoundsInput{Pool: seed.Pool(), ReadyReplicas: 6, Tiers: seed.Tiers(), Dispatchers: 3, Excluded: []bool{true}})
	if !errors.Is(err, ErrInvalidInput) || err.Error() != "invalid bounds input: excluded: 1 entries for 3 dispatchers" {
		t.Errorf("a mark per dispatcher missing: %v", err)
	}
}
