package tokenfile

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/tiergate/tiergate/internal/testutil"
)

func TestNewRefuses(t *testing.T) {
	tests := map[string]struct {
		opts Options
		want string
	}{
		"no path":           {Options{}, "invalid token file options: no path"},
		"negative grace":    {Options{Path: "x", Grace: -time.Second}, "invalid token file options: grace -1s must be between 0s and 1m0s"},
		"grace over 60s":    {Options{Path: "x", Grace: 61 * time.Second}, "invalid token file options: grace 1m1s must be between 0s and 1m0s"},
		"negative interval": {Options{Path: "x", Interval: -time.Second}, "invalid token file options: interval -1s must be positive"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := New(tc.opts)
			if !errors.Is(err, ErrInvalidOptions) || err.Error() != tc.want {
				t.Errorf("New = %v, want %q wrapping ErrInvalidOptions", err, tc.want)
			}
		})
	}
	if _, err := New(Options{Path: "x", Grace: MaxGrace}); err != nil {
		t.Errorf("a grace of exactly MaxGrace is refused: %v", err)
	}
}

type tokens struct{ Cur, Prev string }

func current(f *Follower) tokens {
	c, p := f.Tokens()
	return tokens{c, p}
}

// The kubelet's update of a Secret volume, step by step: the new token is
// in force at the next poll, the old one is accepted until the grace ends
// and refused from then on.
func TestFollowsTheKubeletSwap(t *testing.T) {
	vol := testutil.NewSecretVolume(t, map[string]string{"token": "old-token\n"})
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	f, err := New(Options{Path: vol.Path("token"), Grace: 20 * time.Second, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if got := current(f); got != (tokens{}) {
		t.Errorf("tokens before the first poll: %+v", got)
	}
	if f.Verify([]byte("old-token")) {
		t.Error("a token is accepted before the file was read")
	}
	steps := []struct {
		name     string
		act      func()
		changed  bool
		want     tokens
		accepted map[string]bool
	}{
		{"first read, trailing newline trimmed", func() {}, true, tokens{Cur: "old-token"},
			map[string]bool{"old-token": true, "old-token\n": false, "new-token": false}},
		{"nothing changed", func() { clk.Step(time.Second) }, false, tokens{Cur: "old-token"},
			map[string]bool{"old-token": true}},
		{"the swap", func() { vol.Update(map[string]string{"token": "new-token"}) }, true, tokens{Cur: "new-token", Prev: "old-token"},
			map[string]bool{"old-token": true, "new-token": true, "other": false}},
		{"within the grace", func() { clk.Step(20*time.Second - time.Nanosecond) }, false, tokens{Cur: "new-token", Prev: "old-token"},
			map[string]bool{"old-token": true, "new-token": true}},
		{"the grace ends", func() { clk.Step(time.Nanosecond) }, false, tokens{Cur: "new-token"},
			map[string]bool{"old-token": false, "new-token": true}},
		{"a swap to the same token", func() { vol.Update(map[string]string{"token": "new-token\n"}) }, false, tokens{Cur: "new-token"},
			map[string]bool{"old-token": false, "new-token": true}},
	}
	for _, s := range steps {
		s.act()
		changed, err := f.Poll()
		if err != nil || changed != s.changed {
			t.Errorf("%s: Poll = %v, %v; want %v, nil", s.name, changed, err, s.changed)
		}
		if diff := cmp.Diff(s.want, current(f)); diff != "" {
			t.Errorf("%s: tokens (-want +got):\n%s", s.name, diff)
		}
		for tok, want := range s.accepted {
			if got := f.Verify([]byte(tok)); got != want {
				t.Errorf("%s: Verify(%q) = %v, want %v", s.name, tok, got, want)
			}
		}
	}
}

// A file rewritten in place (not through a symlink) is followed too, by
// its size or modification time; an unchanged stat is not read again.
func TestFollowsAnInPlaceRewrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	write := func(s string, mtime time.Time) {
		t.Helper()
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Unix(5000, 0)
	write("aaaa", t0)
	f, err := New(Options{Path: path, Grace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Poll(); err != nil {
		t.Fatal(err)
	}
	// Same size, same modification time, same inode: the stat says
	// nothing changed, so the file is not read.
	write("bbbb", t0)
	if changed, err := f.Poll(); changed || err != nil || current(f).Cur != "aaaa" {
		t.Errorf("an unchanged stat was read again: %v %v %+v", changed, err, current(f))
	}
	write("bbbb", t0.Add(time.Second))
	if changed, err := f.Poll(); !changed || err != nil || current(f).Cur != "bbbb" {
		t.Errorf("a new modification time: %v %v %+v, want bbbb", changed, err, current(f))
	}
	write("ccccc", t0.Add(time.Second))
	if changed, err := f.Poll(); !changed || err != nil || current(f).Cur != "ccccc" {
		t.Errorf("a new size: %v %v %+v, want ccccc", changed, err, current(f))
	}
}

// A poll that fails keeps the tokens it had; the error says why.
func TestPollErrorsKeepTheToken(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "token")
	f, err := New(Options{Path: path, Grace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Poll()
	if !errors.Is(err, fs.ErrNotExist) || err.Error() != "token file: stat "+path+": no such file or directory" {
		t.Errorf("Poll of a missing file = %v", err)
	}
	if err := os.WriteFile(path, []byte("tok"), 0o600); err != nil {
		t.Fatal(err)
	}
	if changed, err := f.Poll(); !changed || err != nil {
		t.Fatalf("Poll once the file exists = %v, %v", changed, err)
	}
	if err := os.WriteFile(path, []byte(" \n\t"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Poll(); !errors.Is(err, ErrEmpty) || err.Error() != "the token file is empty: "+path {
		t.Errorf("Poll of an empty file = %v", err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Poll(); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Poll of a removed file = %v", err)
	}
	if got := current(f); got != (tokens{Cur: "tok"}) || !f.Verify([]byte("tok")) {
		t.Errorf("after the errors: %+v, want tok still in force", got)
	}
	if f.Path() != path {
		t.Errorf("Path = %q", f.Path())
	}
}

// Run polls on the clock: the swap is seen at the first tick after it,
// and each outcome is reported once the next tick is armed.
func TestRunPollsOnTheClock(t *testing.T) {
	vol := testutil.NewSecretVolume(t, map[string]string{"token": "one"})
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	type outcome struct {
		changed bool
		err     error
	}
	polled := make(chan outcome, 1)
	f, err := New(Options{Path: vol.Path("token"), Grace: 5 * time.Second, Interval: time.Second, Clock: clk,
		Polled: func(c bool, err error) { polled <- outcome{c, err} }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Poll(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.Run(ctx) }()
	defer func() { cancel(); <-done }()
	next := func() outcome {
		t.Helper()
		select {
		case o := <-polled:
			return o
		case <-time.After(10 * time.Second):
			t.Fatal("no poll reported")
			return outcome{}
		}
	}
	if o := next(); o.changed || o.err != nil {
		t.Fatalf("start: %+v", o)
	}
	vol.Update(map[string]string{"token": "two"})
	if f.Verify([]byte("two")) {
		t.Error("the new token is accepted before a poll saw it")
	}
	clk.Step(time.Second)
	if o := next(); !o.changed || o.err != nil {
		t.Fatalf("the tick after the swap: %+v", o)
	}
	if !f.Verify([]byte("two")) || !f.Verify([]byte("one")) {
		t.Errorf("after the swap: %+v", current(f))
	}
	vol.Update(map[string]string{})
	clk.Step(time.Second)
	if o := next(); !errors.Is(o.err, fs.ErrNotExist) {
		t.Errorf("the tick after the key went away: %+v", o)
	}
	clk.Step(5 * time.Second)
	next()
	if f.Verify([]byte("one")) || !f.Verify([]byte("two")) {
		t.Errorf("once the grace ended: %+v", current(f))
	}
}

// Concurrent polls through many swaps (the push client polls from every
// sender) never put an older token back in force: the current token seen
// after any poll is never older than one seen before it, and once the
// swaps stop one more poll finds the last token current.
func TestConcurrentPolls(t *testing.T) {
	vol := testutil.NewSecretVolume(t, map[string]string{"token": "t-0"})
	f, err := New(Options{Path: vol.Path("token"), Grace: MaxGrace})
	if err != nil {
		t.Fatal(err)
	}
	var newest atomic.Int64 // the newest token index any poller has seen
	var regressed atomic.Value
	stop := make(chan struct{})
	done := make(chan struct{})
	for range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, _ = f.Poll()
				before := newest.Load()
				cur, _ := f.Tokens()
				idx, _ := strconv.ParseInt(strings.TrimPrefix(cur, "t-"), 10, 64)
				if idx < before {
					regressed.Store(fmt.Sprintf("t-%d current after t-%d was seen", idx, before))
				}
				for m := newest.Load(); idx > m && !newest.CompareAndSwap(m, idx); m = newest.Load() {
				}
			}
		}()
	}
	const swaps = 200
	for i := 1; i <= swaps; i++ {
		vol.Update(map[string]string{"token": "t-" + strconv.Itoa(i)})
	}
	close(stop)
	for range 4 {
		<-done
	}
	if _, err := f.Poll(); err != nil {
		t.Fatal(err)
	}
	if got := current(f); got.Cur != "t-"+strconv.Itoa(swaps) {
		t.Errorf("after the swaps: %+v, want t-%d current", got, swaps)
	}
	if r := regressed.Load(); r != nil {
		t.Errorf("a poll put an older token back: %s", r)
	}
}
