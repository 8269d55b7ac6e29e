package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	clocktesting "k8s.io/utils/clock/testing"

	policy "github.com/tiergate/tiergate/api/policy/v1"
)

type pollOutcome struct {
	changed bool
	err     error
}

// The watcher polls on its clock: each step of the interval is one poll,
// an edit is applied, a bad edit or an older version keeps the applied
// policy and is reported once, a missing file is reported on every poll.
func TestFileWatcher(t *testing.T) {
	file := filepath.Join(t.TempDir(), "policy.json")
	write := func(v any) {
		t.Helper()
		b, _ := json.Marshal(v)
		if err := os.WriteFile(file, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	d, err := New(Config{PolicyFile: file, Clock: clk, Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	write(pol(1, 1))
	if err := d.loadFile(nil); err != nil {
		t.Fatal(err)
	}
	polls := make(chan pollOutcome, 1)
	w := &fileWatcher{path: file, interval: time.Second, clock: clk, apply: d.Apply, log: logr.Discard(),
		polled: func(changed bool, err error) { polls <- pollOutcome{changed, err} }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.run(ctx) }()
	next := func() pollOutcome {
		t.Helper()
		select {
		case o := <-polls:
			return o
		case <-time.After(10 * time.Second):
			t.Fatal("the watcher did not report within 10s")
			return pollOutcome{}
		}
	}
	if o := next(); o.changed || o.err != nil {
		t.Fatalf("start: %+v", o)
	}

	steps := []struct {
		name        string
		edit        func()
		wantChanged bool
		wantErr     string // "" for none; FILE stands for the path
		wantIs      error
		wantVersion int64
	}{
		{name: "unchanged", wantVersion: 1},
		{name: "an edit is applied", edit: func() { write(pol(2, 3)) }, wantChanged: true, wantVersion: 2},
		{name: "a bad edit keeps the policy", edit: func() { write(map[string]any{"version": 3, "bogus": true}) }, wantChanged: true,
			wantErr: `policy file FILE: policy: decode: json: unknown field "bogus"`, wantIs: policy.ErrDecode, wantVersion: 2},
		{name: "a bad edit is reported once", wantVersion: 2},
		{name: "a newer schema keeps the policy", edit: func() { write(map[string]any{"schemaVersion": 99, "version": 3, "tokens": map[string]any{}}) },
			wantChanged: true, wantIs: policy.ErrUnsupportedSchema, wantVersion: 2,
			wantErr: fmt.Sprintf("policy file FILE: policy: decode: schemaVersion 99 is newer than %d, the newest this build understands", policy.SchemaVersion)},
		{name: "an older version keeps the policy", edit: func() { write(pol(1, 1)) }, wantChanged: true,
			wantErr: "policy file FILE: policy: stale version: have 2, got 1", wantIs: policy.ErrStaleVersion, wantVersion: 2},
		{name: "a missing file", edit: func() { _ = os.Remove(file) },
			wantErr: "policy file: open FILE: no such file or directory", wantIs: os.ErrNotExist, wantVersion: 2},
		{name: "still missing", wantErr: "policy file: open FILE: no such file or directory", wantIs: os.ErrNotExist, wantVersion: 2},
		{name: "back with a newer version", edit: func() { write(pol(4, 1)) }, wantChanged: true, wantVersion: 4},
	}
	for _, st := range steps {
		if st.edit != nil {
			st.edit()
		}
		clk.Step(time.Second - time.Nanosecond)
		if !clk.HasWaiters() {
			t.Fatalf("%s: polled before the interval was up", st.name)
		}
		clk.Step(time.Nanosecond)
		o := next()
		gotErr := ""
		if o.err != nil {
			gotErr = o.err.Error()
		}
		wantErr := strings.ReplaceAll(st.wantErr, "FILE", file)
		if o.changed != st.wantChanged || gotErr != wantErr || (st.wantIs != nil && !errors.Is(o.err, st.wantIs)) {
			t.Errorf("%s: changed %v, err %q; want %v, %q (is %v)", st.name, o.changed, gotErr, st.wantChanged, wantErr, st.wantIs)
		}
		if v := d.Policy().Version; v != st.wantVersion {
			t.Errorf("%s: version %d, want %d", st.name, v, st.wantVersion)
		}
	}
	cancel()
	<-done
	if clk.HasWaiters() {
		t.Error("the watcher left its timer armed")
	}
}
