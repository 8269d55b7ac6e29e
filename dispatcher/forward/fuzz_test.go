package forward

import (
	"maps"
	"net/http"
	"slices"
	"testing"
)

// FuzzBackendAnswer writes arbitrary bytes as a backend's answer to one
// request (then keeps the connection open and answers correctly). The
// invariant: the next requests, from other tenants, get their own
// answers, never a byte of the first one. The seeds are the conformance
// suite's answers and testdata/fuzz/FuzzBackendAnswer.
func FuzzBackendAnswer(f *testing.F) {
	for _, name := range slices.Sorted(maps.Keys(conformance)) {
		if m := conformance[name]; m.method == "" || m.method == http.MethodGet {
			f.Add([]byte(m.answer + m.extra))
		}
	}
	f.Fuzz(func(t *testing.T, answer []byte) {
		checkNextGetsItsOwn(t, false, misbehaviour{answer: string(answer)})
	})
}
