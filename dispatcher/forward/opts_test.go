package forward

import "github.com/google/go-cmp/cmp"

// testOptions are the Options of the tests against misbehaving backends.
func testOptions() Options { return DefaultOptions() }

func cmpDiff(want, got any) string { return cmp.Diff(want, got) }
