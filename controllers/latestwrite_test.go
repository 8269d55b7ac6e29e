package controllers

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
)

// A pool's batches run one at a time, in order; one submitted while
// another runs waits, and a newer one replaces it, so the newest batch is
// written last and a replaced one never; a batch submitted before Start
// runs once it comes; another pool's batch does not wait for this one's.
func TestLatestWritesRunsThePoolsNewestBatch(t *testing.T) {
	w := newLatestWrites(logr.Discard())
	ran := make(chan string, 10)
	release := make(chan struct{})
	batch := func(name string, block bool) func(context.Context) error {
		return func(context.Context) error {
			ran <- name
			if block {
				<-release
			}
			return errors.New("logged, not retried")
		}
	}
	other := types.NamespacedName{Namespace: "ns", Name: "other"}
	w.submit(testPool, batch("first", true))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = w.Start(ctx); close(done) }()
	var got []string
	got = append(got, recv(t, ran)) // first runs once Start came, and holds
	w.submit(testPool, batch("replaced", false))
	w.submit(testPool, batch("newest", false))
	w.submit(other, batch("other pool", false))
	got = append(got, recv(t, ran)) // the other pool's, while first holds
	close(release)
	got = append(got, recv(t, ran))
	if diff := cmp.Diff([]string{"first", "other pool", "newest"}, got); diff != "" {
		t.Errorf("batches run (-want +got):\n%s", diff)
	}
	cancel()
	<-done
	w.submit(testPool, batch("after the end", false))
	select {
	case name := <-ran:
		t.Errorf("batch %q ran after Start returned", name)
	default:
	}
}

func recv(t *testing.T, ch chan string) string {
	t.Helper()
	select {
	case s := <-ch:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("no batch ran within 10s")
		return ""
	}
}
