package controllers

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

func TestFoldServiceTime(t *testing.T) {
	tests := map[string]struct {
		current   time.Duration
		stats     []policy.Measured
		want      time.Duration
		wantMoved bool
	}{
		"no stats keep the current value": {6 * time.Second, nil, 6 * time.Second, false},
		"too few completions are not trusted": {6 * time.Second,
			[]policy.Measured{{ServiceTimeSeconds: 1, Completed: 19}}, 6 * time.Second, false},
		"within 10% is ignored": {6 * time.Second,
			[]policy.Measured{{ServiceTimeSeconds: 6.6, Completed: 100}}, 6 * time.Second, false},
		"beyond 10% moves": {6 * time.Second,
			[]policy.Measured{{ServiceTimeSeconds: 6.61, Completed: 100}}, 6610 * time.Millisecond, true},
		"weighted by completions across dispatchers": {6 * time.Second,
			[]policy.Measured{{ServiceTimeSeconds: 1, Completed: 30}, {ServiceTimeSeconds: 4, Completed: 10}, {ServiceTimeSeconds: 0, Completed: 0}},
			1750 * time.Millisecond, true},
		"nothing recorded yet takes any trusted value": {0,
			[]policy.Measured{{ServiceTimeSeconds: 0.2504, Completed: 20}}, 250 * time.Millisecond, true},
		"garbage is skipped": {6 * time.Second,
			[]policy.Measured{{ServiceTimeSeconds: -1, Completed: 500}, {ServiceTimeSeconds: 3, Completed: -5}}, 6 * time.Second, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, moved := foldServiceTime(tc.current, tc.stats, defaultMeasuredMinCompletions, defaultMeasuredTolerance)
			if got != tc.want || moved != tc.wantMoved {
				t.Errorf("foldServiceTime = %s, %v; want %s, %v", got, moved, tc.want, tc.wantMoved)
			}
		})
	}
}

func TestHashAPIKeys(t *testing.T) {
	// printf key-one | sha256sum, and key-two.
	const one = "9b346041bc9a49574eb2665b2ad2a0a3f9f9cce4e42f5d1f26deb8a256b5966a"
	const two = "c8df51469c308a59bfbd48a3e0bdd228ca922d6032035f5ef6e4ad45f473a9f3"
	secret := &corev1.Secret{Data: map[string][]byte{"a": []byte("key-one\n"), "b": []byte("  key-two "), "empty": []byte("\n")}}
	tests := map[string]struct {
		keys        []string
		want        []string
		wantMissing []string
	}{
		"every key when none are named": {nil, []string{one, two}, []string{"empty"}},
		"named keys, one missing":       {[]string{"b", "nope"}, []string{two}, []string{"nope"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			hashes, missing := hashAPIKeys(secret, tc.keys)
			if diff := cmp.Diff(tc.want, hashes); diff != "" {
				t.Errorf("hashes (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantMissing, missing); diff != "" {
				t.Errorf("missing (-want +got):\n%s", diff)
			}
		})
	}
}
